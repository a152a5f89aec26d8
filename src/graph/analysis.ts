/**
 * Graph analysis: dependency levels and depth. A dispatch's level is one more than the highest level
 * of the earlier dispatches it depends on (RAW, WAR or WAW on shared bytes, the rule of
 * {@link conflict}); the depth is the highest level. Any schedule in one command buffer needs at
 * least depth − 1 barriers, so it is the lower bound to compare barrier counts with, and the
 * "levels" reorder reaches it.
 *
 * Levels are computed in O(n log n): per allocation, two max-trees over the byte offsets that occur
 * (the highest level that wrote each byte, and the highest that touched it) answer "the highest
 * level among earlier dispatches overlapping this range" without looking at those dispatches.
 *
 * @module
 */

import { type CapturedNode, type DispatchNode, isDispatch } from "./nodes.ts";
import { type Accesses, checkRanges, conflict, type MemRange } from "./ranges.ts";

/** Whether `b` (later) depends on `a` (earlier): RAW, WAR or WAW on overlapping bytes. */
export function dependsOn(a: DispatchNode, b: DispatchNode): boolean {
  return conflict(a, b) !== null;
}

/**
 * Per allocation, the highest level written and the highest level touched (read or written) over
 * each byte, as segment trees over the allocation's elementary intervals (between consecutive
 * offsets where some range starts or ends), with "raise to at least v over a range" and "maximum
 * over a range" in O(log m).
 */
class LevelIndex {
  // Every non-empty range of the accesses, in order (each entry's reads, then its writes): its
  // allocation's index and its first and last elementary interval.
  readonly #rangeAlloc: Int32Array;
  readonly #rangeFrom: Int32Array;
  readonly #rangeTo: Int32Array;
  readonly #treeBase: Int32Array; // allocation a's two trees (4·m nodes each) start here below
  readonly #intervals: Int32Array; // allocation a has m = #intervals[a] elementary intervals
  // One pair of arrays for every tree: max over the subtree, and a level raised over all of it.
  readonly #max: Int32Array;
  readonly #raised: Int32Array;

  constructor(accesses: readonly Accesses[]) {
    // Number the allocations and the ranges; count each allocation's offsets.
    const slotOf = new Map<number, number>(), counts: number[] = [], ranges: MemRange[] = [];
    for (const acc of accesses) {
      for (const list of [acc.reads, acc.writes]) {
        for (const r of list) {
          if (r[1] === r[2]) continue;
          let a = slotOf.get(r[0]);
          if (a === undefined) slotOf.set(r[0], a = counts.push(0) - 1);
          counts[a]! += 2;
          ranges.push(r);
        }
      }
    }
    const rangeAlloc = new Int32Array(ranges.length);
    for (let k = 0; k < ranges.length; k++) rangeAlloc[k] = slotOf.get(ranges[k]![0])!;
    // Counting sort of the offsets by allocation, then each allocation's run sorted and deduplicated.
    const allocs = counts.length, start = new Int32Array(allocs + 1);
    for (let a = 0; a < allocs; a++) start[a + 1] = start[a]! + counts[a]!;
    const cuts = new Float64Array(start[allocs]!), fill = start.slice(0, allocs);
    for (let k = 0; k < ranges.length; k++) {
      const a = rangeAlloc[k]!;
      cuts[fill[a]!++] = ranges[k]![1];
      cuts[fill[a]!++] = ranges[k]![2];
    }
    const cutEnd = new Int32Array(allocs), intervals = new Int32Array(allocs);
    const treeBase = new Int32Array(allocs + 1);
    for (let a = 0; a < allocs; a++) {
      const from = start[a]!, to = start[a + 1]!;
      sortRun(cuts, from, to);
      let out = from;
      for (let i = from; i < to; i++) if (i === from || cuts[i] !== cuts[out - 1]) cuts[out++] = cuts[i]!;
      cutEnd[a] = out;
      intervals[a] = out - from - 1;
      treeBase[a + 1] = treeBase[a]! + 2 * 4 * intervals[a]!;
    }
    const cutIndex = (a: number, x: number) => {
      let lo = start[a]!, hi = cutEnd[a]! - 1;
      while (lo < hi) {
        const mid = (lo + hi) >> 1;
        if (cuts[mid]! < x) lo = mid + 1;
        else hi = mid;
      }
      return lo - start[a]!;
    };
    this.#rangeFrom = new Int32Array(ranges.length);
    this.#rangeTo = new Int32Array(ranges.length);
    for (let k = 0; k < ranges.length; k++) {
      this.#rangeFrom[k] = cutIndex(rangeAlloc[k]!, ranges[k]![1]);
      this.#rangeTo[k] = cutIndex(rangeAlloc[k]!, ranges[k]![2]);
    }
    this.#rangeAlloc = rangeAlloc;
    this.#intervals = intervals;
    this.#treeBase = treeBase;
    this.#max = new Int32Array(treeBase[allocs]!);
    this.#raised = new Int32Array(treeBase[allocs]!);
  }

