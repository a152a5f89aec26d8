/** GraphExecutor / GraphSession / capture mode on a real device (the seed's graph tests and more). */
import { deepStrictEqual, equal, match, ok, throws } from "node:assert/strict";
import { CapturedOpKind, counters, DType, GraphExecutor, MlxDevice, MlxError, ops, SESSION_OPS } from "../mod.ts";
import { randomValues, runDeno, testContext } from "./helpers.ts";

const isCode = (code: string) => (e: unknown) => e instanceof MlxError && e.code === code;

Deno.test("an add through a session (direct or recorded) equals a direct dispatch", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const exec = new GraphExecutor(device);
  using a = device.upload(randomValues(1000, 1)), b = device.upload(randomValues(1000, 2));
  using ref = device.alloc(4000, DType.F32), viaDirect = device.alloc(4000, DType.F32);
  using viaRecorded = device.alloc(4000, DType.F32);
  {
    using enc = device.commandEncoder();
    ops.elementwiseAdd(enc, registry, a, b, ref);
    enc.commitAndWait();
  }
  {
    using s = exec.begin();
    s.elementwiseAdd(a, b, viaDirect);
    s.finish();
  }
  {
    using s = exec.beginRecorded();
    s.elementwiseAdd(a, b, viaRecorded);
    const report = s.finish({ fuse: true, reorder: true, dualBuffer: true });
    equal(report.mode, "recorded");
    equal(report.dispatches, 1);
  }
  deepStrictEqual(viaDirect.readBytes(), ref.readBytes());
  deepStrictEqual(viaRecorded.readBytes(), ref.readBytes());
});

Deno.test("add → barrier → mul in one session equals two separate command buffers", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const exec = new GraphExecutor(device);
  using a = device.upload(randomValues(777, 3)), b = device.upload(randomValues(777, 4));
  using t1 = device.alloc(777 * 4, DType.F32), o1 = device.alloc(777 * 4, DType.F32);
  using t2 = device.alloc(777 * 4, DType.F32), o2 = device.alloc(777 * 4, DType.F32);
  for (const step of [0, 1]) {
    using enc = device.commandEncoder();
    if (step === 0) ops.elementwiseAdd(enc, registry, a, b, t1);
    else ops.elementwiseMul(enc, registry, t1, b, o1);
    enc.commitAndWait();
  }
  using s = exec.begin();
  s.elementwiseAdd(a, b, t2);
  s.barrier();
  s.elementwiseMul(t2, b, o2);
  const report = s.finish();
  deepStrictEqual(report.barriers, [1]);
  deepStrictEqual(o2.readBytes(), o1.readBytes());
});

Deno.test("sessions dropped or disposed without finishing leave the device usable and leak nothing", () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device);
  using a = device.upload(new Float32Array(64).fill(1));
  const before = MlxDevice.liveObjects(device).commandBuffers;
  for (let i = 0; i < 200; i++) {
    // The seed hung after ~64 of these (uncommitted command buffers exhausted Metal's pool).
    using s = i % 2 ? exec.begin() : exec.beginRecorded();
    s.elementwiseAdd(a, a, a);
  }
  equal(MlxDevice.liveObjects(device).commandBuffers, before);
  deepStrictEqual(Array.from(a.read().slice(0, 2)), [1, 1], "abandoned work never ran");
  using s = exec.begin();
  s.elementwiseAdd(a, a, a);
  s.finish();
  equal(a.read()[0], 2);
  throws(() => s.barrier(), isCode("InvalidState"));
});

Deno.test("the session's encoder is an escape hatch into the same command buffer", () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device);
  using x = device.upload(new Float32Array([1, 2, 3, 4]));
  using y = device.alloc(16, DType.F32);
  for (const recorded of [false, true]) {
    y.write(new Float32Array(4));
    using s = recorded ? exec.beginRecorded() : exec.begin();
    s.encoder.dispatch({
      pipeline: exec.registry.get("elementwise_mul_f32"),
      bindings: [x, x, y, [4]],
      grid: 4,
      threadgroup: 4,
      dispatchKind: "threads",
    });
    s.barrier();
    s.elementwiseAdd(y, x, y);
    deepStrictEqual(s.finish().barriers, [1]);
    deepStrictEqual(Array.from(y.read()), [2, 6, 12, 20]);
  }
});

Deno.test("barrier counter: capture-mode barriers are nodes and not counted; replay counts them", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  using a = device.upload(new Float32Array(16).fill(1));
  counters.reset();
  using enc = device.commandEncoder();
  enc.startCapture();
  ok(enc.isCapturing);
  enc.memoryBarrier(); // before any dispatch: no node
  ops.elementwiseAdd(enc, registry, a, a, a);
  enc.memoryBarrier();
  ops.elementwiseAdd(enc, registry, a, a, a);
  deepStrictEqual(counters.snapshot().barriers, 0);
  deepStrictEqual(counters.snapshot().dispatches, 0, "captured dispatches are not encoded yet");
  const nodes = enc.takeCapture()!;
  deepStrictEqual(nodes.map((n) => n.kind), ["dispatch", "barrier", "dispatch"]);
  ok(!enc.isCapturing);
  equal(enc.takeCapture(), null);
  const n0 = nodes[0]!;
  ok(n0.kind === "dispatch");
  equal(n0.opKind, CapturedOpKind.ElemAdd);
  deepStrictEqual(n0.reads, [a.range(), a.range()]);
  deepStrictEqual(n0.writes, [a.range()]);
});

