/**
 * Elementwise ops: add, mul (f32/f16/bf16), gelu (tanh form, f32/f16/bf16), softcap and
 * axpby (f32).
 * Geometry: one thread per element, threadgroups of min(256, n).
 *
 * @module
 */

import type { MlxBuffer } from "../buffer.ts";
import { DType } from "../dtype.ts";
import { MlxError } from "../errors.ts";
import { kernelRef, type KernelRegistry, registerContracts } from "../kernels.ts";
import { CommandEncoder } from "../encoder.ts";
import { putBuffer, putWord, putWords } from "../dispatch_writer.ts";
import {
  elementwiseContracts,
  packAxpbyParams,
  packNParams,
  packSoftcapParams,
  packStridedCopyParams,
} from "../kernels.gen.ts";
import {
  checkBuffer,
  checkFinite,
  checkPositive,
  checkU32,
  dispatchReused,
  dispatchReusedSlots,
  type DispatchTarget,
  elementsOf,
  floatKernel,
  type FloatKernels,
  floatKernels,
  isU32,
  overlapping,
  threadsDescriptor,
} from "./common.ts";

type BinaryOp = "add" | "mul" | "silu_mul";

/** Contracts of this family (generated from kernels/spec/kernels.ts). */
export { elementwiseContracts };
registerContracts(elementwiseContracts);

/** Kernel references by op and dtype, made once. */
const BINARY_KERNELS: Record<BinaryOp, FloatKernels> = {
  add: floatKernels("elementwise_add", "elementwise_add"),
  mul: floatKernels("elementwise_mul", "elementwise_mul"),
  silu_mul: floatKernels("silu_mul", "silu_mul"),
};
const ADD = BINARY_KERNELS.add, MUL = BINARY_KERNELS.mul, SILU_MUL = BINARY_KERNELS.silu_mul;
const GELU = floatKernels("gelu", "gelu"), SILU = floatKernels("silu", "silu");
const AXPBY = kernelRef("axpby_f32");
const STRIDED_COPY = kernelRef("strided_copy_f32");
const SOFTCAP = kernelRef("softcap_f32");
const DEBUG_FAULT = kernelRef("debug_fault");

// Reused descriptors: a target consumes a descriptor before dispatch returns (see DispatchTarget),
// so the ops allocate nothing per call.
const binaryWords = [0];
const binaryDescriptor = threadsDescriptor([undefined, undefined, undefined, binaryWords]);
const unaryDescriptor = threadsDescriptor([undefined, undefined]);
const axpbyWords = [0, 0, 0, 0];
const axpbyDescriptor = threadsDescriptor([undefined, undefined, undefined, axpbyWords]);
const copyWords = [0, 0, 0, 0, 0, 0, 0];
const copyGrid = [0, 0, 1], copyGroup = [0, 1, 1];
const copyDescriptor = threadsDescriptor([undefined, undefined, copyWords, undefined]);
const softcapWords = [0, 0];
const softcapDescriptor = threadsDescriptor([undefined, undefined, softcapWords]);

function binary(
  kernels: FloatKernels,
  target: DispatchTarget,
  registry: KernelRegistry,
  a: MlxBuffer,
  b: MlxBuffer,
  out: MlxBuffer,
  n: number | undefined,
): void {
  // Kept small (the messages are out of line) so that V8 inlines the whole op into the caller of a
  // session method.
  const dt = a.dtype, ref = floatKernel(kernels, dt), es = dt === DType.F32 ? 4 : 2; // the float types' sizes
  const count = n ?? Math.floor(out.byteLength / es), need = count * es;
  if (
    (count >>> 0) !== count || count === 0 || b.dtype !== dt || out.dtype !== dt || a.byteLength < need ||
    b.byteLength < need || out.byteLength < need
  ) binaryRefused(kernels, a, b, out, n);
  const p = registry.resolve(ref), tg = count < 256 ? count : 256;
  if (target instanceof CommandEncoder) { // straight into the stream
    let at = target.opBegin(p);
    if (at >= 0) {
      const w = target.opWords;
      at = putWord(w, putBuffer(w, putBuffer(w, putBuffer(w, at, 0, a), 1, b), 2, out), 3, count);
      if (at >= 0) return target.opDispatch(at, true, count, 1, 1, tg, 1, 1);
    }
  }
  const d = binaryDescriptor, bindings = d.bindings;
  d.pipeline = p;
  bindings[0] = a;
  bindings[1] = b;
  bindings[2] = out;
  packNParams(binaryWords, count);
  d.grid = count;
  d.threadgroup = tg;
  dispatchReused(target, d, 3);
}

