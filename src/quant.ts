/**
 * Weight quantizers and dequantizers for the quantized matmul kernels (pure TypeScript; for tests,
 * demos and offline conversion).
 *
 * MLX affine: `w = scale · q + bias` per group of `groupSize` values along K, scales and biases as
 * bf16 [N, K/groupSize]. A row of K values takes K·bits/8 bytes: 4 and 8 bits pack 32/bits values
 * per little-endian u32 (value j at bit j·bits); 6 bits pack every 4 values into 3 bytes (value j
 * at bit 6j of the little-endian 24-bit integer).
 *
 * ggml blocks (row-major [N, K/blockValues] blocks): Q4_0 — 32 values in 18 B, f16 d then 16 bytes
 * of nibbles (byte j: value j in the low nibble, j+16 in the high), w = (q − 8)·d; Q8_0 — 32 values
 * in 34 B, f16 d then 32 int8, w = q·d; Q6_K — 256 values in 210 B: ql[128], qh[64], int8
 * scales[16], f16 d, w = d · scales[v/16] · (q − 32) with the 6-bit q split over ql and qh as ggml
 * lays it out.
 *
 * @module
 */

import { bf16BitsToF32, f16BitsToF32, f32ToBf16Bits, f32ToF16Bits } from "./dtype.ts";
import { MlxError } from "./errors.ts";

/** Bits per weight of the MLX affine format. */
export type AffineBits = 4 | 6 | 8;
/** Group sizes of the MLX affine format. */
export type AffineGroupSize = 32 | 64 | 128;

/** An MLX affine-quantized [N, K] matrix. */
export interface AffineQuantized {
  /** Bits per weight. */
  readonly bits: AffineBits;
  /** Values per scale/bias. */
  readonly groupSize: AffineGroupSize;
  /** Rows. */
  readonly n: number;
  /** Columns. */
  readonly k: number;
  /** Packed weights, N·K·bits/8 bytes. */
  readonly weights: Uint8Array;
  /** bf16 bits, [N, K/groupSize]. */
  readonly scales: Uint16Array;
  /** bf16 bits, [N, K/groupSize]. */
  readonly biases: Uint16Array;
}

function checkShape(n: number, k: number, multiple: number, what: string): void {
  if (!Number.isInteger(n) || !Number.isInteger(k) || n <= 0 || k <= 0 || k % multiple !== 0) {
    throw new MlxError(
      "InvalidArgument",
      `${what}: N and K must be positive and K a multiple of ${multiple} (got ${n}×${k})`,
    );
  }
}

function bf16(v: number): number {
  return bf16BitsToF32(f32ToBf16Bits([v]))[0];
}

function f16(v: number): number {
  return f16BitsToF32(f32ToF16Bits([v]))[0];
}

/** Quantizes a row-major [n, k] f32 matrix to the MLX affine format. */
export function quantizeAffine(
  w: ArrayLike<number>,
  n: number,
  k: number,
  bits: AffineBits,
  groupSize: AffineGroupSize,
): AffineQuantized {
  if (bits !== 4 && bits !== 6 && bits !== 8) {
    throw new MlxError("InvalidArgument", `affine bits must be 4, 6 or 8, got ${bits}`);
  }
  if (groupSize !== 32 && groupSize !== 64 && groupSize !== 128) {
    throw new MlxError("InvalidArgument", `affine group size must be 32, 64 or 128, got ${groupSize}`);
  }
  checkShape(n, k, groupSize, "quantizeAffine");
  if (w.length < n * k) throw new MlxError("InvalidArgument", `quantizeAffine: ${w.length} values for ${n}×${k}`);
  const groups = k / groupSize, levels = (1 << bits) - 1;
  const scales = new Uint16Array(n * groups), biases = new Uint16Array(n * groups);
  const q = new Uint8Array(n * k);
  for (let row = 0; row < n; row++) {
    for (let g = 0; g < groups; g++) {
      const base = row * k + g * groupSize;
      let lo = Infinity, hi = -Infinity;
      for (let j = 0; j < groupSize; j++) {
        lo = Math.min(lo, w[base + j]);
        hi = Math.max(hi, w[base + j]);
      }
      // Quantize against the bf16-rounded scale and bias the kernels will use.
      const scale = bf16((hi - lo) / levels), bias = bf16(lo);
      scales[row * groups + g] = f32ToBf16Bits([scale])[0];
      biases[row * groups + g] = f32ToBf16Bits([bias])[0];
      for (let j = 0; j < groupSize; j++) {
        const v = scale > 0 ? Math.round((w[base + j] - bias) / scale) : 0;
        q[base + j] = Math.max(0, Math.min(levels, v));
      }
    }
  }
  return { bits, groupSize, n, k, weights: packAffine(q, n, k, bits), scales, biases };
}

