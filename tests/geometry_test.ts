/**
 * Dispatch geometry is validated natively: for every kernel, a raw dispatch with an arbitrary
 * threadgroup shape, grid, dispatch kind and threadgroup memory is either refused with an MlxError
 * that names the geometry (or the slice it would overrun), or computes the reference result. On the
 * CPU backend most shapes compute correctly anyway; on the GPU backends (metal-emu runs the real MSL)
 * a shape the kernel does not assume computes a partial result, so this test guards them.
 */
import { equal, ok, throws } from "node:assert/strict";
import fc from "fast-check";
import { type DispatchDescriptor, DType as D, type MlxBuffer, type MlxDevice, MlxError } from "../mod.ts";
import { f32Bits } from "../src/ops/common.ts";
import { assertClose, randomValues, testContext } from "./helpers.ts";
import {
  neoxAngle,
  refAdd,
  refArgmax,
  refAttentionDecode,
  refGelu,
  refMatmul,
  refRmsNorm,
  refRope,
  refRopeNeox,
  refSdpa,
  refSilu,
  refSoftcap,
  refSoftmax,
} from "./reference.ts";

type Dim3 = [number, number, number];
type Kind = "threads" | "threadgroups";

/** One dispatch shape under test. */
interface Geometry {
  kind: Kind;
  tg: Dim3;
  /** Added to one grid dimension of the shape that exactly covers the work. */
  delta: number;
  deltaDim: number;
  /** Threadgroup memory: "fit" = 4 bytes per thread of x (what the row kernels need). */
  tgMemory: "none" | "fit" | "short" | "max";
}

/** The pieces of one kernel case. */
interface Instance {
  /** Bindings of the dispatch under test. */
  bindings: DispatchDescriptor["bindings"];
  /** Dispatches encoded before (with a barrier after) the one under test. */
  before?: DispatchDescriptor[];
  /** Dispatches encoded after (behind a barrier) the one under test. */
  after?: DispatchDescriptor[];
  /** Throws unless the outputs hold the reference result (the first `limit` elements of the output,
   * the rest untouched, where the grid itself sets the size of the work). */
  check(limit?: number): void;
  /** Buffers to release. */
  buffers: MlxBuffer[];
}

interface Case {
  kernel: string;
  /** The test step's name, where one kernel has several cases (default: the kernel's name). */
  label?: string;
  /** The work: element threads (kernels indexed by thread) or threadgroups (indexed by group). */
  unit: "threads" | "groups";
  extent: Dim3;
  /** The geometry src/ops uses. */
  canonical: { tg: Dim3; tgMemory: number };
  /** For kernels whose work size is the grid itself: the output elements a grid defines. */
  defined?: ((threads: Dim3, groups: Dim3) => number) | undefined;
  make(device: MlxDevice, registry: ReturnType<typeof testContext>["registry"]): Instance;
}

const f32 = (n: number, seed: number, lo = -2, hi = 2) => randomValues(n, seed, D.F32, lo, hi);
const nanBuffer = (device: MlxDevice, n: number) => device.upload(new Float32Array(n).fill(NaN), D.F32);
/** Loose enough for any f32 summation order, far tighter than a partial (one lane's) result. */
function close(got: ArrayLike<number>, want: ArrayLike<number>, what: string, limit = want.length): void {
  const head = (v: ArrayLike<number>) => Array.from({ length: limit }, (_, i) => v[i]!);
  assertClose(head(got), head(want), (i) => 1e-4 * (1 + Math.abs(want[i]!)), what);
  for (let i = limit; i < got.length; i++) {
    if (!Number.isNaN(got[i])) throw new Error(`${what}: element ${i} is past the dispatched work but was written`);
  }
}

function elementwiseCase(
  kernel: string,
  n: number,
  params: number[] | null,
  arity: 1 | 2,
  ref: (a: Float32Array, b: Float32Array) => ArrayLike<number>,
  inPlace = false,
): Case {
  return {
    kernel,
    ...(inPlace ? { label: `${kernel}, in place` } : {}),
    unit: "threads",
    extent: [n, 1, 1],
    canonical: { tg: [Math.min(256, n), 1, 1], tgMemory: 0 },
    defined: params ? undefined : (threads) => Math.min(n, threads[0]),
    make(device) {
      const av = f32(n, 11), bv = f32(n, 12);
      // In place, the output is the first input: a geometry that runs an element twice applies the
      // op twice (out of place, a second run writes the same value and goes unseen).
      const a = device.upload(av), b = device.upload(bv), out = inPlace ? a : nanBuffer(device, n);
      const ins = arity === 2 ? [a, b] : [a];
      return {
        bindings: params ? [...ins, out, params] : [...ins, out],
        check: (limit) => close(out.read() as Float32Array, ref(av, bv), kernel, limit),
        buffers: inPlace ? [a, b] : [a, b, out],
      };
    },
  };
}

