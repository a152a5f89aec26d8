/**
 * The capture recorder: a recorded pass is kept as stream words plus the pipelines they name, and
 * its graph nodes (bindings, and automatic barriers where on) are derived from that only when asked
 * for.
 */
import { deepStrictEqual, equal, ok, throws } from "node:assert/strict";
import fc from "fast-check";
import { CapturedOpKind, DType, GraphExecutor, type MlxBuffer, MlxError } from "../mod.ts";
import type { DispatchNode } from "../src/graph/nodes.ts";
import { Op } from "../src/native/abi.ts";
import { rng, runDeno, testContext } from "./helpers.ts";

/** The opcodes of the records in `words[0, length)`. */
function opcodes(words: Uint32Array, length: number): number[] {
  const ops: number[] = [];
  for (let at = 0; at < length; at += words[at]! >>> 16) ops.push(words[at]! & 0xff);
  return ops;
}

Deno.test("capture: SET_PIPELINE only where the pipeline changes, as the direct stream writes it", () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device);
  using a = device.upload(new Float32Array(8).fill(1)), out = device.alloc(32, DType.F32);
  using s = exec.beginRecorded({ autoBarriers: false });
  s.elementwiseAdd(a, a, out);
  s.elementwiseAdd(a, a, out);
  s.elementwiseMul(a, a, out);
  s.barrier();
  s.elementwiseMul(a, a, out);
  s.elementwiseAdd(a, a, out);
  const c = s.encoder.takeCompactCapture()!;
  try {
    const ops = opcodes(c.words, c.length);
    equal(ops.filter((o) => o === Op.SET_PIPELINE).length, 3); // add, mul (kept across the barrier), add
    equal(ops.filter((o) => o === Op.BARRIER).length, 1);
    equal(c.nodeCount, 6);
    const kinds = c.nodes().map((n) => n.kind === "dispatch" ? (n as DispatchNode).pipeline.name : "barrier");
    deepStrictEqual(kinds, [
      "elementwise_add_f32",
      "elementwise_add_f32",
      "elementwise_mul_f32",
      "barrier",
      "elementwise_mul_f32",
      "elementwise_add_f32",
    ]);
  } finally {
    c.release();
  }
});

Deno.test("capture: automatic barriers are placed when the nodes are built, none is recorded per dispatch", () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device);
  using a = device.upload(new Float32Array(8).fill(1)), b = device.alloc(32, DType.F32);
  using c2 = device.alloc(32, DType.F32);
  using s = exec.beginRecorded({ autoBarriers: true });
  s.elementwiseAdd(a, a, b); // writes b
  s.elementwiseAdd(b, a, c2); // reads b: a barrier first
  s.elementwiseAdd(a, a, b.slice(0, 16)); // writes b while the group reads it: a barrier first
  s.elementwiseMul(a, a, b.slice(16, 16)); // disjoint from the group's accesses: concurrent
  const c = s.encoder.takeCompactCapture()!;
  try {
    equal(opcodes(c.words, c.length).filter((o) => o === Op.BARRIER).length, 0);
    ok(c.autoBarriers);
    deepStrictEqual(c.nodes().map((n) => n.kind), [
      "dispatch",
      "barrier",
      "dispatch",
      "barrier",
      "dispatch",
      "dispatch",
    ]);
  } finally {
    c.release();
  }
});

