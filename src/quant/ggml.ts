/**
 * ggml block formats: byte-exact quantizers (ports of ggml-quants.c's `quantize_row_*_ref`) and
 * exact dequantizers.
 *
 * Matched upstream: ggml-org/ggml commit d99724f2b141fed9e1a9f402213506c081433465 (2026-08-21),
 * src/ggml-quants.c, compiled as plain C on x86-64: every float operation rounded to binary32, no
 * FMA contraction, `nearest_int` = round half to even via the 1.5·2²³ trick, `roundf` = halves away
 * from zero, float→int casts truncating (float32.ts says what x86-64 does with the NaN/∞ that a
 * float32-subnormal scale produces, which C leaves undefined). The f16 conversion is IEEE round to
 * nearest even, as `GGML_FP32_TO_FP16` is on every platform. Verified byte for byte against that
 * C code on random and adversarial rows (ties, ±0, outliers, subnormal and f16-overflowing scales).
 *
 * Layouts (little-endian, row-major [N, K/values] blocks):
 * - q4_0: 32 values, 18 B: f16 d, qs[16] (byte j: value j low nibble, j+16 high); w = (q − 8)·d.
 * - q4_1: 32 values, 20 B: f16 d, f16 m, qs[16]; w = q·d + m.
 * - q5_0: 32 values, 22 B: f16 d, qh[4] (bit j: 5th bit of value j), qs[16]; w = (q − 16)·d.
 * - q5_1: 32 values, 24 B: f16 d, f16 m, qh[4], qs[16]; w = q·d + m.
 * - q8_0: 32 values, 34 B: f16 d, int8 qs[32]; w = q·d.
 * - q4_k: 256 values, 144 B: f16 d, f16 dmin, scales[12] (8 6-bit scales and mins), qs[128];
 *   w = d·sc·q − dmin·m per 32 values.
 * - q5_k: 256 values, 176 B: as q4_k plus qh[32] before qs (the 5th bits).
 * - q6_k: 256 values, 210 B: ql[128], qh[64], int8 scales[16], f16 d; w = d·sc·(q − 32) per 16 values.
 * - f16: 1 value, 2 B.
 *
 * @module
 */

import { MlxError } from "../errors.ts";
import {
  f16BitsOf,
  f16Value,
  f32,
  nearestInt,
  requireFiniteValues,
  requireShape,
  roundHalfAway,
  truncToInt8,
  truncToUint8,
} from "./float32.ts";

/** Every ggml storage format these quantizers and dequantizers handle. */
export type GgmlQuantFormat = "f16" | "q4_0" | "q4_1" | "q5_0" | "q5_1" | "q8_0" | "q4_k" | "q5_k" | "q6_k";

/** Values and bytes per block of a ggml format. */
export interface GgmlBlockLayout {
  /** Values per block. */
  readonly values: number;
  /** Bytes per block. */
  readonly bytes: number;
}

/** Values and bytes per block of every {@link GgmlQuantFormat}. */
export const GGML_FORMATS: Readonly<Record<GgmlQuantFormat, GgmlBlockLayout>> = Object.freeze({
  f16: { values: 1, bytes: 2 },
  q4_0: { values: 32, bytes: 18 },
  q4_1: { values: 32, bytes: 20 },
  q5_0: { values: 32, bytes: 22 },
  q5_1: { values: 32, bytes: 24 },
  q8_0: { values: 32, bytes: 34 },
  q4_k: { values: 256, bytes: 144 },
  q5_k: { values: 256, bytes: 176 },
  q6_k: { values: 256, bytes: 210 },
});

/** ggml's GROUP_MAX_EPS: below this absolute maximum a group counts as all zero. */
const GROUP_MAX_EPS = f32(1e-15);
const FLT_MAX = 3.4028234663852886e38;

/** The block layout of `format`, or an InvalidArgument error naming the supported formats. */
export function ggmlLayout(op: string, format: string): GgmlBlockLayout {
  const layout = Object.hasOwn(GGML_FORMATS, format) ? GGML_FORMATS[format as GgmlQuantFormat] : undefined;
  if (!layout) {
    throw new MlxError(
      "InvalidArgument",
      `${op}: unknown ggml format ${JSON.stringify(format)}; use one of ${Object.keys(GGML_FORMATS).join(", ")}`,
    );
  }
  return layout;
}

