/**
 * The ops' write path: an op given a direct command encoder writes its records straight into the
 * stream (CommandEncoder.opBegin / opDispatch) instead of dispatching a descriptor. Its stream must
 * be byte for byte the descriptor path's, a refused op must publish nothing (not even the pipeline
 * change it staged), automatic barriers must land exactly where the accesses conflict, and every
 * other kind of target (sessions that record, validating encoders, user targets) keeps the
 * descriptor. Also the barrier policy's bulk dispatch count.
 */
import { deepStrictEqual, equal, ok, throws } from "node:assert/strict";
import { CommandEncoder, DType, GraphExecutor, KernelRegistry, MlxDevice, MlxError, ops } from "../mod.ts";
import { BarrierPolicy } from "../src/barrier_policy.ts";
import { openDevice } from "./helpers.ts";
import { takeWords, tapStreams } from "./fixtures/stream_tap.ts";
import {
  allBuffers,
  callCounter,
  forwarding,
  ints,
  WRITE_PATH_DISPATCHES,
  writePathBuffers,
  writePathOps,
  writtenValues,
} from "./fixtures/write_path_ops.ts";

/** The dispatches direct encoders took on the write path. */
const taken = callCounter(CommandEncoder.prototype, "opDispatch");

Deno.test("the ops' write path encodes the descriptor path's stream, byte for byte", () => {
  for (const autoBarriers of [false, true]) {
    using device = openDevice();
    const chunks = tapStreams(device), registry = new KernelRegistry(device);
    const bufs = writePathBuffers(device);
    const streams: Uint32Array[] = [];
    const barriers: number[] = [];
    for (const direct of [true, false]) {
      const enc = device.commandEncoder({ autoBarriers });
      const before = taken.count;
      writePathOps(direct ? enc : forwarding(enc), registry, bufs);
      // every dispatch of a direct encoder is written by its op; none of a forwarding target's
      equal(taken.count - before, direct ? WRITE_PATH_DISPATCHES : 0);
      equal(enc.dispatchCount, WRITE_PATH_DISPATCHES);
      enc.commit({ wait: true });
      barriers.push(enc.barrierCount);
      streams.push(takeWords(chunks));
    }
    ok(streams[0]!.length > 1000);
    deepStrictEqual(streams[0], streams[1], `autoBarriers ${autoBarriers}`);
    deepStrictEqual(barriers[0], barriers[1]);
    for (const x of allBuffers(bufs)) x.dispose();
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

Deno.test("direct, recording, validating and user targets give the same results", () => {
  const results: number[][] = [];
  // [mode, ops given the session's encoder (the write path where it takes one) or the session]
  const modes = [
    ["direct", true],
    ["direct", false],
    ["recorded", true],
    ["recorded", false],
    ["validate", true],
    ["user", false],
  ] as const;
  for (const [mode, encoder] of modes) {
    using device = openDevice();
    const exec = new GraphExecutor(device);
    const registry = new KernelRegistry(device);
    const bufs = writePathBuffers(device);
    const before = taken.count;
    if (mode === "user") {
      using enc = device.commandEncoder({ autoBarriers: true });
      writePathOps(forwarding(enc), registry, bufs);
      enc.commit({ wait: true });
    } else {
      const s = mode === "recorded"
        ? exec.beginRecorded({ autoBarriers: true })
        : exec.begin({ autoBarriers: true, validate: mode === "validate" });
      writePathOps(encoder ? s.encoder : s, registry, bufs);
      s.finish();
    }
    // a validating encoder and the targets that are not encoders keep the descriptor; a recording
    // writes all but its first dispatch (the probe)
    const written = !encoder || mode === "validate" ? 0 : WRITE_PATH_DISPATCHES - (mode === "recorded" ? 1 : 0);
    equal(taken.count - before, written, `${mode} ${encoder}`);
    results.push(writtenValues(bufs));
    for (const x of allBuffers(bufs)) x.dispose();
  }
  ok(results[0]!.some((v) => v !== 0));
  for (let i = 1; i < results.length; i++) deepStrictEqual(results[i], results[0], `${modes[i]}`);
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