function rowCase(kernel: "rms_norm_f32" | "rms_norm_no_scale_f32" | "softmax_f32"): Case {
  const rows = 3, dim = 50, eps = 1e-5;
  const tg = 64;
  return {
    kernel,
    unit: "groups",
    extent: [rows, 1, 1],
    canonical: { tg: [tg, 1, 1], tgMemory: tg * 4 },
    defined: (_, groups) => Math.min(rows, groups[0] * groups[1] * groups[2]) * dim,
    make(device) {
      const xv = f32(rows * dim, 21), wv = f32(dim, 22, 0.5, 1.5);
      const x = device.upload(xv), w = device.upload(wv), out = nanBuffer(device, rows * dim);
      const bindings = kernel === "rms_norm_f32"
        ? [x, w, out, [f32Bits(eps), dim]]
        : kernel === "rms_norm_no_scale_f32"
        ? [x, out, [f32Bits(eps), dim]]
        : [x, out, [dim]];
      const want = kernel === "softmax_f32"
        ? refSoftmax(xv, rows, dim)
        : refRmsNorm(xv, kernel === "rms_norm_f32" ? wv : null, rows, dim, eps);
      return {
        bindings,
        check: (limit) => close(out.read() as Float32Array, want, kernel, limit),
        buffers: [x, w, out],
      };
    },
  };
}

/** Deterministic small integers (exact in every format used here). */
function ints(n: number, seed: number, lo: number, hi: number): number[] {
  const v = randomValues(n, seed, D.F32, 0, 1);
  return Array.from(v, (u) => lo + Math.floor(u * (hi - lo + 1)) % (hi - lo + 1));
}

/** Q8_0 blocks (scale 1.0) of rows × k int8 values. */
function q8Blocks(values: number[], k: number): Uint8Array {
  const rows = values.length / k, out = new Uint8Array(rows * (k / 32) * 34);
  let o = 0;
  for (let r = 0; r < rows; r++) {
    for (let b = 0; b < k / 32; b++) {
      out[o] = 0x00;
      out[o + 1] = 0x3c; // f16 1.0
      for (let j = 0; j < 32; j++) out[o + 2 + j] = values[r * k + b * 32 + j]! & 0xff;
      o += 34;
    }
  }
  return out;
}

/** Q4_1 blocks (scale 1.0, min 0) of rows × k values in [0, 15]: value j in the low nibble of
 * qs[j], value j + 16 in the high one. */
function q41Blocks(values: number[], k: number): Uint8Array {
  const rows = values.length / k, out = new Uint8Array(rows * (k / 32) * 20);
  let o = 0;
  for (let r = 0; r < rows; r++) {
    for (let b = 0; b < k / 32; b++) {
      out[o + 1] = 0x3c; // d = f16 1.0; m = 0
      const v = (j: number) => values[r * k + b * 32 + j];
      for (let j = 0; j < 16; j++) out[o + 4 + j] = v(j)! | (v(j + 16)! << 4);
      o += 20;
    }
  }
  return out;
}

/** Rows of `bits`-wide codes as one little-endian bit stream each (code j at bit j·bits). */
function bitStream(codes: number[], k: number, bits: number): Uint8Array {
  const rowBytes = k / 8 * bits, out = new Uint8Array(codes.length / k * rowBytes);
  codes.forEach((c, i) => {
    const at = Math.floor(i / k) * rowBytes * 8 + (i % k) * bits;
    for (let b = 0; b < bits; b++) if ((c >> b) & 1) out[(at + b) >> 3]! |= 1 << ((at + b) & 7);
  });
  return out;
}

function matmulDenseCase(swiglu: boolean, dtype: "f32" | "f16" = "f32"): Case {
  const m = 2, n = 9, k = 70, outs = swiglu ? 2 : 4, kernel = `matmul_${dtype}`;
  return {
    kernel,
    unit: "groups",
    extent: [Math.ceil(n / outs), m, 1],
    canonical: { tg: [128, 1, 1], tgMemory: 0 },
    make(device) {
      const xv = f32(m * k, 31), wv = randomValues((swiglu ? 2 : 1) * n * k, 32, dtype);
      const x = device.upload(xv), w = device.upload(wv, dtype), y = nanBuffer(device, m * n);
      let want: ArrayLike<number>;
      if (swiglu) {
        const g = refMatmul(xv, wv.subarray(0, n * k), m, n, k).y, u = refMatmul(xv, wv.subarray(n * k), m, n, k).y;
        const s = refSilu(g);
        want = Float64Array.from(s, (v, i) => v * u[i]!);
      } else {
        want = refMatmul(xv, wv, m, n, k).y;
      }
      return {
        bindings: [x, w, y, [m, n, k, swiglu ? 2 : 0], undefined],
        check: () => close(y.read() as Float32Array, want, `${kernel}${swiglu ? " swiglu" : ""}`),
        buffers: [x, w, y],
      };
    },
  };
}

/** The dense product with its residual epilogue bound to y itself (y += x · Wᵀ): a geometry that
 * runs an output twice adds the product twice. */
