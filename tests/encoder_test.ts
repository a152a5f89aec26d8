/** CommandEncoder lifecycle, counters, waits, labels, queue order, leaks and registry errors. */
import { deepStrictEqual, equal, match, ok, throws } from "node:assert/strict";
import { counters, DType, KernelRegistry, MlxDevice, MlxError, ops } from "../mod.ts";
import { testContext } from "./helpers.ts";

const isCode = (code: string) => (e: unknown) => e instanceof MlxError && e.code === code;

Deno.test("barrier counter: no-op before any dispatch, counted after each dispatch", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  using a = device.upload(new Float32Array(8).fill(1));
  counters.reset();
  using enc = device.commandEncoder();
  enc.memoryBarrier();
  enc.memoryBarrier();
  equal(enc.barrierCount, 0);
  equal(counters.snapshot().barriers, 0);
  ops.elementwiseAdd(enc, registry, a, a, a);
  enc.memoryBarrier();
  ops.elementwiseAdd(enc, registry, a, a, a);
  enc.memoryBarrier();
  enc.memoryBarrier();
  equal(enc.barrierCount, 3);
  enc.commitAndWait();
  const c = counters.snapshot();
  deepStrictEqual([c.barriers, c.dispatches, c.commandBuffers, c.syncs], [3, 2, 1, 1]);
  deepStrictEqual(Array.from(a.read()), new Array(8).fill(4));
});

Deno.test("lifecycle errors: dispatch after commit, double commit, wait before commit, use after dispose", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  using a = device.upload(new Float32Array(4));
  const enc = device.commandEncoder();
  throws(() => enc.waitUntilCompleted(), isCode("InvalidState"));
  ops.elementwiseAdd(enc, registry, a, a, a);
  enc.commitAndWait();
  equal(enc.state, "completed");
  throws(() => ops.elementwiseAdd(enc, registry, a, a, a), isCode("InvalidState"));
  throws(() => enc.commit(), isCode("InvalidState"));
  throws(() => enc.memoryBarrier(), isCode("InvalidState"));
  enc.waitUntilCompleted(); // waiting again is harmless
  enc.dispose();
  enc.dispose();
  throws(() => ops.elementwiseAdd(enc, registry, a, a, a), isCode("Disposed"));
});

Deno.test("async commit: completed() resolves with GPU times, labels are kept", async () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  using a = device.upload(new Float32Array(1000).fill(1.25));
  using out = device.alloc(4000, DType.F32);
  using enc = device.commandEncoder();
  ops.elementwiseMul(enc, registry, a, a, out);
  enc.commit({ label: "layer.0.ffn" });
  equal(enc.label, "layer.0.ffn");
  await enc.completed();
  equal(enc.state, "completed");
  ok(enc.gpuEndNs >= enc.gpuStartNs && enc.gpuStartNs > 0, "GPU times recorded");
  deepStrictEqual(Array.from(out.read().slice(0, 3)), [1.5625, 1.5625, 1.5625]);
  using enc2 = device.commandEncoder();
  ops.elementwiseMul(enc2, registry, a, a, out);
  counters.reset();
  enc2.commit({ label: "sync-label", wait: true });
  equal(enc2.label, "sync-label");
  equal(enc2.state, "completed", "wait: true blocked until completion");
  equal(counters.snapshot().syncs, 1);
  ok(enc2.gpuEndNs >= enc2.gpuStartNs);
  equal(enc2.gpuNs, enc2.gpuEndNs - enc2.gpuStartNs);
});

Deno.test("command buffers run in commit order: a later one sees an earlier one's writes", async () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const n = 1 << 18;
  using x = device.upload(new Float32Array(n).fill(1));
  using y = device.alloc(n * 4, DType.F32);
  const encs = [];
  for (let i = 0; i < 8; i++) {
    const enc = device.commandEncoder();
    if (i % 2 === 0) ops.elementwiseAdd(enc, registry, x, x, y); // y = 2x
    else ops.elementwiseAdd(enc, registry, y, y, x); // x = 2y
    enc.commit();
    encs.push(enc);
  }
  await encs[encs.length - 1]!.completed();
  for (const e of encs) e.dispose();
  // x: 1 → y=2 → x=4 → … after 8 steps x = 2^8.
  equal(x.read()[n - 1], 256);
  equal(y.read()[0], 128);
});

