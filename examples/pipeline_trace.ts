/**
 * Host and device on one timeline for a {@link DecodeLoop} run: the host's encode, wait and readback
 * spans beside each pass's command buffers, as Chrome trace events, and how much the host's encoding
 * of step n + 1 overlapped the device's work on step n.
 *
 * The loop times the host with `performance.now()` and the backend times command buffers on its own
 * clock; {@link calibrateDeviceClock} measures the offset between the two, with a bound on its error,
 * from empty command buffers (a command buffer starts after its commit and ends before its wait
 * returns).
 *
 * @module
 */
import type { DecodeLoop, DecodeRunReport, MlxDevice, TraceEvent } from "../mod.ts";

/** device clock = host clock (`performance.now()` in ns) + `offsetNs`, within ± `errorNs`. */
export interface ClockOffset {
  /** Midpoint of the feasible offsets, ns. */
  readonly offsetNs: number;
  /** Half the width of the feasible interval, ns. */
  readonly errorNs: number;
}

/**
 * Measures the device clock's offset from the host's with `trials` empty command buffers: each
 * bounds the offset from both sides, and the bounds of all trials are intersected. Throws if they do
 * not meet (the clocks drift or run at different rates), which would make a merged timeline wrong.
 */
export function calibrateDeviceClock(device: MlxDevice, trials = 16): ClockOffset {
  let lo = -Infinity, hi = Infinity;
  for (let i = 0; i < trials; i++) {
    const enc = device.commandEncoder();
    const before = performance.now() * 1e6;
    enc.commitAndWait("clock calibration");
    const after = performance.now() * 1e6;
    // before ≤ start − offset and end − offset ≤ after.
    lo = Math.max(lo, enc.gpuEndNs - after);
    hi = Math.min(hi, enc.gpuStartNs - before);
    enc.dispose();
  }
  if (!(lo <= hi)) {
    throw new Error(`calibrateDeviceClock: host and device clocks disagree (offset bounds ${lo} > ${hi} ns)`);
  }
  return { offsetNs: (lo + hi) / 2, errorNs: (hi - lo) / 2 };
}

/** Per step n (but the last): how the host's encoding of step n + 1 sat against the device's step n. */
export interface StepOverlap {
  /** Step n. */
  readonly index: number;
  /** Time the encode span of step n + 1 and the device span of step n share, ns (0: none). */
  readonly overlapNs: number;
  /** Whether encoding of step n + 1 began before the device finished step n. */
  readonly encodeBeganBeforeDeviceEnd: boolean;
  /** Device idle time between step n's last command buffer and step n + 1's first, ns. */
  readonly deviceGapNs: number;
}

function deviceSpan(t: DecodeRunReport["timings"][number]): [number, number] {
  return [Math.min(...t.deviceSpans.map((s) => s[0])), Math.max(...t.deviceSpans.map((s) => s[1]))];
}

/** The overlap of host encoding and device work, step by step, on the device clock. */
export function stepOverlaps(report: DecodeRunReport, clock: ClockOffset): StepOverlap[] {
  const t = report.timings, out: StepOverlap[] = [];
  for (let n = 0; n + 1 < t.length; n++) {
    const [s0, e0] = deviceSpan(t[n]!), [s1] = deviceSpan(t[n + 1]!);
    const encStart = t[n + 1]!.encodeStartNs + clock.offsetNs, encEnd = t[n + 1]!.committedNs + clock.offsetNs;
    out.push({
      index: t[n]!.index,
      overlapNs: Math.max(0, Math.min(encEnd, e0) - Math.max(encStart, s0)),
      encodeBeganBeforeDeviceEnd: encStart < e0,
      deviceGapNs: Math.max(0, s1 - e0),
    });
  }
  return out;
}

/**
 * Chrome trace events of a run: track 1 the host (encode, wait and "read ids" spans), track 2 the
 * device (one span per command buffer), times in µs from the run's first event on the device clock.
 * `loop` and `title` (what the run was, e.g. how its passes were encoded) name the process, so that
 * traces of several runs opened side by side tell themselves apart.
 */
export function pipelineTraceEvents(
  report: DecodeRunReport,
  clock: ClockOffset,
  loop?: Pick<DecodeLoop, "depth" | "readBatch">,
  title?: string,
): TraceEvent[] {
  const pid = 1, host = 1, dev = 2;
  const spans: {
    name: string;
    cat: string;
    tid: number;
    start: number;
    end: number;
    args?: Record<string, unknown>;
  }[] = [];
  const h = (ns: number) => ns + clock.offsetNs;
  for (const t of report.timings) {
    spans.push({
      name: `encode ${t.index}`,
      cat: "host encode",
      tid: host,
      start: h(t.encodeStartNs),
      end: h(t.committedNs),
    });
    spans.push({ name: `wait ${t.index}`, cat: "host wait", tid: host, start: h(t.waitStartNs), end: h(t.waitEndNs) });
    t.deviceSpans.forEach(([s, e], i) =>
      spans.push({ name: `step ${t.index}`, cat: "command buffer", tid: dev, start: s, end: e, args: { part: i } })
    );
  }
  for (const r of report.readbacks) {
    spans.push({
      name: "read ids",
      cat: "host readback",
      tid: host,
      start: h(r.startNs),
      end: h(r.endNs),
      args: { firstStep: r.firstStep, steps: r.steps },
    });
  }
  const origin = Math.min(...spans.map((s) => s.start));
  const name = (title ? `${title}: ` : "") +
    (loop ? `DecodeLoop (depth ${loop.depth}, read every ${loop.readBatch})` : "DecodeLoop");
  const meta = (tid: number, n: string): TraceEvent => ({
    name: "thread_name",
    cat: "",
    ph: "M",
    ts: 0,
    pid,
    tid,
    args: { name: n },
  });
  return [
    { name: "process_name", cat: "", ph: "M", ts: 0, pid, tid: 0, args: { name } },
    meta(host, `host (clock offset ± ${(clock.errorNs / 1e3).toFixed(1)} µs)`),
    meta(dev, "device command buffers"),
    ...spans.map((s): TraceEvent => ({
      name: s.name,
      cat: s.cat,
      ph: "X",
      ts: (s.start - origin) / 1e3,
      dur: Math.max(0, s.end - s.start) / 1e3,
      pid,
      tid: s.tid,
      args: s.args,
    })),
  ];
}
