/**
 * Byte-range comparison without allocation: Node's `Buffer#compare` with ranges (a memcmp over two
 * views), borrowed for plain Uint8Arrays.
 *
 * @module
 */
import { Buffer } from "node:buffer";

/** `this[sourceStart, sourceEnd)` against `target[targetStart, targetEnd)`: 0 when equal. */
export const compareBytes = Buffer.prototype.compare as (
  this: Uint8Array,
  target: Uint8Array,
  targetStart: number,
  targetEnd: number,
  sourceStart: number,
  sourceEnd: number,
) => number;