function matmulResidualInPlaceCase(): Case {
  const m = 2, n = 9, k = 70;
  return {
    kernel: "matmul_f32",
    label: "matmul_f32, residual in place",
    unit: "groups",
    extent: [Math.ceil(n / 4), m, 1],
    canonical: { tg: [128, 1, 1], tgMemory: 0 },
    make(device) {
      const xv = f32(m * k, 33), wv = f32(n * k, 34), yv = f32(m * n, 35);
      const x = device.upload(xv), w = device.upload(wv), y = device.upload(yv);
      const product = refMatmul(xv, wv, m, n, k).y, want = Float64Array.from(product, (v, i) => v + yv[i]!);
      return {
        bindings: [x, w, y, [m, n, k, 1], y],
        check: () => close(y.read() as Float32Array, want, "matmul_f32 residual in place"),
        buffers: [x, w, y],
      };
    },
  };
}

function affineCase(fast: boolean): Case {
  const m = 2, n = 8, k = fast ? 256 : 64, gs = 32;
  return {
    kernel: fast ? "qmatmul_affine_fast" : "qmatmul_affine",
    unit: "groups",
    extent: [Math.ceil(n / (fast ? 8 : 4)), m, 1],
    canonical: { tg: [fast ? 256 : 128, 1, 1], tgMemory: 0 },
    make(device) {
      const xv = f32(m * k, 41), q = ints(n * k, 42, 0, 15);
      const x = device.upload(xv), w = device.upload(Uint8Array.from(q), D.U8);
      const ones = new Uint16Array(n * (k / gs)).fill(0x3f80), zeros = new Uint16Array(n * (k / gs));
      const sc = device.upload(ones, D.U16), bi = device.upload(zeros, D.U16), y = nanBuffer(device, m * n);
      const want = refMatmul(xv, q, m, n, k).y;
      return {
        bindings: [x, w, sc, bi, y, [m, n, k, 8, gs]],
        check: () => close(y.read() as Float32Array, want, fast ? "qmatmul_affine_fast" : "qmatmul_affine"),
        buffers: [x, w, sc, bi, y],
      };
    },
  };
}

function ggmlCase(kernel: `qmatmul_${"q8_0" | "q4_1"}_${"mv" | "mm"}`): Case {
  const m = 2, n = 6, k = 64, q41 = kernel.includes("q4_1");
  return {
    kernel,
    unit: "groups",
    extent: [Math.ceil(n / 4), kernel.endsWith("mv") ? 1 : m, 1],
    canonical: { tg: [128, 1, 1], tgMemory: 0 },
    make(device) {
      const xv = f32(m * k, 51), q = q41 ? ints(n * k, 52, 0, 15) : ints(n * k, 52, -20, 20);
      const blocks = q41 ? q41Blocks(q, k) : q8Blocks(q, k);
      const x = device.upload(xv), w = device.upload(blocks, D.U8), y = nanBuffer(device, m * n);
      const want = refMatmul(xv, q, m, n, k).y;
      return {
        bindings: [x, w, y, [m, n, k]],
        check: () => close(y.read() as Float32Array, want, kernel),
        buffers: [x, w, y],
      };
    },
  };
}

const moeCase: Case = {
  kernel: "qmatmul_id_q8_0",
  unit: "groups",
  extent: [2, 4, 1],
  canonical: { tg: [128, 1, 1], tgMemory: 0 },
  make(device) {
    const tokens = 2, topK = 2, rows = 4, experts = 3, n = 5, k = 32, ids = [0, 2, 1, 1];
    const xv = f32(tokens * k, 61), q = ints(experts * n * k, 62, -20, 20);
    const x = device.upload(xv), w = device.upload(q8Blocks(q, k), D.U8);
    const idb = device.upload(Uint32Array.from(ids), D.U32), y = nanBuffer(device, rows * n);
    const want = new Float64Array(rows * n);
    for (let r = 0; r < rows; r++) {
      const t = Math.floor(r / topK), e = ids[r]!;
      want.set(refMatmul(xv.subarray(t * k, (t + 1) * k), q.slice(e * n * k, (e + 1) * n * k), 1, n, k).y, r * n);
    }
    return {
      bindings: [x, w, idb, y, [rows, n, k, topK, experts]],
      check: () => close(y.read() as Float32Array, want, "qmatmul_id_q8_0"),
      buffers: [x, w, idb, y],
    };
  },
};

/** MLX affine at 3 bits with f16 scales (1.0) and biases (−2): w = q − 2. */
const AFFINE_GENERAL = { k: 64, gs: 32, bits: 3, one: 0x3c00, minusTwo: 0xc000 };