Deno.test("capture annotations: op kind and ranges for the next dispatch, annotate-if-missing", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  using a = device.upload(new Float32Array(16).fill(1));
  using enc = device.commandEncoder();
  enc.startCapture();
  enc.setOpKind(CapturedOpKind.Sdpa);
  enc.setPendingRanges([[a.allocId, 0, 16]], [[a.allocId, 16, 32]]);
  ops.elementwiseAdd(enc, registry, a, a, a);
  ops.elementwiseAdd(enc, registry, a, a, a); // back to the contract's kind and derived ranges
  enc.annotateLastDispatchIfMissing([[a.allocId, 0, 4]], []); // has ranges: unchanged
  const [first, second] = enc.takeCapture()!;
  ok(first!.kind === "dispatch" && second!.kind === "dispatch");
  equal(first!.opKind, CapturedOpKind.Sdpa);
  // The given ranges lie inside what the bindings touch, so the merged accesses are the derived ones.
  deepStrictEqual(first!.reads, [a.range(), a.range()]);
  deepStrictEqual(first!.writes, [a.range()]);
  equal(second!.opKind, CapturedOpKind.ElemAdd);
  deepStrictEqual(second!.writes, [a.range()]);
});

Deno.test("auto barriers: a barrier exactly on conflict, counted; group histogram", () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device, { autoBarriers: true });
  using x = device.upload(randomValues(256, 5)), y = device.upload(randomValues(256, 6));
  using a = device.alloc(1024, DType.F32), b = device.alloc(1024, DType.F32);
  using c = device.alloc(1024, DType.F32);
  counters.reset();
  using s = exec.begin();
  s.elementwiseAdd(x, y, a); // group 1
  s.elementwiseMul(x, y, b); // independent: joins group 1
  s.elementwiseAdd(a, b, c); // RAW on a and b: barrier
  s.gelu(x, a.slice(0, 512)); // WAR on a (c's input): barrier
  s.gelu(y, a.slice(512, 512)); // disjoint slice of a, inputs unrelated: joins
  const stats = s.encoder.groupStats();
  deepStrictEqual(stats.histogram.slice(1), [1, 2]); // one group of 1, two groups of 2
  equal(stats.groups, 3);
  const report = s.finish();
  deepStrictEqual(report.barriers, [2]);
  const c2 = counters.snapshot();
  equal(c2.autoBarriers, 2);
  equal(c2.autoConcurrent, 3);
  // barrierBetween / trackDispatch by hand, as in the seed
  using s2 = exec.begin({ autoBarriers: false });
  s2.trackDispatch([x], [a]);
  s2.elementwiseAdd(x, y, a);
  s2.barrierBetween([a], [b]); // RAW on a: barrier
  s2.elementwiseMul(a, y, b);
  deepStrictEqual(s2.finish().barriers, [1]);
});

Deno.test("validation: a missing barrier is a HazardError naming both dispatches; nothing runs", () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device, { validate: true });
  using x = device.upload(new Float32Array(64).fill(2));
  using t = device.alloc(256, DType.F32), o = device.alloc(256, DType.F32);
  const s = exec.begin({ autoBarriers: false }); // barriers by hand, still validated
  s.elementwiseAdd(x, x, t);
  s.elementwiseMul(t, x, o); // reads t in the same group: RAW race
  throws(() => s.finish(), (e: unknown) => {
    ok(isCode("HazardError")(e), String(e));
    match((e as Error).message, /RAW: dispatch 0 \(elementwise_add_f32\) and dispatch 1 \(elementwise_mul_f32\)/);
    match((e as Error).message, new RegExp(`alloc ${t.allocId} \\[0, 256\\)`));
    return true;
  });
  ok(t.read().every((v) => v === 0), "the racy command buffer was not committed");
  equal(MlxDevice.liveObjects(device).commandBuffers, 0);
  // the same pass with the barrier validates and runs
  using s2 = exec.begin({ autoBarriers: false });
  s2.elementwiseAdd(x, x, t);
  s2.barrier();
  s2.elementwiseMul(t, x, o);
  s2.finish();
  equal(o.read()[0], 8);
});