/** Throws what is wrong with a binary op's arguments (its combined test failed). */
function binaryRefused(
  kernels: FloatKernels,
  a: MlxBuffer,
  b: MlxBuffer,
  out: MlxBuffer,
  n: number | undefined,
): void {
  const name = kernels.op, dt = a.dtype, count = n ?? elementsOf(out);
  checkU32(name, "n", count);
  checkBuffer(name, "a", a, dt, count);
  checkBuffer(name, "b", b, dt, count);
  checkBuffer(name, "out", out, dt, count);
}

/** out[i] = a[i] + b[i] for i < n (default: out's length). */
export function elementwiseAdd(
  target: DispatchTarget,
  registry: KernelRegistry,
  a: MlxBuffer,
  b: MlxBuffer,
  out: MlxBuffer,
  n?: number,
): void {
  binary(ADD, target, registry, a, b, out, n);
}

/** out[i] = a[i] · b[i] for i < n (default: out's length). */
export function elementwiseMul(
  target: DispatchTarget,
  registry: KernelRegistry,
  a: MlxBuffer,
  b: MlxBuffer,
  out: MlxBuffer,
  n?: number,
): void {
  binary(MUL, target, registry, a, b, out, n);
}

/**
 * SwiGLU: out[i] = silu(gate[i]) · up[i] for i < n (default: out's length), in one kernel. The silu
 * result is rounded to the storage type first, so it equals {@link silu} then
 * {@link elementwiseMul} exactly, one dependent step shorter.
 */
export function siluMul(
  target: DispatchTarget,
  registry: KernelRegistry,
  gate: MlxBuffer,
  up: MlxBuffer,
  out: MlxBuffer,
  n?: number,
): void {
  binary(SILU_MUL, target, registry, gate, up, out, n);
}

function unary(
  kernels: FloatKernels,
  target: DispatchTarget,
  registry: KernelRegistry,
  input: MlxBuffer,
  output: MlxBuffer,
  n: number | undefined,
): void {
  // Kept small like binary (the messages are out of line).
  const dt = input.dtype, ref = floatKernel(kernels, dt), es = dt === DType.F32 ? 4 : 2; // the float types' sizes
  const count = n ?? Math.floor(output.byteLength / es), need = count * es;
  if (
    (count >>> 0) !== count || count === 0 || output.dtype !== dt || input.byteLength < need ||
    output.byteLength < need
  ) unaryRefused(kernels, input, output, n);
  const p = registry.resolve(ref), tg = count < 256 ? count : 256;
  if (target instanceof CommandEncoder) { // straight into the stream
    let at = target.opBegin(p);
    if (at >= 0) {
      const w = target.opWords;
      at = putBuffer(w, putBuffer(w, at, 0, input), 1, output);
      if (at >= 0) return target.opDispatch(at, true, count, 1, 1, tg, 1, 1);
    }
  }
  const d = unaryDescriptor;
  d.pipeline = p;
  d.bindings[0] = input;
  d.bindings[1] = output;
  d.grid = count;
  d.threadgroup = tg;
  dispatchReused(target, d, 2);
}

/** Throws what is wrong with a unary op's arguments (its combined test failed). */
function unaryRefused(kernels: FloatKernels, input: MlxBuffer, output: MlxBuffer, n: number | undefined): void {
  const op = kernels.op, dt = input.dtype, count = n ?? elementsOf(output);
  checkU32(op, "n", count);
  checkBuffer(op, "input", input, dt, count);
  checkBuffer(op, "output", output, dt, count);
}

/** out = gelu(in) with the tanh approximation (tanh argument clamped to ±15). */
export function gelu(
  target: DispatchTarget,
  registry: KernelRegistry,
  input: MlxBuffer,
  output: MlxBuffer,
  n?: number,
): void {
  unary(GELU, target, registry, input, output, n);
}

/** out = x · sigmoid(x) (SiLU, the gate of SwiGLU). */
export function silu(
  target: DispatchTarget,
  registry: KernelRegistry,
  input: MlxBuffer,
  output: MlxBuffer,
  n?: number,
): void {
  unary(SILU, target, registry, input, output, n);
}