Deno.test("capture property: every node rebuilt from the words is the dispatch as it was issued", () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device);
  using big = device.alloc(64 * 64 * 4, DType.F32);
  using other = device.upload(new Float32Array(64).fill(2));
  const add = device.kernels.get("elementwise_add_f32"), mul = device.kernels.get("elementwise_mul_f32");
  fc.assert(
    fc.property(fc.integer({ min: 1, max: 120 }), fc.integer({ min: 0, max: 1 << 30 }), (count, seed) => {
      const r = rng(seed);
      const issued: { pipeline: string; bindings: unknown[]; tg: number; kind?: string }[] = [];
      const views: MlxBuffer[] = [];
      const s = exec.beginRecorded({ autoBarriers: false });
      try {
        const shape: string[] = [];
        for (let i = 0; i < count; i++) {
          if (r() < 0.2) {
            s.barrier();
            if (shape.length > 0) shape.push("barrier"); // none before the first node
            continue;
          }
          const k = Math.floor(r() * 64), n = 1 + Math.floor(r() * 15);
          const out = big.slice(k * 64 * 4, 64 * 4); // a new view object each time
          const inp = r() < 0.5 ? other : big.slice(((k + 1) % 64) * 64 * 4, 64 * 4);
          views.push(out, inp);
          const pipeline = r() < 0.5 ? add : mul, tg = r() < 0.5 ? 16 : 32;
          const kind = r() < 0.1 ? CapturedOpKind.Sdpa : undefined;
          if (kind !== undefined) s.encoder.setOpKind(kind);
          const bindings = [inp, other, out, [n]];
          s.dispatch({ pipeline, bindings, grid: n, threadgroup: tg, dispatchKind: "threads" });
          issued.push({ pipeline: pipeline.name, bindings, tg, ...(kind ? { kind } : {}) });
          shape.push("dispatch");
        }
        if (shape.at(-1) === "barrier") shape.pop(); // a trailing barrier is dropped
        const c = s.encoder.takeCompactCapture()!;
        try {
          const nodes = c.nodes();
          deepStrictEqual(nodes.map((n) => n.kind), shape);
          const dispatches = nodes.filter((n): n is DispatchNode => n.kind === "dispatch");
          equal(dispatches.length, issued.length);
          dispatches.forEach((n, i) => {
            const want = issued[i]!;
            equal(n.pipeline.name, want.pipeline);
            equal(n.bindings!.length, want.bindings.length);
            for (let slot = 0; slot < 3; slot++) {
              // A view of the same bytes; a view of a whole allocation is its owning view itself.
              const got = n.bindings![slot] as MlxBuffer, bound = want.bindings[slot] as MlxBuffer;
              deepStrictEqual(got.range(), bound.range(), `node ${i} slot ${slot}`);
              equal(got.dtype, bound.dtype);
              deepStrictEqual(got.shape, bound.shape);
              if (bound.isWholeAllocation) equal(got, bound, `node ${i} slot ${slot}`);
            }
            deepStrictEqual(n.bindings![3], want.bindings[3]);
            equal(n.grid, (want.bindings[3] as number[])[0]);
            equal(n.threadgroup, want.tg);
            equal(n.dispatchKind, "threads");
            equal(
              n.opKind,
              want.kind ?? (want.pipeline === "elementwise_add_f32" ? CapturedOpKind.ElemAdd : CapturedOpKind.ElemMul),
            );
          });
        } finally {
          c.release();
        }
      } finally {
        s.dispose();
      }
    }),
    { numRuns: 60, seed: 2311 },
  );
});

Deno.test("plan cache: the same pass with and without automatic barriers is two topologies", () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device);
  using a = device.upload(new Float32Array(8).fill(1)), b = device.alloc(32, DType.F32);
  using c = device.alloc(32, DType.F32);
  const pass = (autoBarriers: boolean) => {
    using s = exec.beginRecorded({ autoBarriers });
    s.elementwiseAdd(a, a, b);
    s.elementwiseAdd(b, a, c); // needs a barrier: only automatic barriers place it
    return s.finish({ fuse: true });
  };
  const auto = pass(true);
  equal(auto.planCache, "miss");
  deepStrictEqual(auto.barriers, [1]);
  const manual = pass(false);
  equal(manual.planCache, "miss");
  deepStrictEqual(manual.barriers, [0]);
  equal(pass(true).planCache, "hit");
  deepStrictEqual(pass(false).barriers, [0]);
});