Deno.test("automatic barriers are the default: a forgotten barrier is placed, direct and recorded", () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device, { validate: true });
  equal(exec.options.autoBarriers, true);
  using x = device.upload(new Float32Array(64).fill(2));
  using t = device.alloc(256, DType.F32), o = device.alloc(256, DType.F32), u = device.alloc(256, DType.F32);
  for (const recorded of [false, true]) {
    o.write(new Float32Array(64));
    using s = recorded ? exec.beginRecorded() : exec.begin();
    s.elementwiseAdd(x, x, t);
    s.elementwiseAdd(x, x, u); // independent: same group
    s.elementwiseMul(t, x, o); // RAW on t: the barrier nobody wrote
    const report = s.finish(recorded ? { reorder: true } : {});
    deepStrictEqual(report.barriers, [1], recorded ? "recorded" : "direct");
    equal(report.groups, 2);
    equal(o.read()[0], 8);
  }
});

Deno.test("finish reports fusions, reorders, barriers per command buffer and times", async () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device);
  const dim = 64, rows = 8, n = rows * dim;
  using x = device.upload(randomValues(n, 7)), w = device.upload(randomValues(dim, 8));
  using sc = device.upload(randomValues(n, 9)), t = device.alloc(n * 4, DType.F32);
  using o = device.alloc(n * 4, DType.F32), z = device.alloc(n * 4, DType.F32);
  const pass = (s: ReturnType<GraphExecutor["begin"]>) => {
    s.rmsNorm(x, w, t, { rows, dim, eps: 1e-6 });
    s.barrier();
    s.elementwiseMul(t, sc, o);
    s.barrier();
    s.gelu(x, z); // independent of the fused pair
  };
  using s1 = exec.beginRecorded();
  pass(s1);
  const r1 = s1.finish({ fuse: true, reorder: true, dualBuffer: true, label: "pass" });
  equal(r1.fusions, 1);
  equal(r1.dispatches, 2);
  deepStrictEqual(r1.barriers, [0, 0]);
  equal(r1.groups, 1);
  ok(r1.gpuNs > 0 && r1.encodingNs > 0 && r1.gpuWaitNs >= 0);
  // async commit
  using s2 = exec.beginRecorded();
  pass(s2);
  const pending = s2.commit({ fuse: true });
  equal(pending.encoders.length, 1);
  const r2 = await pending.completed();
  equal(r2.fusions, 1);
  deepStrictEqual(r2.barriers, [1], "without reorder the explicit barrier before gelu stays");
});

Deno.test("kill switches as options: fusion and reorder off", () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device, { fusion: false, reorder: false });
  equal(exec.options.fusion, false);
  const dim = 32;
  using x = device.upload(randomValues(dim, 1)), w = device.upload(randomValues(dim, 2));
  using t = device.alloc(dim * 4, DType.F32), o = device.alloc(dim * 4, DType.F32);
  using s = exec.beginRecorded();
  s.rmsNorm(x, w, t, { rows: 1, dim, eps: 1e-6 });
  s.barrier();
  s.elementwiseMul(t, w, o);
  const r = s.finish({ fuse: true, reorder: true });
  deepStrictEqual([r.fusions, r.reordered, r.dispatches], [0, 0, 2]);
});

Deno.test("kill switches from the environment (MLXN_FUSION=0, MLXN_REORDER=0, MLXN_PLAN_CACHE=0) with --allow-env", async () => {
  const probe = new URL("./fixtures/switch_probe.ts", import.meta.url).pathname;
  const run = async (env: Record<string, string>) => {
    const out = await runDeno(["run", "--no-prompt", "--quiet", "--allow-ffi", "--allow-env", probe], env);
    ok(out.success, out.stderr);
    return JSON.parse(out.stdout);
  };
  deepStrictEqual(await run({}), { fusions: 1, fusionAllowed: true, reorderAllowed: true, secondPass: "hit" });
  deepStrictEqual(await run({ MLXN_FUSION: "0", MLXN_REORDER: "0" }), {
    fusions: 0,
    fusionAllowed: false,
    reorderAllowed: false,
    secondPass: "hit",
  });
  deepStrictEqual(await run({ MLXN_PLAN_CACHE: "0" }), {
    fusions: 1,
    fusionAllowed: true,
    reorderAllowed: true,
    secondPass: "off",
  });
});

Deno.test("every op of SESSION_OPS is a session method; it refuses a finished session by name", () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device);
  using a = device.upload(new Float32Array(8).fill(1)), out = device.alloc(32, DType.F32);
  const s = exec.begin();
  for (const name of ["elementwiseAdd", "rmsNorm", "axpby", "sdpa", "flashAttnVec", ...Object.keys(SESSION_OPS)]) {
    equal(typeof (s as unknown as Record<string, unknown>)[name], "function", name);
  }
  s.axpby(a, a, out, { alpha: 2, beta: 1 }); // optional trailing arguments stay optional
  s.elementwiseAdd(out, a, out);
  s.finish();
  deepStrictEqual(Array.from(out.read() as Float32Array), new Array(8).fill(4));
  throws(
    () => s.elementwiseAdd(a, a, out),
    (e: unknown) => isCode("InvalidState")(e) && /elementwiseAdd/.test(String(e)),
  );
});
