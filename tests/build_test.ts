/** The JSR build entry: its source list and flags match the tree and the Makefile, and it builds a working library. */
import { deepStrictEqual, equal, ok } from "node:assert/strict";
import { buildNative } from "../build.ts";
import { CPU_CFLAGS, CPU_SOURCES } from "../src/native/sources.ts";
import { runDeno } from "./helpers.ts";

const root = new URL("../", import.meta.url);

function filesUnder(dir: string, exts: string[]): string[] {
  return [...Deno.readDirSync(new URL(dir, root))]
    .filter((e) => e.isFile && exts.some((x) => e.name.endsWith(x)))
    .map((e) => `${dir}${e.name}`);
}

Deno.test("the build entry's sources are exactly the CPU backend's files", () => {
  const tree = [
    "native/mlxn.h",
    ...filesUnder("native/core/", [".c", ".h"]),
    ...filesUnder("native/cpu/", [".c", ".h"]),
    ...filesUnder("kernels/cpu/", [".c", ".h"]),
  ];
  deepStrictEqual([...CPU_SOURCES].sort(), tree.sort());
});

Deno.test("the build entry's flags are the Makefile's", () => {
  const make = Deno.readTextFileSync(new URL("Makefile", root));
  const m = make.match(/CFLAGS_COMMON := ((?:[^\n\\]|\\\n)*)/);
  ok(m, "CFLAGS_COMMON not found in the Makefile");
  deepStrictEqual(m[1].replace(/\\\n/g, " ").trim().split(/\s+/), [...CPU_CFLAGS]);
});

Deno.test("the build entry compiles a library that opens and computes", async () => {
  const out = Deno.makeTempDirSync();
  const lib = await buildNative({ outDir: out });
  ok(Deno.statSync(lib).size > 0);
  const probe = new URL("./fixtures/open_probe.ts", import.meta.url).pathname;
  const res = await runDeno(["run", "--no-prompt", "--quiet", `--allow-ffi=${lib}`, probe, lib]);
  const r = JSON.parse(res.stdout.trim());
  equal(r.ok, true, r.message);
  deepStrictEqual(r.result, [2, 4]);
  Deno.removeSync(out, { recursive: true });
});
