/**
 * The barrier policy of a command encoder: with automatic barriers on, every dispatch's accesses
 * are checked against its concurrent group (a ConflictTracker) and a barrier is asked for exactly on
 * conflict; and, always, the sizes of the concurrent groups as they close.
 *
 * @module
 */

import type { MemRange } from "./graph/ranges.ts";
import { ConflictTracker } from "./graph/tracker.ts";

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

/** Auto-barrier decisions and group sizes. */
export class BarrierPolicy {
  /** Whether dispatches are tracked and get a barrier exactly on conflict. */
  auto: boolean;
  readonly #tracker = new ConflictTracker();
  #groupSize = 0;
  readonly #histogram: number[] = [];

  /** A policy with automatic barriers on or off. */
  constructor(auto: boolean) {
    this.auto = auto;
  }

  /** Whether accesses conflict with the current group (so a barrier must come first). */
  conflicts(reads: readonly MemRange[], writes: readonly MemRange[]): boolean {
    return this.#tracker.conflicts(reads, writes);
  }

  /** Adds accesses to the current group. */
  track(reads: readonly MemRange[], writes: readonly MemRange[]): void {
    this.#tracker.add(reads, writes);
  }

  /** Forgets the tracked accesses (after a barrier every earlier write is visible). */
  forget(): void {
    this.#tracker.reset();
  }

  /** Counts one dispatch into the current group. */
  dispatched(): void {
    this.#groupSize++;
  }

  /** Closes the current group (at a barrier or commit). */
  endGroup(): void {
    if (this.#groupSize === 0) return;
    const h = this.#histogram;
    while (h.length <= this.#groupSize) h.push(0);
    h[this.#groupSize]++;
    this.#groupSize = 0;
  }

  /** The group-size histogram so far, the open group included. */
  stats(dispatches: number): GroupStats {
    const h = [...this.#histogram];
    if (this.#groupSize > 0) {
      while (h.length <= this.#groupSize) h.push(0);
      h[this.#groupSize]++;
    }
    const groups = h.reduce((a, b) => a + b, 0);
    return { dispatches, groups, meanGroupSize: groups > 0 ? dispatches / groups : 0, histogram: h };
  }
}
