/** Profiling: per-label command-buffer stats and the Chrome trace file (spans, lanes, barriers). */
import { deepStrictEqual, equal, match, ok, throws } from "node:assert/strict";
import { counters, DType, GraphExecutor, MlxDevice, MlxError, type TraceEvent } from "../mod.ts";
import { runDeno } from "./helpers.ts";

const timed = (() => {
  using d = MlxDevice.open();
  return d.info.perDispatchTiming;
})();

Deno.test({
  name: "the trace file has a span per dispatch, lanes for overlap, and barriers between groups",
  ignore: !timed,
}, () => {
  const dir = Deno.makeTempDirSync();
  const path = `${dir}/trace.json`;
  const device = MlxDevice.open({ trace: path, threads: 2 });
  const exec = new GraphExecutor(device);
  const dim = 1 << 20;
  const x = device.upload(new Float32Array(dim).fill(1)), w = device.upload(new Float32Array(dim).fill(1));
  const a = device.alloc(dim * 4, DType.F32),
    b = device.alloc(dim * 4, DType.F32),
    c = device.alloc(dim * 4, DType.F32);
  for (let pass = 0; pass < 2; pass++) {
    using s = exec.begin();
    s.rmsNorm(x, w, a, { rows: 1, dim, eps: 1e-6 }); // group 1: two independent rows of work
    s.rmsNorm(x, w, b, { rows: 1, dim, eps: 1e-6 });
    s.barrier();
    s.elementwiseAdd(a, b, c); // group 2
    s.finish({ label: `pass ${pass}` });
  }
  const stats = device.profiler!.labels();
  deepStrictEqual([...stats.keys()], ["pass 0", "pass 1"]);
  equal(stats.get("pass 0")!.count, 1);
  device.close(); // writes the trace
  const trace = JSON.parse(Deno.readTextFileSync(path)) as { traceEvents: TraceEvent[] };
  const spans = trace.traceEvents.filter((e) => e.ph === "X" && e.tid > 0);
  const cbs = trace.traceEvents.filter((e) => e.ph === "X" && e.tid === 0);
  const barriers = trace.traceEvents.filter((e) => e.ph === "i");
  deepStrictEqual(cbs.map((e) => e.name), ["pass 0", "pass 1"]);
  equal(spans.length, 6);
  equal(barriers.length, 2);
  deepStrictEqual(spans.map((e) => e.name).sort(), [
    "elementwise_add_f32",
    "elementwise_add_f32",
    "rms_norm_f32",
    "rms_norm_f32",
    "rms_norm_f32",
    "rms_norm_f32",
  ]);
  ok(spans.every((e) => e.cat === (e.name === "rms_norm_f32" ? "RmsNorm" : "ElemAdd")), "op kinds as categories");
  for (let pass = 0; pass < 2; pass++) {
    const mine = spans.filter((e) => e.args!.commandBuffer === `pass ${pass}`);
    const norms = mine.filter((e) => e.name === "rms_norm_f32"),
      add = mine.find((e) => e.name === "elementwise_add_f32")!;
    const cb = cbs[pass]!, barrier = barriers[pass]!;
    // Ordering: every span inside its command buffer; the barrier after both norms, before the add.
    for (const e of mine) ok(e.ts >= cb.ts - 1e-3 && e.ts + e.dur! <= cb.ts + cb.dur! + 1e-3);
    for (const n of norms) ok(barrier.ts >= n.ts + n.dur! - 1e-3, "barrier after the first group");
    ok(add.ts >= barrier.ts - 1e-3, "second group after the barrier");
    // Lanes: spans that overlap in time are on different tracks.
    const [n0, n1] = norms;
    const overlap = Math.max(n0!.ts, n1!.ts) < Math.min(n0!.ts + n0!.dur!, n1!.ts + n1!.dur!);
    if (overlap) ok(n0!.tid !== n1!.tid, "overlapping spans share a lane");
  }
  const lanes = trace.traceEvents.filter((e) => e.ph === "M" && e.name === "thread_name").map((e) => e.args!.name);
  ok(lanes.includes("command buffers") && lanes.includes("lane 1"));
  Deno.removeSync(dir, { recursive: true });
});

Deno.test("per-label command-buffer statistics on every backend", () => {
  using device = MlxDevice.open({ profile: "cb" });
  const exec = new GraphExecutor(device);
  using x = device.upload(new Float32Array(64).fill(1));
  for (const label of ["a", "b", "a"]) {
    using s = exec.begin();
    s.elementwiseAdd(x, x, x);
    s.finish({ label });
  }
  const stats = device.profiler!.labels();
  deepStrictEqual([...stats.keys()], ["a", "b"]);
  equal(stats.get("a")!.count, 2);
  ok(stats.get("a")!.totalNs >= stats.get("a")!.maxNs && stats.get("a")!.minNs <= stats.get("a")!.maxNs);
  equal(device.profiler!.table()["b"]!.count, 1);
});

Deno.test("MLXN_TRACE without write permission is a clear PermissionDenied at open", async () => {
  const probe = new URL("./fixtures/open_probe.ts", import.meta.url).pathname;
  const out = await runDeno(["run", "--no-prompt", "--quiet", "--allow-ffi", "--allow-env", probe], {
    MLXN_TRACE: "/tmp/mlxn-trace-denied.json",
  });
  const r = JSON.parse(out.stdout.trim());
  equal(r.code, "PermissionDenied");
  match(r.message, /--allow-write=\/tmp\/mlxn-trace-denied\.json/);
});