/** Options of {@link stridedCopy}: a rows × cols block, strides in elements. */
export interface StridedCopyOptions {
  /** Rows to copy. */
  rows: number;
  /** Elements per row. */
  cols: number;
  /** Elements between source rows (default cols). */
  srcStride?: number;
  /** Elements between destination rows (default cols). */
  dstStride?: number;
  /**
   * A step state (u32, see `stepAdvance`): the destination rows move by state[0] · `dstPosStride`
   * elements, read on the device, so `dst` can bind a whole KV cache once. A state[0] ≥
   * `maxPositions` fails the dispatch, which writes nothing.
   */
  state?: MlxBuffer | undefined;
  /** Elements the destination moves per position of the state (default 0). */
  dstPosStride?: number | undefined;
  /** Positions the state may hold (required with `state`): `dst` must hold position maxPositions − 1's rows. */
  maxPositions?: number | undefined;
}

/**
 * dst[r·dstStride + c] = src[r·srcStride + c] (f32): e.g. append one token's K/V rows into a cache
 * laid out [kvHeads, capacity, headDim] by binding `dst` as the cache sliced at the token's row.
 */
export function stridedCopy(
  target: DispatchTarget,
  registry: KernelRegistry,
  src: MlxBuffer,
  dst: MlxBuffer,
  o: StridedCopyOptions,
): void {
  const rows = o.rows, cols = o.cols, ss = o.srcStride ?? cols, ds = o.dstStride ?? cols;
  const state = o.state, ps = o.dstPosStride ?? 0, maxPos = o.maxPositions ?? 0;
  const dstBytes = ((rows - 1) * ds + cols + (state ? (maxPos - 1) * ps : 0)) * 4;
  // Every check in one test on the hot path; anything off goes through checkStridedCopy, which
  // throws with the precise message.
  if (
    !(isU32(rows, 1) && isU32(cols, 1) && isU32(ss, cols) && isU32(ds, cols) && isU32(ps, 0) &&
      src.dtype === DType.F32 && src.byteLength >= ((rows - 1) * ss + cols) * 4 && dst.dtype === DType.F32 &&
      dst.byteLength >= dstBytes &&
      (state
        ? isU32(maxPos, 1) && state.dtype === DType.U32 && state.byteLength >= 4 &&
          !overlapping(dst, dstBytes, state, 4)
        : ps === 0 && maxPos === 0))
  ) checkStridedCopy(src, dst, o);
  const p = registry.resolve(STRIDED_COPY), tg = cols < 256 ? cols : 256;
  packStridedCopyParams(copyWords, rows, cols, ss, ds, state ? 1 : 0, ps, maxPos);
  if (target instanceof CommandEncoder) { // straight into the stream
    let at = target.opBegin(p);
    if (at >= 0) {
      const w = target.opWords;
      at = putWords(w, putBuffer(w, putBuffer(w, at, 0, src), 1, dst), 2, copyWords);
      if (state !== undefined) at = putBuffer(w, at, 3, state);
      if (at >= 0) return target.opDispatch(at, true, cols, rows, 1, tg, 1, 1);
    }
  }
  const d = copyDescriptor;
  d.pipeline = p;
  d.bindings[0] = src;
  d.bindings[1] = dst;
  d.bindings[3] = state;
  copyGrid[0] = cols;
  copyGrid[1] = rows;
  copyGroup[0] = tg;
  d.grid = copyGrid;
  d.threadgroup = copyGroup;
  dispatchReusedSlots(target, d, 0b1011);
}

/** Every check of {@link stridedCopy}, each with its message (the slow path). */
function checkStridedCopy(src: MlxBuffer, dst: MlxBuffer, o: StridedCopyOptions): void {
  const op = "strided_copy";
  const ss = o.srcStride ?? o.cols, ds = o.dstStride ?? o.cols;
  checkU32(op, "rows", o.rows);
  checkU32(op, "cols", o.cols);
  checkU32(op, "srcStride", ss, o.cols);
  checkU32(op, "dstStride", ds, o.cols);
  checkBuffer(op, "src", src, DType.F32, (o.rows - 1) * ss + o.cols);
  const state = o.state, ps = o.dstPosStride ?? 0, maxPos = o.maxPositions ?? 0;
  checkU32(op, "dstPosStride", ps, 0);
  if (state) {
    checkU32(op, "maxPositions", maxPos);
    checkBuffer(op, "state", state, DType.U32, 1);
  } else if (ps !== 0 || maxPos !== 0) {
    throw new MlxError("InvalidArgument", `${op}: dstPosStride and maxPositions need a step state (pass state)`);
  }
  const dstElems = (o.rows - 1) * ds + o.cols + (state ? (maxPos - 1) * ps : 0);
  checkBuffer(op, "dst", dst, DType.F32, dstElems);
  if (state && overlapping(dst, dstElems * 4, state, 4)) {
    throw new MlxError("InvalidArgument", `${op}: the step state must not lie in the destination`);
  }
}

