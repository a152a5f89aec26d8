/**
 * Recorded sessions on the ops' write path: while an encoder records for the plan cache
 * (startCompactCapture), an op given that encoder writes its records straight into the recorder's
 * words (CaptureRecorder.opBegin / opDispatch) instead of recording a descriptor. The capture must be
 * byte for byte the descriptor path's (words, pipelines, nodes, plan-cache key), a session's finish
 * report and plan-cache outcome the same either way, a refused op must record nothing, and every
 * dispatch the recorder handles specially (pending annotations, kept caller views, no probe yet) must
 * keep the descriptor.
 */
import { deepStrictEqual, equal, notEqual, ok, throws } from "node:assert/strict";
import {
  type CommandEncoder,
  DType,
  type FinishReport,
  GraphExecutor,
  KernelRegistry,
  MlxBuffer,
  type MlxDevice,
  MlxError,
  ops,
} from "../mod.ts";
import { type Capture, CaptureRecorder } from "../src/capture_recorder.ts";
import type { CapturedNode } from "../src/graph/nodes.ts";
import type { DispatchTarget } from "../src/ops/common.ts";
import { Fingerprint } from "../src/plan_cache.ts";
import { openDevice } from "./helpers.ts";
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

/** The dispatches the recorder took on the write path. */
const taken = callCounter(CaptureRecorder.prototype, "opDispatch");

/** A node as plain data: buffers by allocation and range, constants by value. */
function plain(n: CapturedNode): unknown {
  if (n.kind !== "dispatch") return n.kind;
  const bind = (x: unknown) =>
    x instanceof MlxBuffer
      ? ["buf", x.allocId, x.byteOffset, x.byteLength]
      : x === undefined
      ? x
      : Array.from(x as ArrayLike<number>);
  return {
    pipeline: n.pipeline.name,
    bindings: n.bindings?.map(bind),
    grid: n.grid,
    threadgroup: n.threadgroup,
    threadgroupMemory: n.threadgroupMemory,
    dispatchKind: n.dispatchKind,
    opKind: n.opKind,
    reads: n.reads,
    writes: n.writes,
  };
}

/** What a capture is made of, as plain data (its nodes built), then released. */
function summary(c: Capture): unknown {
  const fp = new Fingerprint();
  fp.compute(c, 0);
  const out = {
    words: Array.from(c.words.subarray(0, c.length)),
    nodeCount: c.nodeCount,
    pipelines: c.pipelines.slice(0, c.pipelineCount).map((p) => [p.name, p.handle]),
    opKinds: [...c.opKinds],
    annotated: [...c.annotated].map(([i, n]) => [i, plain(n)]),
    autoChanges: [...c.autoChanges],
    key: Array.from(fp.view()),
    hash: fp.hash,
    nodes: c.nodes().map(plain),
  };
  c.release();
  return out;
}

/** Records `body` on a fresh encoder both ways: straight into the recorder, and by descriptor. */
function bothWays(
  device: MlxDevice,
  autoBarriers: boolean,
  body: (t: DispatchTarget, enc: CommandEncoder) => void,
): { write: unknown; descriptor: unknown; taken: number } {
  const out: unknown[] = [];
  let writeTaken = 0;
  for (const direct of [true, false]) {
    using enc = device.commandEncoder({ autoBarriers });
    enc.startCompactCapture();
    const before = taken.count;
    body(direct ? enc : forwarding(enc), enc);
    if (direct) writeTaken = taken.count - before;
    else equal(taken.count, before, "a descriptor records no write-path dispatch");
    out.push(summary(enc.takeCompactCapture()!));
  }
  return { write: out[0], descriptor: out[1], taken: writeTaken };
}

