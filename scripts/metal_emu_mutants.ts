/**
 * Mutation check of the emulated Metal backend: builds the emulator from a temporary copy of
 * kernels/metal/ — once unbroken, then once per deliberate MSL bug — and runs the test suite on each
 * build (MLXN_BACKEND=metal-emu, MLXN_LIB pointing at it). The unbroken copy must pass and every
 * broken one must fail; a bug the suite misses is reported and the script exits 1.
 *
 * Usage (from the repository root; `make metal-emu-mutants` runs it):
 *   deno run --allow-read --allow-write --allow-run --allow-env scripts/metal_emu_mutants.ts [test paths…]
 * DENO and DENO_TEST_FLAGS name the Deno binary and the suite's permission flags.
 *
 * @module
 */

import { runtimeOrder } from "../metal_emu/msl_front.ts";

/** One deliberate bug: a unique piece of a .metal file and what it is replaced by. */
export interface Mutant {
  /** What the bug is. */
  name: string;
  /** File under kernels/metal/. */
  file: string;
  /** Text to replace (must occur exactly once). */
  from: string;
  /** Its broken replacement. */
  to: string;
}

/** The bugs a GPU port typically has, each in the MSL that runs it. */
export const MUTANTS: readonly Mutant[] = [
  {
    name: "wrong SIMD lane index (flash attention writes lane l's dimensions at lane l+1's place)",
    file: "attention.metal",
    from: "for (uint i = 0; i < per; i++) out[lane + 32 * i] = acc[i];",
    to: "for (uint i = 0; i < per; i++) out[(lane + 1) % 32 + 32 * i] = acc[i];",
  },
  {
    name: "missing threadgroup barrier inside the tree reduction (tg_sum)",
    file: "common.metal",
    from: "    if (i < s) sh[i] += sh[i + s];\n    threadgroup_barrier(mem_flags::mem_threadgroup);\n",
    to: "    if (i < s) sh[i] += sh[i + s];\n",
  },
  {
    name: "missing threadgroup barrier before threadgroup memory is reused (tg_max, then tg_sum, in softmax)",
    file: "common.metal",
    from: "    if (i < s) sh[i] = max(sh[i], sh[i + s]);\n    threadgroup_barrier(mem_flags::mem_threadgroup);\n" +
      "  }\n  float r = sh[0];\n  threadgroup_barrier(mem_flags::mem_threadgroup);\n",
    to: "    if (i < s) sh[i] = max(sh[i], sh[i + s]);\n    threadgroup_barrier(mem_flags::mem_threadgroup);\n" +
      "  }\n  float r = sh[0];\n",
  },
  {
    name: "off-by-one in a reduction (the tree stops one level early)",
    file: "common.metal",
    from:
      "  sh[i] = v;\n  threadgroup_barrier(mem_flags::mem_threadgroup);\n  for (uint s = n / 2; s > 0; s >>= 1) {\n" +
      "    if (i < s) sh[i] += sh[i + s];",
    to: "  sh[i] = v;\n  threadgroup_barrier(mem_flags::mem_threadgroup);\n  for (uint s = n / 2; s > 1; s >>= 1) {\n" +
      "    if (i < s) sh[i] += sh[i + s];",
  },
  {
    name: "off-by-one in the flash-attention combine (the last workgroup's normaliser is dropped)",
    file: "attention.metal",
    from: "  float l = 0.0f;\n  for (uint w = 0; w < p.nwg; w++) {",
    to: "  float l = 0.0f;\n  for (uint w = 0; w + 1 < p.nwg; w++) {",
  },
];

const decoder = new TextDecoder();

/** Builds the emulator from `dir`'s .metal files into `dir`; throws with the build output on failure. */
function build(dir: string): string {
  const files = runtimeOrder([...Deno.readDirSync(dir)].map((e) => `${dir}/${e.name}`));
  const lib = `${dir}/libmlxn_metal_emu.${Deno.build.os === "darwin" ? "dylib" : "so"}`;
  const out = new Deno.Command("make", {
    args: ["-s", "metal-emu", `METAL_SRC=${files.join(" ")}`, `METAL_EMU_DIR=${dir}`, `METAL_EMU_LIB=${lib}`],
    stdout: "piped",
    stderr: "piped",
  }).outputSync();
  if (!out.success) throw new Error(`building ${lib} failed:\n${decoder.decode(out.stderr)}`);
  return lib;
}

/** Runs the suite on a build; returns whether it passed and the first failing test. */
function suite(lib: string, tests: string[]): { passed: boolean; firstFailure: string } {
  const deno = Deno.env.get("DENO") || Deno.execPath();
  const flags = (Deno.env.get("DENO_TEST_FLAGS") || "--allow-ffi --allow-read --allow-env --allow-run --allow-write")
    .split(/\s+/).filter(Boolean);
  const out = new Deno.Command(deno, {
    args: ["test", ...flags, "--fail-fast", ...tests],
    env: { MLXN_BACKEND: "metal-emu", MLXN_LIB: lib, NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).outputSync();
  const text = decoder.decode(out.stdout) + decoder.decode(out.stderr);
  const failed = /^(.*?) \.\.\. FAILED/m.exec(text);
  return { passed: out.success, firstFailure: failed ? failed[1]!.trim() : out.success ? "" : text.slice(-400) };
}

/** Copies kernels/metal/ into a fresh temporary directory, applying `m` if given. */
function copyKernels(m?: Mutant): string {
  const dir = Deno.makeTempDirSync({ prefix: "mlxn-mutant-" });
  for (const e of Deno.readDirSync("kernels/metal")) {
    if (!e.name.endsWith(".metal")) continue;
    let text = Deno.readTextFileSync(`kernels/metal/${e.name}`);
    if (m && e.name === m.file) {
      const count = text.split(m.from).length - 1;
      if (count !== 1) throw new Error(`mutant "${m.name}": its anchor occurs ${count} times in ${m.file}`);
      text = text.replace(m.from, m.to);
    }
    Deno.writeTextFileSync(`${dir}/${e.name}`, text);
  }
  return dir;
}

if (import.meta.main) {
  const tests = Deno.args.length > 0 ? [...Deno.args] : ["tests/"];
  let bad = 0;
  for (const m of [undefined, ...MUTANTS]) {
    const dir = copyKernels(m);
    try {
      const t0 = performance.now();
      const r = suite(build(dir), tests);
      const secs = ((performance.now() - t0) / 1000).toFixed(1);
      if (!m) {
        console.log(
          `${r.passed ? "ok  " : "FAIL"} unbroken MSL: the suite ${r.passed ? "passes" : "fails"} (${secs} s)`,
        );
        if (!r.passed) {
          console.log(`     first failure: ${r.firstFailure}`);
          bad++;
          break; // a mutant's failure would prove nothing
        }
      } else {
        console.log(`${r.passed ? "FAIL" : "ok  "} ${m.name}: ${r.passed ? "NOT caught" : "caught"} (${secs} s)`);
        if (r.passed) bad++;
        else console.log(`     first failing test: ${r.firstFailure}`);
      }
    } finally {
      Deno.removeSync(dir, { recursive: true });
    }
  }
  console.log(bad === 0 ? `all ${MUTANTS.length} MSL mutants fail the metal-emu suite` : `${bad} problem(s)`);
  Deno.exit(bad === 0 ? 0 : 1);
}
