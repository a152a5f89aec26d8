/**
 * Profiling: per-label command-buffer times, and a Chrome trace / Perfetto file (MLXN_TRACE) with a
 * track per concurrent lane, one span per dispatch (kernel and op kind) and an instant event per
 * barrier. Fed by command encoders as they complete.
 *
 * @module
 */

import { counterState } from "./counters.ts";
import { MlxError } from "./errors.ts";

/** Per-dispatch timing as a command buffer reports it. */
export interface ProfiledDispatch {
  /** Dispatch index in its command buffer. */
  readonly index: number;
  /** Kernel name. */
  readonly kernel: string;
  /** Op kind. */
  readonly opKind: string;
  /** Start, backend clock ns. */
  readonly startNs: number;
  /** End, backend clock ns. */
  readonly endNs: number;
}

/** One completed command buffer. */
export interface ProfiledCommandBuffer {
  /** Commit label ("" if none). */
  readonly label: string;
  /** Execution start, backend clock ns. */
  readonly startNs: number;
  /** Execution end, backend clock ns. */
  readonly endNs: number;
  /** Per-dispatch timings (empty unless dispatch profiling is on). */
  readonly dispatches: readonly ProfiledDispatch[];
  /** Dispatch counts at which barriers were issued (a barrier precedes dispatch k). */
  readonly barriersBefore: readonly number[];
}

/** Aggregate GPU time of the command buffers sharing a label. */
export interface LabelStats {
  /** Command buffers. */
  count: number;
  /** Sum of execution times, ns. */
  totalNs: number;
  /** Shortest, ns. */
  minNs: number;
  /** Longest, ns. */
  maxNs: number;
}

/** Aggregate device time of one kernel's dispatches (dispatch profiling). */
export interface KernelStats {
  /** Timed dispatches. */
  count: number;
  /** Sum of their durations, ns. Concurrent dispatches overlap, so shares can sum past 100 %. */
  totalNs: number;
}

/**
 * Device time the barriers of a command buffer cost: for each barrier, from the last end among the
 * dispatches before it (since the previous barrier) to the first start among those after it (up to
 * the next), clamped at 0. Needs per-dispatch timings; 0 without them.
 */
export function barrierGapNs(cb: ProfiledCommandBuffer): number {
  const cuts = cb.barriersBefore;
  if (cuts.length === 0 || cb.dispatches.length === 0) return 0;
  // Per group: latest end and earliest start of its timed dispatches.
  const groups = cuts.length + 1;
  const end = new Array<number>(groups).fill(-Infinity), start = new Array<number>(groups).fill(Infinity);
  for (const d of cb.dispatches) {
    if (d.endNs <= d.startNs) continue; // not timed
    let g = 0;
    while (g < cuts.length && d.index >= cuts[g]!) g++;
    if (d.endNs > end[g]!) end[g] = d.endNs;
    if (d.startNs < start[g]!) start[g] = d.startNs;
  }
  let total = 0;
  for (let g = 0; g + 1 < groups; g++) {
    if (end[g] === -Infinity || start[g + 1] === Infinity) continue;
    total += Math.max(0, start[g + 1]! - end[g]!);
  }
  return total;
}

/** A Chrome trace event. */
export interface TraceEvent {
  /** Event name (kernel, "barrier", label). */
  name: string;
  /** Category (op kind, "barrier", "command buffer"). */
  cat: string;
  /** "X" complete span, "i" instant, "M" metadata. */
  ph: "X" | "i" | "M";
  /** Microseconds from the first command buffer. */
  ts: number;
  /** Duration, microseconds (spans). */
  dur?: number | undefined;
  /** Process. */
  pid: number;
  /** Track: 0 = command buffers, 1… = concurrent lanes. */
  tid: number;
  /** Instant scope. */
  s?: "t" | "p" | "g" | undefined;
  /** Extra details. */
  args?: Record<string, unknown> | undefined;
}

/**
 * Collects what completed command buffers report.
 *
 * @example
 * ```ts
 * import { MlxDevice } from "@mlxn/mlx-native";
 * using device = MlxDevice.open({ profile: "dispatch" });
 * // … run passes …
 * // The profiler exists only when profiling is on (profile option, MLXN_PROFILE or a trace).
 * if (device.profiler) console.table(device.profiler.table());
 * ```
 */