Deno.test("plan cache: keys of one shape compared in turn each keep their records' constants (hits equal fresh runs)", () => {
  using ctx = testContext();
  const { device } = ctx;
  const cached = new GraphExecutor(device), fresh = new GraphExecutor(device, { planCache: false });
  using x = device.upload(new Float32Array(64).map((_, i) => i)), y = device.upload(new Float32Array(64).fill(3));
  using out = device.alloc(8 * 256, DType.F32);
  // Dispatches 0..2 are the same in both topologies; dispatch 3's output moves with `k`. Comparing
  // the first topology's key for a pass of the second writes dispatches 0..2's constants into the
  // first's records before the difference shows: a later pass of the first with its original
  // constants must still get those.
  const run = (exec: GraphExecutor, k: number, alpha: number) => {
    out.write(new Float32Array(8 * 64));
    using s = exec.beginRecorded();
    for (let i = 0; i < 4; i++) s.axpby(x, y, out.slice((i < 3 ? i : 3 + k) * 256, 256), { alpha: alpha + i, beta: 1 });
    const report = s.finish({ fuse: true, reorder: true });
    return { planCache: report.planCache, bytes: out.readBytes() };
  };
  const outcomes: string[] = [];
  for (const [k, alpha] of [[0, 1], [1, 2], [1, 3], [1, 4], [0, 1], [1, 6], [0, 1], [0, 8]] as const) {
    const got = run(cached, k, alpha);
    outcomes.push(got.planCache);
    deepStrictEqual(got.bytes, run(fresh, k, alpha).bytes, `pass k=${k} alpha=${alpha}`);
  }
  deepStrictEqual(outcomes, ["miss", "miss", "miss", "hit", "hit", "hit", "hit", "hit"]);
});

Deno.test("capture: trackDispatch after barriers annotates the last dispatch, found from its words", () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device);
  using a = device.upload(new Float32Array(8).fill(1)), b = device.alloc(32, DType.F32);
  using note = device.alloc(64, DType.F32);
  using s = exec.beginRecorded({ autoBarriers: false });
  s.elementwiseAdd(a, a, b);
  s.elementwiseMul(a, b, b.slice(0, 16));
  s.barrier();
  s.barrier();
  s.trackDispatch([note.slice(16, 16)], [note.slice(32, 16)]);
  const c = s.encoder.takeCompactCapture()!;
  try {
    const nodes = c.nodes();
    deepStrictEqual(nodes.map((n) => n.kind), ["dispatch", "dispatch", "barrier"]); // one trailing barrier dropped
    const [first, second] = nodes as DispatchNode[];
    deepStrictEqual(first!.reads, [a.range(), a.range()]);
    equal(second!.pipeline.name, "elementwise_mul_f32");
    ok(second!.bindings![2] instanceof Object && (second!.bindings![2] as MlxBuffer).byteLength === 16);
    deepStrictEqual(second!.reads, [a.range(), b.range(), note.slice(16, 16).range()]);
    deepStrictEqual(second!.writes, [b.slice(0, 16).range(), note.slice(32, 16).range()]);
  } finally {
    c.release();
  }
});

Deno.test("capture: a buffer collected while its pass records stays allocated until the pass no longer needs it", async () => {
  const r = await runDeno([
    "run",
    "--allow-ffi",
    "--allow-read",
    "--allow-env",
    "--v8-flags=--expose-gc",
    new URL("./fixtures/capture_gc_probe.ts", import.meta.url).pathname,
  ]);
  ok(r.success, r.stderr);
  const got = JSON.parse(r.stdout.trim().split("\n").pop()!);
  deepStrictEqual(got, {
    missHeld: 1, // allocated while only the recording names it
    missReport: "miss",
    missSum: 16, // 8 × (1 + 1)
    missFreed: 0, // freed once the pass no longer needs it
    droppedFreed: 0, // a dropped recording holds no free back
    hitCollected: true, // the view itself was collected...
    hitHeld: 1, // ...its allocation was not
    hitReport: "hit",
    hitSum: 64,
    hitFreed: 0,
    frozenSum: 80, // a frozen pass keeps its buffers for later commits
    frozenHeld: 1,
    frozenFreed: 0,
    nodesSum: 96, // so do the nodes a caller took
    nodesFreed: 0,
  });
});