Deno.test("a recording on the write path captures the descriptor path's words, nodes and key", () => {
  for (const autoBarriers of [false, true]) {
    using device = openDevice();
    const registry = new KernelRegistry(device), bufs = writePathBuffers(device);
    const r = bothWays(device, autoBarriers, (t) => writePathOps(t, registry, bufs));
    // The first dispatch names the device (the probe) through its descriptor; every later one is written.
    equal(r.taken, WRITE_PATH_DISPATCHES - 1);
    deepStrictEqual(r.write, r.descriptor, `autoBarriers ${autoBarriers}`);
    ok((r.write as { words: number[] }).words.length > 200);
    for (const x of allBuffers(bufs)) x.dispose();
  }
});

Deno.test("the write path across writer spills, auto-barrier switches and annotations of the last dispatch", () => {
  for (const autoBarriers of [false, true]) {
    using device = openDevice();
    const registry = new KernelRegistry(device), bufs = writePathBuffers(device);
    const reps = 50; // 50 × 76 dispatches: past the writer's 65,536 words, so records spill to the store
    const r = bothWays(device, autoBarriers, (t, enc) => {
      for (let k = 0; k < reps; k++) {
        writePathOps(t, registry, bufs);
        if (k === 15) enc.autoBarriers = !autoBarriers;
        if (k === 35) enc.autoBarriers = autoBarriers;
        // merges into the last dispatch, found from its first word (over the store and the writer)
        if (k % 7 === 3) enc.trackDispatch([bufs.state], [bufs.norm.slice(0, 16)]);
        if (k % 11 === 5) enc.annotateLastDispatchIfMissing([], [[bufs.sum.allocId, 0, 8]]);
      }
    });
    const words = (r.write as { words: number[] }).words.length;
    ok(words > 65536, `${words} words spill`);
    equal(r.taken, reps * WRITE_PATH_DISPATCHES - 1);
    deepStrictEqual(r.write, r.descriptor, `autoBarriers ${autoBarriers}`);
    for (const x of allBuffers(bufs)) x.dispose();
  }
});

Deno.test("pending annotations, kept caller views and a pass with no probe yet keep the descriptor", () => {
  using device = openDevice();
  const registry = new KernelRegistry(device), bufs = writePathBuffers(device);
  // Pending op kind / ranges: the annotated dispatch takes its descriptor, the next one is written.
  const r = bothWays(device, true, (t, enc) => {
    ops.gelu(t, registry, bufs.a, bufs.out); // the probe
    enc.setPendingRanges([bufs.state.range()], []);
    ops.gelu(t, registry, bufs.a, bufs.out);
    enc.barrierBetween([bufs.b], [bufs.wide]);
    ops.silu(t, registry, bufs.a, bufs.out);
    ops.silu(t, registry, bufs.a, bufs.out);
  });
  equal(r.taken, 1);
  deepStrictEqual(r.write, r.descriptor);
  ok((r.write as { annotated: unknown[] }).annotated.length === 2);

  // startCapture keeps the caller's views: nodes bind the very views the op bound.
  using enc = device.commandEncoder();
  enc.startCapture();
  const before = taken.count, out = bufs.wide.slice(64, 64);
  ops.gelu(enc, registry, bufs.a, bufs.out);
  ops.gelu(enc, registry, bufs.a, out);
  equal(taken.count, before);
  const nodes = enc.takeCapture()!;
  equal(nodes.length, 2);
  ok(nodes[1]!.kind === "dispatch" && nodes[1]!.bindings![1] === out);
  for (const x of allBuffers(bufs)) x.dispose();
});

Deno.test("a refused op records nothing on the write path, not even the pipeline change it staged", () => {
  using device = openDevice();
  const registry = new KernelRegistry(device);
  using a = device.upload(ints(64, 1)), b = device.upload(ints(64, 4));
  using sum = device.alloc(256, DType.F32), prod = device.alloc(256, DType.F32);
  const gone = device.alloc(256, DType.F32);
  gone.dispose();
  const r = bothWays(device, false, (t, enc) => {
    ops.elementwiseAdd(t, registry, a, b, sum);
    const before = enc.isCapturing;
    throws(() => ops.axpby(t, registry, a, gone, prod, { alpha: 1, beta: 1 }), (e) => e instanceof MlxError);
    throws(
      () => ops.elementwiseMul(t, registry, a, b, gone),
      (e) => e instanceof MlxError && e.code === "Disposed",
    );
    ok(before && enc.isCapturing);
    ops.elementwiseMul(t, registry, a, b, prod); // needs its SET_PIPELINE: the refused one staged it unrecorded
    ops.elementwiseMul(t, registry, b, a, prod);
  });
  equal(r.taken, 2);
  deepStrictEqual(r.write, r.descriptor);
  equal((r.write as { nodeCount: number }).nodeCount, 3);
  equal((r.write as { pipelines: unknown[] }).pipelines.length, 2);
});