const affineGeneralCase: Case = {
  kernel: "qmatmul_affine_general",
  unit: "groups",
  extent: [2, 2, 1],
  canonical: { tg: [128, 1, 1], tgMemory: 0 },
  make(device) {
    const { k, gs, bits } = AFFINE_GENERAL, m = 2, n = 7;
    const xv = f32(m * k, 141), q = ints(n * k, 142, 0, 7);
    const x = device.upload(xv), w = device.upload(bitStream(q, k, bits), D.U8);
    const sc = device.upload(new Uint16Array(n * k / gs).fill(AFFINE_GENERAL.one), D.U16);
    const bi = device.upload(new Uint16Array(n * k / gs).fill(AFFINE_GENERAL.minusTwo), D.U16);
    const y = nanBuffer(device, m * n);
    const want = refMatmul(xv, q.map((v) => v - 2), m, n, k).y;
    return {
      bindings: [x, w, sc, bi, y, [m, n, k, bits, gs, 1]],
      check: () => close(y.read() as Float32Array, want, "qmatmul_affine_general"),
      buffers: [x, w, sc, bi, y],
    };
  },
};

const affineGatherCase: Case = {
  kernel: "qmatmul_affine_gather",
  unit: "groups",
  extent: [2, 4, 1],
  canonical: { tg: [128, 1, 1], tgMemory: 0 },
  make(device) {
    const { k, gs, bits } = AFFINE_GENERAL, tokens = 2, topK = 2, rows = 4, experts = 3, n = 5, ids = [2, 0, 1, 2];
    const xv = f32(tokens * k, 151), q = ints(experts * n * k, 152, 0, 7);
    const x = device.upload(xv), w = device.upload(bitStream(q, k, bits), D.U8);
    const sc = device.upload(new Uint16Array(experts * n * k / gs).fill(AFFINE_GENERAL.one), D.U16);
    const bi = device.upload(new Uint16Array(experts * n * k / gs).fill(AFFINE_GENERAL.minusTwo), D.U16);
    const idb = device.upload(Uint32Array.from(ids), D.U32), y = nanBuffer(device, rows * n);
    const want = new Float64Array(rows * n);
    for (let r = 0; r < rows; r++) {
      const t = Math.floor(r / topK), e = ids[r]!, wq = q.slice(e * n * k, (e + 1) * n * k).map((v) => v - 2);
      want.set(refMatmul(xv.subarray(t * k, (t + 1) * k), wq, 1, n, k).y, r * n);
    }
    return {
      bindings: [x, w, sc, bi, idb, y, [rows, n, k, topK, experts, bits, gs, 1]],
      check: () => close(y.read() as Float32Array, want, "qmatmul_affine_gather"),
      buffers: [x, w, sc, bi, idb, y],
    };
  },
};

/** ggml's normal-mode rope over [seq·heads, hd]: pairs (2i, 2i + 1), i < ropeDim/2; dims ≥ ropeDim
 * copied. */
function refRopeNorm(
  x: ArrayLike<number>,
  positions: ArrayLike<number>,
  o: { theta: number; headDim: number; ropeDim: number; nHeads: number; seqLen: number },
): Float64Array {
  const { headDim: hd, ropeDim: rd, nHeads } = o, out = Float64Array.from(x);
  for (let r = 0; r < o.seqLen * nHeads; r++) {
    for (let i = 0; i < rd / 2; i++) {
      const ang = neoxAngle(positions[Math.floor(r / nHeads)]!, i, o.theta, rd);
      const x0 = x[r * hd + 2 * i]!, x1 = x[r * hd + 2 * i + 1]!;
      out[r * hd + 2 * i] = x0 * Math.cos(ang) - x1 * Math.sin(ang);
      out[r * hd + 2 * i + 1] = x0 * Math.sin(ang) + x1 * Math.cos(ang);
    }
  }
  return out;
}

function ropeHeadsCase(kernel: "rope_neox_f32" | "rope_norm_f32", inPlace = false): Case {
  return {
    kernel,
    ...(inPlace ? { label: `${kernel}, in place` } : {}),
    unit: "threads",
    extent: [4, 6, 1],
    canonical: { tg: [4, 1, 1], tgMemory: 0 },
    defined: (threads) => Math.min(6, threads[1]) * 16,
    make(device) {
      const o = { theta: 10000, headDim: 16, ropeDim: 8, nHeads: 2, seqLen: 3 };
      const xv = f32(6 * 16, 111), pos = [2, 5, 7];
      const x = device.upload(xv), p = device.upload(Uint32Array.from(pos), D.U32);
      // In place, a geometry that runs a pair twice rotates it twice.
      const out = inPlace ? x : nanBuffer(device, 6 * 16);
      const want = kernel === "rope_neox_f32" ? refRopeNeox(xv, pos, o) : refRopeNorm(xv, pos, o);
      const check = (limit = want.length) => {
        if (!inPlace) return close(out.read() as Float32Array, want, kernel, limit);
        // Rows past the grid keep their input.
        close(out.read() as Float32Array, Float64Array.from(want, (v, i) => i < limit ? v : xv[i]!), kernel);
      };
      return {
        bindings: [x, out, [f32Bits(10000), 16, 8], p, [2, 0, 16, 32, 0, 0, 0], undefined],
        check,
        buffers: inPlace ? [x, p] : [x, out, p],
      };
    },
  };
}

