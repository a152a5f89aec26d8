/**
 * MLX affine quantization: `w = scale · q + bias` per group of `groupSize` values along K, a
 * byte-exact port of MLX's `quantize` (mode "affine").
 *
 * Matched upstream: ml-explore/mlx commit 846d176227a0ac13d2667e58d2bb68b322109ab0 (2026-08-22).
 * Two implementations there differ, so both are offered:
 * - `"gpu"` (default; Metal `affine_quantize` in mlx/backend/metal/kernels/quantized.h, built with
 *   -fno-fast-math, and the identical CUDA kernel): the group max starts at 0 (so an all-negative
 *   group's max is 0); codes and q0 round halves away from zero (`round`). This is
 *   what `mlx_lm.convert` produces on a Mac or an NVIDIA GPU.
 * - `"cpu"` (mlx/backend/cpu/quantized.cpp): max/min start at ∓∞; rounding is `std::rint` (halves
 *   to even).
 * Both anchor the group on its larger-magnitude end: scale = ±max((max − min)/(2^bits − 1), 1e-7),
 * negative when the max end is larger; edge = that end, q0 = round(edge/scale); unless q0 = 0,
 * scale = edge/q0 and bias = edge (so zero is exactly representable), else bias = 0. Codes use the
 * float32 scale and bias; the stored scale and bias are rounded to the weights' dtype. Weights are
 * first rounded to that dtype (MLX quantizes the stored bf16/f16/f32 tensor).
 *
 * Packing: a row of K codes is one little-endian bit stream, code j at bit j·bits (MLX's u32 words
 * for 2/4/8 bits, 3-byte packs of 8 codes for 3 bits, 4 codes for 6 bits, 5-byte packs of 8 codes
 * for 5 bits are all this stream).
 *
 * @module
 */

import { MlxError } from "../errors.ts";
import {
  bf16BitsOf,
  bf16Value,
  f16BitsOf,
  f16Value,
  f32,
  requireFiniteValues,
  requireShape,
  roundHalfAway,
  roundHalfEven,
} from "./float32.ts";

/** Bits per weight the MLX affine kernels take. */
export type AffineBits = 4 | 6 | 8;
/** Bits per weight MLX's affine quantizer supports. */
export type AffineQuantBits = 2 | 3 | 4 | 5 | 6 | 8;
/** Group sizes of the MLX affine format. */
export type AffineGroupSize = 32 | 64 | 128;
/** The dtype of the weights, and so of the stored scales and biases. */
export type AffineScaleDtype = "bf16" | "f16" | "f32";

/** Options of {@link quantizeAffine}. */
export interface AffineQuantizeOptions {
  /** The weights' dtype; scales and biases are stored in it. Default "bf16". */
  readonly dtype?: AffineScaleDtype | undefined;
  /** Which MLX implementation to match (see the module doc). Default "gpu". */
  readonly variant?: "gpu" | "cpu" | undefined;
}

/** An MLX affine-quantized [N, K] matrix. */
export interface AffineQuantized {
  /** Bits per weight. */
  readonly bits: AffineQuantBits;
  /** Values per scale/bias. */
  readonly groupSize: AffineGroupSize;
  /** Rows. */
  readonly n: number;
  /** Columns. */
  readonly k: number;
  /** Packed weights, N·K·bits/8 bytes. */
  readonly weights: Uint8Array;
  /** Dtype of `scales` and `biases`; absent means bf16. */
  readonly scaleDtype?: AffineScaleDtype | undefined;
  /** [N, K/groupSize]: bf16 or f16 bits (Uint16Array), or f32 values (Float32Array). */
  readonly scales: Uint16Array | Float32Array;
  /** [N, K/groupSize], same dtype as `scales`. */
  readonly biases: Uint16Array | Float32Array;
}

const BITS: readonly number[] = [2, 3, 4, 5, 6, 8];
const GROUPS: readonly number[] = [32, 64, 128];
function toDtype(dtype: AffineScaleDtype, v: number): number {
  if (dtype === "f32") return f32(v);
  return dtype === "f16" ? f16Value(f16BitsOf(v)) : bf16Value(bf16BitsOf(v));
}

function checkAffine(op: string, bits: number, groupSize: number, dtype: string): void {
  if (!BITS.includes(bits)) {
    throw new MlxError("InvalidArgument", `${op}: bits must be one of ${BITS.join(", ")} (got ${bits})`);
  }
  if (!GROUPS.includes(groupSize)) {
    throw new MlxError("InvalidArgument", `${op}: group size must be 32, 64 or 128 (got ${groupSize})`);
  }
  if (dtype !== "bf16" && dtype !== "f16" && dtype !== "f32") {
    throw new MlxError("InvalidArgument", `${op}: dtype must be "bf16", "f16" or "f32" (got ${JSON.stringify(dtype)})`);
  }
}

/**
 * Quantizes a row-major [n, k] matrix to the MLX affine format, byte for byte as MLX's quantize
 * does for weights of `options.dtype`. Throws InvalidArgument for unsupported bits or group sizes,
 * a K that is not a multiple of the group size, too few values, or a NaN/infinite weight.
 */
