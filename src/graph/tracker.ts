/**
 * ConflictTracker: the memory ranges of the current concurrent group and the question "does a new
 * dispatch conflict with them?" (llama.cpp's ggml_mem_ranges; MLX's barrier logic), under the rule
 * of {@link conflictKind}: read–read never conflicts; a new read overlapping a recorded write is
 * RAW; a new write overlapping any recorded range is WAR or WAW; different allocations never
 * conflict. Exact byte ranges, strict overlap; an empty range touches nothing.
 *
 * Each allocation keeps two sorted sets of disjoint byte intervals — the bytes written and the bytes
 * accessed at all — in blocks ({@link ByteIntervals}), so a check is two binary searches (O(1) when
 * ranges arrive in address order) and an insertion moves at most one block: the cost per dispatch
 * stays near flat in the group's width, even for thousands of disjoint slices of one allocation in
 * any order. {@link GroupWalker} is the one "walk the group, reset at a barrier" loop.
 *
 * @module
 */

import { type Accesses, checkRanges, conflictKind, type MemRange, rangesOverlap } from "./ranges.ts";

/** Why two accesses conflict. */
export interface ConflictReason {
  /** RAW: read after write; WAR: write after read; WAW: write after write. */
  readonly kind: "RAW" | "WAR" | "WAW";
  /** The new dispatch's range. */
  readonly incoming: MemRange;
  /** The recorded range it overlaps. */
  readonly existing: MemRange;
}

