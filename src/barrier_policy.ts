/**
 * The barrier policy of a command encoder: with automatic barriers on, every dispatch's accesses
 * are checked against its concurrent group (a ConflictTracker) and a barrier is asked for exactly on
 * conflict; and, always, the sizes of the concurrent groups as they close.
 *
 * @module
 */

import { MlxBuffer } from "./buffer.ts";
import { checkRange, checkRanges, type MemRange, type RangedBinding } from "./graph/ranges.ts";
import { GroupAccesses } from "./graph/tracker.ts";
import type { KernelContract } from "./kernels.ts";

/** Concurrent-group statistics of an encoder. */
export interface GroupStats {
  /** Dispatches encoded. */
  readonly dispatches: number;
  /** Concurrent groups (runs of dispatches between barriers). */
  readonly groups: number;
  /** Mean dispatches per group. */
  readonly meanGroupSize: number;
  /** histogram[k] = number of groups of exactly k dispatches. */
  readonly histogram: readonly number[];
}

const READ = 1, WRITE = 2;
const SMALL_GROUP = 64;
const EMPTY_F64 = new Float64Array(0);

/** Auto-barrier decisions and group sizes. */
export class BarrierPolicy {
  /** Whether dispatches are tracked and get a barrier exactly on conflict. */
  auto: boolean;
  readonly #group = new GroupAccesses();
  // The ranges of the dispatch being encoded (stageDispatch), added to the group by trackStaged.
  // Four numbers each (allocation, start, end, READ|WRITE) in one array: one typed array to create
  // per encoder, on its first dispatch.
  #stage = EMPTY_F64;
  #staged = 0;
  #groupSize = 0;
  #groups = 0; // closed groups
  // Closed groups by size: counts for sizes below SMALL_GROUP, and each wider group's size (a
  // dense histogram up to a group of hundreds would cost a pass as much as its dispatches).
  readonly #histogram: number[] = [];
  #wide: number[] | undefined;

  /** A policy with automatic barriers on or off. */
  constructor(auto: boolean) {
    this.auto = auto;
  }

  /**
   * Whether accesses conflict with the current group (so a barrier must come first). Throws
   * InvalidArgument for a malformed range.
   */
  conflicts(reads: readonly MemRange[], writes: readonly MemRange[]): boolean {
    checkRanges(reads, "barrier reads");
    checkRanges(writes, "barrier writes");
    const g = this.#group;
    if (g.empty) return false;
    for (let i = 0; i < reads.length; i++) {
      const r = reads[i]!;
      if (g.conflicts(r[0], r[1], r[2], false)) return true;
    }
    for (let i = 0; i < writes.length; i++) {
      const r = writes[i]!;
      if (g.conflicts(r[0], r[1], r[2], true)) return true;
    }
    return false;
  }

  /** Adds accesses to the current group. Throws InvalidArgument for a malformed range. */
  track(reads: readonly MemRange[], writes: readonly MemRange[]): void {
    checkRanges(reads, "tracked reads");
    checkRanges(writes, "tracked writes");
    const g = this.#group;
    for (let i = 0; i < reads.length; i++) {
      const r = reads[i]!;
      g.add(r[0], r[1], r[2], true, false);
    }
    for (let i = 0; i < writes.length; i++) {
      const r = writes[i]!;
      g.add(r[0], r[1], r[2], false, true);
    }
  }

