/**
 * Memory ranges and the accesses of a dispatch. A range is `[allocation id, start, end)` in bytes; a
 * slice view shares its parent's allocation id and covers exactly its bytes. Pure: no device needed.
 *
 * @module
 */

import { MlxError } from "../errors.ts";

/** A byte range of one allocation: `[allocation id, start, end)`. */
export type MemRange = readonly [alloc: number, start: number, end: number];

/**
 * Whether two ranges share at least one byte (different allocations never do; an empty range
 * touches no byte).
 */
export function rangesOverlap(a: MemRange, b: MemRange): boolean {
  return a[0] === b[0] && a[1] < b[2] && b[1] < a[2] && a[1] < a[2] && b[1] < b[2];
}

/** How a later access conflicts with an earlier one of the same bytes. */
export type ConflictKind = "RAW" | "WAR" | "WAW";

/**
 * The conflict rule, in one place: a later access of bytes an earlier access touched conflicts
 * unless both only read. Read after write is RAW, write after read WAR, write after write WAW.
 */
export function conflictKind(earlierWrites: boolean, laterWrites: boolean): ConflictKind | null {
  return laterWrites ? (earlierWrites ? "WAW" : "WAR") : (earlierWrites ? "RAW" : null);
}

/**
 * The first conflict of accesses `b` (later) with accesses `a` (earlier), or null: RAW is looked
 * for first (b's reads against a's writes), then WAR and WAW (b's writes against a's reads, then
 * a's writes). Pairwise, for small sets; groups use the interval structures built on the same rule.
 */
export function conflict(a: Accesses, b: Accesses): ConflictKind | null {
  for (const r of b.reads) for (const w of a.writes) if (rangesOverlap(r, w)) return conflictKind(true, false);
  for (const w of b.writes) {
    for (const r of a.reads) if (rangesOverlap(w, r)) return conflictKind(false, true);
    for (const w2 of a.writes) if (rangesOverlap(w, w2)) return conflictKind(true, true);
  }
  return null;
}

/**
 * Throws an InvalidArgument MlxError unless `r` is `[allocation id, start, end)` with non-negative
 * integers and start <= end. Without this a NaN, fractional, negative or reversed range compares as
 * "no overlap" everywhere and silently drops a needed barrier. `where` names the caller for the
 * message.
 */
export function checkRange(r: MemRange, where: string): void {
  // Per dispatch on the encoder's hot path: comparisons reject NaN, the bound rejects infinities,
  // Math.floor fractions; only a failure pays for the message.
  if (typeof r === "object" && r !== null) {
    const a = r[0], s = r[1], e = r[2];
    if (
      s >= 0 && e >= s && e <= MAX_SAFE && a >= 0 && a <= MAX_SAFE &&
      Math.floor(s) === s && Math.floor(e) === e && Math.floor(a) === a
    ) return;
  }
  throw invalidRange(r, where);
}

const MAX_SAFE = Number.MAX_SAFE_INTEGER;

/** {@link checkRange} on every range of a list (which must be an array). */
export function checkRanges(list: readonly MemRange[], where: string): void {
  if (!Array.isArray(list)) {
    throw new MlxError(
      "InvalidArgument",
      `${where}: expected an array of byte ranges, got ${describe(list)}; pass [] when there are none`,
    );
  }
  for (let i = 0; i < list.length; i++) checkRange(list[i], where);
}

function describe(x: unknown): string {
  if (Array.isArray(x)) return `[${x.map((v) => typeof v === "number" ? String(v) : typeof v).join(", ")}]`;
  return x === null ? "null" : typeof x;
}

function invalidRange(r: unknown, where: string): MlxError {
  let why: string;
  if (!Array.isArray(r) || r.length !== 3) why = "it is not a triple [allocation id, start, end]";
  else {
    const names = ["allocation id", "start", "end"];
    const bad = r.findIndex((v) => !Number.isSafeInteger(v) || (v as number) < 0);
    if (bad >= 0) {
      const v = r[bad];
      why = typeof v !== "number"
        ? `its ${names[bad]} is ${typeof v}, not a number`
        : Number.isNaN(v)
        ? `its ${names[bad]} is NaN`
        : v < 0
        ? `its ${names[bad]} is negative`
        : `its ${names[bad]} is not an integer`;
    } else why = "it is reversed (end < start)";
  }
  return new MlxError(
    "InvalidArgument",
    `${where}: invalid byte range ${describe(r)}: ${why}. A range is [allocation id, start byte, end byte) ` +
      `with non-negative integers and start <= end; pass buffer.range() or a buffer view, or fix the offsets ` +
      `(an invalid range would compare as "no overlap" and hide a race)`,
  );
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

/** How a kernel touches a buffer slot. */
export type SlotAccess = "read" | "write" | "readwrite";

/** What the graph needs to know of one kernel slot (a kernel contract's SlotSpec fits). */
export interface SlotAccesses {
  /** Name, for messages. */
  readonly name: string;
  /** A buffer, or inline constant bytes. */
  readonly kind: "buffer" | "bytes";
  /** For buffers: how the kernel accesses it (default "readwrite"). */
  readonly access?: SlotAccess | undefined;
  /**
   * For read buffers: the dispatch promises that no earlier dispatch of its command buffer writes
   * this buffer when bit(s) `mask` of u32 word `word` of bytes slot `slot` are set.
   */
  readonly constantIf?: { readonly slot: number; readonly word: number; readonly mask: number } | undefined;
}

/**
 * A kernel's slot accesses as data: what the graph derives a dispatch's reads and writes from (a
 * KernelContract fits; the encoder and executor hand theirs in on each node's pipeline).
 */
export interface KernelAccesses {
  /** Argument slots in order. */
  readonly slots: readonly SlotAccesses[];
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
export function accessesOf(contract: KernelAccesses, bindings: readonly unknown[]): Accesses {
  const reads: MemRange[] = [], writes: MemRange[] = [];
  const slots = contract.slots;
  for (let i = 0; i < slots.length && i < bindings.length; i++) {
    const s = slots[i]!, b = bindings[i];
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
