/**
 * Shared pieces of the op dispatchers: the dispatch target interface, f32 bits for inline constants and
 * argument checks with actionable messages.
 *
 * @module
 */

import type { MlxBuffer } from "../buffer.ts";
import { type DType, dtypeSize } from "../dtype.ts";
import type { Binding, Dims, DispatchDescriptor, DispatchKind } from "../encoder.ts";
import { type KernelRef, kernelRef, type Pipeline } from "../kernels.ts";
import { MlxError } from "../errors.ts";

/** Anything dispatches can be encoded into: a CommandEncoder or a GraphSession. */
export interface DispatchTarget {
  /**
   * Encodes (or records) one dispatch. The descriptor and its arrays belong to the caller and may be
   * reused once this returns (the ops do): copy what must outlive the call.
   */
  dispatch(d: DispatchDescriptor): void;
  /** A barrier (multi-dispatch ops place their own between dependent steps). */
  memoryBarrier(): void;
}

/** A descriptor an op fills in and reuses (every field but the dispatch kind is overwritten). */
export interface ReusedDescriptor {
  /** The kernel (set before each use). */
  pipeline: Pipeline | null;
  /** One entry per slot. */
  readonly bindings: Binding[];
  /** Threads or threadgroups per dimension, per the kind. */
  grid: Dims;
  /** Threads per threadgroup. */
  threadgroup: Dims;
  /** Threadgroup memory bytes. */
  threadgroupMemory: number;
  /** Fixed per descriptor. */
  readonly dispatchKind: DispatchKind;
}

/** A reusable threads-kind descriptor over `bindings`. */
export function threadsDescriptor(bindings: Binding[]): ReusedDescriptor {
  return { pipeline: null, bindings, grid: 1, threadgroup: 1, threadgroupMemory: 0, dispatchKind: "threads" };
}

/** A reusable threadgroups-kind descriptor over `bindings`. */
export function groupsDescriptor(bindings: Binding[]): ReusedDescriptor {
  return { pipeline: null, bindings, grid: 1, threadgroup: 1, threadgroupMemory: 0, dispatchKind: "threadgroups" };
}

/** The kernels of a family with one variant per float storage type, referenced once at module load. */
export interface FloatKernels {
  /** The op's name in messages. */
  readonly op: string;
  /** The f32 variant. */
  readonly f32: KernelRef;
  /** The f16 variant. */
  readonly f16: KernelRef;
  /** The bf16 variant. */
  readonly bf16: KernelRef;
}

/** The family `${prefix}_f32`, `_f16`, `_bf16`, named `op` in messages. */
export function floatKernels(op: string, prefix: string): FloatKernels {
  return Object.freeze({
    op,
    f32: kernelRef(`${prefix}_f32`),
    f16: kernelRef(`${prefix}_f16`),
    bf16: kernelRef(`${prefix}_bf16`),
  });
}

/** The variant of `kernels` for `dtype`; throws InvalidArgument for a dtype the family lacks. */
export function floatKernel(kernels: FloatKernels, dtype: DType): KernelRef {
  // Conditionals rather than a switch, and the refusal out of line: ops inline this on their hot path.
  return dtype === "f32"
    ? kernels.f32
    : dtype === "bf16"
    ? kernels.bf16
    : dtype === "f16"
    ? kernels.f16
    : noFloatKernel(kernels, dtype);
}

function noFloatKernel(kernels: FloatKernels, dtype: DType): never {
  throw new MlxError("InvalidArgument", `${kernels.op}: dtype ${dtype} is not supported (use f32, f16, bf16)`);
}

/** Elements `buf` holds (MlxBuffer#length without the keyed dtype lookup). */
export function elementsOf(buf: MlxBuffer): number {
  return Math.floor(buf.byteLength / elementBytes(buf.dtype));
}

/** Kernel references `${prefix}_${dtype}` for each dtype, made once. */
export function refsByDType(prefix: string, dtypes: readonly string[]): Record<string, KernelRef> {
  return Object.fromEntries(dtypes.map((t) => [t, kernelRef(`${prefix}_${t}`)]));
}

/**
 * Dispatches a filled-in reused descriptor, then empties its first `buffers` binding slots (the
 * buffers), so the descriptor never keeps a buffer alive after the call.
 */
export function dispatchReused(target: DispatchTarget, d: ReusedDescriptor, buffers: number): void {
  const b = d.bindings;
  try {
    target.dispatch(d as DispatchDescriptor);
  } finally {
    for (let i = 0; i < buffers; i++) b[i] = undefined;
  }
}

/**
 * {@link dispatchReused} for descriptors whose buffer slots are not all first: empties slot i after
 * the dispatch when bit i of `bufferSlots` is set (inline-word slots keep their arrays).
 */
export function dispatchReusedSlots(target: DispatchTarget, d: ReusedDescriptor, bufferSlots: number): void {
  const b = d.bindings;
  try {
    target.dispatch(d as DispatchDescriptor);
  } finally {
    for (let i = 0; i < b.length; i++) if ((bufferSlots >>> i) & 1) b[i] = undefined;
  }
}

const f32Scratch = new Float32Array(1);
const u32OfF32 = new Uint32Array(f32Scratch.buffer);

/** The bits of `v` rounded to f32, as a u32 (for building inline constants). */
export function f32Bits(v: number): number {
  f32Scratch[0] = v;
  return u32OfF32[0]!;
}