function packAffine(q: Uint8Array, n: number, k: number, bits: AffineBits): Uint8Array {
  const rowBytes = (k * bits) / 8;
  const out = new Uint8Array(n * rowBytes);
  for (let row = 0; row < n; row++) {
    const src = row * k, dst = row * rowBytes;
    for (let j = 0; j < k; j++) {
      const v = q[src + j];
      if (bits === 8) out[dst + j] = v;
      else if (bits === 4) out[dst + (j >> 1)] |= v << ((j & 1) * 4);
      else {
        const at = dst + (j >> 2) * 3, shift = (j & 3) * 6; // 6 bits: value j at bit 6j of 24
        const word = (out[at] | (out[at + 1] << 8) | (out[at + 2] << 16)) | (v << shift);
        out[at] = word & 0xff;
        out[at + 1] = (word >> 8) & 0xff;
        out[at + 2] = (word >> 16) & 0xff;
      }
    }
  }
  return out;
}

/** The integer code of weight (row, j) of an affine matrix. */
function affineCode(q: AffineQuantized, row: number, j: number): number {
  const rowBytes = (q.k * q.bits) / 8, base = row * rowBytes;
  if (q.bits === 8) return q.weights[base + j];
  if (q.bits === 4) return (q.weights[base + (j >> 1)] >> ((j & 1) * 4)) & 0xf;
  const at = base + (j >> 2) * 3;
  const word = q.weights[at] | (q.weights[at + 1] << 8) | (q.weights[at + 2] << 16);
  return (word >> ((j & 3) * 6)) & 0x3f;
}

/** Dequantizes an affine matrix exactly (float64). */
export function dequantizeAffine(q: AffineQuantized): Float64Array {
  const out = new Float64Array(q.n * q.k);
  const groups = q.k / q.groupSize;
  const scales = bf16BitsToF32(q.scales), biases = bf16BitsToF32(q.biases);
  for (let row = 0; row < q.n; row++) {
    for (let j = 0; j < q.k; j++) {
      const g = row * groups + Math.floor(j / q.groupSize);
      out[row * q.k + j] = scales[g] * affineCode(q, row, j) + biases[g];
    }
  }
  return out;
}

/** ggml block formats. */
export type GgmlFormat = "q4_0" | "q8_0" | "q6_k";

/** Values and bytes per block of each ggml format. */
export const GGML_BLOCK: Readonly<Record<GgmlFormat, { readonly values: number; readonly bytes: number }>> = {
  q4_0: { values: 32, bytes: 18 },
  q8_0: { values: 32, bytes: 34 },
  q6_k: { values: 256, bytes: 210 },
};

/** Bytes of a ggml [n, k] matrix. */
export function ggmlBytes(format: GgmlFormat, n: number, k: number): number {
  const b = GGML_BLOCK[format];
  return n * (k / b.values) * b.bytes;
}

/** C's roundf: halves away from zero. */
function roundAway(v: number): number {
  return Math.sign(v) * Math.floor(Math.abs(v) + 0.5);
}

function setHalf(out: Uint8Array, at: number, v: number): void {
  const h = f32ToF16Bits([v])[0];
  out[at] = h & 0xff;
  out[at + 1] = h >> 8;
}

function getHalf(b: Uint8Array, at: number): number {
  return f16BitsToF32(new Uint16Array([b[at] | (b[at + 1] << 8)]))[0];
}

/** Quantizes a row-major [n, k] f32 matrix into a ggml block format. */
export function quantizeGgml(w: ArrayLike<number>, n: number, k: number, format: GgmlFormat): Uint8Array {
  const blk = GGML_BLOCK[format];
  if (!blk) throw new MlxError("InvalidArgument", `unknown ggml format ${format}`);
  checkShape(n, k, blk.values, `quantizeGgml(${format})`);
  const out = new Uint8Array(ggmlBytes(format, n, k));
  const x = new Float64Array(blk.values);
  for (let b = 0; b < (n * k) / blk.values; b++) {
    for (let j = 0; j < blk.values; j++) x[j] = Math.fround(w[b * blk.values + j]);
    const at = b * blk.bytes;
    if (format === "q4_0") quantQ4_0(x, out, at);
    else if (format === "q8_0") quantQ8_0(x, out, at);
    else quantQ6K(x, out, at);
  }
  return out;
}