export class Profiler {
  /** Whether per-dispatch timings are collected. */
  readonly dispatches: boolean;
  /** Where the trace goes (written by writeTrace / on device close), if anywhere. */
  readonly tracePath: string | undefined;
  readonly #labels = new Map<string, LabelStats>();
  readonly #kernels = new Map<string, KernelStats>();
  readonly #events: TraceEvent[] = [];
  readonly #traceUndo: string;
  #origin: number | undefined;
  #lanes = 0;

  /**
   * A profiler; `tracePath` implies per-dispatch timings. `traceUndo` is how a user turns the trace
   * off (for error hints), e.g. "unset MLXN_TRACE".
   */
  constructor(
    options: {
      dispatches?: boolean | undefined;
      tracePath?: string | undefined;
      backend?: string | undefined;
      traceUndo?: string | undefined;
    } = {},
  ) {
    this.tracePath = options.tracePath;
    this.#traceUndo = options.traceUndo ?? "drop the trace path";
    this.dispatches = (options.dispatches ?? false) || options.tracePath !== undefined;
    this.#events.push(
      {
        name: "process_name",
        cat: "",
        ph: "M",
        ts: 0,
        pid: 1,
        tid: 0,
        args: { name: `mlx-native (${options.backend ?? "?"})` },
      },
      { name: "thread_name", cat: "", ph: "M", ts: 0, pid: 1, tid: 0, args: { name: "command buffers" } },
    );
  }

  /** Records a completed command buffer (and adds its barriers' device time to `counters.barrierNs`). */
  record(cb: ProfiledCommandBuffer): void {
    counterState.barrierNs += barrierGapNs(cb);
    for (const d of cb.dispatches) {
      if (d.endNs <= d.startNs) continue; // not timed
      const k = this.#kernels.get(d.kernel) ?? { count: 0, totalNs: 0 };
      k.count++;
      k.totalNs += d.endNs - d.startNs;
      this.#kernels.set(d.kernel, k);
    }
    const dur = cb.endNs - cb.startNs;
    const key = cb.label || "(unlabelled)";
    const s = this.#labels.get(key) ?? { count: 0, totalNs: 0, minNs: Infinity, maxNs: 0 };
    s.count++;
    s.totalNs += dur;
    s.minNs = Math.min(s.minNs, dur);
    s.maxNs = Math.max(s.maxNs, dur);
    this.#labels.set(key, s);
    if (this.tracePath !== undefined) this.#trace(cb);
  }

  /** Per-label statistics, in ms, for console.table. */
  table(): Record<
    string,
    { count: number; "total ms": number; "mean ms": number; "min ms": number; "max ms": number }
  > {
    const out: ReturnType<Profiler["table"]> = {};
    for (const [label, s] of this.#labels) {
      out[label] = {
        count: s.count,
        "total ms": +(s.totalNs / 1e6).toFixed(3),
        "mean ms": +(s.totalNs / s.count / 1e6).toFixed(3),
        "min ms": +(s.minNs / 1e6).toFixed(3),
        "max ms": +(s.maxNs / 1e6).toFixed(3),
      };
    }
    return out;
  }

  /** The raw per-label statistics. */
  labels(): ReadonlyMap<string, Readonly<LabelStats>> {
    return this.#labels;
  }

  /** Per-kernel device time (needs dispatch profiling). */
  kernels(): ReadonlyMap<string, Readonly<KernelStats>> {
    return this.#kernels;
  }

  /**
   * Per-kernel device time for console.table, most expensive first: dispatches, total ms, mean µs
   * and share of the command buffers' total time.
   */
  kernelTable(): Record<string, { count: number; "total ms": number; "mean µs": number; "share %": number }> {
    let cbNs = 0;
    for (const s of this.#labels.values()) cbNs += s.totalNs;
    const out: ReturnType<Profiler["kernelTable"]> = {};
    for (const [name, k] of [...this.#kernels].sort((a, b) => b[1].totalNs - a[1].totalNs)) {
      out[name] = {
        count: k.count,
        "total ms": +(k.totalNs / 1e6).toFixed(3),
        "mean µs": +(k.totalNs / k.count / 1e3).toFixed(2),
        "share %": cbNs > 0 ? +(100 * k.totalNs / cbNs).toFixed(1) : 0,
      };
    }
    return out;
  }

  /** The trace events so far. */
  events(): readonly TraceEvent[] {
    return this.#events;
  }

  /**
   * Writes the Chrome trace JSON (Perfetto and chrome://tracing open it). Throws an MlxError
   * (PermissionDenied, or InvalidArgument for a path that cannot be written) on failure.
   */
  writeTrace(path: string | undefined = this.tracePath): void {
    if (path === undefined) throw new MlxError("InvalidArgument", "writeTrace: no path (set MLXN_TRACE or pass one)");
    const undo = path === this.tracePath ? this.#traceUndo : "pass a path you may write";
    assertWritable(path, undo);
    try {
      Deno.writeTextFileSync(path, JSON.stringify({ displayTimeUnit: "ns", traceEvents: this.#events }));
    } catch (e) {
      throw traceWriteError(path, e, undo);
    }
  }

  #trace(cb: ProfiledCommandBuffer): void {
    const origin = this.#origin ??= cb.startNs;
    const us = (ns: number) => (ns - origin) / 1000;
    this.#events.push({
      name: cb.label || "command buffer",
      cat: "command buffer",
      ph: "X",
      ts: us(cb.startNs),
      dur: (cb.endNs - cb.startNs) / 1000,
      pid: 1,
      tid: 0,
      args: { dispatches: cb.dispatches.length, barriers: cb.barriersBefore.length },
    });
    // Groups are the runs of dispatches between barriers; inside one, overlapping spans get
    // different lanes (greedy interval packing), so each lane shows what ran side by side.
    const cuts = [0, ...cb.barriersBefore, Infinity];
    let previousEnd = cb.startNs;
    for (let g = 0; g + 1 < cuts.length; g++) {
      const group = cb.dispatches.filter((d) => d.index >= cuts[g]! && d.index < cuts[g + 1]! && d.endNs > 0);
      if (g > 0) {
        this.#events.push({
          name: "barrier",
          cat: "barrier",
          ph: "i",
          s: "p",
          ts: us(previousEnd),
          pid: 1,
          tid: 0,
          args: { before: cuts[g] },
        });
      }
      const laneEnds: number[] = [];
      for (const d of [...group].sort((a, b) => a.startNs - b.startNs)) {
        let lane = laneEnds.findIndex((end) => end <= d.startNs);
        if (lane < 0) lane = laneEnds.push(0) - 1;
        laneEnds[lane] = d.endNs;
        this.#ensureLane(lane + 1);
        this.#events.push({
          name: d.kernel,
          cat: d.opKind,
          ph: "X",
          ts: us(d.startNs),
          dur: (d.endNs - d.startNs) / 1000,
          pid: 1,
          tid: lane + 1,
          args: { index: d.index, opKind: d.opKind, commandBuffer: cb.label },
        });
        previousEnd = Math.max(previousEnd, d.endNs);
      }
    }
  }

  #ensureLane(tid: number): void {
    while (this.#lanes < tid) {
      this.#lanes++;
      this.#events.push({
        name: "thread_name",
        cat: "",
        ph: "M",
        ts: 0,
        pid: 1,
        tid: this.#lanes,
        args: { name: `lane ${this.#lanes}` },
      });
    }
  }
}

