/**
 * Row ops: rms_norm (f32/f16/bf16), the fused rms_norm_mul and rms_norm_mul_add, rms_norm_no_scale_f32
 * and softmax_f32.
 * Geometry: one threadgroup per row of min(256, next_pow2(dim)) threads with 4 B of threadgroup
 * memory per thread (the GPU kernels reduce through it).
 *
 * @module
 */

import type { MlxBuffer } from "../buffer.ts";
import { DType } from "../dtype.ts";
import { CapturedOpKind } from "../graph/op_kind.ts";
import { type KernelContract, type KernelRegistry, registerContracts } from "../kernels.ts";
import {
  checkBuffer,
  checkFinite,
  checkFloatDType,
  checkU32,
  type DispatchTarget,
  f32Bits,
  kernelName,
  nextPow2,
} from "./common.ts";

const FLOATS = [DType.F32, DType.F16, DType.BF16] as const;
const PARAMS = { name: "params{eps:f32,dim:u32}", kind: "bytes", size: 8 } as const;

/** Contracts of this family. */
export const normContracts: readonly KernelContract[] = [
  ...FLOATS.map((t): KernelContract => ({
    name: `rms_norm_${t}`,
    opKind: CapturedOpKind.RmsNorm,
    slots: [
      { name: "input", kind: "buffer", access: "read" },
      { name: "weight", kind: "buffer", access: "read" },
      { name: "output", kind: "buffer", access: "write" },
      PARAMS,
    ],
  })),
  ...FLOATS.map((t): KernelContract => ({
    name: `rms_norm_mul_${t}`,
    opKind: CapturedOpKind.RmsNormMul,
    slots: [
      { name: "input", kind: "buffer", access: "read" },
      { name: "weight", kind: "buffer", access: "read" },
      { name: "scale", kind: "buffer", access: "read" },
      { name: "output", kind: "buffer", access: "write" },
      PARAMS,
    ],
  })),
  ...FLOATS.map((t): KernelContract => ({
    name: `rms_norm_mul_add_${t}`,
    opKind: CapturedOpKind.RmsNormMul,
    slots: [
      { name: "input", kind: "buffer", access: "read" },
      { name: "weight", kind: "buffer", access: "read" },
      { name: "scale", kind: "buffer", access: "read" },
      { name: "residual", kind: "buffer", access: "read" },
      { name: "output", kind: "buffer", access: "write" },
      PARAMS,
    ],
  })),
  {
    name: "rms_norm_no_scale_f32",
    opKind: CapturedOpKind.Other,
    slots: [
      { name: "input", kind: "buffer", access: "read" },
      { name: "output", kind: "buffer", access: "write" },
      PARAMS,
    ],
  },
  {
    name: "softmax_f32",
    opKind: CapturedOpKind.Softmax,
    slots: [
      { name: "input", kind: "buffer", access: "read" },
      { name: "output", kind: "buffer", access: "write" },
      { name: "params{cols:u32}", kind: "bytes", size: 4 },
    ],
  },
];
registerContracts(normContracts);

/** Shape of a row-wise normalisation. */
export interface NormOptions {
  /** Rows. */
  rows: number;
  /** Elements per row. */
  dim: number;
  /** Added to the mean square before the square root. */
  eps: number;
}

/** Row geometry shared by every kernel of this family. */
export function rowGeometry(
  rows: number,
  cols: number,
): { grid: number; threadgroup: number; threadgroupMemory: number } {
  const tg = Math.min(256, nextPow2(cols));
  return { grid: rows, threadgroup: tg, threadgroupMemory: tg * 4 };
}

function checkNorm(op: string, o: NormOptions): void {
  checkU32(op, "rows", o.rows);
  checkU32(op, "dim", o.dim);
  checkFinite(op, "eps", o.eps, { min: 0 });
}