  /**
   * Takes the accesses of a dispatch of a kernel with this contract, bound to `bindings`, and says
   * whether they conflict with the current group; {@link BarrierPolicy.trackStaged} then adds them
   * (once the dispatch is written). The accesses are those of `accessesOf` (ranges.ts) — every bound
   * buffer slot's exact range, read and/or written per the contract — read straight from the
   * bindings in one walk, with no range lists built. Throws InvalidArgument for a binding whose own
   * `range()` is malformed.
   */
  stageDispatch(contract: KernelContract, bindings: readonly unknown[]): boolean {
    const g = this.#group, slots = contract.slots, n = Math.min(slots.length, bindings.length);
    if (4 * n > this.#stage.length) this.#stage = new Float64Array(4 * Math.max(2 * n, 8));
    const stage = this.#stage;
    this.#staged = 0; // nothing staged if a binding throws below
    const check = !g.empty;
    let conflict = false, k = 0;
    for (let i = 0; i < n; i++) {
      const slot = slots[i]!;
      if (slot.kind !== "buffer") continue;
      const b = bindings[i];
      let a: number, s: number, e: number;
      if (b instanceof MlxBuffer) {
        a = b.allocId;
        s = b.byteOffset;
        e = s + b.byteLength;
      } else if (isRanged(b)) {
        const r = rangeOf(b, contract, i);
        a = r[0];
        s = r[1];
        e = r[2];
      } else continue;
      if (s === e) continue; // zero bytes touch nothing
      const access = slot.access, m = access === "read" ? READ : access === "write" ? WRITE : READ | WRITE;
      // A write is checked against every byte the group touched, which covers the read check.
      if (check && !conflict) conflict = g.conflicts(a, s, e, m !== READ);
      stage[k] = a;
      stage[k + 1] = s;
      stage[k + 2] = e;
      stage[k + 3] = m;
      k += 4;
    }
    this.#staged = k;
    return conflict;
  }

  /** Adds the accesses of the last {@link BarrierPolicy.stageDispatch} to the current group. */
  trackStaged(): void {
    const g = this.#group, stage = this.#stage;
    for (let k = 0; k < this.#staged; k += 4) {
      const m = stage[k + 3]!;
      g.add(stage[k]!, stage[k + 1]!, stage[k + 2]!, (m & READ) !== 0, (m & WRITE) !== 0);
    }
    this.#staged = 0;
  }

  /** Forgets the tracked accesses (after a barrier every earlier write is visible): O(1). */
  forget(): void {
    this.#group.reset();
  }

  /** Counts one dispatch into the current group. */
  dispatched(): void {
    this.#groupSize++;
  }

  /** Closes the current group (at a barrier or commit). */
  endGroup(): void {
    const size = this.#groupSize;
    if (size === 0) return;
    this.#groups++;
    this.#groupSize = 0;
    if (size < SMALL_GROUP) {
      const h = this.#histogram;
      while (h.length <= size) h.push(0);
      h[size] = h[size]! + 1;
    } else (this.#wide ??= []).push(size);
  }

  /** The group statistics so far, the open group included (O(1) per group, the histogram aside). */
  stats(dispatches: number): GroupStats {
    const open = this.#groupSize, groups = this.#groups + (open > 0 ? 1 : 0);
    return {
      dispatches,
      groups,
      meanGroupSize: groups > 0 ? dispatches / groups : 0,
      histogram: buildHistogram(this.#histogram, this.#wide, open),
    };
  }
}

/** histogram[k] = groups of exactly k dispatches, from the small sizes' counts, the wide sizes and the open group. */
function buildHistogram(small: readonly number[], wide: readonly number[] | undefined, open: number): number[] {
  const h = small.slice();
  const add = (size: number) => {
    if (size >= h.length) {
      const from = h.length;
      h.length = size + 1;
      h.fill(0, from);
    }
    h[size] = h[size]! + 1;
  };
  if (wide !== undefined) { for (let i = 0; i < wide.length; i++) add(wide[i]!); }
  if (open > 0) add(open);
  return h;
}

function isRanged(b: unknown): b is RangedBinding {
  return typeof b === "object" && b !== null && typeof (b as RangedBinding).range === "function";
}

/** The range a non-MlxBuffer binding reports, checked (a malformed one would hide a race). */
function rangeOf(b: RangedBinding, contract: KernelContract, slot: number): MemRange {
  const r = b.range();
  checkRange(r, `${contract.name}: slot ${slot} (${contract.slots[slot]!.name}) range()`);
  return r;
}
