/**
 * Memory ranges and the accesses of a dispatch. A range is `[allocation id, start, end)` in bytes; a
 * slice view shares its parent's allocation id and covers exactly its bytes. Pure: no device needed.
 *
 * @module
 */

import type { KernelContract } from "../kernels.ts";

/** A byte range of one allocation: `[allocation id, start, end)`. */
export type MemRange = readonly [alloc: number, start: number, end: number];

/** Whether two ranges share at least one byte (different allocations never do). */
export function rangesOverlap(a: MemRange, b: MemRange): boolean {
  return a[0] === b[0] && a[1] < b[2] && b[1] < a[2];
}

/** Whether two ranges are the same bytes of the same allocation. */
export function sameRange(a: MemRange, b: MemRange): boolean {
  return a[0] === b[0] && a[1] === b[1] && a[2] === b[2];
}

/** Whether `outer` contains every byte of `inner`. */
export function rangeCovers(outer: MemRange, inner: MemRange): boolean {
  return outer[0] === inner[0] && outer[1] <= inner[1] && inner[2] <= outer[2];
}

/** The reads and writes of one dispatch. */
export interface Accesses {
  /** Ranges the dispatch reads. */
  readonly reads: readonly MemRange[];
  /** Ranges the dispatch writes. */
  readonly writes: readonly MemRange[];
}

/** Anything bound to a buffer slot that can report its byte range (an MlxBuffer). */
export interface RangedBinding {
  /** The bytes it covers. */
  range(): MemRange;
}

function isRanged(b: unknown): b is RangedBinding {
  return typeof b === "object" && b !== null && typeof (b as RangedBinding).range === "function";
}

/**
 * The true accesses of a dispatch: every bound buffer slot contributes its exact range, as a read,
 * a write or both according to the kernel contract's declared access mode.
 */
export function accessesOf(contract: KernelContract, bindings: readonly unknown[]): Accesses {
  const reads: MemRange[] = [], writes: MemRange[] = [];
  const slots = contract.slots;
  for (let i = 0; i < slots.length && i < bindings.length; i++) {
    const s = slots[i], b = bindings[i];
    if (s.kind !== "buffer" || !isRanged(b)) continue;
    const r = b.range();
    if (r[2] === r[1]) continue; // zero bytes touch nothing
    const access = s.access ?? "readwrite";
    if (access !== "write") reads.push(r);
    if (access !== "read") writes.push(r);
  }
  return { reads, writes };
}

/** Formats a range for messages: `alloc 3 [256, 512)`. */
export function formatRange(r: MemRange): string {
  return `alloc ${r[0]} [${r[1]}, ${r[2]})`;
}
