/**
 * Property tests (fast-check) of the graph engine.
 *
 * On the device: random programs of 1–300 dispatches of real kernels over shared allocations and
 * overlapping/disjoint slices give bit-identical results in every mode — direct with a barrier after
 * every op (the ground truth), direct with auto barriers, recorded, +fuse, +reorder, +dual buffer —
 * and every mode passes the hazard validator.
 *
 * Pure: after reorder every RAW/WAR/WAW dependency of the original order still holds; barriers
 * recomputed from ranges leave no hazard; removing any one needed barrier is always reported.
 */
import { deepStrictEqual, equal, ok } from "node:assert/strict";
import fc from "fast-check";
import {
  BARRIER,
  barrierLowerBound,
  type CapturedNode,
  CapturedOpKind as K,
  ComputeGraph,
  countRedundantBarriers,
  dependencyDepth,
  type DispatchNode,
  DType,
  findHazards,
  GraphExecutor,
  type GraphSession,
  type MlxBuffer,
} from "../mod.ts";
import { placeBarriers } from "../src/graph/barriers.ts";
import type { MemRange } from "../src/graph/ranges.ts";
import { reorderLevels, reorderNodes } from "../src/graph/reorder.ts";
import {
  dependent,
  referenceDepth,
  referenceHazards,
  referenceLookahead,
  referenceRedundantBarriers,
} from "./graph_reference.ts";
import { randomValues, testContext } from "./helpers.ts";

// ---- random programs on the device ------------------------------------------------------------

const ALLOCS = 3, ELEMS = 1024, DIM = 64;

/** A view: allocation index, first element, element count. */
type View = readonly [alloc: number, first: number, count: number];
type Op =
  | { op: "add" | "mul" | "axpby"; a: View; b: View; out: View }
  | { op: "gelu" | "softmax" | "norm"; a: View; out: View }
  | { op: "normMul"; x: View; tmp: View; s: View; out: View; residual?: View; out2?: View };

const overlaps = (p: View, q: View) => p[0] === q[0] && p[1] < q[1] + q[2] && q[1] < p[1] + p[2];
const same = (p: View, q: View) => p[0] === q[0] && p[1] === q[1] && p[2] === q[2];
/** An output may be exactly an input (element-wise in place) or disjoint from all of them. */
const outputOk = (out: View, inputs: View[]) => inputs.every((i) => same(i, out) || !overlaps(i, out));

const viewArb = (count: number) =>
  fc.tuple(fc.integer({ min: 0, max: ALLOCS - 1 }), fc.integer({ min: 0, max: ELEMS / count - 1 }))
    .map(([a, k]): View => [a, k * count, count]);
// Some views start at half-size offsets, so views of two sizes overlap partially.
const anyView = (count: number) =>
  fc.oneof(
    viewArb(count),
    fc.tuple(fc.integer({ min: 0, max: ALLOCS - 1 }), fc.integer({ min: 0, max: 6 })).map(
      ([a, k]): View => [a, k * 128, count],
    ),
  );

const opArb: fc.Arbitrary<Op | null> = fc.integer({ min: 0, max: 2 }).chain((sizeClass) => {
  const n = [64, 128, 256][sizeClass]!;
  const v = anyView(n);
  return fc.oneof(
    fc.record({ op: fc.constantFrom("add", "mul", "axpby") as fc.Arbitrary<"add">, a: v, b: v, out: v }).map((o) =>
      outputOk(o.out, [o.a, o.b]) ? o : null
    ),
    fc.record({ op: fc.constantFrom("gelu", "softmax", "norm") as fc.Arbitrary<"gelu">, a: v, out: v }).map((o) =>
      outputOk(o.out, [o.a]) ? o : null
    ),
    fc.record({ x: v, tmp: v, s: v, out: v, withAdd: fc.boolean(), residual: v, out2: v }).map((o): Op | null => {
      if (!outputOk(o.tmp, [o.x]) || overlaps(o.tmp, o.s) || !outputOk(o.out, [o.tmp, o.s])) return null;
      if (!o.withAdd) return { op: "normMul", x: o.x, tmp: o.tmp, s: o.s, out: o.out };
      if (!outputOk(o.out2, [o.out, o.residual]) || overlaps(o.residual, o.out) && !same(o.residual, o.out)) {
        return null;
      }
      return { op: "normMul", x: o.x, tmp: o.tmp, s: o.s, out: o.out, residual: o.residual, out2: o.out2 };
    }),
  );
});

