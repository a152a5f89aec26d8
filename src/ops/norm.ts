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
import { type KernelContract, kernelRef, type KernelRegistry, registerContracts } from "../kernels.ts";
import {
  checkBuffer,
  checkNonNegative,
  checkU32,
  dispatchReused,
  type DispatchTarget,
  f32Bits,
  floatKernel,
  floatKernels,
  groupsDescriptor,
  nextPow2,
  type ReusedDescriptor,
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

const NORM = floatKernels("rms_norm", "rms_norm");
const NORM_MUL = floatKernels("rms_norm_mul", "rms_norm_mul");
const NORM_MUL_ADD = floatKernels("rms_norm_mul_add", "rms_norm_mul_add");
const NORM_NO_SCALE = kernelRef("rms_norm_no_scale_f32");
const SOFTMAX = kernelRef("softmax_f32");

// Reused descriptors (see DispatchTarget): the row ops allocate nothing per call.
const normWords = [0, 0];
const normDescriptor = groupsDescriptor([undefined, undefined, undefined, normWords]);
const normMulDescriptor = groupsDescriptor([undefined, undefined, undefined, undefined, normWords]);
const normMulAddDescriptor = groupsDescriptor([undefined, undefined, undefined, undefined, undefined, normWords]);
const noScaleDescriptor = groupsDescriptor([undefined, undefined, normWords]);
const softmaxWords = [0];
const softmaxDescriptor = groupsDescriptor([undefined, undefined, softmaxWords]);

/** Sets a reused descriptor's row geometry (see {@link rowGeometry}). */
function setRows(d: ReusedDescriptor, rows: number, cols: number): void {
  const tg = Math.min(256, nextPow2(cols));
  d.grid = rows;
  d.threadgroup = tg;
  d.threadgroupMemory = tg * 4;
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
  checkNonNegative(op, "eps", o.eps);
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
  const ref = floatKernel(NORM, input.dtype);
  checkBuffer("rms_norm", "input", input, input.dtype, o.rows * o.dim);
  checkBuffer("rms_norm", "weight", weight, input.dtype, o.dim);
  checkBuffer("rms_norm", "output", output, input.dtype, o.rows * o.dim);
  const d = normDescriptor, b = d.bindings;
  d.pipeline = registry.resolve(ref);
  b[0] = input;
  b[1] = weight;
  b[2] = output;
  normWords[0] = f32Bits(o.eps);
  normWords[1] = o.dim;
  setRows(d, o.rows, o.dim);
  dispatchReused(target, d, 3);
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
  const ref = floatKernel(NORM_MUL, input.dtype);
  checkBuffer("rms_norm_mul", "input", input, input.dtype, o.rows * o.dim);
  checkBuffer("rms_norm_mul", "weight", weight, input.dtype, o.dim);
  checkBuffer("rms_norm_mul", "scale", scale, input.dtype, o.rows * o.dim);
  checkBuffer("rms_norm_mul", "output", output, input.dtype, o.rows * o.dim);
  const d = normMulDescriptor, b = d.bindings;
  d.pipeline = registry.resolve(ref);
  b[0] = input;
  b[1] = weight;
  b[2] = scale;
  b[3] = output;
  normWords[0] = f32Bits(o.eps);
  normWords[1] = o.dim;
  setRows(d, o.rows, o.dim);
  dispatchReused(target, d, 4);
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
  const ref = floatKernel(NORM_MUL_ADD, input.dtype);
  checkBuffer(op, "input", input, input.dtype, o.rows * o.dim);
  checkBuffer(op, "weight", weight, input.dtype, o.dim);
  checkBuffer(op, "scale", scale, input.dtype, o.rows * o.dim);
  checkBuffer(op, "residual", residual, input.dtype, o.rows * o.dim);
  checkBuffer(op, "output", output, input.dtype, o.rows * o.dim);
  const d = normMulAddDescriptor, b = d.bindings;
  d.pipeline = registry.resolve(ref);
  b[0] = input;
  b[1] = weight;
  b[2] = scale;
  b[3] = residual;
  b[4] = output;
  normWords[0] = f32Bits(o.eps);
  normWords[1] = o.dim;
  setRows(d, o.rows, o.dim);
  dispatchReused(target, d, 5);
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
  const d = noScaleDescriptor, b = d.bindings;
  d.pipeline = registry.resolve(NORM_NO_SCALE);
  b[0] = input;
  b[1] = output;
  normWords[0] = f32Bits(o.eps);
  normWords[1] = o.dim;
  setRows(d, o.rows, o.dim);
  dispatchReused(target, d, 2);
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
  const d = softmaxDescriptor, b = d.bindings;
  d.pipeline = registry.resolve(SOFTMAX);
  b[0] = input;
  b[1] = output;
  softmaxWords[0] = o.cols;
  setRows(d, o.rows, o.cols);
  dispatchReused(target, d, 2);
}