/** Index of the first of the `count` intervals of `set` whose end is >= `s` (touching counts), or `count`. */
function firstEndingFrom(set: Float64Array, count: number, s: number): number {
  let lo = 0, hi = count;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (set[2 * mid + 1]! < s) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** Index of the first of the first `count` values of `v` (ascending) that is >= `s`, or `count`. */
function firstAtLeast(v: Float64Array, count: number, s: number): number {
  let lo = 0, hi = count;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (v[mid]! < s) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** Intervals per block of a {@link ByteIntervals} unless its constructor is given another size. */
const BLOCK_INTERVALS = 64;

/**
 * A set of bytes of one allocation, as sorted, disjoint, non-touching half-open intervals, kept in
 * blocks of at most `blockSize` intervals with each block's last end in an array of its own. Testing
 * is two binary searches; adding is the same plus a move of at most one block's intervals (and, when
 * a full block splits, of the block list), so tens of thousands of intervals added in any order cost
 * about what a few do. Ranges in address order append in O(1).
 */
export class ByteIntervals {
  // Blocks [0, #nb) are in use, in order, none empty: interleaved [s0, e0, s1, e1, …] with
  // e_k < s_{k+1} across blocks too. Blocks past #nb are spares kept for reuse.
  readonly #blocks: Float64Array[] = [];
  #counts: Int32Array = new Int32Array(4); // intervals in block b
  #last: Float64Array = new Float64Array(4); // the end of block b's last interval
  #nb = 0;
  #size = 0;
  readonly #blockSize: number;

  /** An empty set; `blockSize` (intervals per block, at least 2) is for tests of the block logic. */
  constructor(blockSize: number = BLOCK_INTERVALS) {
    if (!Number.isInteger(blockSize) || blockSize < 2) throw new RangeError("blockSize must be an integer >= 2");
    this.#blockSize = blockSize;
  }

  /** Number of disjoint intervals. */
  get intervalCount(): number {
    return this.#size;
  }

  /** Empties the set (keeping its storage). */
  clear(): void {
    this.#nb = 0;
    this.#size = 0;
  }

  /** Whether [s, e) shares a byte with the set (an empty range never does). */
  intersects(s: number, e: number): boolean {
    const nb = this.#nb, last = this.#last;
    if (nb === 0 || s >= e || s >= last[nb - 1]! || e <= this.#blocks[0]![0]!) return false;
    const lb = this.#blocks[nb - 1]!;
    if (s >= lb[2 * this.#counts[nb - 1]! - 2]!) return true; // starts inside the last interval
    const b = firstAtLeast(last, nb, s + 1), blk = this.#blocks[b]!; // the first interval ending after s
    return blk[2 * firstEndingFrom(blk, this.#counts[b]!, s + 1)]! < e;
  }

  /** Adds [s, e), merging every interval it overlaps or touches (an empty range adds nothing). */
  add(s: number, e: number): void {
    if (s >= e) return;
    const nb = this.#nb;
    if (nb === 0 || s > this.#last[nb - 1]!) { // after everything: the address-order case
      let b = nb - 1;
      if (nb === 0 || this.#counts[b] === this.#blockSize) this.#open(b = nb);
      const blk = this.#blocks[b]!, c = this.#counts[b]!;
      blk[2 * c] = s;
      blk[2 * c + 1] = e;
      this.#counts[b] = c + 1;
      this.#last[b] = e;
      this.#size++;
      return;
    }
    const lb = this.#blocks[nb - 1]!;
    if (s >= lb[2 * this.#counts[nb - 1]! - 2]!) { // inside or touching the last interval
      if (e > this.#last[nb - 1]!) lb[2 * this.#counts[nb - 1]! - 1] = this.#last[nb - 1] = e;
      return;
    }
    const b = firstAtLeast(this.#last, nb, s);
    const blk = this.#blocks[b]!, i = firstEndingFrom(blk, this.#counts[b]!, s); // first touching or after
    if (blk[2 * i]! > e) this.#insert(b, blk, i, s, e); // touches nothing
    else this.#merge(b, blk, i, s, e);
  }

  /** Inserts [s, e), which touches nothing, before interval i of block b. */
  #insert(b: number, blk: Float64Array, i: number, s: number, e: number): void {
    let c = this.#counts[b]!;
    if (c === this.#blockSize) { // split: the upper half goes into a new block after b
      const half = c >> 1, hi = this.#open(b + 1);
      hi.set(blk.subarray(2 * half, 2 * c));
      this.#counts[b + 1] = c - half;
      this.#last[b + 1] = this.#last[b]!;
      this.#counts[b] = half;
      this.#last[b] = blk[2 * half - 1]!;
      if (i >= half) {
        blk = hi;
        b++;
        i -= half;
      }
      c = this.#counts[b]!;
    }
    for (let k = 2 * c - 1; k >= 2 * i; k--) blk[k + 2] = blk[k]!;
    blk[2 * i] = s;
    blk[2 * i + 1] = e;
    this.#counts[b] = c + 1;
    this.#size++;
  }

  /**
   * Merges [s, e) with interval i of block b, which it touches, and every later one it touches. Within
   * block b they are found by walking (each merged interval is removed, so the walk is O(1)
   * amortised); past it, the last is the first interval ending past e if that one starts at or before
   * e, else the one before it (found by binary search, so a merge across many blocks stays cheap).
   */
  #merge(b: number, blk: Float64Array, i: number, s: number, e: number): void {
    const nb = this.#nb, counts = this.#counts, c = counts[b]!;
    let b2 = b, j = i;
    while (j + 1 < c && blk[2 * j + 2]! <= e) j++; // usually one or two steps
    if (j + 1 === c && b + 1 < nb && this.#blocks[b + 1]![0]! <= e) { // past block b
      if (e >= this.#last[nb - 1]!) {
        b2 = nb - 1;
        j = counts[b2]! - 1;
      } else {
        b2 = firstAtLeast(this.#last, nb, e + 1);
        j = firstEndingFrom(this.#blocks[b2]!, counts[b2]!, e + 1);
        if (this.#blocks[b2]![2 * j]! > e) { // starts past e: the one before it
          if (j > 0) j--;
          else j = counts[--b2]! - 1;
        }
      }
    }
    const blk2 = this.#blocks[b2]!;
    blk[2 * i] = Math.min(s, blk[2 * i]!);
    blk[2 * i + 1] = Math.max(e, blk2[2 * j + 1]!);
    if (b2 === b) { // one block: close the gap of the merged ones
      blk.copyWithin(2 * i + 2, 2 * j + 2, 2 * c);
      counts[b] = c - (j - i);
      this.#size -= j - i;
      this.#last[b] = blk[2 * counts[b]! - 1]!;
      return;
    }
    let removed = c - i - 1 + j + 1; // block b past i, and block b2 up to j
    for (let q = b + 1; q < b2; q++) removed += counts[q]!;
    counts[b] = i + 1;
    this.#last[b] = blk[2 * i + 1]!;
    const c2 = counts[b2]!;
    blk2.copyWithin(0, 2 * j + 2, 2 * c2);
    counts[b2] = c2 - j - 1;
    this.#size -= removed;
    this.#close(b + 1, b2 - b - 1 + (counts[b2] === 0 ? 1 : 0));
  }

  /** Puts an empty block in use at position p (<= #nb) and returns it: a spare, or a new one. */
  #open(p: number): Float64Array {
    const nb = this.#nb, blocks = this.#blocks;
    if (nb === this.#counts.length) {
      const counts = new Int32Array(2 * nb), last = new Float64Array(2 * nb);
      counts.set(this.#counts);
      last.set(this.#last);
      this.#counts = counts;
      this.#last = last;
    }
    const k = blocks[nb] ?? new Float64Array(2 * this.#blockSize);
    for (let q = nb; q > p; q--) blocks[q] = blocks[q - 1]!;
    blocks[p] = k;
    this.#counts.copyWithin(p + 1, p, nb);
    this.#last.copyWithin(p + 1, p, nb);
    this.#counts[p] = 0;
    this.#nb = nb + 1;
    return k;
  }

  /** Takes blocks [p, p + count) out of use; they become spares. */
  #close(p: number, count: number): void {
    if (count === 0) return;
    const nb = this.#nb, blocks = this.#blocks, closed = blocks.slice(p, p + count);
    for (let q = p; q + count < nb; q++) blocks[q] = blocks[q + count]!;
    for (let q = 0; q < count; q++) blocks[nb - count + q] = closed[q]!;
    this.#counts.copyWithin(p, p + count, nb);
    this.#last.copyWithin(p, p + count, nb);
    this.#nb = nb - count;
  }
}

const EMPTY_F64 = new Float64Array(0);

// The hash table's slots: six numbers each. An allocation's written bytes and touched (read or
// written) bytes are each one inline interval [S, E) — empty when S = E — until a second disjoint
// interval arrives; then S is SPILLED and the bytes live in a ByteIntervals of the slot.
const SLOT = 6, KEY = 0, EPOCH = 1, WRITTEN = 2, TOUCHED = 4, SPILLED = -1;

/**
 * The bytes a concurrent group wrote and touched, per allocation, and the per-range conflict test
 * of {@link conflictKind}'s rule: the table behind {@link ConflictTracker}, used directly on the
 * encoder's hot path (no range lists, no recording order). Ranges are taken as valid — non-negative
 * safe integers with start <= end, as `checkRange` in ranges.ts ensures and a buffer view's own
 * range always is — and are not checked here.
 */
export class GroupAccesses {
  // An open-addressing hash table (linear probing) whose slots carry the group (epoch) that claimed
  // them, so a slot of an earlier group is empty and reset is O(1). Typed arrays are allocated on
  // first use: one costs ~0.7 µs to create in Deno, and most encoders (no autoBarriers) never
  // record a range.
  #slots = EMPTY_F64;
  #spillWritten: (ByteIntervals | undefined)[] = [];
  #spillTouched: (ByteIntervals | undefined)[] = [];
  #mask = -1;
  #allocs = 0; // slots claimed by the current group
  #epoch = 1;
  #layout = 0;

  /**
   * Changes whenever a slot from {@link GroupAccesses.find} may have gone stale: at a reset (the
   * allocation may now belong nearer its hash) and when the table grows.
   */
  get layout(): number {
    return this.#layout;
  }

  /** Whether the group touched no byte yet. */
  get empty(): boolean {
    return this.#allocs === 0;
  }

  /** Forgets the group (after a barrier): O(1). */
  reset(): void {
    this.#allocs = 0;
    this.#epoch++; // exact up to 2^53 groups
    this.#layout++;
  }

  /**
   * Whether reading bytes [start, end) of allocation `alloc` — or, with `write`, writing them —
   * conflicts with the group: a read conflicts with a written byte, a write with any touched byte.
   */
  conflicts(alloc: number, start: number, end: number, write: boolean): boolean {
    if (this.#allocs === 0 || start >= end) return false;
    const slots = this.#slots, mask = this.#mask, epoch = this.#epoch;
    let i = (Math.imul(alloc | 0, 0x9e3779b1) >>> 7) & mask, k = i * SLOT;
    while (slots[k + KEY] !== alloc) { // probing ends at the first slot of an earlier group
      if (slots[k + EPOCH] !== epoch) return false;
      i = (i + 1) & mask;
      k = i * SLOT;
    }
    if (slots[k + EPOCH] !== epoch) return false;
    const f = k + (write ? TOUCHED : WRITTEN), s = slots[f]!;
    if (s !== SPILLED) return s < end && start < slots[f + 1]!;
    return (write ? this.#spillTouched : this.#spillWritten)[i]!.intersects(start, end);
  }

  /**
   * Makes room for `n` more allocations, so that the next `n` adds of new allocations do not move
   * any: a slot from {@link GroupAccesses.find} stays valid until then (or until a reset).
   */
  reserve(n: number): void {
    while (2 * (this.#allocs + n) > this.#mask + 1) this.#rehash();
  }

  /**
   * The slot of allocation `alloc`: where the group holds it, or the free slot where it would go
   * (call {@link GroupAccesses.reserve} first). For {@link GroupAccesses.conflictsAt} and
   * {@link GroupAccesses.addStaged}, so that a dispatch's check and add probe the table once.
   */
  find(alloc: number): number {
    const slots = this.#slots, mask = this.#mask, epoch = this.#epoch;
    let i = (Math.imul(alloc | 0, 0x9e3779b1) >>> 7) & mask;
    while (slots[i * SLOT + EPOCH] === epoch && slots[i * SLOT + KEY] !== alloc) i = (i + 1) & mask;
    return i;
  }

  /** {@link GroupAccesses.conflicts} for a non-empty range of the allocation {@link GroupAccesses.find} gave `slot` for. */
  conflictsAt(slot: number, start: number, end: number, write: boolean): boolean {
    const slots = this.#slots, k = slot * SLOT;
    if (slots[k + EPOCH] !== this.#epoch) return false; // the allocation is not in the group
    const f = k + (write ? TOUCHED : WRITTEN), s = slots[f]!;
    if (s !== SPILLED) return s < end && start < slots[f + 1]!;
    return (write ? this.#spillTouched : this.#spillWritten)[slot]!.intersects(start, end);
  }

  /**
   * Adds `n` staged ranges, each at the slot {@link GroupAccesses.find} gave for its allocation
   * (room reserved first), in one call: range k is allocation
   * `ranges[3k]`, bytes [`ranges[3k+1]`, `ranges[3k+2]`) (non-empty), written when `info[2k]` is
   * non-zero, found at slot `info[2k+1]` — probed again with `reprobe` (the layout changed since),
   * or when another allocation took that free slot in between. The common cases (a new allocation,
   * a range that overlaps or touches the single interval held) are inline: one call per dispatch.
   */
  addStaged(ranges: Float64Array, info: Int32Array, n: number, reprobe: boolean): void {
    const slots = this.#slots, epoch = this.#epoch, mask = this.#mask;
    for (let k = 0; k < n; k++) {
      const a = ranges[3 * k]!, s = ranges[3 * k + 1]!, e = ranges[3 * k + 2]!, write = info[2 * k] !== 0;
      let i = info[2 * k + 1]!, o = i * SLOT;
      if (reprobe || (slots[o + EPOCH] === epoch && slots[o + KEY] !== a)) {
        i = (Math.imul(a | 0, 0x9e3779b1) >>> 7) & mask;
        while (slots[i * SLOT + EPOCH] === epoch && slots[i * SLOT + KEY] !== a) i = (i + 1) & mask;
        o = i * SLOT;
      }
      if (slots[o + EPOCH] !== epoch) { // claim the slot with this range
        slots[o + KEY] = a;
        slots[o + EPOCH] = epoch;
        slots[o + TOUCHED] = s;
        slots[o + TOUCHED + 1] = e;
        slots[o + WRITTEN] = write ? s : 0;
        slots[o + WRITTEN + 1] = write ? e : 0;
        this.#allocs++;
        continue;
      }
      const ts = slots[o + TOUCHED]!, te = slots[o + TOUCHED + 1]!;
      if (ts !== SPILLED && s <= te && ts <= e) { // still one interval
        if (s < ts) slots[o + TOUCHED] = s;
        if (e > te) slots[o + TOUCHED + 1] = e;
      } else this.#addTo(i, TOUCHED, s, e);
      if (!write) continue;
      const ws = slots[o + WRITTEN]!, we = slots[o + WRITTEN + 1]!;
      if (ws !== SPILLED && ws !== we && s <= we && ws <= e) {
        if (s < ws) slots[o + WRITTEN] = s;
        if (e > we) slots[o + WRITTEN + 1] = e;
      } else this.#addTo(i, WRITTEN, s, e);
    }
  }

  /** Adds bytes [start, end) of allocation `alloc` to the group, as read and/or written. */
  add(alloc: number, start: number, end: number, read: boolean, write: boolean): void {
    if (start >= end || !(read || write)) return; // touches nothing
    if (2 * (this.#allocs + 1) > this.#mask + 1) this.#rehash();
    const slot = this.#slot(alloc), slots = this.#slots, k = slot * SLOT;
    if (slots[k + EPOCH] !== this.#epoch) { // claim the slot with this range
      slots[k + KEY] = alloc;
      slots[k + EPOCH] = this.#epoch;
      slots[k + TOUCHED] = start;
      slots[k + TOUCHED + 1] = end;
      if (write) {
        slots[k + WRITTEN] = start;
        slots[k + WRITTEN + 1] = end;
      } else slots[k + WRITTEN] = slots[k + WRITTEN + 1] = 0;
      this.#allocs++;
      return;
    }
    if (write) this.#addTo(slot, WRITTEN, start, end);
    this.#addTo(slot, TOUCHED, start, end);
  }

  /** The slot of `alloc`: where it is, or the free slot where it would go. */
  #slot(alloc: number): number {
    const slots = this.#slots, mask = this.#mask, epoch = this.#epoch;
    // Fibonacci hashing of the id's low 32 bits (ids are small counters).
    let i = (Math.imul(alloc | 0, 0x9e3779b1) >>> 7) & mask;
    while (slots[i * SLOT + EPOCH] === epoch && slots[i * SLOT + KEY] !== alloc) i = (i + 1) & mask;
    return i;
  }

  /** Adds [s, e) (non-empty) to the slot's written or touched bytes. */
  #addTo(slot: number, field: number, s: number, e: number): void {
    const slots = this.#slots, k = slot * SLOT + field, start = slots[k]!, end = slots[k + 1]!;
    if (start === SPILLED) (field === WRITTEN ? this.#spillWritten : this.#spillTouched)[slot]!.add(s, e);
    else if (start === end) { // empty
      slots[k] = s;
      slots[k + 1] = e;
    } else if (s <= end && start <= e) { // overlaps or touches: still one interval
      slots[k] = Math.min(start, s);
      slots[k + 1] = Math.max(end, e);
    } else {
      const spill = field === WRITTEN ? this.#spillWritten : this.#spillTouched;
      const set = spill[slot] ??= new ByteIntervals();
      set.clear();
      set.add(start, end);
      set.add(s, e);
      slots[k] = SPILLED;
    }
  }

  /** Doubles the table (at least 64 slots), keeping the current group's allocations. */
  #rehash(): void {
    const old = this.#slots, oldWritten = this.#spillWritten, oldTouched = this.#spillTouched;
    const cap = Math.max(64, 2 * (this.#mask + 1));
    this.#layout++;
    this.#slots = new Float64Array(cap * SLOT);
    this.#spillWritten = new Array(cap);
    this.#spillTouched = new Array(cap);
    this.#mask = cap - 1;
    for (let j = 0; j < old.length / SLOT; j++) {
      if (old[j * SLOT + EPOCH] !== this.#epoch) continue;
      const i = this.#slot(old[j * SLOT + KEY]!);
      this.#slots.set(old.subarray(j * SLOT, j * SLOT + SLOT), i * SLOT);
      this.#spillWritten[i] = oldWritten[j];
      this.#spillTouched[i] = oldTouched[j];
    }
  }
}

/**
 * The ranges of one concurrent group.
 *
 * @example
 * ```ts
 * import { ConflictTracker } from "@mlxn/mlx-native";
 * const t = new ConflictTracker();
 * t.add([[1, 0, 64]], [[2, 0, 64]]);       // reads alloc 1, writes alloc 2
 * t.conflicts([[2, 32, 48]], []);          // true: RAW on alloc 2
 * t.conflicts([[1, 0, 64]], [[3, 0, 8]]);  // false: read–read, other allocation
 * ```
 */
export class ConflictTracker {
  readonly #group = new GroupAccesses();
  // Every recorded range in order, for conflictReason and size: allocation, start, end and 1 for a
  // write / 0 for a read, four numbers each (a plain array: typed arrays grown from small cost a
  // zero-filled native allocation at each doubling).
  readonly #log: number[] = [];
  #n = 0;
  // The lists conflicts() last validated: add() of the same lists (the check-then-add of a
  // dispatch) does not validate them again.
  #checkedReads: readonly MemRange[] | null = null;
  #checkedWrites: readonly MemRange[] | null = null;

  /** Number of recorded ranges. */
  get size(): number {
    return this.#n;
  }

  /** Forgets every range (after a barrier). */
  reset(): void {
    this.#n = 0;
    this.#group.reset();
  }

  /**
   * Records a dispatch's reads and writes as part of the current group. Throws InvalidArgument for
   * a malformed range (see `checkRange` in ranges.ts).
   */
  add(reads: readonly MemRange[], writes: readonly MemRange[]): void {
    if (reads !== this.#checkedReads || writes !== this.#checkedWrites) {
      checkRanges(reads, "ConflictTracker.add reads");
      checkRanges(writes, "ConflictTracker.add writes");
    }
    this.#checkedReads = this.#checkedWrites = null;
    for (let i = 0; i < reads.length; i++) this.#record(reads[i]!, false);
    for (let i = 0; i < writes.length; i++) this.#record(writes[i]!, true);
  }

  /**
   * Whether a dispatch with these accesses conflicts with the recorded group. Throws
   * InvalidArgument for a malformed range.
   */
  conflicts(reads: readonly MemRange[], writes: readonly MemRange[]): boolean {
    checkRanges(reads, "ConflictTracker.conflicts reads");
    checkRanges(writes, "ConflictTracker.conflicts writes");
    this.#checkedReads = reads;
    this.#checkedWrites = writes;
    return this.#n > 0 && this.#firstConflict(reads, writes) >= 0;
  }

  /** The first conflict of a dispatch with the recorded group (in recording order), or null. */
  conflictReason(reads: readonly MemRange[], writes: readonly MemRange[]): ConflictReason | null {
    checkRanges(reads, "ConflictTracker.conflictReason reads");
    checkRanges(writes, "ConflictTracker.conflictReason writes");
    const k = this.#firstConflict(reads, writes);
    if (k < 0) return null;
    // Diagnostics only: the recorded range is found by a scan of the group.
    const incomingWrites = (k & 1) === 1, hit = incomingWrites ? writes[k >> 1] : reads[k >> 1];
    const log = this.#log;
    for (let j = 0; j < this.#n; j++) {
      const existing: MemRange = [log[4 * j]!, log[4 * j + 1]!, log[4 * j + 2]!];
      const kind = conflictKind(log[4 * j + 3] === 1, incomingWrites);
      if (kind !== null && rangesOverlap(hit!, existing)) return { kind, incoming: hit!, existing };
    }
    return null; // unreachable: the interval sets hold exactly the recorded ranges
  }

  /**
   * The first incoming range that conflicts, reads first (RAW), then writes (WAR/WAW): 2·i for
   * reads[i], 2·i + 1 for writes[i], -1 for none.
   */
  #firstConflict(reads: readonly MemRange[], writes: readonly MemRange[]): number {
    const g = this.#group;
    if (g.empty) return -1;
    for (let i = 0; i < reads.length; i++) {
      const r = reads[i]!;
      if (g.conflicts(r[0], r[1], r[2], false)) return 2 * i;
    }
    for (let i = 0; i < writes.length; i++) {
      const r = writes[i]!;
      if (g.conflicts(r[0], r[1], r[2], true)) return 2 * i + 1;
    }
    return -1;
  }

  #record(r: MemRange, isWrite: boolean): void {
    const log = this.#log, k = 4 * this.#n++;
    if (k === log.length) log.push(r[0], r[1], r[2], isWrite ? 1 : 0);
    else {
      log[k] = r[0];
      log[k + 1] = r[1];
      log[k + 2] = r[2];
      log[k + 3] = isWrite ? 1 : 0;
    }
    this.#group.add(r[0], r[1], r[2], !isWrite, isWrite);
  }
}

/**
 * The concurrent group being built while walking a sequence of dispatches and barriers: the one
 * "walk the group, reset at a barrier" loop of the barrier pass, the validator and the encoders.
 * With `recompute` (the default) it tracks the group's ranges so that a conflicting dispatch can
 * start a new group; without, groups end only at barriers (the groups as placed).
 */
export class GroupWalker {
  readonly #tracker: ConflictTracker | null;
  #size = 0;

  /** A walker at the start of a sequence. */
  constructor(options: { recompute?: boolean } = {}) {
    this.#tracker = options.recompute === false ? null : new ConflictTracker();
  }

  /** Dispatches in the current group. */
  get groupSize(): number {
    return this.#size;
  }

  /** Ends the group. Returns whether it held a dispatch (so the barrier separates something). */
  barrier(): boolean {
    const had = this.#size > 0;
    this.#tracker?.reset();
    this.#size = 0;
    return had;
  }

  /**
   * Adds a dispatch to the group. When recomputing, a dispatch that conflicts with the group first
   * ends it; returns whether it did (a barrier belongs before this dispatch).
   */
  dispatch(acc: Accesses): boolean {
    const t = this.#tracker;
    let split = false;
    if (t !== null) {
      split = this.#size > 0 && t.conflicts(acc.reads, acc.writes);
      if (split) this.barrier();
      t.add(acc.reads, acc.writes);
    }
    this.#size++;
    return split;
  }
}