const programArb = fc.array(opArb, { minLength: 1, maxLength: 260, size: "max" })
  .map((ops) => ops.filter((o): o is Op => o !== null))
  .filter((ops) => ops.length > 0);

/** Encodes a program; `barrier` is called wherever the ground truth needs ordering. */
function emit(s: GraphSession, prog: Op[], views: (v: View) => MlxBuffer, w: MlxBuffer, barrier: () => void): void {
  for (const o of prog) {
    const rows = (o.op === "normMul" ? o.x[2] : o.a[2]) / DIM;
    switch (o.op) {
      case "add":
        s.elementwiseAdd(views(o.a), views(o.b), views(o.out));
        break;
      case "mul":
        s.elementwiseMul(views(o.a), views(o.b), views(o.out));
        break;
      case "axpby":
        s.axpby(views(o.a), views(o.b), views(o.out), { alpha: 0.5, beta: -0.25 });
        break;
      case "gelu":
        s.gelu(views(o.a), views(o.out));
        break;
      case "softmax":
        s.softmax(views(o.a), views(o.out), { rows, cols: DIM });
        break;
      case "norm":
        s.rmsNorm(views(o.a), w, views(o.out), { rows, dim: DIM, eps: 1e-5 });
        break;
      case "normMul":
        s.rmsNorm(views(o.x), w, views(o.tmp), { rows, dim: DIM, eps: 1e-5 });
        barrier();
        s.elementwiseMul(views(o.tmp), views(o.s), views(o.out));
        if (o.residual && o.out2) {
          barrier();
          s.elementwiseAdd(views(o.out), views(o.residual), views(o.out2));
        }
        break;
    }
    barrier();
  }
}

Deno.test("random programs: direct, auto-barrier, recorded, +fuse, +reorder, +dual buffer are bit-identical", () => {
  using ctx = testContext({ validate: true });
  const { device } = ctx;
  const exec = new GraphExecutor(device);
  const allocs = Array.from({ length: ALLOCS }, () => device.alloc(ELEMS * 4, DType.F32));
  const w = device.upload(randomValues(DIM, 99, DType.F32, 0.5, 1.5));
  const init = allocs.map((_, i) => randomValues(ELEMS, 1000 + i));
  const views = (v: View) => allocs[v[0]]!.slice(v[1] * 4, v[2] * 4);
  let fusionsSeen = 0, reorderedSeen = 0, dualSplits = 0, longest = 0;
  type Mode = {
    name: string;
    recorded: boolean;
    auto: boolean;
    explicit: boolean;
    finish: Parameters<GraphSession["finish"]>[0];
  };
  const modes: Mode[] = [
    { name: "direct+auto", recorded: false, auto: true, explicit: false, finish: {} },
    { name: "recorded", recorded: true, auto: false, explicit: true, finish: {} },
    { name: "recorded+fuse", recorded: true, auto: false, explicit: true, finish: { fuse: true } },
    {
      name: "recorded+fuse+reorder",
      recorded: true,
      auto: false,
      explicit: true,
      finish: { fuse: true, reorder: true },
    },
    {
      name: "recorded+fuse+reorder+dual",
      recorded: true,
      auto: false,
      explicit: true,
      finish: { fuse: true, reorder: true, dualBuffer: true },
    },
    {
      name: "recorded+auto+reorder+dual",
      recorded: true,
      auto: true,
      explicit: false,
      finish: { reorder: true, dualBuffer: true },
    },
  ];
  const runMode = (prog: Op[], m: Mode | null): Uint32Array[] => {
    allocs.forEach((a, i) => a.write(init[i]!));
    using s = m?.recorded
      ? exec.beginRecorded({ autoBarriers: m.auto })
      : exec.begin({ autoBarriers: m?.auto ?? false });
    const explicit = m === null || m.explicit;
    emit(s, prog, views, w, () => explicit && s.barrier());
    const report = s.finish(m?.finish ?? {});
    if (m?.finish?.fuse) fusionsSeen += report.fusions;
    if (m?.finish?.reorder) reorderedSeen += report.reordered;
    if (report.barriers.length === 2 && report.dispatches > 64) dualSplits++;
    return allocs.map((a) => new Uint32Array(a.readBytes().buffer));
  };
  /**
   * Elements a fusion may legitimately leave with other bytes: their last writer in the recorded
   * program is a node the fusion consumed, and their last writer in the fused program is not the
   * fused node that produces that same final write (so the recorded value was a dropped
   * intermediate). Everything else must match bit for bit; a wrongly dropped write that someone
   * reads shows up in that reader's outputs.
   */
  const fusionMask = (prog: Op[]): Uint8Array[] => {
    const s = exec.beginRecorded();
    emit(s, prog, views, w, () => s.barrier());
    const recorded = s.encoder.takeCapture()!;
    s.dispose();
    const g = new ComputeGraph(recorded);
    g.fuse();
    const kept = new Set(g.nodes);
    type Last = { node: CapturedNode; range: MemRange } | undefined;
    const lastWriters = (nodes: readonly CapturedNode[]) => {
      const last = allocs.map(() => new Array<Last>(ELEMS));
      for (const n of nodes) {
        if (n.kind !== "dispatch") continue;
        for (const range of n.writes) {
          const i = allocs.findIndex((a) => a.allocId === range[0]);
          last[i]!.fill({ node: n, range }, range[1] / 4, range[2] / 4);
        }
      }
      return last;
    };
    const before = lastWriters(recorded), after = lastWriters(g.nodes);
    return before.map((lw, i) =>
      Uint8Array.from(lw, (b, k) => {
        if (!b || kept.has(b.node)) return 0;
        const a = after[i]![k];
        return a && !kept.has(a.node) && a.range === b.range ? 0 : 1;
      })
    );
  };
  const masked = (bits: Uint32Array[], dead: Uint8Array[] | null) =>
    bits.map((b, i) => Array.from(b, (x, k) => dead && dead[i]![k] ? 0 : x).join(","));
  fc.assert(
    fc.property(programArb, (prog) => {
      longest = Math.max(longest, prog.reduce((n, o) => n + (o.op !== "normMul" ? 1 : o.out2 ? 3 : 2), 0));
      const truth = runMode(prog, null); // a barrier after every op
      const dead = fusionMask(prog);
      for (const m of modes) {
        const d = m.finish?.fuse ? dead : null;
        deepStrictEqual(masked(runMode(prog, m), d), masked(truth, d), `mode ${m.name} differs`);
      }
    }),
    { numRuns: 40, seed: 20261121 },
  );
  ok(fusionsSeen > 0, "the fusion pass fired on the random programs");
  ok(reorderedSeen > 0, "the reorder pass moved nodes on the random programs");
  ok(dualSplits > 0, "some programs were long enough to split over two command buffers");
  ok(longest >= 200, `the longest program had only ${longest} dispatches`);
  for (const a of allocs) a.dispose();
  w.dispose();
});

