/**
 * Shared pieces of the op dispatchers: the dispatch target interface, inline-constant packing and
 * argument checks with actionable messages.
 *
 * @module
 */

import type { MlxBuffer } from "../buffer.ts";
import { type DType, dtypeSize } from "../dtype.ts";
import type { DispatchDescriptor } from "../encoder.ts";
import { MlxError } from "../errors.ts";

/** Anything dispatches can be encoded into: a CommandEncoder or a GraphSession. */
export interface DispatchTarget {
  /** Encodes (or records) one dispatch. */
  dispatch(d: DispatchDescriptor): void;
}

/** A field of an inline-constant block. */
export type ParamField = readonly ["f32" | "u32" | "i32", number];

/** Packs little-endian 4-byte fields into inline bytes. */
export function packParams(fields: readonly ParamField[]): Uint8Array {
  const out = new Uint8Array(fields.length * 4);
  const view = new DataView(out.buffer);
  for (let i = 0; i < fields.length; i++) {
    const [type, v] = fields[i];
    if (type === "f32") view.setFloat32(i * 4, v, true);
    else if (type === "u32") view.setUint32(i * 4, v, true);
    else view.setInt32(i * 4, v, true);
  }
  return out;
}

/** Throws InvalidArgument unless `v` is an integer in [min, 2³²). */
export function checkU32(op: string, name: string, v: number, min = 1): void {
  if (!Number.isInteger(v) || v < min || v > 0xffffffff) {
    throw new MlxError("InvalidArgument", `${op}: ${name} must be an integer >= ${min}, got ${v}`);
  }
}

/** Throws InvalidArgument unless `v` is finite and in the allowed range. */
export function checkFinite(
  op: string,
  name: string,
  v: number,
  opts: { min?: number; positive?: boolean } = {},
): void {
  if (!Number.isFinite(v)) throw new MlxError("InvalidArgument", `${op}: ${name} must be finite, got ${v}`);
  if (opts.positive && !(v > 0)) throw new MlxError("InvalidArgument", `${op}: ${name} must be > 0, got ${v}`);
  if (opts.min !== undefined && v < opts.min) {
    throw new MlxError("InvalidArgument", `${op}: ${name} must be >= ${opts.min}, got ${v}`);
  }
}

/** Throws InvalidArgument unless `buf` has dtype `dtype` and at least `elements` elements. */
export function checkBuffer(op: string, name: string, buf: MlxBuffer, dtype: DType, elements: number): void {
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

/** Smallest power of two ≥ n. */
export function nextPow2(n: number): number {
  let p = 1;
  while (p < n) p *= 2;
  return p;
}
