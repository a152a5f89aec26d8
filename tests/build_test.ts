/** The JSR build entry: its source list and flags match the tree and the Makefile, and it builds a working library. */
import { deepStrictEqual, equal, ok } from "node:assert/strict";
import { buildNative } from "../build.ts";
import {
  CPU_CFLAGS,
  CPU_SOURCES,
  METAL_OBJC_SOURCE,
  METAL_SHADERS,
  metalCompileArgs,
  metalSourceHeader,
  PACKAGE_VERSION,
} from "../src/native/sources.ts";
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
    ...filesUnder("native/contracts/", [".c", ".h"]),
    ...filesUnder("native/cpu/", [".c", ".h"]),
    ...filesUnder("kernels/cpu/", [".c", ".h"]),
  ];
  deepStrictEqual([...CPU_SOURCES].sort(), tree.sort());
});

Deno.test("the build entry's flags are the Makefile's", () => {
  const make = Deno.readTextFileSync(new URL("Makefile", root));
  const m = make.match(/CFLAGS_COMMON := ((?:[^\n\\]|\\\n)*)/);
  ok(m, "CFLAGS_COMMON not found in the Makefile");
  deepStrictEqual(m[1]!.replace(/\\\n/g, " ").trim().split(/\s+/), [...CPU_CFLAGS]);
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

Deno.test("the build entry's Metal sources are the tree's, in the Makefile's order", () => {
  const shaders = filesUnder("kernels/metal/", [".metal"]).sort();
  const common = "kernels/metal/common.metal";
  deepStrictEqual([...METAL_SHADERS], [common, ...shaders.filter((f) => f !== common)]);
  ok(Deno.statSync(new URL(METAL_OBJC_SOURCE, root)).isFile);
});

Deno.test("the build entry's embedded-MSL header is byte-identical to the Makefile's", async () => {
  const made = await new Deno.Command("make", {
    args: ["-s", "-C", root.pathname, "-B", "build/mlxn_metal_source.h"],
    stdout: "piped",
    stderr: "piped",
  }).output();
  equal(made.code, 0, new TextDecoder().decode(made.stderr));
  const want = Deno.readTextFileSync(new URL("build/mlxn_metal_source.h", root));
  const shaders = METAL_SHADERS.map((f) => Deno.readTextFileSync(new URL(f, root)));
  equal(metalSourceHeader(shaders), want);
  // Quotes and backslashes are escaped, so the literal holds the MSL text exactly.
  equal(metalSourceHeader(['a "q" \\ b\n']), 'static const char mlxn_metal_source[] =\n"a \\"q\\" \\\\ b\\n"\n;\n');
});

Deno.test("the published package holds every file the build entry reads; its version is deno.json's", () => {
  const config = JSON.parse(Deno.readTextFileSync(new URL("deno.json", root)));
  equal(PACKAGE_VERSION, config.version);
  const include: string[] = config.publish.include, exclude: string[] = config.publish.exclude;
  const under = (f: string, dirs: string[]) => dirs.some((d) => d.endsWith("/") ? f.startsWith(d) : f === d);
  for (const f of [...CPU_SOURCES, METAL_OBJC_SOURCE, ...METAL_SHADERS, "build.ts", "src/native/sources.ts"]) {
    ok(under(f, include) && !under(f, exclude), `${f} is not in the published package`);
  }
});

Deno.test("the build entry compiles the Metal library with the Makefile's recipe", () => {
  const make = Deno.readTextFileSync(new URL("Makefile", root));
  const recipe = make.match(/^\$\(METAL_LIB\):.*\n((?:\t.*\\\n)*\t.*)$/m);
  ok(recipe, "the Makefile's METAL_LIB rule not found");
  const core = [...filesUnder("native/core/", [".c"]), ...filesUnder("native/contracts/", [".c"])].sort();
  const want = recipe[1]!.replace(/\\\n/g, " ").trim().split(/\s+/).slice(1).flatMap((t) =>
    t === "$(CFLAGS_COMMON)"
      ? [...CPU_CFLAGS, "-D_DARWIN_C_SOURCE"] // the Makefile adds it on Darwin
      : t === "$(CORE_SRC)"
      ? core.map((f) => `SRC/${f}`)
      : t === "-Ibuild"
      ? ["-IGEN"]
      : t === "$@"
      ? ["LIB"]
      : t === "objc/mlxn_metal.m"
      ? ["SRC/objc/mlxn_metal.m"]
      : [t]
  );
  const got = metalCompileArgs({ src: "SRC", include: "GEN", lib: "LIB" });
  const cut = got.indexOf("SRC/objc/mlxn_metal.m");
  deepStrictEqual([...got.slice(0, cut + 1), ...got.slice(cut + 1).sort()], want);
});