// ---- pure properties ----------------------------------------------------------------------------

const rangeArb: fc.Arbitrary<MemRange> = fc.tuple(
  fc.integer({ min: 1, max: 4 }),
  fc.integer({ min: 0, max: 15 }),
  fc.integer({ min: 1, max: 4 }),
).map(([a, k, len]) => [a, k * 64, (k + len) * 64]);

const nodeArb: fc.Arbitrary<DispatchNode> = fc.record({
  reads: fc.array(rangeArb, { maxLength: 3 }),
  writes: fc.array(rangeArb, { maxLength: 2 }),
  kind: fc.constantFrom(K.Other, K.Other, K.Other, K.ElemAdd, K.Softmax),
}).map(({ reads, writes, kind }) => ({ kind: "dispatch", pipeline: { name: "k" }, opKind: kind, reads, writes }));

const graphArb = fc.array(fc.oneof({ weight: 6, arbitrary: nodeArb }, { weight: 1, arbitrary: fc.constant(BARRIER) }), {
  minLength: 1,
  maxLength: 300,
  size: "max",
});

Deno.test("reorder keeps every RAW/WAR/WAW dependency of the original order", () => {
  fc.assert(
    fc.property(graphArb, (nodes: CapturedNode[]) => {
      const original = nodes.filter((n): n is DispatchNode => n.kind === "dispatch");
      const g = new ComputeGraph(nodes);
      g.reorder();
      const pos = new Map(g.nodes.map((n, i) => [n, i]));
      equal(pos.size, original.length, "every dispatch kept exactly once");
      for (let j = 0; j < original.length; j++) {
        for (let i = 0; i < j; i++) {
          if (dependent(original[i]!, original[j]!)) ok(pos.get(original[i]!)! < pos.get(original[j]!)!);
        }
      }
      // … and barriers recomputed from ranges leave no hazard.
      deepStrictEqual(findHazards(placeBarriers(g.nodes, false)), []);
    }),
    { numRuns: 300, seed: 7 },
  );
});

