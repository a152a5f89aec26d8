/**
 * Permission and library-loading behaviour, each in a subprocess with exactly the flags a user
 * would pass: never a prompt, never a misleading error.
 */
import { deepStrictEqual, equal, match, ok } from "node:assert/strict";
import { ABI_VERSION } from "../src/native/abi.ts";
import { defaultLibraryPath } from "../src/native/loader.ts";
import { runDeno } from "./helpers.ts";

const probe = new URL("./fixtures/open_probe.ts", import.meta.url).pathname;
const cpuLib = defaultLibraryPath("cpu")!;

interface Outcome {
  pure: boolean;
  ok: boolean;
  code?: string;
  message?: string;
  result?: number[];
  serial?: boolean;
}

async function runProbeWithStderr(
  flags: string[],
  args: string[] = [],
  env: Record<string, string> = {},
): Promise<Outcome & { stderr: string }> {
  const out = await runDeno(["run", "--no-prompt", "--quiet", ...flags, probe, ...args], env);
  ok(out.success, `probe exited with ${out.code}: ${out.stderr}`);
  return { ...JSON.parse(out.stdout.trim().split("\n").pop()!), stderr: out.stderr };
}

async function runProbe(flags: string[], args: string[] = [], env: Record<string, string> = {}): Promise<Outcome> {
  const { stderr: _, ...outcome } = await runProbeWithStderr(flags, args, env);
  return outcome;
}

const NOTICE = /mlx-native: MLXN_\* environment switches cannot be read without env permission/g;

Deno.test("without --allow-ffi: PermissionDenied naming the exact flag; pure-TS parts still work", async () => {
  const r = await runProbe([]);
  equal(r.pure, true);
  equal(r.ok, false);
  equal(r.code, "PermissionDenied");
  match(r.message!, new RegExp(`--allow-ffi=${cpuLib.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&")}`));
});

Deno.test("--allow-ffi scoped to the library path is enough", async () => {
  const r = await runProbe([`--allow-ffi=${cpuLib}`]);
  equal(r.ok, true, r.message);
  deepStrictEqual(r.result, [2, 4]);
});

Deno.test("--allow-ffi scoped to another path is PermissionDenied, not 'library not found'", async () => {
  const r = await runProbe(["--allow-ffi=/nonexistent-mlxn-dir"]);
  equal(r.code, "PermissionDenied");
});

Deno.test("without --allow-env, switches are ignored and the first read says so once on stderr", async () => {
  const env = { MLXN_CONCURRENCY: "0" };
  const ignored = await runProbeWithStderr([`--allow-ffi=${cpuLib}`], [], env);
  equal(ignored.ok, true, ignored.message);
  equal(ignored.serial, false);
  equal(ignored.stderr.match(NOTICE)?.length, 1, ignored.stderr);
  match(ignored.stderr, /--allow-env='MLXN_\*'/);
  const applied = await runProbeWithStderr([`--allow-ffi=${cpuLib}`, "--allow-env"], [], env);
  equal(applied.serial, true);
  equal(applied.stderr, "");
  const wildcard = await runProbeWithStderr([`--allow-ffi=${cpuLib}`, "--allow-env=MLXN_*"], [], env);
  equal(wildcard.serial, true);
  equal(wildcard.stderr, "");
});

Deno.test("switches denied on purpose (--deny-env) are ignored without a notice", async () => {
  const r = await runProbeWithStderr([`--allow-ffi=${cpuLib}`, "--deny-env=MLXN_*"], [], { MLXN_CONCURRENCY: "0" });
  equal(r.serial, false);
  equal(r.stderr, "");
});

Deno.test("switches partly granted: the notice names the ones that cannot be read", async () => {
  const r = await runProbeWithStderr([`--allow-ffi=${cpuLib}`, "--allow-env=MLXN_LIB,MLXN_CONCURRENCY"], [], {});
  match(r.stderr, /MLXN_BACKEND, MLXN_FUSION, .*MLXN_CUDA_PDL, MLXN_PLAN_CACHE cannot be read/);
  ok(!/MLXN_LIB|MLXN_CONCURRENCY/.test(r.stderr.split("cannot be read")[0]!), r.stderr);
});

Deno.test("a missing library is LibraryNotFound with the build command", async () => {
  const r = await runProbe(["--allow-ffi"], ["/nonexistent/libmlxn_cpu.so"]);
  equal(r.code, "LibraryNotFound");
  match(r.message!, /check the libPath given to MlxDevice\.open/);
  match(r.message!, /make native/);
});

Deno.test("a wrong MLXN_LIB is blamed on the variable, not on the build", async () => {
  const viaEnv = await runProbe(["--allow-ffi", "--allow-env"], [], { MLXN_LIB: "/nonexistent/lib.so" });
  equal(viaEnv.code, "LibraryNotFound");
  match(viaEnv.message!, /MLXN_LIB=\/nonexistent\/lib\.so is wrong/);
  ok(!/rebuild|make native/.test(viaEnv.message!), viaEnv.message);
  const dir = Deno.makeTempDirSync();
  const bogus = `${dir}/libmlxn_cpu.so`;
  Deno.writeTextFileSync(bogus, "not an ELF file");
  const notLib = await runProbe(["--allow-ffi", "--allow-env"], [], { MLXN_LIB: bogus });
  equal(notLib.code, "LibraryLoadFailed");
  match(notLib.message!, /MLXN_LIB=.* is wrong/);
  ok(!/rebuild|make native/.test(notLib.message!), notLib.message);
  Deno.removeSync(dir, { recursive: true });
});

Deno.test({
  name: "a missing CUDA library names `make cuda`, not `make native`",
  ignore: (() => {
    try {
      return Deno.statSync(defaultLibraryPath("cuda")).isFile; // a GPU machine's checkout has it
    } catch {
      return false;
    }
  })(),
  fn: async () => {
    const r = await runProbe(["--allow-ffi", "--allow-env"], [], { MLXN_BACKEND: "cuda" });
    equal(r.code, "LibraryNotFound");
    match(r.message!, /`make cuda` in .* \(needs nvcc\)/);
    ok(!r.message!.includes("make native"), r.message);
  },
});

Deno.test("a file that is not a loadable library is LibraryLoadFailed", async () => {
  const dir = Deno.makeTempDirSync();
  const bogus = `${dir}/libmlxn_cpu.so`;
  Deno.writeTextFileSync(bogus, "not an ELF file");
  const r = await runProbe(["--allow-ffi"], [bogus]);
  equal(r.code, "LibraryLoadFailed");
  Deno.removeSync(dir, { recursive: true });
});

Deno.test("a library with another ABI version is AbiMismatch", async () => {
  const dir = Deno.makeTempDirSync();
  Deno.writeTextFileSync(`${dir}/v.c`, "unsigned mlxn_abi_version(void) { return 999; }\n");
  const cc = await new Deno.Command("cc", {
    args: ["-shared", "-fPIC", "-o", `${dir}/libv.so`, `${dir}/v.c`],
    stderr: "piped",
  }).output();
  ok(cc.success, new TextDecoder().decode(cc.stderr));
  const r = await runProbe(["--allow-ffi"], [`${dir}/libv.so`]);
  equal(r.code, "AbiMismatch");
  match(r.message!, new RegExp(`ABI version 999.*needs ${ABI_VERSION}`));
  Deno.removeSync(dir, { recursive: true });
});
