/**
 * ConflictTracker: the memory ranges of the current concurrent group and the question "does a new
 * dispatch conflict with them?" (llama.cpp's ggml_mem_ranges; MLX's barrier logic). Read–read never
 * conflicts; a new read overlapping a recorded write is RAW; a new write overlapping any recorded
 * range is WAR or WAW; different allocations never conflict. Exact byte ranges, strict overlap.
 * Storage is typed arrays that grow as needed: no allocation per check.
 *
 * @module
 */

import type { MemRange } from "./ranges.ts";

/** Why two accesses conflict. */
export interface ConflictReason {
  /** RAW: read after write; WAR: write after read; WAW: write after write. */
  readonly kind: "RAW" | "WAR" | "WAW";
  /** The new dispatch's range. */
  readonly incoming: MemRange;
  /** The recorded range it overlaps. */
  readonly existing: MemRange;
}

const EMPTY_F64 = new Float64Array(0);
const EMPTY_U8 = new Uint8Array(0);

/**
 * The ranges of one concurrent group.
 *
 * @example
 * ```ts
 * import { ConflictTracker } from "./mod.ts";
 * const t = new ConflictTracker();
 * t.add([[1, 0, 64]], [[2, 0, 64]]);       // reads alloc 1, writes alloc 2
 * t.conflicts([[2, 32, 48]], []);          // true: RAW on alloc 2
 * t.conflicts([[1, 0, 64]], [[3, 0, 8]]);  // false: read–read, other allocation
 * ```
 */
export class ConflictTracker {
  // Allocated on first use: a typed array costs ~0.7 µs to create in Deno, and most encoders
  // (no autoBarriers) never record a range.
  #alloc = EMPTY_F64;
  #start = EMPTY_F64;
  #end = EMPTY_F64;
  #write = EMPTY_U8;
  #n = 0;
  #lastIncoming: MemRange | null = null; // the incoming range of the last conflict found

  /** Number of recorded ranges. */
  get size(): number {
    return this.#n;
  }

  /** Forgets every range (after a barrier). */
  reset(): void {
    this.#n = 0;
  }

  /** Records a dispatch's reads and writes as part of the current group. */
  add(reads: readonly MemRange[], writes: readonly MemRange[]): void {
    for (let i = 0; i < reads.length; i++) this.#push(reads[i], 0);
    for (let i = 0; i < writes.length; i++) this.#push(writes[i], 1);
  }

  /** Whether a dispatch with these accesses conflicts with the recorded group. */
  conflicts(reads: readonly MemRange[], writes: readonly MemRange[]): boolean {
    return this.#find(reads, writes) >= 0;
  }

  /** The first conflict of a dispatch with the recorded group, or null. */
  conflictReason(reads: readonly MemRange[], writes: readonly MemRange[]): ConflictReason | null {
    const hit = this.#find(reads, writes);
    if (hit < 0) return null;
    const j = hit >>> 1, isWriteIn = (hit & 1) === 1;
    const existing: MemRange = [this.#alloc[j], this.#start[j], this.#end[j]];
    const incoming = this.#lastIncoming!;
    const kind = !isWriteIn ? "RAW" : this.#write[j] ? "WAW" : "WAR";
    return { kind, incoming, existing };
  }

  /** Index·2 + (1 if the incoming range is a write) of the first conflict, or -1. */
  #find(reads: readonly MemRange[], writes: readonly MemRange[]): number {
    const n = this.#n, alloc = this.#alloc, start = this.#start, end = this.#end, write = this.#write;
    for (let i = 0; i < reads.length; i++) {
      const r = reads[i];
      for (let j = 0; j < n; j++) {
        if (write[j] && alloc[j] === r[0] && start[j] < r[2] && r[1] < end[j]) {
          this.#lastIncoming = r;
          return j * 2;
        }
      }
    }
    for (let i = 0; i < writes.length; i++) {
      const r = writes[i];
      for (let j = 0; j < n; j++) {
        if (alloc[j] === r[0] && start[j] < r[2] && r[1] < end[j]) {
          this.#lastIncoming = r;
          return j * 2 + 1;
        }
      }
    }
    return -1;
  }

  #push(r: MemRange, isWrite: number): void {
    if (this.#n === this.#alloc.length) this.#grow();
    const k = this.#n++;
    this.#alloc[k] = r[0];
    this.#start[k] = r[1];
    this.#end[k] = r[2];
    this.#write[k] = isWrite;
  }

  #grow(): void {
    const cap = Math.max(32, this.#alloc.length * 2);
    const grow64 = (a: Float64Array) => {
      const b = new Float64Array(cap);
      b.set(a);
      return b;
    };
    this.#alloc = grow64(this.#alloc);
    this.#start = grow64(this.#start);
    this.#end = grow64(this.#end);
    const w = new Uint8Array(cap);
    w.set(this.#write);
    this.#write = w;
  }
}