/**
 * Throws PermissionDenied unless writing `path` is already granted (never prompts). `undo` says how
 * the caller asked for the file (e.g. "unset MLXN_TRACE"), for the hint.
 */
export function assertWritable(path: string, undo = "pass a path you may write"): void {
  let state: Deno.PermissionState = "denied";
  try {
    state = Deno.permissions.querySync({ name: "write", path }).state;
  } catch { /* treated as not granted */ }
  if (state !== "granted") {
    throw new MlxError(
      "PermissionDenied",
      `writing the trace file ${path} needs write access: run with --allow-write=${path} (or ${undo})`,
    );
  }
}

/**
 * Creates (or truncates) the trace file now, so that a path in a missing folder or a read-only place
 * fails when profiling starts rather than after all the work. Needs write permission (see
 * {@link assertWritable}).
 */
export function prepareTraceFile(path: string, undo: string): void {
  assertWritable(path, undo);
  try {
    Deno.writeTextFileSync(path, "");
  } catch (e) {
    throw traceWriteError(path, e, undo);
  }
}

/** An MlxError for a trace file that could not be written. */
function traceWriteError(path: string, cause: unknown, undo: string): MlxError {
  const why = cause instanceof Error ? cause.message : String(cause);
  const code = cause instanceof Deno.errors.PermissionDenied || cause instanceof Deno.errors.NotCapable
    ? "PermissionDenied"
    : "InvalidArgument";
  return new MlxError(
    code,
    `could not write the trace file ${path} (${why}): give a path in an existing, writable folder (or ${undo})`,
    { cause },
  );
}