Deno.test("an encoder whose device closed while recording refuses the op instead of recording it", () => {
  const device = openDevice();
  const registry = new KernelRegistry(device);
  const a = device.upload(ints(8, 1)), out = device.alloc(32, DType.F32);
  const enc = device.commandEncoder();
  enc.startCompactCapture();
  ops.gelu(enc, registry, a, out);
  ops.gelu(enc, registry, a, out);
  device.close();
  notEqual(enc.state, "encoding");
  const before = taken.count;
  throws(() => ops.gelu(enc, registry, a, out), (e) => e instanceof MlxError);
  equal(taken.count, before);
});

/** The parts of a finish report that do not depend on timing. */
function outcome(r: FinishReport): unknown {
  return {
    mode: r.mode,
    planCache: r.planCache,
    fusions: r.fusions,
    reordered: r.reordered,
    barriers: r.barriers,
    dispatches: r.dispatches,
    groups: r.groups,
  };
}

Deno.test("recorded sessions: finish reports, plan-cache hits and results equal on both paths", () => {
  const options = [{}, { fuse: true }, { reorder: true }, { fuse: true, reorder: true }, {
    fuse: true,
    reorder: true,
    dualBuffer: true,
  }];
  for (const autoBarriers of [false, true]) {
    for (const opts of options) {
      const label = `autoBarriers ${autoBarriers} ${JSON.stringify(opts)}`;
      using device = openDevice();
      const registry = new KernelRegistry(device), bufs = writePathBuffers(device);
      const all = allBuffers(bufs), initial = all.map((x) => x.readBytes());
      const reports: unknown[][] = [];
      const results: number[][] = [];
      // Two executors, one starting with each path, passes alternating paths: each later pass hits
      // the plan the first pass (the other path, every other time) cached, so their keys match.
      for (const first of [true, false]) {
        const exec = new GraphExecutor(device), mine: unknown[] = [];
        for (let pass = 0; pass < 4; pass++) {
          all.forEach((x, k) => x.writeBytes(initial[k]!));
          const direct = (pass % 2 === 0) === first;
          const s = exec.beginRecorded({ autoBarriers });
          const before = taken.count;
          writePathOps(direct ? s.encoder : s, registry, bufs);
          equal(taken.count - before, direct ? WRITE_PATH_DISPATCHES - 1 : 0);
          mine.push(outcome(s.finish(opts)));
          results.push(writtenValues(bufs));
        }
        reports.push(mine);
      }
      for (const mine of reports) {
        deepStrictEqual(mine.map((r) => (r as { planCache: string }).planCache), ["miss", "hit", "hit", "hit"], label);
        deepStrictEqual(mine[2], mine[1], label);
        deepStrictEqual(mine[3], mine[1], label);
      }
      deepStrictEqual(reports[0]![0], reports[1]![0], label); // the misses: one per path
      deepStrictEqual(reports[0]![1], reports[1]![1], label);
      if ("fuse" in opts) ok((reports[0]![0] as { fusions: number }).fusions > 0, label);
      // everyOp has hazards between barriers: without automatic barriers which write lands last is
      // up to the backend's threads, so only the automatic-barrier passes have one right result.
      if (autoBarriers) { for (let i = 1; i < results.length; i++) deepStrictEqual(results[i], results[0], label); }
      for (const x of allBuffers(bufs)) x.dispose();
    }
  }
});
