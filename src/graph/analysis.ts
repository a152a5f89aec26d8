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

/** The byte offsets of one allocation that start or end a range, and its two trees' place. */
interface AllocAxis {
  readonly cuts: number[]; // sorted, distinct; elementary interval k is [cuts[k], cuts[k + 1])
  readonly base: number; // where its trees start in the shared arrays
}

/**
 * Per allocation, the highest level written and the highest level touched (read or written) over
 * each byte, as segment trees over the allocation's elementary intervals, with "raise to at least
 * v over a range" and "maximum over a range" in O(log m).
 */
class LevelIndex {
  readonly #axes = new Map<number, AllocAxis>();
  // One pair of arrays for every tree: max over the subtree, and a level raised over all of it.
  readonly #max: Int32Array;
  readonly #raised: Int32Array;

  constructor(accesses: readonly Accesses[]) {
    const cutSets = new Map<number, number[]>();
    const note = (r: MemRange) => {
      if (r[1] === r[2]) return;
      let c = cutSets.get(r[0]);
      if (!c) cutSets.set(r[0], c = []);
      c.push(r[1], r[2]);
    };
    for (const a of accesses) {
      a.reads.forEach(note);
      a.writes.forEach(note);
    }
    let size = 0;
    for (const [alloc, c] of cutSets) {
      c.sort((x, y) => x - y);
      let k = 0;
      for (let i = 0; i < c.length; i++) if (i === 0 || c[i] !== c[k - 1]) c[k++] = c[i];
      c.length = k;
      this.#axes.set(alloc, { cuts: c, base: size });
      size += 2 * 4 * (k - 1); // two trees of 4·m nodes for m elementary intervals
    }
    this.#max = new Int32Array(size);
    this.#raised = new Int32Array(size);
  }

  /** The highest level written (`written`) or touched over the non-empty range, 0 if none. */
  highest(r: MemRange, written: boolean): number {
    const axis = this.#axes.get(r[0])!, m = axis.cuts.length - 1;
    const base = axis.base + (written ? 0 : 4 * m);
    return this.#query(base, 1, 0, m, indexOf(axis.cuts, r[1]), indexOf(axis.cuts, r[2]));
  }

  /** Raises the written (`written`) or touched level over the non-empty range to at least `level`. */
  raise(r: MemRange, written: boolean, level: number): void {
    const axis = this.#axes.get(r[0])!, m = axis.cuts.length - 1;
    const base = axis.base + (written ? 0 : 4 * m);
    this.#update(base, 1, 0, m, indexOf(axis.cuts, r[1]), indexOf(axis.cuts, r[2]), level);
  }

  // Node `node` (1-based heap order) covers elementary intervals [lo, hi).
  #query(base: number, node: number, lo: number, hi: number, from: number, to: number): number {
    if (to <= lo || hi <= from) return 0;
    const k = base + node - 1;
    if (from <= lo && hi <= to) return this.#max[k];
    const mid = (lo + hi) >> 1;
    return Math.max(
      this.#raised[k],
      this.#query(base, 2 * node, lo, mid, from, to),
      this.#query(base, 2 * node + 1, mid, hi, from, to),
    );
  }

  #update(base: number, node: number, lo: number, hi: number, from: number, to: number, v: number): void {
    if (to <= lo || hi <= from) return;
    const k = base + node - 1;
    if (v > this.#max[k]) this.#max[k] = v;
    if (from <= lo && hi <= to) {
      if (v > this.#raised[k]) this.#raised[k] = v;
      return;
    }
    const mid = (lo + hi) >> 1;
    this.#update(base, 2 * node, lo, mid, from, to, v);
    this.#update(base, 2 * node + 1, mid, hi, from, to, v);
  }
}

function indexOf(cuts: readonly number[], x: number): number {
  let lo = 0, hi = cuts.length - 1;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (cuts[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/**
 * The dependency level (1-based) of each of `accesses`, in order: one more than the highest level
 * of an earlier entry it depends on. An entry `pinned` says nothing may move across it: it gets at
 * least the highest level so far, and every later entry at least its level. Throws
 * InvalidArgument for a malformed range.
 */
export function dependencyLevels(accesses: readonly Accesses[], pinned?: (index: number) => boolean): Int32Array {
  for (let i = 0; i < accesses.length; i++) {
    checkRanges(accesses[i].reads, `dispatch ${i} reads`);
    checkRanges(accesses[i].writes, `dispatch ${i} writes`);
  }
  const index = new LevelIndex(accesses);
  const levels = new Int32Array(accesses.length);
  let highest = 0, floor = 1;
  for (let i = 0; i < accesses.length; i++) {
    const { reads, writes } = accesses[i];
    let after = 0; // the highest level this entry depends on
    for (const r of reads) if (r[1] < r[2]) after = Math.max(after, index.highest(r, true)); // RAW
    for (const w of writes) if (w[1] < w[2]) after = Math.max(after, index.highest(w, false)); // WAR, WAW
    let level = Math.max(after + 1, floor);
    if (pinned?.(i)) floor = level = Math.max(level, highest);
    levels[i] = level;
    if (level > highest) highest = level;
    for (const r of reads) if (r[1] < r[2]) index.raise(r, false, level);
    for (const w of writes) {
      if (w[1] === w[2]) continue;
      index.raise(w, true, level);
      index.raise(w, false, level);
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