/** Bytes of a ggml [n, k] matrix in `format` (K a multiple of the block size). */
export function ggmlMatrixBytes(format: GgmlQuantFormat, n: number, k: number): number {
  const b = ggmlLayout("ggmlBytes", format);
  requireShape(`ggmlBytes(${format})`, n, k, b.values);
  const bytes = n * (k / b.values) * b.bytes;
  if (!Number.isSafeInteger(bytes)) {
    throw new MlxError("InvalidArgument", `ggmlBytes(${format}): ${n}×${k} is too large to address`);
  }
  return bytes;
}

function setHalf(out: Uint8Array, at: number, v: number): void {
  const h = f16BitsOf(v);
  out[at] = h & 0xff;
  out[at + 1] = h >> 8;
}

function getHalf(b: Uint8Array, at: number): number {
  return f16Value(b[at]! | (b[at + 1]! << 8));
}

function setU32(out: Uint8Array, at: number, v: number): void {
  out[at] = v & 0xff;
  out[at + 1] = (v >>> 8) & 0xff;
  out[at + 2] = (v >>> 16) & 0xff;
  out[at + 3] = v >>> 24;
}

function getU32(b: Uint8Array, at: number): number {
  return (b[at]! | (b[at + 1]! << 8) | (b[at + 2]! << 16) | (b[at + 3]! << 24)) >>> 0;
}

// ---- 32-value formats ------------------------------------------------------------------------

/** The first value of largest magnitude (ggml's `amax < fabsf(v)` scan). */
function signedAbsMax(x: Float32Array, at: number, n: number): number {
  let amax = 0, max = 0;
  for (let j = 0; j < n; j++) {
    const v = x[at + j]!;
    if (amax < Math.abs(v)) {
      amax = Math.abs(v);
      max = v;
    }
  }
  return max;
}

function minMax(x: Float32Array, at: number, n: number): [number, number] {
  let min = FLT_MAX, max = -FLT_MAX;
  for (let j = 0; j < n; j++) {
    const v = x[at + j]!;
    if (v < min) min = v;
    if (v > max) max = v;
  }
  return [min, max];
}

function quantQ4_0(x: Float32Array, xa: number, out: Uint8Array, at: number): void {
  const d = f32(signedAbsMax(x, xa, 32) / -8), id = d ? f32(1 / d) : 0;
  setHalf(out, at, d);
  for (let j = 0; j < 16; j++) {
    const q0 = Math.min(15, truncToInt8(f32(f32(x[xa + j]! * id) + 8.5))) & 0xff;
    const q1 = Math.min(15, truncToInt8(f32(f32(x[xa + j + 16]! * id) + 8.5))) & 0xff;
    out[at + 2 + j] = q0 | (q1 << 4);
  }
}

function quantQ4_1(x: Float32Array, xa: number, out: Uint8Array, at: number): void {
  const [min, max] = minMax(x, xa, 32);
  const d = f32(f32(max - min) / 15), id = d ? f32(1 / d) : 0;
  setHalf(out, at, d);
  setHalf(out, at + 2, min);
  for (let j = 0; j < 16; j++) {
    const q0 = Math.min(15, truncToInt8(f32(f32(f32(x[xa + j]! - min) * id) + 0.5))) & 0xff;
    const q1 = Math.min(15, truncToInt8(f32(f32(f32(x[xa + j + 16]! - min) * id) + 0.5))) & 0xff;
    out[at + 4 + j] = q0 | (q1 << 4);
  }
}

function quantQ5_0(x: Float32Array, xa: number, out: Uint8Array, at: number): void {
  const d = f32(signedAbsMax(x, xa, 32) / -16), id = d ? f32(1 / d) : 0;
  setHalf(out, at, d);
  let qh = 0;
  for (let j = 0; j < 16; j++) {
    const q0 = Math.min(31, truncToInt8(f32(f32(x[xa + j]! * id) + 16.5))) & 0xff;
    const q1 = Math.min(31, truncToInt8(f32(f32(x[xa + j + 16]! * id) + 16.5))) & 0xff;
    out[at + 6 + j] = (q0 & 0xf) | ((q1 & 0xf) << 4);
    qh |= ((q0 & 0x10) >> 4) << j;
    qh |= ((q1 & 0x10) >> 4) << (j + 16);
  }
  setU32(out, at + 2, qh >>> 0);
}

