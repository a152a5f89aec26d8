/**
 * The emulated Metal backend's execution model, probed with small MSL kernels
 * (metal_emu/tests/semantics.metal run by metal_emu/tests/semantics.c) against what Metal's
 * specification says: 32-lane SIMD-groups whose reductions, shuffles, broadcasts and scans see
 * exactly the active lanes, real threadgroup barriers, undefined behaviour reported instead of a
 * silent result; and its checker (MLXN_EMU_CHECK=1) on the library kernels.
 */
import { deepStrictEqual, equal, match, notDeepStrictEqual, ok, throws } from "node:assert/strict";
import { DType, MlxDevice, MlxError, ops } from "../mod.ts";
import { KernelRegistry } from "../src/kernels.ts";
import { cxx, CXX_FLAGS, front } from "../metal_emu/msl_front.ts";
import { MUTANTS } from "../scripts/metal_emu_mutants.ts";
import { randomValues } from "./helpers.ts";

const root = new URL("../", import.meta.url);
const rootPath = decodeURIComponent(root.pathname);
const hasClang = (() => {
  try {
    return new Deno.Command("clang++", { args: ["--version"], stdout: "null", stderr: "null" }).outputSync().success;
  } catch {
    return false;
  }
})();
const decoder = new TextDecoder();

function run(cmd: string, args: string[]): string {
  const out = new Deno.Command(cmd, { args, cwd: rootPath, stdout: "piped", stderr: "piped" }).outputSync();
  if (!out.success) throw new Error(`${cmd} ${args.join(" ")} failed:\n${decoder.decode(out.stderr)}`);
  return decoder.decode(out.stdout);
}