Deno.test("the validator reports the removal of any one needed barrier (catch rate 100%)", () => {
  let removed = 0, caught = 0;
  fc.assert(
    fc.property(graphArb, (nodes: CapturedNode[]) => {
      const placed = placeBarriers(nodes, false); // every barrier here separates a real conflict
      deepStrictEqual(findHazards(placed), []);
      placed.forEach((n, i) => {
        if (n.kind !== "barrier") return;
        removed++;
        if (findHazards(placed.filter((_, k) => k !== i)).length > 0) caught++;
      });
    }),
    { numRuns: 200, seed: 11 },
  );
  ok(removed > 100, `only ${removed} barriers were exercised`);
  equal(caught, removed, `validator caught ${caught} of ${removed} removed barriers`);
});

Deno.test("fusion never leaves a hazard in an explicit-barrier program", () => {
  const X: MemRange = [1, 0, 256], Wt: MemRange = [2, 0, 64];
  fc.assert(
    fc.property(graphArb, fc.array(rangeArb, { minLength: 3, maxLength: 3 }), (nodes, [t, s, o]) => {
      // Plant a norm → mul pattern amid random work, with barriers placed from ranges.
      const norm: DispatchNode = {
        kind: "dispatch",
        pipeline: { name: "rms_norm_f32" },
        opKind: K.RmsNorm,
        reads: [X, Wt],
        writes: [t!],
      };
      const mul: DispatchNode = {
        kind: "dispatch",
        pipeline: { name: "elementwise_mul_f32" },
        opKind: K.ElemMul,
        reads: [t!, s!],
        writes: [o!],
      };
      const mid = Math.floor(nodes.length / 2);
      const program = placeBarriers([...nodes.slice(0, mid), norm, BARRIER, mul, ...nodes.slice(mid)], true);
      const g = new ComputeGraph(program);
      g.fuse();
      deepStrictEqual(findHazards(g.nodes), []);
    }),
    { numRuns: 200, seed: 3 },
  );
});

// ---- the levels reorder and the O(n log n) passes against quadratic references --------------------

const bigNodeArb = (kinds: K[]): fc.Arbitrary<DispatchNode> =>
  fc.record({
    reads: fc.array(rangeArb, { maxLength: 3 }),
    writes: fc.array(rangeArb, { minLength: 1, maxLength: 2 }),
    kind: fc.constantFrom(...kinds),
  }).map(({ reads, writes, kind }) => ({ kind: "dispatch", pipeline: { name: "k" }, opKind: kind, reads, writes }));
const bigGraphArb = (kinds: K[]) => fc.array(bigNodeArb(kinds), { minLength: 300, maxLength: 800 });
const pinnedKind = (d: DispatchNode) => d.opKind === K.Softmax || d.opKind === K.Sdpa;

/** Checks a levels schedule: each dispatch once, every dependency in order and across a barrier. */
function checkSchedule(original: DispatchNode[], scheduled: readonly DispatchNode[]): number {
  equal(scheduled.length, original.length);
  const placed = placeBarriers(scheduled, false);
  const group = new Map<DispatchNode, number>(), pos = new Map<DispatchNode, number>();
  let g = 0;
  for (const n of placed) {
    if (n.kind === "barrier") g++;
    else {
      group.set(n, g);
      pos.set(n, pos.size);
    }
  }
  equal(pos.size, original.length, "every dispatch kept exactly once");
  for (let j = 0; j < original.length; j++) {
    for (let i = 0; i < j; i++) {
      if (!dependent(original[i]!, original[j]!)) continue;
      ok(pos.get(original[i]!)! < pos.get(original[j]!)!, `dependency ${i} → ${j} reversed`);
      ok(group.get(original[i]!)! < group.get(original[j]!)!, `dependency ${i} → ${j} shares a group`);
    }
  }
  return g; // barriers
}

Deno.test("levels reorder: random graphs of 300–800 dispatches reach the depth bound and keep every dependency", () => {
  fc.assert(
    fc.property(bigGraphArb([K.Other, K.ElemAdd, K.MatMul]), (nodes) => {
      const barriers = checkSchedule(nodes, reorderLevels(nodes).nodes);
      const depth = referenceDepth(nodes);
      equal(barriers, depth - 1, "barriers = dependency depth − 1");
      equal(barrierLowerBound(nodes), depth - 1);
    }),
    { numRuns: 25, seed: 41 },
  );
});