  /** The highest level written (`written`) or touched over non-empty range number `k`, 0 if none. */
  highest(k: number, written: boolean): number {
    const a = this.#rangeAlloc[k]!, m = this.#intervals[a]!;
    const base = this.#treeBase[a]! + (written ? 0 : 4 * m);
    return this.#query(base, 1, 0, m, this.#rangeFrom[k]!, this.#rangeTo[k]!);
  }

  /** Raises the written (`written`) or touched level over non-empty range number `k` to at least `level`. */
  raise(k: number, written: boolean, level: number): void {
    const a = this.#rangeAlloc[k]!, m = this.#intervals[a]!;
    const base = this.#treeBase[a]! + (written ? 0 : 4 * m);
    this.#update(base, 1, 0, m, this.#rangeFrom[k]!, this.#rangeTo[k]!, level);
  }

  // Node `node` (1-based heap order) covers elementary intervals [lo, hi).
  #query(base: number, node: number, lo: number, hi: number, from: number, to: number): number {
    if (to <= lo || hi <= from) return 0;
    const k = base + node - 1;
    if (from <= lo && hi <= to) return this.#max[k]!;
    const mid = (lo + hi) >> 1;
    const left = this.#query(base, 2 * node, lo, mid, from, to);
    const right = this.#query(base, 2 * node + 1, mid, hi, from, to);
    const raised = this.#raised[k]!;
    return left > right ? (left > raised ? left : raised) : (right > raised ? right : raised);
  }

  #update(base: number, node: number, lo: number, hi: number, from: number, to: number, v: number): void {
    if (to <= lo || hi <= from) return;
    const k = base + node - 1;
    if (v > this.#max[k]!) this.#max[k] = v;
    if (from <= lo && hi <= to) {
      if (v > this.#raised[k]!) this.#raised[k] = v;
      return;
    }
    const mid = (lo + hi) >> 1;
    this.#update(base, 2 * node, lo, mid, from, to, v);
    this.#update(base, 2 * node + 1, mid, hi, from, to, v);
  }
}

/** Sorts a[from, to) ascending: insertion sort for short runs (most allocations have one range). */
function sortRun(a: Float64Array, from: number, to: number): void {
  if (to - from > 32) {
    a.subarray(from, to).sort();
    return;
  }
  for (let i = from + 1; i < to; i++) {
    const x = a[i]!;
    let j = i - 1;
    while (j >= from && a[j]! > x) {
      a[j + 1] = a[j]!;
      j--;
    }
    a[j + 1] = x;
  }
}

/**
 * The dependency level (1-based) of each of `accesses`, in order: one more than the highest level
 * of an earlier entry it depends on. An entry `pinned` says nothing may move across it: it gets at
 * least the highest level so far, and every later entry at least its level. Throws
 * InvalidArgument for a malformed range.
 */
export function dependencyLevels(accesses: readonly Accesses[], pinned?: (index: number) => boolean): Int32Array {
  for (const acc of accesses) {
    checkRanges(acc.reads, "dependency analysis: a dispatch's reads");
    checkRanges(acc.writes, "dependency analysis: a dispatch's writes");
  }
  const index = new LevelIndex(accesses);
  const levels = new Int32Array(accesses.length);
  let highest = 0, floor = 1, next = 0; // next: the number of this entry's first non-empty range
  for (let i = 0; i < accesses.length; i++) {
    const { reads, writes } = accesses[i]!;
    let after = 0, k = next; // after: the highest level this entry depends on
    for (const r of reads) if (r[1] < r[2]) after = Math.max(after, index.highest(k++, true)); // RAW
    for (const w of writes) if (w[1] < w[2]) after = Math.max(after, index.highest(k++, false)); // WAR, WAW
    let level = Math.max(after + 1, floor);
    if (pinned?.(i)) floor = level = Math.max(level, highest);
    levels[i] = level;
    if (level > highest) highest = level;
    for (const r of reads) if (r[1] < r[2]) index.raise(next++, false, level);
    for (const w of writes) {
      if (w[1] === w[2]) continue;
      index.raise(next, true, level);
      index.raise(next++, false, level);
    }
  }
  return levels;
}

/** Length of the longest dependency chain among the dispatches (barriers ignored). */
export function dependencyDepth(nodes: readonly CapturedNode[]): number {
  const levels = dependencyLevels(nodes.filter(isDispatch));
  let max = 0;
  for (const l of levels) if (l > max) max = l;
  return max;
}

/** The fewest barriers any valid single-command-buffer schedule of these dispatches can use. */
export function barrierLowerBound(nodes: readonly CapturedNode[]): number {
  return Math.max(0, dependencyDepth(nodes) - 1);
}