function quantQ5_1(x: Float32Array, xa: number, out: Uint8Array, at: number): void {
  const [min, max] = minMax(x, xa, 32);
  const d = f32(f32(max - min) / 31), id = d ? f32(1 / d) : 0;
  setHalf(out, at, d);
  setHalf(out, at + 2, min);
  let qh = 0;
  for (let j = 0; j < 16; j++) {
    const q0 = truncToUint8(f32(f32(f32(x[xa + j]! - min) * id) + 0.5));
    const q1 = truncToUint8(f32(f32(f32(x[xa + j + 16]! - min) * id) + 0.5));
    out[at + 8 + j] = (q0 & 0xf) | ((q1 & 0xf) << 4);
    qh |= ((q0 & 0x10) >> 4) << j;
    qh |= ((q1 & 0x10) >> 4) << (j + 16);
  }
  setU32(out, at + 4, qh >>> 0);
}

function quantQ8_0(x: Float32Array, xa: number, out: Uint8Array, at: number): void {
  let amax = 0;
  for (let j = 0; j < 32; j++) {
    const a = Math.abs(x[xa + j]!);
    amax = amax > a ? amax : a;
  }
  const d = f32(amax / 127), id = d ? f32(1 / d) : 0;
  setHalf(out, at, d);
  for (let j = 0; j < 32; j++) out[at + 2 + j] = truncToInt8(roundHalfAway(f32(x[xa + j]! * id))) & 0xff;
}

// ---- k-quants ------------------------------------------------------------------------------------

/** ggml's make_qx_quants with rmse_type 1 and no importance weights (what Q6_K's reference uses). */
function makeQxQuants(n: number, nmax: number, x: Float32Array, xa: number, L: Uint8Array, la: number): number {
  let max = 0, amax = 0;
  for (let i = 0; i < n; i++) {
    const ax = Math.abs(x[xa + i]!);
    if (ax > amax) {
      amax = ax;
      max = x[xa + i]!;
    }
  }
  if (amax < GROUP_MAX_EPS) {
    L.fill(0, la, la + n);
    return 0;
  }
  const clampL = (l: number) => Math.max(-nmax, Math.min(nmax - 1, l));
  let iscale = f32(-nmax / max);
  let sumlx = 0, suml2 = 0;
  for (let i = 0; i < n; i++) {
    const v = x[xa + i]!;
    const l = clampL(nearestInt(f32(iscale * v)));
    L[la + i] = l + nmax;
    const w = f32(v * v);
    sumlx = f32(sumlx + f32(f32(w * v) * l));
    suml2 = f32(suml2 + f32(f32(w * l) * l));
  }
  let scale = suml2 ? f32(sumlx / suml2) : 0;
  let best = f32(scale * sumlx);
  for (let is = -9; is <= 9; is++) {
    if (is === 0) continue;
    iscale = f32(-f32(nmax + f32(f32(0.1) * is)) / max);
    sumlx = suml2 = 0;
    for (let i = 0; i < n; i++) {
      const v = x[xa + i]!;
      const l = clampL(nearestInt(f32(iscale * v)));
      const w = f32(v * v);
      sumlx = f32(sumlx + f32(f32(w * v) * l));
      suml2 = f32(suml2 + f32(f32(w * l) * l));
    }
    if (suml2 > 0 && f32(sumlx * sumlx) > f32(best * suml2)) {
      for (let i = 0; i < n; i++) L[la + i] = nmax + clampL(nearestInt(f32(iscale * x[xa + i]!)));
      scale = f32(sumlx / suml2);
      best = f32(scale * sumlx);
    }
  }
  return scale;
}

/**
 * ggml's make_qkx2_quants (squared error): a scale and a min for `n` values, searched over
 * `nstep` + 1 candidate inverse scales. Returns [scale, −min].
 */
