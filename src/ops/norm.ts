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
import { kernelRef, type KernelRegistry, type Pipeline, registerContracts, rowThreadgroup } from "../kernels.ts";
import { CommandEncoder } from "../encoder.ts";
import { putBuffer, putTgMemory, putWords } from "../dispatch_writer.ts";
import { normContracts, packNormParams, packSoftmaxParams } from "../kernels.gen.ts";
import {
  checkBuffer,
  checkNonNegative,
  checkU32,
  dispatchReused,
  type DispatchTarget,
  elementBytes,
  floatKernel,
  floatKernels,
  groupsDescriptor,
  isU32,
  type ReusedDescriptor,
} from "./common.ts";

/** Contracts of this family (generated from kernels/spec/kernels.ts). */
export { normContracts };
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

/**
 * Sets a reused descriptor's row geometry (see {@link rowGeometry}); its pipeline is set, and the
 * threadgroup memory follows that kernel's contract.
 */
function setRows(d: ReusedDescriptor, rows: number, cols: number): void {
  const tg = rowThreadgroup(cols);
  d.grid = rows;
  d.threadgroup = tg;
  d.threadgroupMemory = tg * 4 * (d.pipeline?.contract.tgFloatsPerThread ?? ROW_TG_FLOATS);
}

/**
 * The row ops' write path: where `target` is a direct encoder, writes one dispatch of `p` over
 * `rows` rows of `cols` (the geometry of {@link setRows}) binding the buffers `b0`, `b1` and those
 * of `b2`…`b4` that are given, in slot order, then the parameter words `words`; false, with nothing
 * published, where the op must dispatch its descriptor instead.
 */
function writeRows(
  target: DispatchTarget,
  p: Pipeline,
  rows: number,
  cols: number,
  words: readonly number[],
  b0: MlxBuffer,
  b1: MlxBuffer,
  b2?: MlxBuffer,
  b3?: MlxBuffer,
  b4?: MlxBuffer,
): boolean {
  if (!(target instanceof CommandEncoder)) return false;
  let at = target.opBegin(p);
  if (at < 0) return false;
  const w = target.opWords, tg = rowThreadgroup(cols);
  at = putTgMemory(w, at, tg * 4 * (p.contract.tgFloatsPerThread ?? ROW_TG_FLOATS));
  at = putBuffer(w, putBuffer(w, at, 0, b0), 1, b1);
  let slot = 2;
  if (b2 !== undefined) at = putBuffer(w, at, slot++, b2);
  if (b3 !== undefined) at = putBuffer(w, at, slot++, b3);
  if (b4 !== undefined) at = putBuffer(w, at, slot++, b4);
  at = putWords(w, at, slot, words);
  if (at < 0) return false;
  target.opDispatch(at, false, rows, 1, 1, tg, 1, 1);
  return true;
}

/** The row kernels' threadgroup-memory rule (one f32 per thread; every one of this family shares it). */
const ROW_TG_FLOATS = normContracts[0]?.tgFloatsPerThread ?? 1;

/** Row geometry shared by every kernel of this family. */
export function rowGeometry(
  rows: number,
  cols: number,
): { grid: number; threadgroup: number; threadgroupMemory: number } {
  const tg = rowThreadgroup(cols);
  return { grid: rows, threadgroup: tg, threadgroupMemory: tg * 4 * ROW_TG_FLOATS };
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
  const rows = o.rows, dim = o.dim, eps = o.eps, dt = input.dtype, bytes = rows * dim * elementBytes(dt);
  // Every check in one test on the hot path; anything off goes through the checks below, which
  // throw with the precise message.
  if (
    !(isU32(rows, 1) && isU32(dim, 1) && eps >= 0 && eps < Infinity &&
      (dt === DType.F32 || dt === DType.F16 || dt === DType.BF16) && input.byteLength >= bytes &&
      weight.dtype === dt && weight.byteLength >= dim * elementBytes(dt) && output.dtype === dt &&
      output.byteLength >= bytes)
  ) {
    checkNorm("rms_norm", o);
    floatKernel(NORM, dt);
    checkBuffer("rms_norm", "input", input, dt, rows * dim);
    checkBuffer("rms_norm", "weight", weight, dt, dim);
    checkBuffer("rms_norm", "output", output, dt, rows * dim);
  }
  const p = registry.resolve(floatKernel(NORM, dt));
  packNormParams(normWords, eps, dim);
  if (writeRows(target, p, rows, dim, normWords, input, weight, output)) return;
  const d = normDescriptor, b = d.bindings;
  d.pipeline = p;
  b[0] = input;
  b[1] = weight;
  b[2] = output;
  setRows(d, rows, dim);
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
  const p = registry.resolve(ref);
  packNormParams(normWords, o.eps, o.dim);
  if (writeRows(target, p, o.rows, o.dim, normWords, input, weight, scale, output)) return;
  const d = normMulDescriptor, b = d.bindings;
  d.pipeline = p;
  b[0] = input;
  b[1] = weight;
  b[2] = scale;
  b[3] = output;
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
  const p = registry.resolve(ref);
  packNormParams(normWords, o.eps, o.dim);
  if (writeRows(target, p, o.rows, o.dim, normWords, input, weight, scale, residual, output)) return;
  const d = normMulAddDescriptor, b = d.bindings;
  d.pipeline = p;
  b[0] = input;
  b[1] = weight;
  b[2] = scale;
  b[3] = residual;
  b[4] = output;
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
  const p = registry.resolve(NORM_NO_SCALE);
  packNormParams(normWords, o.eps, o.dim);
  if (writeRows(target, p, o.rows, o.dim, normWords, input, output)) return;
  const d = noScaleDescriptor, b = d.bindings;
  d.pipeline = p;
  b[0] = input;
  b[1] = output;
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
  const p = registry.resolve(SOFTMAX);
  packSoftmaxParams(softmaxWords, o.cols);
  if (writeRows(target, p, o.rows, o.cols, softmaxWords, input, output)) return;
  const d = softmaxDescriptor, b = d.bindings;
  d.pipeline = p;
  b[0] = input;
  b[1] = output;
  setRows(d, o.rows, o.cols);
  dispatchReused(target, d, 2);
}