Deno.test("levels reorder: non-reorderable ops keep their place; the bound with them is reached", () => {
  let looser = 0;
  fc.assert(
    fc.property(bigGraphArb([K.Other, K.Other, K.Other, K.Other, K.MatMul, K.Softmax, K.Sdpa]), (nodes) => {
      const scheduled = reorderLevels(nodes).nodes;
      const barriers = checkSchedule(nodes, scheduled);
      equal(barriers, referenceDepth(nodes, pinnedKind) - 1);
      if (barriers > barrierLowerBound(nodes)) looser++;
      // Nothing crosses a non-reorderable op, either way.
      const at = new Map(scheduled.map((n, i) => [n, i]));
      nodes.forEach((p, i) => {
        if (!pinnedKind(p)) return;
        nodes.forEach((q, j) => ok((j < i) === (at.get(q)! < at.get(p)!) || i === j, `dispatch ${j} crossed ${i}`));
      });
    }),
    { numRuns: 15, seed: 43 },
  );
  ok(looser > 0, "the pinned ops constrained some schedules (the test exercises them)");
});

Deno.test("levels reorder never uses more barriers than the look-ahead on graphs of reorderable ops", () => {
  const count = (ns: readonly CapturedNode[]) => placeBarriers(ns, false).filter((n) => n.kind === "barrier").length;
  let fewer = 0;
  // Only reorderable kinds: the look-ahead lets later work overtake a non-reorderable op that
  // starts a group, which the levels pass (nothing crosses such an op) does not.
  const reorderable = graphArb.map((ns) =>
    ns.map((n) => n.kind === "dispatch" && pinnedKind(n) ? { ...n, opKind: K.Other } : n)
  );
  // Independent chains recorded one after the other: the look-ahead's 64-node window cannot see the
  // next chain from the start of a long one; the levels pass runs them side by side.
  const chains = fc.array(fc.integer({ min: 1, max: 120 }), { minLength: 1, maxLength: 4 }).map((lengths) =>
    lengths.flatMap((len, c) =>
      Array.from({ length: len }, (_, k): CapturedNode => ({
        kind: "dispatch",
        pipeline: { name: "k" },
        opKind: K.Other,
        reads: [[10 + c, k * 64, k * 64 + 64]],
        writes: [[10 + c, k * 64 + 64, k * 64 + 128]],
      }))
    )
  );
  fc.assert(
    fc.property(fc.oneof(reorderable, chains), (nodes) => {
      const levels = count(reorderLevels(nodes).nodes), lookahead = count(reorderNodes(nodes).nodes);
      ok(levels <= lookahead, `levels ${levels} > look-ahead ${lookahead}`);
      if (levels < lookahead) fewer++;
    }),
    { numRuns: 200, seed: 5 },
  );
  ok(fewer > 0, "levels beat the look-ahead on some graph");
});

Deno.test("dependency depth, hazards, redundant barriers and barrier placement equal their quadratic definitions", () => {
  fc.assert(
    fc.property(graphArb, (nodes: CapturedNode[]) => {
      const ds = nodes.filter((n): n is DispatchNode => n.kind === "dispatch");
      equal(dependencyDepth(nodes), referenceDepth(ds));
      deepStrictEqual(
        findHazards(nodes).map((h) => ({ kind: h.kind, first: h.first.index, second: h.second.index, range: h.range })),
        referenceHazards(nodes),
      );
      equal(countRedundantBarriers(nodes), referenceRedundantBarriers(nodes));
      // Greedy placement: a barrier exactly before each dispatch that depends on its group.
      const expected: CapturedNode[] = [];
      let group: DispatchNode[] = [];
      for (const n of nodes) {
        if (n.kind === "barrier") continue;
        if (group.some((a) => dependent(a, n))) {
          expected.push(BARRIER);
          group = [];
        }
        group.push(n);
        expected.push(n);
      }
      deepStrictEqual(placeBarriers(nodes, false), expected);
    }),
    { numRuns: 300, seed: 13 },
  );
});

Deno.test("the look-ahead reorder keeps the seed's exact permutation", () => {
  fc.assert(
    fc.property(graphArb, (nodes: CapturedNode[]) => {
      const g = new ComputeGraph(nodes);
      g.reorder();
      deepStrictEqual(g.nodes, referenceLookahead(nodes));
    }),
    { numRuns: 300, seed: 17 },
  );
});
