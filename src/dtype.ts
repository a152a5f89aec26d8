/**
 * Element types of buffers, their sizes, and host conversions for the 16-bit float formats.
 *
 * @module
 */

/** Element types a buffer can hold. */
export const DType = {
  /** IEEE 754 binary32. */
  F32: "f32",
  /** IEEE 754 binary16. */
  F16: "f16",
  /** bfloat16: the upper half of a binary32. */
  BF16: "bf16",
  /** Unsigned 32-bit integer. */
  U32: "u32",
  /** Signed 32-bit integer. */
  I32: "i32",
  /** Unsigned 16-bit integer. */
  U16: "u16",
  /** Unsigned byte (raw data such as quantized blocks). */
  U8: "u8",
} as const;

/** One of the {@link DType} values. */
export type DType = typeof DType[keyof typeof DType];

const SIZES: Record<DType, number> = { f32: 4, f16: 2, bf16: 2, u32: 4, i32: 4, u16: 2, u8: 1 };

/** Bytes per element of a dtype. */
export function dtypeSize(dtype: DType): number {
  if (!isDType(dtype)) throw new TypeError(`unknown dtype ${String(dtype)}`);
  return SIZES[dtype];
}

/** Whether `value` is one of the {@link DType} values. */
export function isDType(value: unknown): value is DType {
  // Own keys only: names inherited from Object.prototype ("toString", "constructor") are no dtype.
  return typeof value === "string" && Object.hasOwn(SIZES, value);
}

/** The typed array a buffer's contents are read as: 16-bit floats widen to Float32Array. */
export type HostArray = Float32Array | Uint32Array | Int32Array | Uint16Array | Uint8Array;

/** Converts f32 values to IEEE binary16 bits (round to nearest even). */
export function f32ToF16Bits(src: ArrayLike<number>): Uint16Array {
  const half = Float16Array.from(src as ArrayLike<number>);
  return new Uint16Array(half.buffer, half.byteOffset, half.length);
}

/** Converts IEEE binary16 bits to f32 values (exact). */
export function f16BitsToF32(bits: Uint16Array): Float32Array {
  return Float32Array.from(new Float16Array(bits.buffer, bits.byteOffset, bits.length));
}

/** Converts f32 values to bfloat16 bits (round to nearest even; NaN stays NaN). */
export function f32ToBf16Bits(src: ArrayLike<number>): Uint16Array {
  const f = Float32Array.from(src);
  const u = new Uint32Array(f.buffer);
  const out = new Uint16Array(f.length);
  for (let i = 0; i < u.length; i++) {
    const x = u[i]!;
    if ((x & 0x7fffffff) > 0x7f800000) out[i] = (x >>> 16) | 0x40;
    else out[i] = ((x + 0x7fff + ((x >>> 16) & 1)) >>> 16) & 0xffff;
  }
  return out;
}

/** Converts bfloat16 bits to f32 values (exact). */
export function bf16BitsToF32(bits: Uint16Array): Float32Array {
  const u = new Uint32Array(bits.length);
  for (let i = 0; i < bits.length; i++) u[i] = bits[i]! << 16;
  return new Float32Array(u.buffer);
}

/** Rounds f32 values through a storage dtype (what a store followed by a load yields). */
export function roundThrough(dtype: DType, values: ArrayLike<number>): Float32Array {
  if (dtype === DType.F16) return f16BitsToF32(f32ToF16Bits(values));
  if (dtype === DType.BF16) return bf16BitsToF32(f32ToBf16Bits(values));
  return Float32Array.from(values);
}