const sdpaCase: Case = {
  kernel: "sdpa_f32",
  unit: "groups",
  extent: [1, 2, 1],
  canonical: { tg: [32, 1, 1], tgMemory: 0 },
  make(device) {
    const o = { batch: 1, nHeads: 2, nKvHeads: 1, headDim: 8, seqLen: 3, kvSeqLen: 5, kvCapacity: 6, scale: 0.35 };
    const qv = f32(2 * 3 * 8, 71), kv = f32(6 * 8, 72), vv = f32(6 * 8, 73);
    const q = device.upload(qv), k = device.upload(kv), v = device.upload(vv), out = nanBuffer(device, 2 * 3 * 8);
    const want = refSdpa(qv, kv, vv, o);
    return {
      bindings: [q, k, v, out, [2, 1, 8, 3, 5, f32Bits(o.scale), 6]],
      check: () => close(out.read() as Float32Array, want, "sdpa_f32"),
      buffers: [q, k, v, out],
    };
  },
};

const FAV = { nHeads: 2, nKvHeads: 1, headDim: 64, kvSeqLen: 7, kvCapacity: 8, scale: 0.125, nwg: 2 };

/** flash_attn_vec then its reduce; `which` is the dispatch under test, the other is canonical. */
function flashCase(which: "flash_attn_vec_f32" | "flash_attn_vec_reduce"): Case {
  const { nHeads, headDim: hd, nwg } = FAV;
  return {
    kernel: which,
    unit: "groups",
    extent: which === "flash_attn_vec_f32" ? [nHeads, nwg, 1] : [nHeads, 1, 1],
    canonical: { tg: which === "flash_attn_vec_f32" ? [32, 1, 1] : [hd, 1, 1], tgMemory: 0 },
    make(device, registry) {
      const qv = f32(nHeads * hd, 81), kv = f32(FAV.kvCapacity * hd, 82), vv = f32(FAV.kvCapacity * hd, 83);
      const q = device.upload(qv), k = device.upload(kv), v = device.upload(vv);
      const tmp = nanBuffer(device, nHeads * nwg * (hd + 2)), out = nanBuffer(device, nHeads * hd);
      const favBindings: DispatchDescriptor["bindings"] = [
        q,
        k,
        v,
        tmp,
        [nHeads, FAV.nKvHeads, hd, FAV.kvSeqLen, FAV.kvCapacity, f32Bits(FAV.scale), 0, 0, 0, nwg, 0],
      ];
      const reduceBindings: DispatchDescriptor["bindings"] = [tmp, out, [nHeads, hd, nwg]];
      const want = refAttentionDecode(qv, kv, vv, { ...FAV, mask: "none" });
      const fav = { pipeline: registry.get("flash_attn_vec_f32"), bindings: favBindings, grid: [nHeads, nwg, 1] };
      const reduce = { pipeline: registry.get("flash_attn_vec_reduce"), bindings: reduceBindings, grid: nHeads };
      return {
        bindings: which === "flash_attn_vec_f32" ? favBindings : reduceBindings,
        before: which === "flash_attn_vec_reduce" ? [{ ...fav, threadgroup: 32 }] : undefined,
        after: which === "flash_attn_vec_f32" ? [{ ...reduce, threadgroup: hd }] : undefined,
        check: () => close(out.read() as Float32Array, want, which),
        buffers: [q, k, v, tmp, out],
      } as Instance;
    },
  };
}

