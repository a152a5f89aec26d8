/**
 * Process-wide counters of the work the module issued, mirroring the seed's: blocking syncs,
 * dispatches, command buffers, barriers actually issued, barrier device time (when profiling
 * dispatches), the auto-barrier decisions and plan-cache hits and misses.
 *
 * @module
 */

/** A snapshot of every counter. */
export interface CounterSnapshot {
  /** Blocking waits for a commit: commitAndWait calls and session finish() calls. */
  syncs: number;
  /** Dispatches encoded (not captured). */
  dispatches: number;
  /** Command buffers committed. */
  commandBuffers: number;
  /** Barriers actually issued into a command buffer. */
  barriers: number;
  /**
   * Device nanoseconds spent at barriers: per barrier, from the last dispatch end before it to the
   * first dispatch start after it. Measured only while profiling dispatches (MLXN_PROFILE=dispatch
   * or a trace) on a backend with per-dispatch timings; 0 otherwise.
   */
  barrierNs: number;
  /** Tracked dispatches that needed a barrier. */
  autoBarriers: number;
  /** Tracked dispatches that joined the current concurrent group. */
  autoConcurrent: number;
  /** Recorded passes that replayed a cached plan. */
  planCacheHits: number;
  /** Recorded passes optimised because no plan of their topology was cached. */
  planCacheMisses: number;
  /**
   * Direct passes replayed from an earlier pass's decoded commands instead of decoded (a DecodeLoop's
   * repeated passes, sessions begun with `reuse`), patched or not.
   */
  passReplays: number;
}

/** Mutable counter storage; the encoder increments these fields directly. */
export const counterState: CounterSnapshot = {
  syncs: 0,
  dispatches: 0,
  commandBuffers: 0,
  barriers: 0,
  barrierNs: 0,
  autoBarriers: 0,
  autoConcurrent: 0,
  planCacheHits: 0,
  planCacheMisses: 0,
  passReplays: 0,
};

/**
 * The module's counters.
 *
 * @example
 * ```ts
 * import { counters } from "@mlxn/mlx-native";
 * counters.reset();
 * // … run a forward pass …
 * console.log(counters.snapshot().barriers);
 * ```
 */
export const counters: {
  /** A copy of every counter's current value. */
  snapshot(): CounterSnapshot;
  /** Sets every counter to zero. */
  reset(): void;
} = {
  /** A copy of every counter's current value. */
  snapshot(): CounterSnapshot {
    return { ...counterState };
  },
  /** Sets every counter to zero. */
  reset(): void {
    for (const k of Object.keys(counterState) as (keyof CounterSnapshot)[]) counterState[k] = 0;
  },
};