/** output = input / rms(input) · weight, per row. */
export function rmsNorm(
  target: DispatchTarget,
  registry: KernelRegistry,
  input: MlxBuffer,
  weight: MlxBuffer,
  output: MlxBuffer,
  o: NormOptions,
): void {
  checkNorm("rms_norm", o);
  checkFloatDType("rms_norm", input.dtype, FLOATS);
  checkBuffer("rms_norm", "input", input, input.dtype, o.rows * o.dim);
  checkBuffer("rms_norm", "weight", weight, input.dtype, o.dim);
  checkBuffer("rms_norm", "output", output, input.dtype, o.rows * o.dim);
  target.dispatch({
    pipeline: registry.get(kernelName("rms_norm", input.dtype)),
    bindings: [input, weight, output, [f32Bits(o.eps), o.dim]],
    ...rowGeometry(o.rows, o.dim),
  });
}

/** output = (input / rms(input) · weight) · scale, per row: the fused rms_norm → mul. */
export function rmsNormMul(
  target: DispatchTarget,
  registry: KernelRegistry,
  input: MlxBuffer,
  weight: MlxBuffer,
  scale: MlxBuffer,
  output: MlxBuffer,
  o: NormOptions,
): void {
  checkNorm("rms_norm_mul", o);
  checkFloatDType("rms_norm_mul", input.dtype, FLOATS);
  checkBuffer("rms_norm_mul", "input", input, input.dtype, o.rows * o.dim);
  checkBuffer("rms_norm_mul", "weight", weight, input.dtype, o.dim);
  checkBuffer("rms_norm_mul", "scale", scale, input.dtype, o.rows * o.dim);
  checkBuffer("rms_norm_mul", "output", output, input.dtype, o.rows * o.dim);
  target.dispatch({
    pipeline: registry.get(kernelName("rms_norm_mul", input.dtype)),
    bindings: [input, weight, scale, output, [f32Bits(o.eps), o.dim]],
    ...rowGeometry(o.rows, o.dim),
  });
}

/** output = (input / rms(input) · weight) · scale + residual, per row: the fused norm → mul → add. */
export function rmsNormMulAdd(
  target: DispatchTarget,
  registry: KernelRegistry,
  input: MlxBuffer,
  weight: MlxBuffer,
  scale: MlxBuffer,
  residual: MlxBuffer,
  output: MlxBuffer,
  o: NormOptions,
): void {
  const op = "rms_norm_mul_add";
  checkNorm(op, o);
  checkFloatDType(op, input.dtype, FLOATS);
  checkBuffer(op, "input", input, input.dtype, o.rows * o.dim);
  checkBuffer(op, "weight", weight, input.dtype, o.dim);
  checkBuffer(op, "scale", scale, input.dtype, o.rows * o.dim);
  checkBuffer(op, "residual", residual, input.dtype, o.rows * o.dim);
  checkBuffer(op, "output", output, input.dtype, o.rows * o.dim);
  target.dispatch({
    pipeline: registry.get(kernelName(op, input.dtype)),
    bindings: [input, weight, scale, residual, output, [f32Bits(o.eps), o.dim]],
    ...rowGeometry(o.rows, o.dim),
  });
}

/** output = input / rms(input), per row (f32). */
export function rmsNormNoScale(
  target: DispatchTarget,
  registry: KernelRegistry,
  input: MlxBuffer,
  output: MlxBuffer,
  o: NormOptions,
): void {
  checkNorm("rms_norm_no_scale", o);
  checkBuffer("rms_norm_no_scale", "input", input, DType.F32, o.rows * o.dim);
  checkBuffer("rms_norm_no_scale", "output", output, DType.F32, o.rows * o.dim);
  target.dispatch({
    pipeline: registry.get("rms_norm_no_scale_f32"),
    bindings: [input, output, [f32Bits(o.eps), o.dim]],
    ...rowGeometry(o.rows, o.dim),
  });
}

/** output = softmax(input) per row of `cols` (f32, max-subtracted). */
export function softmax(
  target: DispatchTarget,
  registry: KernelRegistry,
  input: MlxBuffer,
  output: MlxBuffer,
  o: { rows: number; cols: number },
): void {
  checkU32("softmax", "rows", o.rows);
  checkU32("softmax", "cols", o.cols);
  checkBuffer("softmax", "input", input, DType.F32, o.rows * o.cols);
  checkBuffer("softmax", "output", output, DType.F32, o.rows * o.cols);
  target.dispatch({
    pipeline: registry.get("softmax_f32"),
    bindings: [input, output, [o.cols]],
    ...rowGeometry(o.rows, o.cols),
  });
}