const CASES: Case[] = [
  elementwiseCase("elementwise_add_f32", 37, [37], 2, refAdd),
  elementwiseCase("gelu_f32", 37, null, 1, refGelu),
  elementwiseCase("silu_f32", 37, null, 1, refSilu),
  elementwiseCase("silu_mul_f32", 37, [37], 2, (a, b) => Float64Array.from(refSilu(a), (s, i) => s * b[i]!)),
  elementwiseCase("softcap_f32", 37, [f32Bits(1.5), 37], 1, (a) => refSoftcap(a, 1.5)),
  elementwiseCase(
    "axpby_f32",
    37,
    [f32Bits(0.5), f32Bits(-2), 37, 0],
    2,
    (a, b) => Float64Array.from(a, (x, i) => Math.fround(0.5 * x) + Math.fround(-2 * b[i]!)),
  ),
  // Kernels with an element count in their parameters may run in place (out = a).
  elementwiseCase("elementwise_add_f32", 37, [37], 2, refAdd, true),
  elementwiseCase("silu_mul_f32", 37, [37], 2, (a, b) => Float64Array.from(refSilu(a), (s, i) => s * b[i]!), true),
  elementwiseCase("softcap_f32", 37, [f32Bits(1.5), 37], 1, (a) => refSoftcap(a, 1.5), true),
  elementwiseCase(
    "axpby_f32",
    37,
    [f32Bits(0.5), f32Bits(-2), 37, 0],
    2,
    (a, b) => Float64Array.from(a, (x, i) => Math.fround(0.5 * x) + Math.fround(-2 * b[i]!)),
    true,
  ),
  {
    kernel: "strided_copy_f32",
    unit: "threads",
    extent: [10, 3, 1],
    canonical: { tg: [10, 1, 1], tgMemory: 0 },
    make(device) {
      const sv = f32(3 * 12, 91);
      const src = device.upload(sv), dst = nanBuffer(device, 3 * 10);
      const want = Float64Array.from({ length: 30 }, (_, i) => sv[Math.floor(i / 10) * 12 + (i % 10)]!);
      return {
        bindings: [src, dst, [3, 10, 12, 10, 0, 0, 0]],
        check: () => close(dst.read() as Float32Array, want, "strided_copy_f32"),
        buffers: [src, dst],
      };
    },
  },
  rowCase("rms_norm_f32"),
  rowCase("rms_norm_no_scale_f32"),
  rowCase("softmax_f32"),
  {
    kernel: "rope_f32",
    unit: "threads",
    extent: [8, 3, 1],
    canonical: { tg: [8, 1, 1], tgMemory: 0 },
    make(device) {
      const xv = f32(3 * 16, 101), pos = [4, 0, 9];
      const x = device.upload(xv), out = nanBuffer(device, 3 * 16), p = device.upload(Uint32Array.from(pos), D.U32);
      const want = refRope(xv, pos, 10000, 16, 3);
      return {
        bindings: [x, out, [f32Bits(10000), 16, 3], p],
        check: () => close(out.read() as Float32Array, want, "rope_f32"),
        buffers: [x, out, p],
      };
    },
  },
  ropeHeadsCase("rope_neox_f32"),
  ropeHeadsCase("rope_neox_f32", true),
  matmulResidualInPlaceCase(),
  matmulDenseCase(false),
  matmulDenseCase(true),
  affineCase(false),
  affineCase(true),
  ggmlCase("qmatmul_q8_0_mv"),
  ggmlCase("qmatmul_q8_0_mm"),
  moeCase,
  sdpaCase,
  flashCase("flash_attn_vec_f32"),
  flashCase("flash_attn_vec_reduce"),
  {
    kernel: "argmax_f32",
    unit: "groups",
    extent: [2, 1, 1],
    canonical: { tg: [64, 1, 1], tgMemory: 0 },
    make(device) {
      const vocab = 100, lv = f32(2 * vocab, 121);
      const l = device.upload(lv), ids = device.upload(new Uint32Array(2).fill(0xffffffff), D.U32);
      const want = [refArgmax(lv.subarray(0, vocab)), refArgmax(lv.subarray(vocab))];
      return {
        bindings: [l, ids, [vocab, 2, 1, 0], undefined],
        check: () => equal(Array.from(ids.read() as Uint32Array).join(), want.join(), "argmax_f32"),
        buffers: [l, ids],
      };
    },
  },
  {
    kernel: "embed_gather_f32",
    unit: "threads",
    extent: [12, 3, 1],
    canonical: { tg: [12, 1, 1], tgMemory: 0 },
    make(device) {
      const vocab = 5, dim = 12, idv = [4, 0, 2], tv = f32(vocab * dim, 131);
      const t = device.upload(tv), ids = device.upload(Uint32Array.from(idv), D.U32), out = nanBuffer(device, 3 * dim);
      const want = Float64Array.from({ length: 3 * dim }, (_, i) => tv[idv[Math.floor(i / dim)]! * dim + (i % dim)]!);
      return {
        bindings: [t, ids, out, [3, dim, vocab, 1, 0], undefined],
        check: () => close(out.read() as Float32Array, want, "embed_gather_f32"),
        buffers: [t, ids, out],
      };
    },
  },
  // Later additions go last: a case's property seed is its index.
  ropeHeadsCase("rope_norm_f32"),
  matmulDenseCase(false, "f16"),
  matmulDenseCase(true, "f16"),
  affineGeneralCase,
  affineGatherCase,
  ggmlCase("qmatmul_q4_1_mv"),
  ggmlCase("qmatmul_q4_1_mm"),
];

/** The grid of a geometry: the shape that exactly covers the case's work, then the delta. */
function gridOf(c: Case, g: Geometry): Dim3 {
  const grid = [0, 1, 2].map((i) => {
    const e = c.extent[i]!, t = g.tg[i]!;
    if (c.unit === "threads") return g.kind === "threads" ? e : Math.ceil(e / t);
    return g.kind === "threadgroups" ? e : e * t;
  }) as Dim3;
  grid[g.deltaDim] = Math.max(1, grid[g.deltaDim]! + g.delta);
  return grid;
}

function tgMemoryOf(g: Geometry): number {
  const fit = 4 * g.tg[0];
  return g.tgMemory === "none" ? 0 : g.tgMemory === "fit" ? fit : g.tgMemory === "short" ? fit - 4 : 32768;
}

/** What a refusal must mention: the geometry, or the slice a wrong grid would overrun. */
const GEOMETRY_REFUSAL = /threadgroup|grid|bound slice/;