/** Builds and runs the probe harness (fibers by `defines`); returns its lines by case name. */
async function probe(defines: string[] = []): Promise<Map<string, string[]>> {
  const dir = await Deno.makeTempDir({ prefix: "mlxn-emu-probe-" });
  try {
    const r = await front(["metal_emu/tests/semantics.metal"], root);
    equal(r.stderr, "");
    deepStrictEqual(r.diagnostics, []);
    Deno.writeTextFileSync(`${dir}/k.cpp`, r.cpp);
    run(cxx(), [...CXX_FLAGS, "-O2", "-c", "-o", `${dir}/k.o`, `${dir}/k.cpp`]);
    run("clang", [
      "-std=c11",
      "-O1",
      "-pthread",
      ...defines,
      "-o",
      `${dir}/probe`,
      "metal_emu/tests/semantics.c",
      "metal_emu/runtime.c",
      `${dir}/k.o`,
    ]);
    const lines = run(`${dir}/probe`, []).trim().split("\n");
    return new Map(lines.map((l) => {
      const [name, ...rest] = l.split(" ");
      return [name!, rest];
    }));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

const numbers = (r: string[] | undefined, what: string) => {
  ok(r, `${what}: no result`);
  equal(r[0], "ok", `${what}: ${r.join(" ")}`);
  return r.slice(1).map(Number);
};
const failure = (r: string[] | undefined, what: string) => {
  ok(r, `${what}: no result`);
  equal(r[0], "error", `${what} ran without an error: ${r.slice(0, 8).join(" ")}`);
  return r.slice(1).join(" ");
};

Deno.test(
  { name: "metal-emu runtime: SIMD-group functions, barriers and undefined behaviour", ignore: !hasClang },
  async () => {
    const res = await probe();

    // Two full SIMD-groups: every function over 32 active lanes, the same in either schedule.
    const want: number[] = [];
    for (let tid = 0; tid < 64; tid++) {
      const lane = tid % 32, sg = Math.floor(tid / 32);
      want.push(
        528,
        lane + 3 < 32 ? lane + 3 : lane,
        lane >= 5 ? lane - 5 : lane,
        lane ^ 7,
        90,
        lane,
        31 * (sg + 1),
        2,
      );
    }
    deepStrictEqual(numbers(res.get("simd_ops"), "simd_ops"), want);
    deepStrictEqual(numbers(res.get("simd_ops_reverse"), "simd_ops in reverse order"), want);

    // A partial SIMD-group (lanes 0-7 of the second): reductions and scans over its live lanes only.
    const partial: number[] = [];
    for (let tid = 0; tid < 40; tid++) {
      const lane = tid % 32, last = tid < 32 ? 31 : 7;
      partial.push(((last + 1) * (last + 2)) / 2, (lane * (lane + 1)) / 2, 31 - last, 2);
    }
    deepStrictEqual(numbers(res.get("simd_partial"), "simd_partial"), partial);
    // …where a shuffle from a lane past its end (undefined in MSL) is an error, not a value.
    match(failure(res.get("simd_ops_partial"), "shuffle from an inactive lane"), /read an inactive lane/);

    // Lanes that returned are inactive: the sum covers the 16 even lanes.
    deepStrictEqual(
      numbers(res.get("simd_inactive"), "simd_inactive"),
      Array.from({ length: 32 }, (_, l) => l % 2 ? -1 : 240),
    );
    // A real barrier: every thread sees its neighbour's write.
    deepStrictEqual(
      numbers(res.get("barrier_neighbour"), "barrier_neighbour"),
      Array.from({ length: 100 }, (_, i) => ((i + 1) % 100) * 3),
    );
    match(failure(res.get("barrier_divergent"), "barrier in divergent flow"), /reached by 5 of its 64 threads/);
    match(failure(res.get("simd_divergent"), "simd_* in divergent flow"), /different SIMD-group function calls/);

    // The checker's criterion: a race or an uninitialised read gives different bytes in the two
    // schedules (threads forward with memory 0x00, backward with 0xff).
    notDeepStrictEqual(res.get("tg_race_forward"), res.get("tg_race_reverse"));
    notDeepStrictEqual(res.get("tg_uninit_forward"), res.get("tg_uninit_reverse"));

    // half + half rounds to half (1 + 2^-11 is a tie, to even: 1); vector constructors convert values.
    deepStrictEqual(numbers(res.get("numerics"), "numerics"), [1, 1, -2, 40000, 4, 127]);

    // threadgroup variables declared in the kernel are shared by the group; program-scope constants.
    const weights = [0.5, 1, 2, 4];
    const tg = [Array.from({ length: 64 }, (_, t) => t * weights[t % 4]!).reduce((a, b) => a + b) + 7];
    for (let t = 0; t < 64; t++) tg.push(((t + 1) % 64) * weights[((t + 1) % 64) % 4]!);
    deepStrictEqual(numbers(res.get("tg_variables"), "tg_variables"), tg);
    deepStrictEqual(numbers(res.get("tg_variables_reverse"), "tg_variables in reverse order"), tg);

    const builtins: number[] = [];
    for (let l = 0; l < 32; l++) {
      const pop = l.toString(2).split("").filter((c) => c === "1").length;
      builtins.push((l + 3) % 32, 10 * l, pop + Math.clz32(l + 1), Math.max(l, 3) + 1 + 100);
    }
    deepStrictEqual(numbers(res.get("builtins"), "builtins"), builtins);

    // SIMD-group matrices: C = A · B + 0.5 from 8×8 tiles (small integers: exact in float).
    const mat: number[] = [];
    for (let i = 0; i < 16; i++) {
      for (let j = 0; j < 16; j++) {
        let sum = 0;
        for (let k = 0; k < 16; k++) sum += ((i * 16 + k) % 7 - 3) * ((j * 16 + k) % 5 - 2);
        mat.push(sum + 0.5);
      }
    }
    deepStrictEqual(numbers(res.get("simd_matrix"), "simd_matrix"), mat);

    // The portable fibers (ucontext, used off x86-64) behave exactly as the x86-64 switch.
    deepStrictEqual(await probe(["-DMLXN_EMU_UCONTEXT"]), res);
  },
);

const libName = `libmlxn_metal_emu.${Deno.build.os === "darwin" ? "dylib" : "so"}`;
const builtLib = `${rootPath}build/${libName}`;
const haveBuiltLib = (() => {
  try {
    return Deno.statSync(builtLib).isFile;
  } catch {
    return false;
  }
})();

/** rms_norm of `rows` × `dim` on a device; returns the output. */
function rmsNorm(device: MlxDevice, rows: number, dim: number): { got: Float32Array; want: Float32Array } {
  const registry = new KernelRegistry(device);
  const xv = randomValues(rows * dim, 7), wv = randomValues(dim, 8);
  using x = device.upload(xv), w = device.upload(wv), y = device.alloc(rows * dim * 4, DType.F32);
  using enc = device.commandEncoder();
  ops.rmsNorm(enc, registry, x, w, y, { rows, dim, eps: 1e-6 });
  enc.commitAndWait();
  const want = new Float32Array(rows * dim);
  for (let r = 0; r < rows; r++) {
    let ss = 0;
    for (let k = 0; k < dim; k++) ss += xv[r * dim + k]! ** 2;
    const inv = 1 / Math.sqrt(ss / dim + 1e-6);
    for (let k = 0; k < dim; k++) want[r * dim + k] = xv[r * dim + k]! * inv * wv[k]!;
  }
  return { got: y.read() as Float32Array, want };
}

/** Opens a metal-emu library with the checker on (read by the library at device open). */
function openChecked(libPath: string, threads = 0): MlxDevice {
  Deno.env.set("MLXN_EMU_CHECK", "1");
  try {
    return MlxDevice.open({ backend: "metal-emu", libPath, threads });
  } finally {
    Deno.env.delete("MLXN_EMU_CHECK");
  }
}

Deno.test({
  name: "metal-emu checker (MLXN_EMU_CHECK=1): the library's reductions are race-free",
  ignore: !haveBuiltLib,
}, () => {
  using device = openChecked(builtLib);
  equal(device.info.name.includes("checker"), true, device.info.name);
  const { got, want } = rmsNorm(device, 3, 1000);
  for (let i = 0; i < want.length; i++) ok(Math.abs(got[i]! - want[i]!) <= 1e-5 * (1 + Math.abs(want[i]!)), `at ${i}`);
});

/** An axpby whose threadgroups all write the first elements of `out` (a race between threadgroups). */
const crossGroupRace = {
  file: "elementwise.metal",
  from: "  out[i] = p.alpha * a[i] + p.beta * b[i];",
  to: "  out[lid.x] = p.alpha * a[i] + p.beta * b[i];",
};

Deno.test({
  name: "metal-emu checker: a missing threadgroup barrier and a race between threadgroups are reported",
  ignore: !hasClang,
}, async () => {
  const barrier = MUTANTS.find((m) => m.name.startsWith("missing threadgroup barrier inside the tree reduction"))!;
  const dir = await Deno.makeTempDir({ prefix: "mlxn-emu-race-" });
  try {
    const files = [...Deno.readDirSync(new URL("kernels/metal/", root))].map((e) => e.name).sort();
    for (const f of files) {
      let text = Deno.readTextFileSync(new URL(`kernels/metal/${f}`, root));
      for (const m of [barrier, crossGroupRace]) {
        if (f === m.file) {
          ok(text.includes(m.from), m.from);
          text = text.replace(m.from, m.to);
        }
      }
      Deno.writeTextFileSync(`${dir}/${f}`, text);
    }
    const ordered = ["common.metal", ...files.filter((f) => f !== "common.metal")].map((f) => `${dir}/${f}`);
    run("make", [
      "-s",
      "metal-emu",
      `METAL_SRC=${ordered.join(" ")}`,
      `METAL_EMU_DIR=${dir}`,
      `METAL_EMU_LIB=${dir}/${libName}`,
    ]);
    // One worker: the checker's two schedules then run the threadgroups strictly first to last and
    // last to first, so the racing groups' last writer differs between them every time (with helper
    // threads both schedules can end on the same group, and the race goes unseen).
    using device = openChecked(`${dir}/${libName}`, 1);
    const race = /checker: slot 2 differs .*races on threadgroup memory/s;
    throws(() => rmsNorm(device, 2, 256), (e: unknown) => {
      ok(e instanceof MlxError, String(e));
      match(e.message, /rms_norm_f32/);
      match(e.message, race);
      return true;
    });
    const registry = new KernelRegistry(device);
    const n = 1024;
    using a = device.upload(randomValues(n, 4)), b = device.upload(randomValues(n, 5));
    using out = device.alloc(n * 4, DType.F32);
    using enc = device.commandEncoder();
    ops.axpby(enc, registry, a, b, out, { alpha: 2, beta: 3, n });
    throws(() => enc.commitAndWait(), (e: unknown) => {
      ok(e instanceof MlxError, String(e));
      match(e.message, /axpby_f32/);
      match(e.message, race);
      return true;
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

/** Flash attention (split over workgroups, then combined) and a norm, as bytes. */
function attentionBytes(device: MlxDevice): Uint8Array {
  const registry = new KernelRegistry(device);
  const nHeads = 4, nKvHeads = 2, headDim = 64, kvSeqLen = 100, nwg = 8;
  using q = device.upload(randomValues(nHeads * headDim, 1));
  using k = device.upload(randomValues(nKvHeads * kvSeqLen * headDim, 2));
  using v = device.upload(randomValues(nKvHeads * kvSeqLen * headDim, 3));
  using tmp = device.alloc(nHeads * nwg * (headDim + 2) * 4, DType.F32);
  using out = device.alloc(nHeads * headDim * 4, DType.F32);
  using enc = device.commandEncoder();
  ops.flashAttnVec(enc, registry, q, k, v, tmp, out, {
    nHeads,
    nKvHeads,
    headDim,
    kvSeqLen,
    kvCapacity: kvSeqLen,
    nwg,
  });
  enc.commitAndWait();
  const { got } = rmsNorm(device, 5, 300);
  const a = out.read() as Float32Array;
  return new Uint8Array([...new Uint8Array(a.buffer.slice(0)), ...new Uint8Array(got.buffer.slice(0))]);
}

Deno.test({
  name: "metal-emu results are deterministic: the same bits on every run and with any number of workers",
  ignore: !haveBuiltLib,
}, () => {
  using one = MlxDevice.open({ backend: "metal-emu", libPath: builtLib, threads: 1 });
  using three = MlxDevice.open({ backend: "metal-emu", libPath: builtLib, threads: 3 });
  const first = attentionBytes(one);
  deepStrictEqual(attentionBytes(one), first);
  deepStrictEqual(attentionBytes(three), first);
});