function quantQ4_0(x: Float64Array, out: Uint8Array, at: number): void {
  // ggml's reference: d from the value of largest magnitude, so that value maps to −8.
  let amax = 0, max = 0;
  for (const v of x) {
    if (Math.abs(v) > amax) {
      amax = Math.abs(v);
      max = v;
    }
  }
  const d = max / -8, id = d !== 0 ? 1 / d : 0;
  setHalf(out, at, d);
  for (let j = 0; j < 16; j++) {
    const q0 = Math.min(15, Math.trunc(x[j] * id + 8.5)), q1 = Math.min(15, Math.trunc(x[j + 16] * id + 8.5));
    out[at + 2 + j] = q0 | (q1 << 4);
  }
}

function quantQ8_0(x: Float64Array, out: Uint8Array, at: number): void {
  let amax = 0;
  for (const v of x) amax = Math.max(amax, Math.abs(v));
  const d = amax / 127, id = d !== 0 ? 1 / d : 0;
  setHalf(out, at, d);
  for (let j = 0; j < 32; j++) out[at + 2 + j] = roundAway(x[j] * id) & 0xff;
}

function quantQ6K(x: Float64Array, out: Uint8Array, at: number): void {
  // A simple, format-exact Q6_K quantizer: per 16 values a scale so that |q| ≤ 31, the scales
  // themselves quantized to int8 against one f16 super-scale d.
  const sub = new Float64Array(16);
  for (let s = 0; s < 16; s++) {
    let amax = 0;
    for (let j = 0; j < 16; j++) amax = Math.max(amax, Math.abs(x[s * 16 + j]));
    sub[s] = amax / 31;
  }
  const dmax = Math.max(...sub);
  const d = f16(dmax / 127);
  const sc = Int8Array.from(sub, (v) => d > 0 ? Math.max(-128, Math.min(127, roundAway(v / d))) : 0);
  const L = new Uint8Array(256);
  for (let v = 0; v < 256; v++) {
    const eff = d * sc[v >> 4];
    const q = eff !== 0 ? Math.max(-32, Math.min(31, roundAway(x[v] / eff))) : 0;
    L[v] = q + 32;
  }
  for (let half = 0; half < 2; half++) {
    const n = half * 128;
    for (let l = 0; l < 32; l++) {
      const q1 = L[n + l], q2 = L[n + l + 32], q3 = L[n + l + 64], q4 = L[n + l + 96];
      out[at + half * 64 + l] = (q1 & 0xf) | ((q3 & 0xf) << 4);
      out[at + half * 64 + l + 32] = (q2 & 0xf) | ((q4 & 0xf) << 4);
      out[at + 128 + half * 32 + l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
    }
  }
  for (let s = 0; s < 16; s++) out[at + 192 + s] = sc[s] & 0xff;
  setHalf(out, at + 208, d);
}

/** Dequantizes a ggml [n, k] matrix exactly (float64). */
export function dequantizeGgml(bytes: Uint8Array, n: number, k: number, format: GgmlFormat): Float64Array {
  const blk = GGML_BLOCK[format];
  checkShape(n, k, blk.values, `dequantizeGgml(${format})`);
  const out = new Float64Array(n * k);
  for (let b = 0; b < (n * k) / blk.values; b++) {
    const at = b * blk.bytes, o = b * blk.values;
    if (format === "q4_0") {
      const d = getHalf(bytes, at);
      for (let j = 0; j < 16; j++) {
        out[o + j] = ((bytes[at + 2 + j] & 0xf) - 8) * d;
        out[o + j + 16] = ((bytes[at + 2 + j] >> 4) - 8) * d;
      }
    } else if (format === "q8_0") {
      const d = getHalf(bytes, at);
      for (let j = 0; j < 32; j++) out[o + j] = ((bytes[at + 2 + j] << 24) >> 24) * d;
    } else {
      const d = getHalf(bytes, at + 208);
      for (let v = 0; v < 256; v++) {
        const half = v >> 7, off = v & 127, quad = off >> 5, l = off & 31;
        const ql = bytes[at + half * 64 + l + (quad & 1) * 32];
        const low = quad < 2 ? ql & 0xf : ql >> 4;
        const high = (bytes[at + 128 + half * 32 + l] >> (2 * quad)) & 3;
        const sc = (bytes[at + 192 + (v >> 4)] << 24) >> 24;
        out[o + v] = d * sc * ((low | (high << 4)) - 32);
      }
    }
  }
  return out;
}