/** Dispatches one case with one geometry; returns "refused" or "computed" (after checking it). */
function runOnce(ctx: ReturnType<typeof testContext>, c: Case, g: Geometry): "refused" | "computed" {
  const { device, registry } = ctx;
  const inst = c.make(device, registry);
  try {
    using enc = device.commandEncoder();
    for (const d of inst.before ?? []) enc.dispatch(d);
    if (inst.before) enc.memoryBarrier();
    const grid = gridOf(c, g);
    try {
      enc.dispatch({
        pipeline: registry.get(c.kernel),
        bindings: inst.bindings,
        grid,
        threadgroup: g.tg,
        threadgroupMemory: tgMemoryOf(g),
        dispatchKind: g.kind,
      });
      if (inst.after) enc.memoryBarrier();
      for (const d of inst.after ?? []) enc.dispatch(d);
      enc.commitAndWait();
    } catch (e) {
      if (!(e instanceof MlxError) || !GEOMETRY_REFUSAL.test(e.message)) throw e;
      return "refused";
    }
    const threads = grid.map((v, i) => g.kind === "threads" ? v : v * g.tg[i]!) as Dim3;
    const groups = grid.map((v, i) => g.kind === "threads" ? Math.ceil(v / g.tg[i]!) : v) as Dim3;
    inst.check(c.defined?.(threads, groups));
    return "computed";
  } finally {
    for (const b of inst.buffers) b.dispose();
  }
}

const SIZES_X = [1, 2, 3, 4, 7, 8, 10, 12, 16, 31, 32, 33, 64, 96, 100, 128, 129, 255, 256, 512, 1024];
/** Shapes around the case's canonical threadgroup (a third of them) and arbitrary ones. */
function geometryArb(c: Case): fc.Arbitrary<Geometry> {
  const arbitraryTg = fc.tuple(fc.constantFrom(...SIZES_X), fc.constantFrom(1, 1, 1, 2, 3), fc.constantFrom(1, 1, 1, 2))
    .filter(([x, y, z]) => x * y * z <= 1024) as fc.Arbitrary<Dim3>;
  return fc.record({
    kind: fc.constantFrom<Kind>("threads", "threadgroups"),
    tg: fc.oneof({ arbitrary: fc.constant(c.canonical.tg), weight: 1 }, { arbitrary: arbitraryTg, weight: 2 }),
    delta: fc.constantFrom(0, 0, 0, 0, -1, 1),
    deltaDim: fc.constantFrom(0, 0, 1, 2),
    tgMemory: fc.constantFrom<Geometry["tgMemory"]>("fit", "fit", "none", "short", "max"),
  });
}

Deno.test("the geometry src/ops uses computes the reference result for every kernel", async (t) => {
  using ctx = testContext();
  for (const c of CASES) {
    await t.step(c.label ?? c.kernel, () => {
      const g: Geometry = {
        kind: c.unit === "threads" ? "threads" : "threadgroups",
        tg: c.canonical.tg,
        delta: 0,
        deltaDim: 0,
        tgMemory: c.canonical.tgMemory ? "fit" : "none",
      };
      equal(runOnce(ctx, c, g), "computed");
    });
  }
});

Deno.test("any dispatch geometry is refused naming it, or computes the reference result", async (t) => {
  using ctx = testContext();
  for (const [i, c] of CASES.entries()) {
    await t.step(c.label ?? c.kernel, () => {
      const seen = { refused: 0, computed: 0 };
      fc.assert(fc.property(geometryArb(c), (g) => void seen[runOnce(ctx, c, g)]++), { numRuns: 40, seed: 0x9e0 + i });
      // Neither outcome may be vacuous: some shapes run (and match), some are refused.
      ok(seen.computed > 0 && seen.refused > 0, `${c.kernel}: ${JSON.stringify(seen)}`);
    });
  }
});