Deno.test({ name: "per-kernel device time from dispatch profiling", ignore: !timed }, () => {
  using device = MlxDevice.open({ profile: "dispatch" });
  const exec = new GraphExecutor(device);
  const dim = 1 << 16;
  using x = device.upload(new Float32Array(dim).fill(1)), w = device.upload(new Float32Array(dim).fill(1));
  using y = device.alloc(dim * 4, DType.F32);
  for (let pass = 0; pass < 3; pass++) {
    using s = exec.begin();
    s.rmsNorm(x, w, y, { rows: 1, dim, eps: 1e-6 });
    s.barrier();
    s.elementwiseAdd(y, x, y);
    s.barrier();
    s.elementwiseAdd(y, x, x);
    s.finish({ label: "pass" });
  }
  const kernels = device.profiler!.kernels();
  deepStrictEqual([...kernels.keys()].sort(), ["elementwise_add_f32", "rms_norm_f32"]);
  equal(kernels.get("rms_norm_f32")!.count, 3);
  equal(kernels.get("elementwise_add_f32")!.count, 6);
  const cbNs = device.profiler!.labels().get("pass")!.totalNs;
  for (const k of kernels.values()) ok(k.totalNs > 0 && k.totalNs <= cbNs, "a kernel's time lies within its buffers'");
  const table = device.profiler!.kernelTable();
  const shares = Object.values(table).map((r) => r["share %"]);
  ok(shares.every((p) => p > 0 && p <= 100));
  deepStrictEqual(Object.keys(table).length, 2);
});

Deno.test("a trace path in a missing folder fails at open, with a hint that fits the option", () => {
  const dir = Deno.makeTempDirSync();
  try {
    const path = `${dir}/missing/trace.json`;
    throws(() => MlxDevice.open({ trace: path }), (e: unknown) => {
      ok(e instanceof MlxError && e.code === "InvalidArgument", String(e));
      match(e.message, /could not write the trace file .*missing\/trace\.json/);
      ok(!e.message.includes("MLXN_TRACE"), "the trace came from the option, not the environment");
      return true;
    });
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("a trace that cannot be written at close frees the device first, then throws an MlxError", () => {
  const dir = Deno.makeTempDirSync();
  const device = MlxDevice.open({ trace: `${dir}/trace.json` });
  const devicesOpen = MlxDevice.liveObjects(device).devices;
  {
    using a = device.upload(new Float32Array([1, 2]));
    using s = new GraphExecutor(device).begin();
    s.elementwiseAdd(a, a, a);
    s.finish();
  }
  Deno.removeSync(dir, { recursive: true }); // the folder vanishes while the device runs
  throws(() => device.close(), (e: unknown) => e instanceof MlxError && e.code === "InvalidArgument");
  ok(device.closed);
  equal(MlxDevice.liveObjects(device).devices, devicesOpen - 1, "the native device was freed");
  device.close(); // closing again is a no-op
});

Deno.test("the trace option without write permission: PermissionDenied without the MLXN_TRACE hint", async () => {
  const probe = new URL("./fixtures/trace_probe.ts", import.meta.url).pathname;
  const out = await runDeno([
    "run",
    "--no-prompt",
    "--quiet",
    "--allow-ffi",
    "--allow-env",
    "--allow-read",
    probe,
    "/tmp/mlxn-opt.json",
  ]);
  const r = JSON.parse(out.stdout.trim());
  equal(r.code, "PermissionDenied");
  match(r.message, /--allow-write=\/tmp\/mlxn-opt\.json/);
  ok(!r.message.includes("MLXN_TRACE"), r.message);
});

Deno.test("counters: a session's finish() is a sync; barrierNs is the device gap at each barrier", () => {
  using device = MlxDevice.open({ profile: "dispatch", threads: 2 });
  const exec = new GraphExecutor(device, { autoBarriers: false });
  const n = 1 << 14;
  using a = device.upload(new Float32Array(n).fill(1)), t = device.alloc(n * 4, DType.F32);
  using out = device.alloc(n * 4, DType.F32);
  counters.reset();
  const s = exec.begin();
  s.elementwiseAdd(a, a, t);
  s.elementwiseAdd(a, a, out);
  s.barrier();
  s.elementwiseMul(t, a, out);
  s.barrier();
  s.elementwiseAdd(out, a, t);
  const pass = s.commit();
  pass.wait();
  const c = counters.snapshot();
  equal(c.syncs, 1, "finish waited once");
  equal(c.barriers, 2);
  const timings = pass.encoders[0]!.dispatchTimings;
  if (!timed || timings === null) return; // no per-dispatch clock on this backend: barrierNs stays 0
  // Independent reference: groups are dispatches {0, 1}, {2}, {3}.
  const at = (i: number) => timings.find((x) => x.index === i)!;
  const gap1 = Math.max(0, at(2).startNs - Math.max(at(0).endNs, at(1).endNs));
  const gap2 = Math.max(0, at(3).startNs - at(2).endNs);
  equal(c.barrierNs, gap1 + gap2);
  ok(c.barrierNs > 0, "a barrier costs some device time");
});