Deno.test("capture: a buffer disposed before a miss's finish is a Disposed error naming its slot; nothing runs", () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device);
  using a = device.upload(new Float32Array(8).fill(1)), out = device.alloc(32, DType.F32);
  const victim = device.upload(new Float32Array(8).fill(2));
  const s = exec.beginRecorded();
  s.elementwiseAdd(a, a, out);
  s.elementwiseMul(a, victim.slice(0, 16), out.slice(0, 16));
  victim.dispose();
  throws(
    () => s.finish({ fuse: true, reorder: true }),
    (e) =>
      e instanceof MlxError && e.code === "Disposed" &&
      /elementwise_mul_f32: slot 1 \(b\) binds a disposed buffer/.test(e.message),
  );
  deepStrictEqual(Array.from(out.read() as Float32Array), new Array(8).fill(0));
  // The executor and its cache still work.
  using s2 = exec.beginRecorded();
  s2.elementwiseAdd(a, a, out);
  equal(s2.finish().planCache, "miss");
  deepStrictEqual(Array.from(out.read() as Float32Array), new Array(8).fill(2));
});

Deno.test("capture: bindings are views of the bound bytes, the allocation's own view where whole, shared between passes", () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device);
  using bytes = device.alloc(64, DType.U8), f = device.alloc(64, DType.F32);
  const nodesOf = () => {
    using s = exec.beginRecorded({ autoBarriers: false });
    s.dispatch({
      pipeline: device.kernels.get("elementwise_add_f32"),
      bindings: [f.slice(0, 16, { dtype: DType.U8 }), f, f.slice(3 * 4, 4 * 4), [4]],
      grid: 4,
      threadgroup: 4,
      dispatchKind: "threads",
    });
    s.dispatch({
      pipeline: device.kernels.get("elementwise_add_f32"),
      bindings: [f, bytes.slice(3, 16), f.slice(4, 16), [4]],
      grid: 4,
      threadgroup: 4,
      dispatchKind: "threads",
    });
    const nodes = s.encoder.takeCapture()! as DispatchNode[];
    return nodes.map((n) => n.bindings!.slice(0, 3) as MlxBuffer[]);
  };
  const [[a0, a1, a2], [b0, b1, b2]] = nodesOf() as [MlxBuffer[], MlxBuffer[]];
  equal(a1, f); // whole: the allocation's own view
  equal(b0, f);
  deepStrictEqual([a0!.range(), a0!.dtype], [f.slice(0, 16).range(), DType.F32]); // the allocation's dtype where aligned
  deepStrictEqual([a2!.range(), a2!.dtype, a2!.shape], [f.slice(12, 16).range(), DType.F32, [4]]);
  deepStrictEqual([b1!.range(), b1!.dtype], [bytes.slice(3, 16).range(), DType.U8]);
  deepStrictEqual([b2!.range(), b2!.dtype], [f.slice(4, 16).range(), DType.F32]);
  const [[c0], [, c1]] = nodesOf() as [MlxBuffer[], MlxBuffer[]];
  equal(c0, a0); // the same bytes: the same view
  equal(c1, b1);
});

Deno.test("capture: a pass larger than the writer spills to the store; every node and annotation keeps its place", () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device, { planCache: false });
  const count = 5000, n = 4; // about 100,000 stream words: several spills
  using a = device.upload(new Float32Array(n).fill(1)), out = device.alloc(count * n * 4, DType.F32);
  using note = device.alloc(count * 4, DType.F32);
  using s = exec.beginRecorded({ autoBarriers: false });
  for (let i = 0; i < count; i++) {
    s.elementwiseAdd(a, a, out.slice(i * n * 4, n * 4));
    if (i % 7 === 3) s.trackDispatch([note.slice(i * 4, 4)], []);
  }
  const c = s.encoder.takeCompactCapture()!;
  try {
    ok(c.length > 65536, `${c.length} words`);
    const nodes = c.nodes() as DispatchNode[];
    equal(nodes.length, count);
    nodes.forEach((node, i) => {
      deepStrictEqual(node.writes, [out.slice(i * n * 4, n * 4).range()], `node ${i}`);
      const extra = i % 7 === 3 ? [note.slice(i * 4, 4).range()] : [];
      deepStrictEqual(node.reads, [a.range(), a.range(), ...extra], `node ${i}`);
    });
  } finally {
    c.release();
  }
});
