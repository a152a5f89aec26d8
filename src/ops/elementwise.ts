/**
 * Elementwise ops: add, mul (f32/f16/bf16), gelu (tanh form, f32/f16/bf16), softcap and
 * axpby (f32).
 * Geometry: one thread per element, threadgroups of min(256, n).
 *
 * @module
 */

import type { MlxBuffer } from "../buffer.ts";
import { DType } from "../dtype.ts";
import { CapturedOpKind } from "../graph/op_kind.ts";
import { type KernelContract, type KernelRef, kernelRef, type KernelRegistry, registerContracts } from "../kernels.ts";
import {
  checkBuffer,
  checkFinite,
  checkFloatDType,
  checkU32,
  dispatchReused,
  type DispatchTarget,
  f32Bits,
  refsByDType,
  threadsDescriptor,
} from "./common.ts";

const FLOATS = [DType.F32, DType.F16, DType.BF16] as const;

type BinaryOp = "add" | "mul" | "silu_mul";
const binaryKernel = (op: BinaryOp) => op === "silu_mul" ? op : `elementwise_${op}`;

function binaryContract(op: BinaryOp, dtype: string): KernelContract {
  return {
    name: `${binaryKernel(op)}_${dtype}`,
    // silu_mul is not an ElemMul: the fusion pass must never take it for the MUL of RMSNorm→MUL.
    opKind: op === "add" ? CapturedOpKind.ElemAdd : op === "mul" ? CapturedOpKind.ElemMul : CapturedOpKind.Activation,
    slots: [
      { name: "a", kind: "buffer", access: "read" },
      { name: "b", kind: "buffer", access: "read" },
      { name: "out", kind: "buffer", access: "write" },
      { name: "params{n:u32}", kind: "bytes", size: 4 },
    ],
  };
}

/** A one-input activation: `out[i] = f(in[i])` over the whole output buffer. */
function activationContract(name: string): KernelContract {
  return {
    name,
    opKind: CapturedOpKind.Activation,
    slots: [
      { name: "in", kind: "buffer", access: "read" },
      { name: "out", kind: "buffer", access: "write" },
    ],
  };
}

/** Contracts of this family. */
export const elementwiseContracts: readonly KernelContract[] = [
  ...FLOATS.map((t) => binaryContract("add", t)),
  ...FLOATS.map((t) => binaryContract("mul", t)),
  ...FLOATS.map((t) => activationContract(`gelu_${t}`)),
  {
    name: "softcap_f32",
    opKind: CapturedOpKind.Activation,
    slots: [
      { name: "in", kind: "buffer", access: "read" },
      { name: "out", kind: "buffer", access: "write" },
      { name: "params{cap:f32,n:u32}", kind: "bytes", size: 8 },
    ],
  },
  ...FLOATS.map((t) => activationContract(`silu_${t}`)),
  ...FLOATS.map((t) => binaryContract("silu_mul", t)),
  {
    name: "strided_copy_f32",
    opKind: CapturedOpKind.Other,
    slots: [
      { name: "src", kind: "buffer", access: "read" },
      { name: "dst", kind: "buffer", access: "write" },
      { name: "params{rows,cols,src_stride,dst_stride}", kind: "bytes", size: 16 },
    ],
  },
  {
    name: "debug_fault",
    opKind: CapturedOpKind.Other,
    slots: [
      { name: "marker", kind: "buffer", access: "write" },
      { name: "params{fail:u32}", kind: "bytes", size: 4 },
    ],
  },
  {
    name: "axpby_f32",
    opKind: CapturedOpKind.ElemAdd,
    slots: [
      { name: "a", kind: "buffer", access: "read" },
      { name: "b", kind: "buffer", access: "read" },
      { name: "out", kind: "buffer", access: "write" },
      { name: "params{alpha:f32,beta:f32,n:u32,pad:u32}", kind: "bytes", size: 16 },
    ],
  },
];
registerContracts(elementwiseContracts);

/** Kernel references by op and dtype, made once. */
const BINARY_REFS: Record<BinaryOp, Record<string, KernelRef>> = {
  add: refsByDType("elementwise_add", FLOATS),
  mul: refsByDType("elementwise_mul", FLOATS),
  silu_mul: refsByDType("silu_mul", FLOATS),
};
const UNARY_REFS: Record<"gelu" | "silu", Record<string, KernelRef>> = {
  gelu: refsByDType("gelu", FLOATS),
  silu: refsByDType("silu", FLOATS),
};
const AXPBY = kernelRef("axpby_f32");

// Reused descriptors: a target consumes a descriptor before dispatch returns (see DispatchTarget),
// so the hot ops allocate nothing per call.
const binaryWords = [0];
const binaryDescriptor = threadsDescriptor([undefined, undefined, undefined, binaryWords]);
const unaryDescriptor = threadsDescriptor([undefined, undefined]);
const axpbyWords = [0, 0, 0, 0];
const axpbyDescriptor = threadsDescriptor([undefined, undefined, undefined, axpbyWords]);