export function quantizeAffine(
  w: ArrayLike<number>,
  n: number,
  k: number,
  bits: AffineQuantBits,
  groupSize: AffineGroupSize,
  options: AffineQuantizeOptions = {},
): AffineQuantized {
  const op = "quantizeAffine";
  const dtype = options.dtype ?? "bf16", variant = options.variant ?? "gpu";
  checkAffine(op, bits, groupSize, dtype);
  if (variant !== "gpu" && variant !== "cpu") {
    throw new MlxError("InvalidArgument", `${op}: variant must be "gpu" or "cpu" (got ${JSON.stringify(variant)})`);
  }
  requireShape(op, n, k, groupSize);
  requireFiniteValues(op, w, n * k);
  const gpu = variant === "gpu";
  const round = gpu ? roundHalfAway : roundHalfEven;
  const nBins = (1 << bits) - 1, eps = f32(1e-7);
  const groups = k / groupSize;
  const scales = dtype === "f32" ? new Float32Array(n * groups) : new Uint16Array(n * groups);
  const biases = dtype === "f32" ? new Float32Array(n * groups) : new Uint16Array(n * groups);
  const store = (arr: Uint16Array | Float32Array, i: number, v: number) => {
    arr[i] = dtype === "f32" ? v : dtype === "f16" ? f16BitsOf(v) : bf16BitsOf(v);
  };
  const rowBytes = (k * bits) / 8;
  const out = new Uint8Array(n * rowBytes);
  const x = new Float32Array(groupSize);
  for (let row = 0; row < n; row++) {
    for (let g = 0; g < groups; g++) {
      const base = row * k + g * groupSize;
      let wMin = Infinity, wMax = gpu ? 0 : -Infinity;
      for (let j = 0; j < groupSize; j++) {
        const v = toDtype(dtype, w[base + j]!);
        if (!Number.isFinite(v)) {
          throw new MlxError(
            "InvalidArgument",
            `${op}: weight ${base + j} (${w[base + j]}) overflows ${dtype}; scale the weights or use a wider dtype`,
          );
        }
        x[j] = v;
        if (wMax < v) wMax = v;
        if (v < wMin) wMin = v;
      }
      const anchorMin = Math.abs(wMin) > Math.abs(wMax);
      let scale = f32(f32(wMax - wMin) / nBins);
      if (scale < eps) scale = eps;
      if (!anchorMin) scale = -scale;
      const edge = anchorMin ? wMin : wMax;
      const q0 = round(f32(edge / scale));
      let bias = 0;
      if (q0 !== 0) {
        scale = f32(edge / q0);
        bias = edge;
      }
      for (let j = 0; j < groupSize; j++) {
        const q = Math.min(Math.max(round(f32(f32(x[j]! - bias) / scale)), 0), nBins);
        const bit = (g * groupSize + j) * bits, at = row * rowBytes + (bit >> 3), shift = bit & 7;
        // A code spans at most two bytes (bits ≤ 8).
        const word = q << shift;
        out[at]! |= word & 0xff;
        if (shift + bits > 8) out[at + 1]! |= word >> 8;
      }
      store(scales, row * groups + g, scale);
      store(biases, row * groups + g, bias);
    }
  }
  return { bits, groupSize, n, k, weights: out, scaleDtype: dtype, scales, biases };
}

/** The integer code of weight (row, j) of an affine matrix. */
function affineCode(weights: Uint8Array, rowBytes: number, bits: number, row: number, j: number): number {
  const bit = j * bits, at = row * rowBytes + (bit >> 3), shift = bit & 7;
  const word = weights[at]! | (shift + bits > 8 ? weights[at + 1]! << 8 : 0);
  return (word >> shift) & ((1 << bits) - 1);
}

/**
 * Dequantizes an affine matrix exactly (float64 of scale·q + bias). Throws InvalidArgument when the
 * packed weights, scales or biases are shorter than the shape needs.
 */
export function dequantizeAffine(q: AffineQuantized): Float64Array {
  const op = "dequantizeAffine";
  const dtype = q.scaleDtype ?? "bf16";
  checkAffine(op, q.bits, q.groupSize, dtype);
  requireShape(op, q.n, q.k, q.groupSize);
  const rowBytes = (q.k * q.bits) / 8, groups = q.k / q.groupSize;
  if (!(q.weights instanceof Uint8Array) || q.weights.length < q.n * rowBytes) {
    throw new MlxError(
      "InvalidArgument",
      `${op}: weights hold ${q.weights?.length} bytes, ${q.n}×${q.k} at ${q.bits} bits needs ${q.n * rowBytes}`,
    );
  }
  const want = dtype === "f32" ? Float32Array : Uint16Array;
  for (const [name, arr] of [["scales", q.scales], ["biases", q.biases]] as const) {
    if (!(arr instanceof want) || arr.length < q.n * groups) {
      throw new MlxError(
        "InvalidArgument",
        `${op}: ${name} must be a ${want.name} of ${q.n * groups} ${dtype} values (got ${arr?.length ?? arr})`,
      );
    }
  }
  const value = (arr: Uint16Array | Float32Array, i: number) =>
    dtype === "f32" ? arr[i] : dtype === "f16" ? f16Value(arr[i]!) : bf16Value(arr[i]!);
  const out = new Float64Array(q.n * q.k);
  for (let row = 0; row < q.n; row++) {
    for (let j = 0; j < q.k; j++) {
      const g = row * groups + Math.floor(j / q.groupSize);
      out[row * q.k + j] = value(q.scales, g)! * affineCode(q.weights, rowBytes, q.bits, row, j) + value(q.biases, g)!;
    }
  }
  return out;
}
