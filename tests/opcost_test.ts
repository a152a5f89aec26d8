/**
 * The ops' write path: an op given a direct command encoder writes its records straight into the
 * stream (CommandEncoder.opBegin / opDispatch) instead of dispatching a descriptor. Its stream must
 * be byte for byte the descriptor path's, a refused op must publish nothing (not even the pipeline
 * change it staged), automatic barriers must land exactly where the accesses conflict, and every
 * other kind of target (sessions that record, validating encoders, user targets) keeps the
 * descriptor. Also the barrier policy's bulk dispatch count.
 */
import { deepStrictEqual, equal, ok, throws } from "node:assert/strict";
import { DType, GraphExecutor, KernelRegistry, type MlxBuffer, MlxDevice, MlxError, ops } from "../mod.ts";
import type { DispatchDescriptor } from "../src/dispatch.ts";
import type { DispatchTarget } from "../src/ops/common.ts";
import { BarrierPolicy } from "../src/barrier_policy.ts";
import type { StreamWriter } from "../src/native/stream.ts";
import { openDevice } from "./helpers.ts";

/** Every chunk of stream words the device's encoders hand to the native side, in order. */
function tapStreams(device: MlxDevice): Uint32Array[] {
  const chunks: Uint32Array[] = [];
  const take = device.takeWriter.bind(device), tapped = new WeakSet<StreamWriter>();
  device.takeWriter = (): StreamWriter => {
    const w = take();
    if (tapped.has(w)) return w;
    tapped.add(w);
    const attach = w.attach.bind(w);
    w.attach = (sink) =>
      attach(
        sink && ((bytes, len) => {
          chunks.push(new Uint32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + len)));
          sink(bytes, len);
        }),
      );
    return w;
  };
  return chunks;
}

/** A target that is not a CommandEncoder: ops dispatch their descriptor to it. */
function forwarding(enc: DispatchTarget): DispatchTarget {
  return {
    dispatch: (d: DispatchDescriptor) => enc.dispatch(d),
    memoryBarrier: () => enc.memoryBarrier(),
  };
}

function ints(n: number, seed: number): Float32Array {
  return Float32Array.from({ length: n }, (_, i) => ((i * 5 + seed) % 11) - 5);
}

/** Calls every op with a write path, over whole buffers, slices and an optional state binding. */
function everyOp(
  t: DispatchTarget,
  r: KernelRegistry,
  b: { a: MlxBuffer; b: MlxBuffer; out: MlxBuffer; wide: MlxBuffer; half: MlxBuffer; state: MlxBuffer },
): void {
  const s0 = b.wide.slice(0, 64 * 4), s1 = b.wide.slice(64 * 4, 64 * 4);
  ops.elementwiseAdd(t, r, b.a, b.b, b.out);
  ops.elementwiseMul(t, r, b.a, b.b, s0);
  ops.siluMul(t, r, b.a, b.b, s1, 17);
  ops.elementwiseAdd(t, r, b.half, b.half, b.half); // f16, in place
  ops.gelu(t, r, b.a, s0);
  ops.silu(t, r, s0, s1, 33);
  ops.softcap(t, r, b.a, b.out, { cap: 3 });
  ops.axpby(t, r, b.a, s1, b.out, { alpha: 0.5, beta: -2 });
  ops.stridedCopy(t, r, b.a, b.wide, { rows: 4, cols: 8, srcStride: 16, dstStride: 20 });
  ops.stridedCopy(t, r, b.a, s1, {
    rows: 2,
    cols: 24,
    srcStride: 30,
    state: b.state,
    dstPosStride: 4,
    maxPositions: 3,
  });
  t.memoryBarrier();
  ops.elementwiseAdd(t, r, s0, s1, s0);
  const rows = { rows: 4, dim: 16, eps: 1e-5 };
  ops.rmsNorm(t, r, b.a, b.b, s0, rows);
  ops.rmsNorm(t, r, b.half, b.half.slice(0, 32), b.half.slice(32, 32), { rows: 1, dim: 16, eps: 0 });
  ops.rmsNormMul(t, r, b.a, b.b, s0, s1, rows);
  ops.rmsNormMulAdd(t, r, b.a, b.b, s1, b.out, b.wide, { rows: 2, dim: 32, eps: 1e-6 });
  ops.rmsNormNoScale(t, r, b.wide, b.out, rows);
  ops.softmax(t, r, b.a, b.wide.slice(512, 1024), { rows: 3, cols: 70 });
  ops.rope(t, r, b.a, s0, b.state, { theta: 10000, headDim: 16, seqLen: 1 });
  const heads = { theta: 500, headDim: 16, ropeDim: 8, nHeads: 2, seqLen: 1 };
  ops.ropeNeox(t, r, b.a, s1, b.state, heads);
  ops.ropeNorm(t, r, b.a, b.wide, undefined, { ...heads, state: b.state, outPosStride: 32, maxPositions: 4 });
  ops.ropeNeox(t, r, b.a, b.out, b.state, { ...heads, freqFactors: b.b.slice(0, 16) });
  ops.matmul(t, r, b.a, b.b, s0, { m: 2, n: 8, k: 16 });
  ops.matmul(t, r, b.a, b.b, s1, { m: 1, n: 8, k: 16, residual: s1, constantWeights: true });
  ops.matmul(t, r, b.a, b.b, b.out, { m: 1, n: 8, k: 32, swiglu: true });
}