function binary(
  op: BinaryOp,
  target: DispatchTarget,
  registry: KernelRegistry,
  a: MlxBuffer,
  b: MlxBuffer,
  out: MlxBuffer,
  n: number,
): void {
  const name = binaryKernel(op);
  checkFloatDType(name, a.dtype, FLOATS);
  checkU32(name, "n", n);
  checkBuffer(name, "a", a, a.dtype, n);
  checkBuffer(name, "b", b, a.dtype, n);
  checkBuffer(name, "out", out, a.dtype, n);
  const d = binaryDescriptor, bindings = d.bindings;
  d.pipeline = registry.resolve(BINARY_REFS[op][a.dtype]);
  bindings[0] = a;
  bindings[1] = b;
  bindings[2] = out;
  binaryWords[0] = n;
  d.grid = n;
  d.threadgroup = n < 256 ? n : 256;
  dispatchReused(target, d, 3);
}

/** out[i] = a[i] + b[i] for i < n (default: out's length). */
export function elementwiseAdd(
  target: DispatchTarget,
  registry: KernelRegistry,
  a: MlxBuffer,
  b: MlxBuffer,
  out: MlxBuffer,
  n: number = out.length,
): void {
  binary("add", target, registry, a, b, out, n);
}

/** out[i] = a[i] · b[i] for i < n (default: out's length). */
export function elementwiseMul(
  target: DispatchTarget,
  registry: KernelRegistry,
  a: MlxBuffer,
  b: MlxBuffer,
  out: MlxBuffer,
  n: number = out.length,
): void {
  binary("mul", target, registry, a, b, out, n);
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
  n: number = out.length,
): void {
  binary("silu_mul", target, registry, gate, up, out, n);
}

function unary(
  op: "gelu" | "silu",
  target: DispatchTarget,
  registry: KernelRegistry,
  input: MlxBuffer,
  output: MlxBuffer,
  n: number,
): void {
  checkFloatDType(op, input.dtype, FLOATS);
  checkU32(op, "n", n);
  checkBuffer(op, "input", input, input.dtype, n);
  checkBuffer(op, "output", output, input.dtype, n);
  const d = unaryDescriptor;
  d.pipeline = registry.resolve(UNARY_REFS[op][input.dtype]);
  d.bindings[0] = input;
  d.bindings[1] = output;
  d.grid = n;
  d.threadgroup = n < 256 ? n : 256;
  dispatchReused(target, d, 2);
}

/** out = gelu(in) with the tanh approximation (tanh argument clamped to ±15). */
export function gelu(
  target: DispatchTarget,
  registry: KernelRegistry,
  input: MlxBuffer,
  output: MlxBuffer,
  n: number = output.length,
): void {
  unary("gelu", target, registry, input, output, n);
}

/** out = x · sigmoid(x) (SiLU, the gate of SwiGLU). */
export function silu(
  target: DispatchTarget,
  registry: KernelRegistry,
  input: MlxBuffer,
  output: MlxBuffer,
  n: number = output.length,
): void {
  unary("silu", target, registry, input, output, n);
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
  const op = "strided_copy";
  const ss = o.srcStride ?? o.cols, ds = o.dstStride ?? o.cols;
  checkU32(op, "rows", o.rows);
  checkU32(op, "cols", o.cols);
  checkU32(op, "srcStride", ss, o.cols);
  checkU32(op, "dstStride", ds, o.cols);
  checkBuffer(op, "src", src, DType.F32, (o.rows - 1) * ss + o.cols);
  checkBuffer(op, "dst", dst, DType.F32, (o.rows - 1) * ds + o.cols);
  target.dispatch({
    pipeline: registry.get("strided_copy_f32"),
    bindings: [src, dst, [o.rows, o.cols, ss, ds]],
    grid: [o.cols, o.rows, 1],
    threadgroup: [Math.min(o.cols, 256), 1, 1],
    dispatchKind: "threads",
  });
}

/** out = tanh(in / cap) · cap (f32). */
export function softcap(
  target: DispatchTarget,
  registry: KernelRegistry,
  input: MlxBuffer,
  output: MlxBuffer,
  options: { cap: number; n?: number },
): void {
  const n = options.n ?? output.length;
  checkFinite("softcap", "cap", options.cap, { positive: true });
  checkU32("softcap", "n", n);
  checkBuffer("softcap", "input", input, DType.F32, n);
  checkBuffer("softcap", "output", output, DType.F32, n);
  target.dispatch({
    pipeline: registry.get("softcap_f32"),
    bindings: [input, output, [f32Bits(options.cap), n]],
    grid: n,
    threadgroup: Math.min(256, n),
    dispatchKind: "threads",
  });
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
  const n = options.n ?? out.length;
  checkFinite("axpby", "alpha", options.alpha);
  checkFinite("axpby", "beta", options.beta);
  checkU32("axpby", "n", n);
  checkBuffer("axpby", "a", a, DType.F32, n);
  checkBuffer("axpby", "b", b, DType.F32, n);
  checkBuffer("axpby", "out", out, DType.F32, n);
  const d = axpbyDescriptor, bindings = d.bindings;
  d.pipeline = registry.resolve(AXPBY);
  bindings[0] = a;
  bindings[1] = b;
  bindings[2] = out;
  axpbyWords[0] = f32Bits(options.alpha);
  axpbyWords[1] = f32Bits(options.beta);
  axpbyWords[2] = n;
  d.grid = n;
  d.threadgroup = n < 256 ? n : 256;
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
    pipeline: registry.get("debug_fault"),
    bindings: [marker, [options.fail ? 1 : 0]],
    grid: 1,
    threadgroup: 1,
  });
}