Deno.test("abandoned encoders release their command buffers: no leak, no hang", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  using a = device.upload(new Float32Array(16).fill(1));
  const before = MlxDevice.liveObjects(device);
  for (let i = 0; i < 500; i++) {
    const enc = device.commandEncoder();
    ops.elementwiseAdd(enc, registry, a, a, a);
    enc.dispose(); // dropped without commit: must not run
  }
  equal(MlxDevice.liveObjects(device).commandBuffers, before.commandBuffers);
  deepStrictEqual(Array.from(a.read()), new Array(16).fill(1), "dropped work never ran");
  using enc = device.commandEncoder();
  ops.elementwiseAdd(enc, registry, a, a, a);
  enc.commitAndWait();
  equal(a.read()[0], 2);
});

Deno.test("an empty command buffer commits and completes", () => {
  using ctx = testContext();
  using enc = ctx.device.commandEncoder();
  enc.commitAndWait();
  equal(enc.state, "completed");
});

Deno.test("unknown kernels give KernelNotFound listing the known ones", () => {
  using ctx = testContext();
  const registry = new KernelRegistry(ctx.device);
  throws(() => registry.get("flash_attn_nonexistent"), (e: unknown) => {
    ok(isCode("KernelNotFound")(e));
    match((e as Error).message, /'flash_attn_nonexistent'.*Known kernels: .*elementwise_add_f32/s);
    return true;
  });
  equal(registry.has("rms_norm_bf16"), true);
  equal(registry.has("nope"), false);
  equal(registry.get("rope_f32"), registry.get("rope_f32"), "pipelines are cached");
});

Deno.test("ops reject NaN/Inf parameters, wrong dtypes and short buffers with InvalidArgument", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  using x = device.alloc(64, DType.F32), w = device.alloc(64, DType.F32), h = device.alloc(32, DType.F16);
  using enc = device.commandEncoder();
  const bad = (fn: () => void, re: RegExp) =>
    throws(fn, (e: unknown) => isCode("InvalidArgument")(e) && re.test((e as Error).message));
  bad(() => ops.rmsNorm(enc, registry, x, w, x, { rows: 1, dim: 16, eps: NaN }), /eps must be finite/);
  bad(() => ops.softcap(enc, registry, x, x, { cap: Infinity }), /cap must be finite/);
  bad(() => ops.softcap(enc, registry, x, x, { cap: 0 }), /cap must be > 0/);
  bad(() => ops.rmsNorm(enc, registry, x, w, x, { rows: 2, dim: 16, eps: 0 }), /holds 64 bytes, needs 128/);
  bad(() => ops.elementwiseAdd(enc, registry, x, h, x), /b must be f32, got f16/);
  bad(() => ops.rope(enc, registry, x, x, x, { theta: 1e4, headDim: 3, seqLen: 1 }), /headDim must be even/);
  bad(() => ops.softmax(enc, registry, x, x, { rows: 0, cols: 4 }), /rows must be an integer >= 1/);
  equal(enc.dispatchCount, 0);
});

Deno.test("closing the device frees everything; later use is Disposed", () => {
  const device = MlxDevice.open();
  const registry = new KernelRegistry(device);
  const before = MlxDevice.liveObjects(device);
  const a = device.upload(new Float32Array(1 << 16).fill(1));
  const enc = device.commandEncoder();
  ops.elementwiseAdd(enc, registry, a, a, a);
  enc.commit(); // in flight at close: close waits for it
  const pending = device.commandEncoder();
  ops.elementwiseAdd(pending, registry, a, a, a);
  device.close();
  device.close();
  const after = MlxDevice.liveObjects(device);
  equal(after.devices, before.devices - 1);
  equal(after.buffers, before.buffers);
  equal(after.commandBuffers, before.commandBuffers);
  throws(() => device.alloc(4), isCode("Disposed"));
  throws(() => a.read(), isCode("Disposed"));
  throws(() => ops.elementwiseAdd(pending, registry, a, a, a), isCode("Disposed"));
});

Deno.test("auto barriers: a rejected dispatch leaves no barrier and no record behind", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  using x = device.upload(new Float32Array(16).fill(1)), y = device.alloc(64, DType.F32);
  using enc = device.commandEncoder({ autoBarriers: true });
  ops.elementwiseAdd(enc, registry, x, x, y); // writes y
  const add = registry.get("elementwise_add_f32");
  // Reads y (a RAW conflict) but its constants are the wrong size: rejected before anything is written.
  throws(
    () =>
      enc.dispatch({ pipeline: add, bindings: [y, x, x, [16, 0]], grid: 16, threadgroup: 16, dispatchKind: "threads" }),
    isCode("InvalidArgument"),
  );
  equal(enc.barrierCount, 0);
  equal(enc.dispatchCount, 1);
  ops.elementwiseAdd(enc, registry, y, x, x); // the real RAW: one barrier
  equal(enc.barrierCount, 1);
  enc.commitAndWait();
  deepStrictEqual(Array.from(x.read() as Float32Array).slice(0, 2), [3, 3]);
});