function buffers(device: MlxDevice) {
  return {
    a: device.upload(ints(640, 1)),
    b: device.upload(ints(640, 2)),
    out: device.alloc(64 * 4, DType.F32),
    wide: device.alloc(640 * 4, DType.F32),
    half: device.upload(ints(48, 3), DType.F16),
    state: device.upload(new Uint32Array([0])),
  };
}

Deno.test("the ops' write path encodes the descriptor path's stream, byte for byte", () => {
  for (const autoBarriers of [false, true]) {
    using device = openDevice();
    const chunks = tapStreams(device), registry = new KernelRegistry(device);
    const bufs = buffers(device);
    const streams: Uint32Array[] = [];
    const barriers: number[] = [];
    for (const direct of [true, false]) {
      const enc = device.commandEncoder({ autoBarriers });
      everyOp(direct ? enc : forwarding(enc), registry, bufs);
      equal(enc.dispatchCount, 24);
      enc.commit({ wait: true });
      barriers.push(enc.barrierCount);
      streams.push(Uint32Array.from(chunks.splice(0).flatMap((c) => Array.from(c))));
    }
    ok(streams[0]!.length > 100);
    deepStrictEqual(streams[0], streams[1], `autoBarriers ${autoBarriers}`);
    deepStrictEqual(barriers[0], barriers[1]);
    for (const x of Object.values(bufs)) x.dispose();
  }
});

Deno.test("a refused op publishes nothing, not even the pipeline change it staged", () => {
  using device = openDevice();
  const registry = new KernelRegistry(device);
  const av = ints(64, 1), bv = ints(64, 4);
  using a = device.upload(av), b = device.upload(bv);
  using sum = device.alloc(256, DType.F32), prod = device.alloc(256, DType.F32);
  const gone = device.alloc(256, DType.F32);
  gone.dispose();
  using enc = device.commandEncoder();
  ops.elementwiseAdd(enc, registry, a, b, sum);
  throws(() => ops.axpby(enc, registry, a, gone, prod, { alpha: 1, beta: 1 }), (e) => e instanceof MlxError);
  throws(() => ops.elementwiseMul(enc, registry, a, b, gone), (e) => e instanceof MlxError && e.code === "Disposed");
  equal(enc.dispatchCount, 1);
  ops.elementwiseMul(enc, registry, a, b, prod); // needs its SET_PIPELINE: the refused one staged it unpublished
  enc.commit({ wait: true });
  deepStrictEqual(Array.from(sum.read()), Array.from(av, (x, i) => x + bv[i]!));
  deepStrictEqual(Array.from(prod.read()), Array.from(av, (x, i) => x * bv[i]!));
});