/** Whether `v` is an integer in [min, 2³²) (checkU32's test, for combined hot-path tests). */
export function isU32(v: number, min: number): boolean {
  return (v >>> 0) === v && v >= min;
}

/** Throws InvalidArgument unless `v` is an integer in [min, 2³²). */
export function checkU32(op: string, name: string, v: number, min = 1): void {
  // Small enough to inline at every call site; the message is built out of line.
  if ((v >>> 0) !== v || v < min) u32Error(op, name, v, min);
}

function u32Error(op: string, name: string, v: number, min: number): never {
  throw new MlxError("InvalidArgument", `${op}: ${name} must be an integer >= ${min}, got ${v}`);
}

/** Whether bytes [0, aBytes) of `a` and [0, bBytes) of `b` share memory (same allocation, ranges meet). */
export function overlapping(a: MlxBuffer, aBytes: number, b: MlxBuffer, bBytes: number): boolean {
  return a.allocId === b.allocId && a.byteOffset < b.byteOffset + bBytes && b.byteOffset < a.byteOffset + aBytes;
}

const POSITIVE = Object.freeze({ positive: true }), NON_NEGATIVE = Object.freeze({ min: 0 });

/** Throws InvalidArgument unless `v` is finite and > 0 (checkFinite's `positive` without an options object). */
export function checkPositive(op: string, name: string, v: number): void {
  if (!(v > 0 && v < Infinity)) checkFinite(op, name, v, POSITIVE); // throws with the message
}

/** Throws InvalidArgument unless `v` is finite and >= 0 (checkFinite's `min: 0` without an options object). */
export function checkNonNegative(op: string, name: string, v: number): void {
  if (!(v >= 0 && v < Infinity)) checkFinite(op, name, v, NON_NEGATIVE); // throws with the message
}

/** Throws InvalidArgument unless `v` is finite and in the allowed range. */
export function checkFinite(
  op: string,
  name: string,
  v: number,
  opts?: { readonly min?: number; readonly positive?: boolean },
): void {
  // Small enough to inline in the common case (finite, no options); the messages are out of line.
  if (opts !== undefined || !Number.isFinite(v)) rangeCheck(op, name, v, opts);
}

function rangeCheck(op: string, name: string, v: number, opts?: { min?: number; positive?: boolean }): void {
  if (!Number.isFinite(v)) throw new MlxError("InvalidArgument", `${op}: ${name} must be finite, got ${v}`);
  if (opts === undefined) return;
  if (opts.positive && !(v > 0)) throw new MlxError("InvalidArgument", `${op}: ${name} must be > 0, got ${v}`);
  if (opts.min !== undefined && v < opts.min) {
    throw new MlxError("InvalidArgument", `${op}: ${name} must be >= ${opts.min}, got ${v}`);
  }
}

/** Bytes per element of `dtype` (a switch: cheaper than a keyed lookup on the hot path). */
export function elementBytes(dtype: DType): number {
  switch (dtype) {
    case "f32":
    case "u32":
    case "i32":
      return 4;
    case "f16":
    case "bf16":
    case "u16":
      return 2;
    default:
      return dtypeSize(dtype);
  }
}

/** Throws InvalidArgument unless `buf` has dtype `dtype` and at least `elements` elements. */
export function checkBuffer(op: string, name: string, buf: MlxBuffer, dtype: DType, elements: number): void {
  // Small enough to inline at every call site: no allocation, no keyed lookup; messages out of line.
  if (buf.dtype !== dtype || buf.byteLength < elements * elementBytes(dtype)) {
    bufferError(op, name, buf, dtype, elements);
  }
}

function bufferError(op: string, name: string, buf: MlxBuffer, dtype: DType, elements: number): void {
  if (buf.dtype !== dtype) {
    throw new MlxError("InvalidArgument", `${op}: ${name} must be ${dtype}, got ${buf.dtype}`);
  }
  const need = elements * dtypeSize(dtype);
  if (buf.byteLength < need) {
    throw new MlxError(
      "InvalidArgument",
      `${op}: ${name} holds ${buf.byteLength} bytes, needs ${need} (${elements} × ${dtype})`,
    );
  }
}

/** Throws InvalidArgument unless dtype is one of the kernel family's variants. */
export function checkFloatDType(op: string, dtype: DType, allowed: readonly DType[]): void {
  if (!allowed.includes(dtype)) {
    throw new MlxError("InvalidArgument", `${op}: dtype ${dtype} is not supported (use ${allowed.join(", ")})`);
  }
}

const joined = new Map<string, Map<string, string>>();

/**
 * The kernel name `${prefix}_${suffix}`, built once per pair: a fresh template string would be
 * flattened and hashed again by every registry lookup, which cost more than the rest of an op.
 */
export function kernelName(prefix: string, suffix: string): string {
  let bySuffix = joined.get(prefix);
  if (bySuffix === undefined) joined.set(prefix, bySuffix = new Map());
  let name = bySuffix.get(suffix);
  if (name === undefined) bySuffix.set(suffix, name = `${prefix}_${suffix}`);
  return name;
}

/** Smallest power of two ≥ n. */
export function nextPow2(n: number): number {
  let p = 1;
  while (p < n) p *= 2;
  return p;
}