function makeQkx2Quants(
  n: number,
  nmax: number,
  x: Float32Array,
  xa: number,
  weights: Float32Array,
  L: Uint8Array,
  la: number,
  Laux: Uint8Array,
  rmin: number,
  rdelta: number,
  nstep: number,
): [number, number] {
  let min = x[xa]!, max = x[xa]!;
  let sumW = weights[0]!;
  let sumX = f32(sumW * x[xa]!);
  for (let i = 1; i < n; i++) {
    const v = x[xa + i]!;
    if (v < min) min = v;
    if (v > max) max = v;
    const w = weights[i]!;
    sumW = f32(sumW + w);
    sumX = f32(sumX + f32(w * v));
  }
  if (min > 0) min = 0;
  if (max === min) {
    L.fill(0, la, la + n);
    return [0, -min];
  }
  let iscale = f32(nmax / f32(max - min));
  let scale = f32(1 / iscale);
  let bestError = 0;
  for (let i = 0; i < n; i++) {
    const l = Math.max(0, Math.min(nmax, nearestInt(f32(iscale * f32(x[xa + i]! - min)))));
    L[la + i] = l;
    let diff = f32(f32(f32(scale * l) + min) - x[xa + i]!);
    diff = f32(diff * diff);
    bestError = f32(bestError + f32(weights[i]! * diff));
  }
  for (let is = 0; is <= nstep; is++) {
    // `min` moves to the best candidate's min, so later candidates use the updated range.
    iscale = f32(f32(f32(rmin + f32(rdelta * is)) + nmax) / f32(max - min));
    let sumL = 0, sumL2 = 0, sumXL = 0;
    for (let i = 0; i < n; i++) {
      const v = x[xa + i]!;
      const l = Math.max(0, Math.min(nmax, nearestInt(f32(iscale * f32(v - min)))));
      Laux[i] = l;
      const w = weights[i]!;
      const wl = f32(w * l);
      sumL = f32(sumL + wl);
      sumL2 = f32(sumL2 + f32(wl * l));
      sumXL = f32(sumXL + f32(wl * v));
    }
    const D = f32(f32(sumW * sumL2) - f32(sumL * sumL));
    if (D > 0) {
      let thisScale = f32(f32(f32(sumW * sumXL) - f32(sumX * sumL)) / D);
      let thisMin = f32(f32(f32(sumL2 * sumX) - f32(sumL * sumXL)) / D);
      if (thisMin > 0) {
        thisMin = 0;
        thisScale = f32(sumXL / sumL2);
      }
      let curError = 0;
      for (let i = 0; i < n; i++) {
        let diff = f32(f32(f32(thisScale * Laux[i]!) + thisMin) - x[xa + i]!);
        diff = f32(diff * diff);
        curError = f32(curError + f32(weights[i]! * diff));
      }
      if (curError < bestError) {
        L.set(Laux.subarray(0, n), la);
        bestError = curError;
        scale = thisScale;
        min = thisMin;
      }
    }
  }
  return [scale, -min];
}

/** ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j from the 12 packed bytes. */
function scaleMinK4(j: number, q: Uint8Array, at: number): [number, number] {
  if (j < 4) return [q[at + j]! & 63, q[at + j + 4]! & 63];
  return [
    (q[at + j + 4]! & 0xf) | ((q[at + j - 4]! >> 6) << 4),
    (q[at + j + 4]! >> 4) | ((q[at + j]! >> 6) << 4),
  ];
}

// Per-block scratch of the k-quant quantizers (blocks are quantized one at a time).
const kWeights = new Float32Array(32), kLaux = new Uint8Array(32);
const kScales = new Float32Array(16), kMins = new Float32Array(8);
const kL = new Uint8Array(256);