Deno.test("automatic barriers on the write path: exactly one per hazard, none between disjoint slices", () => {
  using device = openDevice();
  const exec = new GraphExecutor(device);
  const N = 64, E = 16;
  using x = device.upload(ints(E, 1)), y = device.upload(ints(E, 2));
  using acc = device.alloc(E * 4, DType.F32), wide = device.alloc(N * E * 4, DType.F32);
  const slices = Array.from({ length: N }, (_, i) => wide.slice(i * E * 4, E * 4));
  const s = exec.begin({ autoBarriers: true });
  for (let i = 0; i < N; i++) s.elementwiseAdd(x, y, slices[(i * 37) % N]!); // disjoint: one group
  s.elementwiseAdd(x, y, acc); // another allocation: same group
  for (let i = 0; i < 5; i++) s.elementwiseAdd(acc, y, acc); // read-modify-write: a barrier before each
  s.axpby(acc, slices[3]!, slices[5]!, { alpha: 1, beta: 1 }); // reads what the chain wrote last
  const report = s.finish();
  deepStrictEqual(report.barriers, [6]);
  const xv = ints(E, 1), yv = ints(E, 2), accv = Array.from(xv, (v, i) => v + 6 * yv[i]!);
  deepStrictEqual(Array.from(acc.read()), accv);
  const w = wide.read() as Float32Array;
  deepStrictEqual(Array.from(w.subarray(5 * E, 6 * E)), accv.map((v, i) => v + xv[i]! + yv[i]!));
  deepStrictEqual(Array.from(w.subarray(0, E)), Array.from(xv, (v, i) => v + yv[i]!));
});

Deno.test("recording, validating and user targets keep the descriptor path, with the same results", () => {
  const results: number[][] = [];
  for (const mode of ["direct", "recorded", "validate", "user"] as const) {
    using device = openDevice();
    const exec = new GraphExecutor(device);
    const registry = new KernelRegistry(device);
    const bufs = buffers(device);
    if (mode === "user") {
      using enc = device.commandEncoder({ autoBarriers: true });
      everyOp(forwarding(enc), registry, bufs);
      enc.commit({ wait: true });
    } else {
      const s = mode === "recorded"
        ? exec.beginRecorded()
        : exec.begin({ autoBarriers: true, validate: mode === "validate" });
      everyOp(s, registry, bufs);
      s.finish();
    }
    results.push([...bufs.out.read(), ...bufs.wide.read(), ...bufs.half.read()]);
    for (const x of Object.values(bufs)) x.dispose();
  }
  for (let i = 1; i < results.length; i++) deepStrictEqual(results[i], results[0]);
});

Deno.test("ops on a closed device or a committed encoder still refuse with MlxError", () => {
  const device = MlxDevice.open({ backend: "cpu" });
  const registry = new KernelRegistry(device);
  using a = device.upload(ints(8, 1)), out = device.alloc(32, DType.F32);
  const enc = device.commandEncoder();
  ops.gelu(enc, registry, a, out);
  enc.commit({ wait: true });
  throws(() => ops.gelu(enc, registry, a, out), (e) => e instanceof MlxError && e.code === "InvalidState");
  device.close();
});

Deno.test("BarrierPolicy.dispatchedMany counts like as many dispatched() calls", () => {
  const sizes = [0, 1, 3, 64, 65, 200, 7, 0, 63];
  const one = new BarrierPolicy(false), many = new BarrierPolicy(false);
  let total = 0;
  for (const n of sizes) {
    for (let k = 0; k < n; k++) one.dispatched();
    many.dispatchedMany(n);
    many.dispatchedMany(0);
    many.dispatchedMany(-3); // counts nothing, as a loop of -3 calls would
    total += n;
    one.endGroup();
    many.endGroup();
  }
  one.dispatched();
  many.dispatchedMany(1); // an open group
  deepStrictEqual(many.stats(total + 1), one.stats(total + 1));
  equal(one.stats(total + 1).groups, sizes.filter((n) => n > 0).length + 1);
});

Deno.test("plan-cache hits count their groups in bulk: the same stats as the miss", () => {
  using device = openDevice();
  const exec = new GraphExecutor(device);
  const E = 16;
  using x = device.upload(ints(E, 1)), y = device.upload(ints(E, 2));
  using acc = device.alloc(E * 4, DType.F32), wide = device.alloc(8 * E * 4, DType.F32);
  const stats = [];
  for (let pass = 0; pass < 3; pass++) {
    const s = exec.beginRecorded();
    for (let i = 0; i < 8; i++) s.elementwiseAdd(x, y, wide.slice(i * E * 4, E * 4));
    s.elementwiseAdd(x, y, acc);
    for (let i = 0; i < 3; i++) s.elementwiseAdd(acc, y, acc);
    const pending = s.commit();
    const report = pending.wait();
    equal(pending.encoders.length, 1);
    stats.push({ outcome: report.planCache, groups: pending.encoders[0]!.groupStats() });
  }
  equal(stats[0]!.outcome, "miss");
  equal(stats[2]!.outcome, "hit");
  deepStrictEqual(stats[2]!.groups, stats[0]!.groups);
  equal(stats[0]!.groups.dispatches, 12);
});