Deno.test("geometries the GPU kernels do not assume are refused with the geometry they need", async (t) => {
  using ctx = testContext();
  const byName = (k: string) => CASES.find((c) => c.kernel === k)!;
  const mustRefuse = (c: Case, g: Partial<Geometry>, re: RegExp) => {
    // runOnce returns "refused" quietly; turn that into a throw carrying the message for `throws`.
    const { device, registry } = ctx;
    const inst = c.make(device, registry);
    try {
      const full: Geometry = {
        kind: c.unit === "threads" ? "threads" : "threadgroups",
        tg: c.canonical.tg,
        delta: 0,
        deltaDim: 0,
        tgMemory: "fit",
        ...g,
      };
      using enc = device.commandEncoder();
      throws(() => {
        enc.dispatch({
          pipeline: registry.get(c.kernel),
          bindings: inst.bindings,
          grid: gridOf(c, full),
          threadgroup: full.tg,
          threadgroupMemory: tgMemoryOf(full),
          dispatchKind: full.kind,
        });
        enc.commitAndWait();
      }, (e: unknown) => e instanceof MlxError && re.test(e.message));
    } finally {
      for (const b of inst.buffers) b.dispose();
    }
  };
  await t.step("matmul kernels: one simdgroup per output, 128 threads", () => {
    for (
      const k of [
        "matmul_f32",
        "matmul_f16",
        "qmatmul_affine",
        "qmatmul_affine_general",
        "qmatmul_affine_gather",
        "qmatmul_q8_0_mv",
        "qmatmul_q8_0_mm",
        "qmatmul_q4_1_mv",
        "qmatmul_q4_1_mm",
        "qmatmul_id_q8_0",
      ]
    ) {
      mustRefuse(byName(k), { tg: [1, 1, 1] }, /threadgroup must be \(128, 1, 1\)/);
      mustRefuse(byName(k), { tg: [32, 4, 1] }, /threadgroup must be \(128, 1, 1\)/);
    }
    mustRefuse(byName("qmatmul_affine_fast"), { tg: [128, 1, 1] }, /threadgroup must be \(256, 1, 1\)/);
  });
  await t.step("attention: one 32-lane simdgroup", () => {
    mustRefuse(byName("sdpa_f32"), { tg: [16, 1, 1] }, /threadgroup must be \(32, 1, 1\)/);
    mustRefuse(byName("flash_attn_vec_f32"), { tg: [64, 1, 1] }, /threadgroup must be \(32, 1, 1\)/);
  });
  await t.step("row reductions: a power of two wide, one row, 4 bytes of threadgroup memory a thread", () => {
    for (const k of ["rms_norm_f32", "rms_norm_no_scale_f32", "softmax_f32"]) {
      mustRefuse(byName(k), { tg: [48, 1, 1] }, /power of two/);
      mustRefuse(byName(k), { tg: [32, 2, 1] }, /threadgroup must be/);
      mustRefuse(byName(k), { tgMemory: "short" }, /threadgroup memory/);
    }
  });
  await t.step("thread-indexed kernels: the grid must cover the work", () => {
    for (const k of ["elementwise_add_f32", "silu_mul_f32", "softcap_f32", "axpby_f32", "strided_copy_f32"]) {
      mustRefuse(byName(k), { delta: -1, deltaDim: 0 }, /grid/);
    }
    mustRefuse(byName("strided_copy_f32"), { delta: -1, deltaDim: 1 }, /grid/);
    mustRefuse(byName("rope_f32"), { delta: -1, deltaDim: 0 }, /grid/);
    mustRefuse(byName("rope_f32"), { delta: -1, deltaDim: 1 }, /grid/);
    mustRefuse(byName("rope_neox_f32"), { delta: -1, deltaDim: 0 }, /grid/);
    mustRefuse(byName("rope_norm_f32"), { delta: -1, deltaDim: 0 }, /grid/);
  });
});

Deno.test("token kernels refuse id, cursor, logits and table bindings at misaligned offsets", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  using raw = device.alloc(4096, D.U8);
  const at = (offset: number, bytes: number) => raw.slice(offset, bytes);
  const refusedAt = (kernel: string, bindings: DispatchDescriptor["bindings"], grid: Dim3, kind: Kind, tg: number) => {
    using enc = device.commandEncoder();
    throws(() => {
      enc.dispatch({ pipeline: registry.get(kernel), bindings, grid, threadgroup: [tg, 1, 1], dispatchKind: kind });
      enc.commitAndWait();
    }, (e: unknown) => e instanceof MlxError && /not a multiple of \d bytes/.test(e.message));
  };
  const sampleParams = [16, 1, 1, 1, f32Bits(1), 0, 2 ** 31, 0, 0, 0];
  refusedAt("argmax_f32", [at(0, 64), at(258, 4), [16, 1, 1, 0], undefined], [1, 1, 1], "threadgroups", 32);
  refusedAt("argmax_f32", [at(2, 64), at(256, 4), [16, 1, 1, 0], undefined], [1, 1, 1], "threadgroups", 32);
  refusedAt("argmax_bf16", [at(1, 32), at(256, 4), [16, 1, 1, 0], undefined], [1, 1, 1], "threadgroups", 32);
  refusedAt("sample_f32", [at(0, 64), at(256, 4), sampleParams, at(513, 4)], [1, 1, 1], "threadgroups", 32);
  const gather = [1, 16, 1, 1, 0];
  refusedAt("embed_gather_f32", [at(0, 64), at(258, 4), at(512, 64), gather, undefined], [16, 1, 1], "threads", 16);
  refusedAt("embed_gather_f32", [at(2, 64), at(256, 4), at(512, 64), gather, undefined], [16, 1, 1], "threads", 16);
  refusedAt("embed_gather_bf16", [at(1, 32), at(256, 4), at(512, 64), gather, undefined], [16, 1, 1], "threads", 16);
  refusedAt("embed_gather_f32", [at(0, 64), at(256, 4), at(514, 64), gather, undefined], [16, 1, 1], "threads", 16);
});
