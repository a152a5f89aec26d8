/**
 * Float32 arithmetic as C performs it (each operation rounded to binary32, no contraction), and the
 * integer conversions the ggml and MLX quantizers rely on. The quantizers build every float step
 * from these so that their bytes equal the upstream C code's.
 *
 * Computing a +, −, ×, ÷ or √ of two binary32 values in binary64 and rounding the result once to
 * binary32 gives the correctly rounded binary32 result, so `Math.fround(a op b)` is exactly C's
 * `a op b` on floats.
 *
 * @module
 */

import { MlxError } from "../errors.ts";

/** Rounds to binary32 (C's float). */
export const f32 = Math.fround;

const scratchF32 = new Float32Array(1);
const scratchU32 = new Uint32Array(scratchF32.buffer);
const scratchF16 = new Float16Array(1);
const scratchU16 = new Uint16Array(scratchF16.buffer);

/** The binary32 bit pattern of `v` (after rounding `v` to binary32). */
export function f32Bits(v: number): number {
  scratchF32[0] = v;
  return scratchU32[0]!;
}

/**
 * ggml's `nearest_int`: adds 1.5·2²³ in float32 and reads the low mantissa bits, i.e. rounds half to
 * even for |v| ≤ 4194303; beyond that range (where ggml's assert is compiled out) it returns what
 * the same bit manipulation yields, as the C code does.
 */
export function nearestInt(v: number): number {
  return (f32Bits(f32(v) + 12582912) & 0x007fffff) - 0x00400000;
}

/**
 * C's conversion of a float to a 32-bit int as x86-64 performs it (`cvttss2si` / `cvttps2dq`):
 * truncation toward zero; NaN and values outside the int32 range give INT32_MIN.
 */
export function truncToInt32(v: number): number {
  if (!(v > -2147483649 && v < 2147483648)) return -2147483648;
  return Math.trunc(v) | 0;
}

/**
 * `(int8_t)v` for a float `v` as ggml's reference quantizers compile on x86-64 (clang -O2: the
 * conversion is vectorized as `cvttps2dq` followed by a saturating pack). In range it is plain
 * truncation; NaN or infinite inputs (C leaves them undefined; they arise only when a block's scale
 * is a float32 subnormal whose inverse overflows, i.e. all |w| below about 1e-37) give −128. A gcc
 * -O2 build of the same C writes other bytes for exactly those blocks, and agrees everywhere else.
 */
export function truncToInt8(v: number): number {
  return Math.max(-128, Math.min(127, truncToInt32(v)));
}

/** `(uint8_t)v` for a float `v`, as {@link truncToInt8} but with unsigned saturation (NaN gives 0). */
export function truncToUint8(v: number): number {
  return Math.max(0, Math.min(255, truncToInt32(v)));
}

/** C's `roundf`: nearest integer, halves away from zero. */
export function roundHalfAway(v: number): number {
  const r = Math.floor(Math.abs(v) + 0.5);
  // |v| + 0.5 is exact in binary64 for every binary32 v below 2^52, so floor is the true rounding.
  return v < 0 || Object.is(v, -0) ? -r : r;
}

/** C's `rintf` in the default rounding mode: nearest integer, halves to even. */
export function roundHalfEven(v: number): number {
  const r = Math.round(v); // halves toward +∞, and −0 for −0.5 ≤ v ≤ −0
  return r - v === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** IEEE binary16 bits of `v` (round to nearest even; overflow to ±∞). */
export function f16BitsOf(v: number): number {
  scratchF16[0] = f32(v);
  return scratchU16[0]!;
}

/** The value of IEEE binary16 bits. */
export function f16Value(bits: number): number {
  scratchU16[0] = bits;
  return scratchF16[0]!;
}

/** bfloat16 bits of `v` (round to nearest even; NaN stays NaN). */
export function bf16BitsOf(v: number): number {
  const x = f32Bits(v);
  if ((x & 0x7fffffff) > 0x7f800000) return (x >>> 16) | 0x40;
  return ((x + 0x7fff + ((x >>> 16) & 1)) >>> 16) & 0xffff;
}

/** The value of bfloat16 bits. */
export function bf16Value(bits: number): number {
  scratchU32[0] = (bits & 0xffff) << 16;
  return scratchF32[0]!;
}

/**
 * Checks that `w` holds at least `count` finite values; the quantizers' scale searches turn one NaN
 * or infinity into a garbage block, so it is rejected up front with the offending index.
 */
export function requireFiniteValues(op: string, w: ArrayLike<number>, count: number): void {
  if (w == null || typeof w.length !== "number") {
    throw new MlxError("InvalidArgument", `${op}: weights must be an array of numbers (got ${typeof w})`);
  }
  if (w.length < count) {
    throw new MlxError(
      "InvalidArgument",
      `${op}: ${w.length} values given for ${count} weights; pass the full row-major matrix`,
    );
  }
  for (let i = 0; i < count; i++) {
    const v = w[i];
    if (typeof v !== "number" || !Number.isFinite(f32(v))) {
      throw new MlxError(
        "InvalidArgument",
        `${op}: weight ${i} is ${v}, which is not a finite float32; replace NaN/Inf (or out-of-range) values before quantizing`,
      );
    }
  }
}

/** Checks a positive integer matrix shape whose K is a multiple of `multiple`. */
export function requireShape(op: string, n: number, k: number, multiple: number): void {
  if (!Number.isSafeInteger(n) || !Number.isSafeInteger(k) || n <= 0 || k <= 0 || k % multiple !== 0) {
    throw new MlxError(
      "InvalidArgument",
      `${op}: N and K must be positive integers and K a multiple of ${multiple} (got ${n}×${k})`,
    );
  }
}