/** The shared part of Q4_K and Q5_K: sub-block scales/mins, d, dmin and the codes L. */
function quantKScaleMin(
  x: Float32Array,
  xa: number,
  out: Uint8Array,
  at: number,
  nmax: number,
  rmin: number,
  nstep: number,
  L: Uint8Array,
): void {
  const weights = kWeights, Laux = kLaux, scales = kScales, mins = kMins;
  let maxScale = 0, maxMin = 0;
  for (let j = 0; j < 8; j++) {
    const sa = xa + 32 * j;
    let sumX2 = 0;
    for (let l = 0; l < 32; l++) sumX2 = f32(sumX2 + f32(x[sa + l]! * x[sa + l]!));
    const avX = f32(Math.sqrt(f32(sumX2 / 32)));
    for (let l = 0; l < 32; l++) weights[l] = f32(avX + Math.abs(x[sa + l]!));
    const [scale, min] = makeQkx2Quants(32, nmax, x, sa, weights, L, 32 * j, Laux, rmin, f32(0.1), nstep);
    scales[j] = scale;
    mins[j] = min;
    if (scale > maxScale) maxScale = scale;
    if (min > maxMin) maxMin = min;
  }
  const invScale = maxScale > 0 ? f32(63 / maxScale) : 0;
  const invMin = maxMin > 0 ? f32(63 / maxMin) : 0;
  const sc = at + 4;
  for (let j = 0; j < 8; j++) {
    const ls = Math.min(63, nearestInt(f32(invScale * scales[j]!)) & 0xff);
    const lm = Math.min(63, nearestInt(f32(invMin * mins[j]!)) & 0xff);
    if (j < 4) {
      out[sc + j] = ls;
      out[sc + j + 4] = lm;
    } else {
      out[sc + j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
      out[sc + j - 4]! |= (ls >> 4) << 6;
      out[sc + j]! |= (lm >> 4) << 6;
    }
  }
  setHalf(out, at, f32(maxScale / 63));
  setHalf(out, at + 2, f32(maxMin / 63));
  const dAll = getHalf(out, at), dminAll = getHalf(out, at + 2);
  for (let j = 0; j < 8; j++) {
    const [s, m] = scaleMinK4(j, out, sc);
    const d = f32(dAll * s);
    if (!d) continue;
    const dm = f32(dminAll * m);
    for (let ii = 0; ii < 32; ii++) {
      L[32 * j + ii] = Math.max(0, Math.min(nmax, nearestInt(f32(f32(x[xa + 32 * j + ii]! + dm) / d))));
    }
  }
}

function quantQ4K(x: Float32Array, xa: number, out: Uint8Array, at: number): void {
  const L = kL;
  quantKScaleMin(x, xa, out, at, 15, -1, 20, L);
  for (let j = 0, q = at + 16; j < 256; j += 64, q += 32) {
    for (let l = 0; l < 32; l++) out[q + l] = L[j + l]! | (L[j + l + 32]! << 4);
  }
}

function quantQ5K(x: Float32Array, xa: number, out: Uint8Array, at: number): void {
  const L = kL;
  quantKScaleMin(x, xa, out, at, 31, -0.5, 15, L);
  const qh = at + 16;
  out.fill(0, qh, qh + 32);
  let m1 = 1, m2 = 2;
  for (let n = 0, ql = at + 48; n < 256; n += 64, ql += 32) {
    for (let j = 0; j < 32; j++) {
      let l1 = L[n + j]!, l2 = L[n + j + 32]!;
      if (l1 > 15) {
        l1 -= 16;
        out[qh + j]! |= m1;
      }
      if (l2 > 15) {
        l2 -= 16;
        out[qh + j]! |= m2;
      }
      out[ql + j] = l1 | (l2 << 4);
    }
    m1 <<= 2;
    m2 <<= 2;
  }
}

function quantQ6K(x: Float32Array, xa: number, out: Uint8Array, at: number): void {
  const L = kL, scales = kScales;
  let maxScale = 0, maxAbsScale = 0;
  for (let ib = 0; ib < 16; ib++) {
    const scale = makeQxQuants(16, 32, x, xa + 16 * ib, L, 16 * ib);
    scales[ib] = scale;
    if (Math.abs(scale) > maxAbsScale) {
      maxAbsScale = Math.abs(scale);
      maxScale = scale;
    }
  }
  out.fill(0, at, at + 210);
  if (maxAbsScale < GROUP_MAX_EPS) return; // an all-zero block, d = +0
  const iscale = f32(-128 / maxScale);
  setHalf(out, at + 208, f32(1 / iscale));
  for (let ib = 0; ib < 16; ib++) out[at + 192 + ib] = Math.min(127, nearestInt(f32(iscale * scales[ib]!))) & 0xff;
  const d16 = getHalf(out, at + 208);
  for (let j = 0; j < 16; j++) {
    const d = f32(d16 * ((out[at + 192 + j]! << 24) >> 24));
    if (!d) continue;
    for (let ii = 0; ii < 16; ii++) {
      L[16 * j + ii] = Math.max(-32, Math.min(31, nearestInt(f32(x[xa + 16 * j + ii]! / d)))) + 32;
    }
  }
  for (let half = 0; half < 2; half++) {
    const n = half * 128;
    for (let l = 0; l < 32; l++) {
      const q1 = L[n + l]!, q2 = L[n + l + 32]!, q3 = L[n + l + 64]!, q4 = L[n + l + 96]!;
      out[at + half * 64 + l] = (q1 & 0xf) | ((q3 & 0xf) << 4);
      out[at + half * 64 + l + 32] = (q2 & 0xf) | ((q4 & 0xf) << 4);
      out[at + 128 + half * 32 + l] = ((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6)) & 0xff;
    }
  }
}

function quantF16(x: Float32Array, xa: number, out: Uint8Array, at: number): void {
  setHalf(out, at, x[xa]!);
}

type BlockQuantizer = (x: Float32Array, xa: number, out: Uint8Array, at: number) => void;

const QUANTIZERS: Record<GgmlQuantFormat, BlockQuantizer> = {
  f16: quantF16,
  q4_0: quantQ4_0,
  q4_1: quantQ4_1,
  q5_0: quantQ5_0,
  q5_1: quantQ5_1,
  q8_0: quantQ8_0,
  q4_k: quantQ4K,
  q5_k: quantQ5K,
  q6_k: quantQ6K,
};

/**
 * Quantizes a row-major [n, k] matrix (values rounded to float32 first, as the C reference takes
 * `float*`) into a ggml format, byte for byte as ggml-quants.c's `quantize_row_*_ref` does.
 * Throws InvalidArgument for an unknown format, a K that is not a multiple of the block size, too
 * few values, or a NaN/infinite weight.
 */
export function quantizeGgml(w: ArrayLike<number>, n: number, k: number, format: GgmlQuantFormat): Uint8Array {
  const op = `quantizeGgml(${format})`;
  const blk = ggmlLayout("quantizeGgml", format);
  const bytes = ggmlMatrixBytes(format, n, k);
  requireFiniteValues(op, w, n * k);
  const out = new Uint8Array(bytes);
  const quant = QUANTIZERS[format];
  // One row of float32 at a time: the C code reads float32 and every block is independent.
  const x = new Float32Array(k);
  for (let row = 0; row < n; row++) {
    for (let j = 0; j < k; j++) x[j] = w[row * k + j]!;
    const rowAt = row * (k / blk.values) * blk.bytes;
    for (let b = 0; b < k / blk.values; b++) quant(x, b * blk.values, out, rowAt + b * blk.bytes);
  }
  return out;
}

// ---- dequantizers --------------------------------------------------------------------------------

type BlockDequantizer = (b: Uint8Array, at: number, out: Float64Array, o: number) => void;

const DEQUANTIZERS: Record<GgmlQuantFormat, BlockDequantizer> = {
  f16: (b, at, out, o) => {
    out[o] = getHalf(b, at);
  },
  q4_0: (b, at, out, o) => {
    const d = getHalf(b, at);
    for (let j = 0; j < 16; j++) {
      out[o + j] = ((b[at + 2 + j]! & 0xf) - 8) * d;
      out[o + j + 16] = ((b[at + 2 + j]! >> 4) - 8) * d;
    }
  },
  q4_1: (b, at, out, o) => {
    const d = getHalf(b, at), m = getHalf(b, at + 2);
    for (let j = 0; j < 16; j++) {
      out[o + j] = (b[at + 4 + j]! & 0xf) * d + m;
      out[o + j + 16] = (b[at + 4 + j]! >> 4) * d + m;
    }
  },
  q5_0: (b, at, out, o) => {
    const d = getHalf(b, at), qh = getU32(b, at + 2);
    for (let j = 0; j < 16; j++) {
      out[o + j] = (((b[at + 6 + j]! & 0xf) | (((qh >>> j) & 1) << 4)) - 16) * d;
      out[o + j + 16] = (((b[at + 6 + j]! >> 4) | (((qh >>> (j + 16)) & 1) << 4)) - 16) * d;
    }
  },
  q5_1: (b, at, out, o) => {
    const d = getHalf(b, at), m = getHalf(b, at + 2), qh = getU32(b, at + 4);
    for (let j = 0; j < 16; j++) {
      out[o + j] = ((b[at + 8 + j]! & 0xf) | (((qh >>> j) & 1) << 4)) * d + m;
      out[o + j + 16] = ((b[at + 8 + j]! >> 4) | (((qh >>> (j + 16)) & 1) << 4)) * d + m;
    }
  },
  q8_0: (b, at, out, o) => {
    const d = getHalf(b, at);
    for (let j = 0; j < 32; j++) out[o + j] = ((b[at + 2 + j]! << 24) >> 24) * d;
  },
  q4_k: (b, at, out, o) => {
    const d = getHalf(b, at), dmin = getHalf(b, at + 2);
    for (let v = 0; v < 256; v++) {
      const [sc, m] = scaleMinK4(v >> 5, b, at + 4);
      const chunk = v >> 6, l = v & 31, high = (v >> 5) & 1;
      const byte = b[at + 16 + chunk * 32 + l]!;
      out[o + v] = d * sc * (high ? byte >> 4 : byte & 0xf) - dmin * m;
    }
  },
  q5_k: (b, at, out, o) => {
    const d = getHalf(b, at), dmin = getHalf(b, at + 2);
    for (let v = 0; v < 256; v++) {
      const sub = v >> 5, [sc, m] = scaleMinK4(sub, b, at + 4);
      const chunk = v >> 6, l = v & 31, high = sub & 1;
      const byte = b[at + 48 + chunk * 32 + l]!;
      const q = (high ? byte >> 4 : byte & 0xf) | (((b[at + 16 + l]! >> sub) & 1) << 4);
      out[o + v] = d * sc * q - dmin * m;
    }
  },
  q6_k: (b, at, out, o) => {
    const d = getHalf(b, at + 208);
    for (let v = 0; v < 256; v++) {
      const half = v >> 7, off = v & 127, quad = off >> 5, l = off & 31;
      const ql = b[at + half * 64 + l + (quad & 1) * 32]!;
      const low = quad < 2 ? ql & 0xf : ql >> 4;
      const high = (b[at + 128 + half * 32 + l]! >> (2 * quad)) & 3;
      const sc = (b[at + 192 + (v >> 4)]! << 24) >> 24;
      out[o + v] = d * sc * ((low | (high << 4)) - 32);
    }
  },
};

/**
 * Dequantizes a ggml [n, k] matrix exactly (each weight's value in float64, as the format defines
 * it). Throws InvalidArgument for an unknown format, a bad shape, or fewer bytes than the matrix
 * needs.
 */
export function dequantizeGgml(bytes: Uint8Array, n: number, k: number, format: GgmlQuantFormat): Float64Array {
  const op = `dequantizeGgml(${format})`;
  const blk = ggmlLayout("dequantizeGgml", format);
  const need = ggmlMatrixBytes(format, n, k);
  if (!(bytes instanceof Uint8Array)) {
    throw new MlxError(
      "InvalidArgument",
      `${op}: bytes must be a Uint8Array (got ${Object.prototype.toString.call(bytes)})`,
    );
  }
  if (bytes.length < need) {
    throw new MlxError(
      "InvalidArgument",
      `${op}: ${bytes.length} bytes given, a ${n}×${k} matrix needs ${need}; pass the whole tensor`,
    );
  }
  const out = new Float64Array(n * k);
  const deq = DEQUANTIZERS[format];
  for (let b = 0; b < (n * k) / blk.values; b++) deq(bytes, b * blk.bytes, out, b * blk.values);
  return out;
}
