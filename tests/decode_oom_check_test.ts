/**
 * The decoder under allocation failure (tests/native/decode_oom_check.c): a TRACK-heavy stream that
 * grows the conflict tracker's sets past many blocks is encoded with each allocation call failing in
 * turn; every encode must fail with MLXN_E_OUT_OF_MEMORY (never crash), and the failed command buffer's
 * recycled storage must then encode the whole stream. Built with the library's C sources and GNU ld's
 * --wrap (Linux only), under AddressSanitizer and UndefinedBehaviorSanitizer where the compiler has
 * them (so a leak on a failure path fails it too), else plainly.
 */
import { ok } from "node:assert/strict";
import { hostCompiler } from "./helpers.ts";

const root = new URL("../", import.meta.url).pathname;

/** The library's C sources for the CPU backend (as the Makefile's CPU_SRC). */
function cpuSources(): string[] {
  const out: string[] = [];
  for (const dir of ["native/core", "native/contracts", "native/cpu", "kernels/cpu"]) {
    for (const e of Deno.readDirSync(`${root}${dir}`)) {
      if (e.isFile && e.name.endsWith(".c")) out.push(`${root}${dir}/${e.name}`);
    }
  }
  return out.sort();
}

Deno.test({
  name: "the decoder reports every allocation failure while tracking, and its recycled storage works after",
  ignore: Deno.build.os !== "linux",
  fn: async () => {
    const dir = await Deno.makeTempDir();
    try {
      const exe = `${dir}/decode_oom_check`;
      const build = (flags: string[]) =>
        new Deno.Command(hostCompiler(), {
          args: [
            "-std=c11",
            "-pthread",
            "-D_POSIX_C_SOURCE=200809L",
            ...flags,
            "-Wl,--wrap=malloc,--wrap=realloc,--wrap=calloc",
            "-o",
            exe,
            `${root}tests/native/decode_oom_check.c`,
            ...cpuSources(),
            "-ldl",
            "-lm",
          ],
          stdout: "piped",
          stderr: "piped",
        }).output();
      let built = await build(["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]);
      if (!built.success) built = await build(["-O2"]); // this compiler cannot build with the sanitizers
      ok(built.success, new TextDecoder().decode(built.stderr));
      // A clean environment: under `make sanitize-test` this process preloads an ASan runtime.
      const run = await new Deno.Command(exe, { clearEnv: true, stdout: "piped", stderr: "piped" }).output();
      const out = (new TextDecoder().decode(run.stdout) + new TextDecoder().decode(run.stderr)).trim();
      ok(run.success, out);
      ok(/^decode oom: ok [1-9]\d* failures$/.test(out), out);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});