/** out = tanh(in / cap) · cap (f32). */
export function softcap(
  target: DispatchTarget,
  registry: KernelRegistry,
  input: MlxBuffer,
  output: MlxBuffer,
  options: { cap: number; n?: number },
): void {
  const n = options.n ?? elementsOf(output), cap = options.cap; // each option read once: checked is written
  checkPositive("softcap", "cap", cap);
  checkU32("softcap", "n", n);
  checkBuffer("softcap", "input", input, DType.F32, n);
  checkBuffer("softcap", "output", output, DType.F32, n);
  const p = registry.resolve(SOFTCAP), tg = n < 256 ? n : 256;
  packSoftcapParams(softcapWords, cap, n);
  if (target instanceof CommandEncoder) { // straight into the stream
    let at = target.opBegin(p);
    if (at >= 0) {
      const w = target.opWords;
      at = putWords(w, putBuffer(w, putBuffer(w, at, 0, input), 1, output), 2, softcapWords);
      if (at >= 0) return target.opDispatch(at, true, n, 1, 1, tg, 1, 1);
    }
  }
  const d = softcapDescriptor;
  d.pipeline = p;
  d.bindings[0] = input;
  d.bindings[1] = output;
  d.grid = n;
  d.threadgroup = tg;
  dispatchReused(target, d, 2);
}

/** out = alpha · a + beta · b (f32), e.g. a scaled residual add. */
export function axpby(
  target: DispatchTarget,
  registry: KernelRegistry,
  a: MlxBuffer,
  b: MlxBuffer,
  out: MlxBuffer,
  options: { alpha: number; beta: number; n?: number },
): void {
  const n = options.n ?? elementsOf(out), alpha = options.alpha, beta = options.beta; // each read once
  checkFinite("axpby", "alpha", alpha);
  checkFinite("axpby", "beta", beta);
  const need = n * 4;
  if (
    (n >>> 0) !== n || n === 0 || a.dtype !== DType.F32 || b.dtype !== DType.F32 || out.dtype !== DType.F32 ||
    a.byteLength < need || b.byteLength < need || out.byteLength < need
  ) {
    checkU32("axpby", "n", n);
    checkBuffer("axpby", "a", a, DType.F32, n);
    checkBuffer("axpby", "b", b, DType.F32, n);
    checkBuffer("axpby", "out", out, DType.F32, n);
  }
  const p = registry.resolve(AXPBY), tg = n < 256 ? n : 256;
  packAxpbyParams(axpbyWords, alpha, beta, n, 0);
  if (target instanceof CommandEncoder) { // straight into the stream
    let at = target.opBegin(p);
    if (at >= 0) {
      const w = target.opWords;
      at = putWords(w, putBuffer(w, putBuffer(w, putBuffer(w, at, 0, a), 1, b), 2, out), 3, axpbyWords);
      if (at >= 0) return target.opDispatch(at, true, n, 1, 1, tg, 1, 1);
    }
  }
  const d = axpbyDescriptor, bindings = d.bindings;
  d.pipeline = p;
  bindings[0] = a;
  bindings[1] = b;
  bindings[2] = out;
  d.grid = n;
  d.threadgroup = tg;
  dispatchReused(target, d, 3);
}

/**
 * Fault injection for tests: with `fail` the dispatch fails at run time, so its command buffer
 * reports a CommandBufferError at wait (sticky; later groups do not run); otherwise it writes 1 to
 * marker[0] (u32).
 */
export function debugFault(
  target: DispatchTarget,
  registry: KernelRegistry,
  marker: MlxBuffer,
  options: { fail: boolean },
): void {
  checkBuffer("debug_fault", "marker", marker, DType.U32, 1);
  target.dispatch({
    pipeline: registry.resolve(DEBUG_FAULT),
    bindings: [marker, [options.fail ? 1 : 0]],
    grid: 1,
    threadgroup: 1,
  });
}
