/**
 * Each of native/core/key_compare.c's comparison paths against a reference loop
 * (tests/native/key_compare_check.c): the host's SIMD one (SSE2 on x86-64), the portable one, and the
 * AArch64 NEON one that Apple silicon runs, cross-compiled and run under qemu-aarch64 where
 * `aarch64-linux-gnu-gcc` and `qemu-aarch64` are installed (Debian: gcc-aarch64-linux-gnu,
 * qemu-user; .ci/run installs them). tests/hitpath4_test.ts checks the library's own build through FFI.
 */
import { equal, ok } from "node:assert/strict";
import { hasTool, hostCompiler } from "./helpers.ts";

const path = (p: string) => new URL(`../${p}`, import.meta.url).pathname;
const SOURCES = [path("tests/native/key_compare_check.c"), path("native/core/key_compare.c")];

/** Builds the check with `cc` and `flags`, runs it (through `runner` when given) and returns its output. */
async function buildAndRun(cc: string, flags: string[], runner?: string): Promise<string> {
  const dir = await Deno.makeTempDir();
  try {
    const exe = `${dir}/key_compare_check`;
    const build = await new Deno.Command(cc, {
      args: ["-std=c11", "-O2", ...flags, "-o", exe, ...SOURCES],
      stdout: "piped",
      stderr: "piped",
    }).output();
    ok(build.success, new TextDecoder().decode(build.stderr));
    const run = await new Deno.Command(runner ?? exe, { args: runner ? [exe] : [], stdout: "piped", stderr: "piped" })
      .output();
    const out = new TextDecoder().decode(run.stdout) + new TextDecoder().decode(run.stderr);
    ok(run.success, out);
    return out.trim();
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

const CASES = /^key compare: ok \d{3,} cases$/;

Deno.test("mlxn_key_compare, the host's SIMD path, agrees with the reference loop", async () => {
  const out = await buildAndRun(hostCompiler(), []);
  ok(CASES.test(out), out);
});

Deno.test("mlxn_key_compare, the portable path, agrees with the reference loop", async () => {
  const out = await buildAndRun(hostCompiler(), ["-DMLXN_KEY_COMPARE_PORTABLE"]);
  ok(CASES.test(out), out);
});

const cross = hasTool("aarch64-linux-gnu-gcc") && hasTool("qemu-aarch64");

Deno.test({
  name: "mlxn_key_compare, the AArch64 NEON path, agrees with the reference loop (under qemu-aarch64)",
  ignore: !cross,
  fn: async () => {
    // -static: qemu then needs no AArch64 loader or libc of its own.
    const out = await buildAndRun("aarch64-linux-gnu-gcc", ["-static", "-march=armv8-a+simd"], "qemu-aarch64");
    ok(CASES.test(out), out);
    // The NEON path is the one built (a portable build would pass too, and prove nothing about it).
    const pre = await new Deno.Command("aarch64-linux-gnu-gcc", { args: ["-dM", "-E", "-x", "c", "/dev/null"] })
      .output();
    const macros = new TextDecoder().decode(pre.stdout);
    equal(/#define __ARM_NEON 1/.test(macros) && /#define __aarch64__ 1/.test(macros), true, "NEON is on");
  },
});
