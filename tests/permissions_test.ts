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

async function runProbe(flags: string[], args: string[] = [], env: Record<string, string> = {}): Promise<Outcome> {
  const out = await runDeno(["run", "--no-prompt", "--quiet", ...flags, probe, ...args], env);
  ok(out.success, `probe exited with ${out.code}: ${out.stderr}`);
  return JSON.parse(out.stdout.trim().split("\n").pop()!);
}

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

Deno.test("without --allow-env, switches are ignored silently; with it, they apply", async () => {
  const env = { MLXN_CONCURRENCY: "0" };
  const ignored = await runProbe([`--allow-ffi=${cpuLib}`], [], env);
  equal(ignored.ok, true, ignored.message);
  equal(ignored.serial, false);
  const applied = await runProbe([`--allow-ffi=${cpuLib}`, "--allow-env"], [], env);
  equal(applied.serial, true);
});

Deno.test("a missing library is LibraryNotFound with the build command", async () => {
  const r = await runProbe(["--allow-ffi"], ["/nonexistent/libmlxn_cpu.so"]);
  equal(r.code, "LibraryNotFound");
  match(r.message!, /make native/);
  const viaEnv = await runProbe(["--allow-ffi", "--allow-env"], [], { MLXN_LIB: "/nonexistent/lib.so" });
  equal(viaEnv.code, "LibraryNotFound");
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
