/**
 * The barrier policy of a command encoder: with automatic barriers on, every dispatch's accesses
 * are checked against its concurrent group (a ConflictTracker) and a barrier is asked for exactly on
 * conflict; and, always, the sizes of the concurrent groups as they close. A direct encoder leaves
 * the tracking to the native decoder (AUTO_BARRIERS and TRACK records) and loads its group sizes
 * here; capture mode and validating or profiling encoders, which need every barrier on the host,
 * track here.
 *
 * @module
 */

import { MlxBuffer } from "./buffer.ts";
import { checkRange, checkRanges, type MemRange, type RangedBinding } from "./graph/ranges.ts";
import { GroupAccesses } from "./graph/tracker.ts";
import type { KernelContract } from "./kernels.ts";
import { Stat } from "./native/abi.ts";

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

/**
 * What a policy tracks with: the group's table and the staged dispatch's ranges. Kept across
 * encoders (see {@link BarrierPolicy.release}): each typed array costs ~0.7 µs to create in Deno,
 * and a table grown to a group of hundreds of allocations is reused at that size instead of
 * rehashed up again by every pass.
 */
class TrackingScratch {
  readonly group = new GroupAccesses();
  // The staged dispatch: allocation, start, end per range; access mode and table slot per range.
  ranges = new Float64Array(3 * 16);
  modes = new Int32Array(2 * 16);

  /** Room for `n` staged ranges. */
  fit(n: number): void {
    if (3 * n <= this.ranges.length) return;
    const cap = Math.max(2 * n, 32);
    this.ranges = new Float64Array(3 * cap);
    this.modes = new Int32Array(2 * cap);
  }
}

const scratchPool: TrackingScratch[] = [];
const POOLED_SCRATCH = 8;

// READ / WRITE per slot of a contract (0: not a buffer), made once per contract.
const slotModes = new WeakMap<KernelContract, Uint8Array>();

function accessModes(contract: KernelContract): Uint8Array {
  let modes = slotModes.get(contract);
  if (modes === undefined) {
    const slots = contract.slots;
    modes = new Uint8Array(slots.length);
    for (let i = 0; i < slots.length; i++) {
      const slot = slots[i]!;
      if (slot.kind !== "buffer") continue;
      modes[i] = slot.access === "read" ? READ : slot.access === "write" ? WRITE : READ | WRITE;
    }
    slotModes.set(contract, modes);
  }
  return modes;
}

const NO_MODES: Uint8Array = new Uint8Array(0);

/** Auto-barrier decisions and group sizes. */
export class BarrierPolicy {
  /** Whether dispatches are tracked and get a barrier exactly on conflict. */
  auto: boolean;
  #scratch: TrackingScratch | null = null; // taken on the first tracked access
  #contract: KernelContract | null = null; // the last staged dispatch's contract and its modes
  #modes: Uint8Array = NO_MODES;
  #staged = 0; // ranges staged by stageDispatch
  #stagedLayout = 0; // the table's layout when they were staged (their slots hold until it changes)
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

  #take(): TrackingScratch {
    const scratch = scratchPool.pop() ?? new TrackingScratch();
    scratch.group.reset();
    return this.#scratch = scratch;
  }

  /**
   * Hands the tracking structures back for a later encoder (at commit or dispose): the group is
   * forgotten; a later tracked access takes them again.
   */
  release(): void {
    const scratch = this.#scratch;
    if (scratch === null) return;
    this.#scratch = null;
    this.#staged = 0;
    scratch.group.reset();
    if (scratchPool.length < POOLED_SCRATCH) scratchPool.push(scratch);
  }

  /**
   * Whether accesses conflict with the current group (so a barrier must come first). Throws
   * InvalidArgument for a malformed range.
   */
  conflicts(reads: readonly MemRange[], writes: readonly MemRange[]): boolean {
    checkRanges(reads, "barrier reads");
    checkRanges(writes, "barrier writes");
    const scratch = this.#scratch;
    if (scratch === null) return false;
    const g = scratch.group;
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
    if (reads.length + writes.length === 0) return;
    const g = (this.#scratch ?? this.#take()).group;
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
   * bindings in one walk, with no range lists built; each allocation's table slot is probed once,
   * here, and kept for the add. Throws InvalidArgument for a binding whose own `range()` is
   * malformed.
   */
  stageDispatch(contract: KernelContract, bindings: readonly unknown[]): boolean {
    let modes = this.#modes;
    if (contract !== this.#contract) {
      modes = this.#modes = accessModes(contract);
      this.#contract = contract;
    }
    const n = modes.length < bindings.length ? modes.length : bindings.length;
    const scratch = this.#scratch ?? this.#take(), g = scratch.group;
    this.#staged = 0; // nothing staged if a binding throws below
    scratch.fit(n);
    g.reserve(n); // the slots found below stay valid until trackStaged
    const ranges = scratch.ranges, staged = scratch.modes;
    let conflict = false, k = 0;
    for (let i = 0; i < n; i++) {
      const m = modes[i]!;
      if (m === 0) continue;
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
      const slot = g.find(a);
      // A write is checked against every byte the group touched, which covers the read check.
      if (!conflict) conflict = g.conflictsAt(slot, s, e, m !== READ);
      ranges[3 * k] = a;
      ranges[3 * k + 1] = s;
      ranges[3 * k + 2] = e;
      staged[2 * k] = m & WRITE;
      staged[2 * k + 1] = slot;
      k++;
    }
    this.#staged = k;
    this.#stagedLayout = g.layout;
    return conflict;
  }

  /** Adds the accesses of the last {@link BarrierPolicy.stageDispatch} to the current group. */
  trackStaged(): void {
    const n = this.#staged;
    if (n === 0) return;
    this.#staged = 0;
    const scratch = this.#scratch!, g = scratch.group;
    // After a barrier (or growth) an allocation may belong elsewhere in the table: probe again.
    g.addStaged(scratch.ranges, scratch.modes, n, g.layout !== this.#stagedLayout);
  }

  /** Forgets the tracked accesses (after a barrier every earlier write is visible): O(1). */
  forget(): void {
    this.#scratch?.group.reset();
  }

  /** Counts one dispatch into the current group. */
  dispatched(): void {
    this.#groupSize++;
  }

  /** Counts `n` dispatches into the current group: `dispatched()` n times (none when n ≤ 0), in O(1). */
  dispatchedMany(n: number): void {
    if (n > 0) this.#groupSize += n;
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

  /**
   * Takes the group sizes the native decoder counted (it places the barriers of a direct encoder
   * with automatic barriers): `words` is what `mlxn_cmdbuf_barrier_stats` wrote, `total` words of it.
   * They replace the sizes counted here.
   */
  loadNativeGroups(words: Uint32Array, total: number): void {
    const open = words[Stat.OPEN_GROUP]!;
    this.#groupSize = open;
    this.#groups = words[Stat.GROUPS]! - (open > 0 ? 1 : 0);
    const h = this.#histogram, small = Stat.COUNT;
    let top = Stat.SMALL_SIZES - 1; // the histogram runs to the largest small size seen, as endGroup grows it
    while (top > 0 && words[small + top] === 0) top--;
    h.length = 0;
    if (top > 0) { for (let k = 0; k <= top; k++) h.push(words[small + k]!); }
    const wide = total - small - Stat.SMALL_SIZES;
    if (wide > 0) this.#wide = Array.from(words.subarray(small + Stat.SMALL_SIZES, total));
    else this.#wide = undefined;
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
