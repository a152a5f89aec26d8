/**
 * The graph passes on hand-computed graphs (pure: no device). Every expected result below was worked
 * out by hand from the rules in src/graph/*.ts.
 */
import { deepStrictEqual, equal, match, ok, throws } from "node:assert/strict";
import {
  BARRIER,
  barrierLowerBound,
  type CapturedNode,
  CapturedOpKind as K,
  ComputeGraph,
  countRedundantBarriers,
  dependencyDepth,
  type DispatchNode,
  dualBufferSplit,
  dualBufferSplitIndex,
  findHazards,
  MlxError,
} from "../mod.ts";
import { placeBarriers } from "../src/graph/barriers.ts";
import { checkChunk, encodeChunk, type GraphEncodeTarget } from "../src/graph/compute_graph.ts";
import { reorderLevels, reorderNodes } from "../src/graph/reorder.ts";
import type { MemRange } from "../src/graph/ranges.ts";

const r = (alloc: number, start: number, end: number): MemRange => [alloc, start, end];
const X = r(1, 0, 256), W = r(2, 0, 64), S = r(3, 0, 256), T = r(4, 0, 256), O = r(5, 0, 256), R = r(6, 0, 256);

function node(name: string, opKind: K, reads: MemRange[], writes: MemRange[]): DispatchNode {
  return { kind: "dispatch", pipeline: { name }, opKind, reads, writes, bindings: [], grid: 1, threadgroup: 1 };
}
const norm = (x: MemRange, w: MemRange, out: MemRange, t = "f32") => node(`rms_norm_${t}`, K.RmsNorm, [x, w], [out]);
const mul = (a: MemRange, b: MemRange, out: MemRange, t = "f32") =>
  node(`elementwise_mul_${t}`, K.ElemMul, [a, b], [out]);
const add = (a: MemRange, b: MemRange, out: MemRange) => node("elementwise_add_f32", K.ElemAdd, [a, b], [out]);
const other = (name: string, reads: MemRange[], writes: MemRange[], kind: K = K.Other) =>
  node(name, kind, reads, writes);
const names = (nodes: readonly CapturedNode[]) => nodes.map((n) => n.kind === "barrier" ? "|" : n.pipeline.name);

Deno.test("fuse: RMSNorm → barrier → MUL reading the norm's output becomes rms_norm_mul", () => {
  const g = new ComputeGraph([norm(X, W, T), BARRIER, BARRIER, mul(T, S, O)]);
  equal(g.fuse(), 1);
  deepStrictEqual(names(g.nodes), ["rms_norm_mul_f32"]);
  const f = g.nodes[0] as DispatchNode;
  deepStrictEqual(f.reads, [X, W, S]);
  deepStrictEqual(f.writes, [O]);
  equal(f.opKind, K.RmsNormMul);
  // the scale may be either operand of the mul
  const g2 = new ComputeGraph([norm(X, W, T), BARRIER, mul(S, T, O)]);
  equal(g2.fuse(), 1);
  deepStrictEqual((g2.nodes[0] as DispatchNode).reads, [X, W, S]);
});

Deno.test("fuse: RMSNorm → MUL → ADD becomes rms_norm_mul_add (longest match wins)", () => {
  const g = new ComputeGraph([norm(X, W, T), BARRIER, mul(T, S, O), BARRIER, add(R, O, r(7, 0, 256))]);
  equal(g.fuse(), 1);
  deepStrictEqual(names(g.nodes), ["rms_norm_mul_add_f32"]);
  deepStrictEqual((g.nodes[0] as DispatchNode).reads, [X, W, S, R]);
  // in-place residual (out == residual) is element-wise, hence allowed
  const g2 = new ComputeGraph([norm(X, W, T), BARRIER, mul(T, S, O), BARRIER, add(O, R, R)]);
  equal(g2.fuse(), 1);
  deepStrictEqual(names(g2.nodes), ["rms_norm_mul_add_f32"]);
});

Deno.test("fuse refuses every unsafe or non-matching pattern", () => {
  const refused: [string, CapturedNode[]][] = [
    ["no barrier between (same group: a race, not a pattern)", [norm(X, W, T), mul(T, S, O)]],
    ["intermediate read again later", [
      norm(X, W, T),
      BARRIER,
      mul(T, S, O),
      BARRIER,
      other("gelu", [T], [r(8, 0, 256)]),
    ]],
    ["output overlaps the weight", [norm(X, W, T), BARRIER, mul(T, r(2, 0, 256), r(2, 0, 256))]],
    ["output partially overlaps the input", [norm(X, W, T), BARRIER, mul(T, S, r(1, 128, 384))]],
    ["dtype mismatch", [norm(X, W, T, "f16"), BARRIER, mul(T, S, O, "f32")]],
    ["mul reads only part of the norm output", [norm(X, W, T), BARRIER, mul(r(4, 0, 128), r(3, 0, 128), r(5, 0, 128))]],
    ["the norm output is both operands (x·x)", [norm(X, W, T), BARRIER, mul(T, T, O)]],
    ["mul does not read the norm output", [norm(X, W, T), BARRIER, mul(S, R, O)]],
  ];
  for (const [why, nodes] of refused) {
    const g = new ComputeGraph(nodes);
    equal(g.fuse(), 0, why);
    deepStrictEqual(g.nodes, nodes, why);
  }
});

Deno.test("fuse: an intermediate completely overwritten before any read is dead, so both layers fuse", () => {
  const X2 = r(9, 0, 256), O2 = r(10, 0, 256);
  const g = new ComputeGraph([
    norm(X, W, T),
    BARRIER,
    mul(T, S, O),
    BARRIER,
    norm(X2, W, T), // overwrites T entirely: layer 1's T is dead
    BARRIER,
    mul(T, S, O2),
  ]);
  equal(g.fuse(), 2);
  // The program's explicit barrier stays (fusion keeps barriers; reorder recomputes them) …
  deepStrictEqual(names(g.nodes), ["rms_norm_mul_f32", "|", "rms_norm_mul_f32"]);
  // … and it is now redundant: the fused layers are independent, so reorder makes one group.
  equal(g.redundantBarriers(), 1);
  g.reorder();
  const t = recordingTarget();
  equal(g.encodeWithBarriers(t), 0);
  // In place (output == norm input) is element-wise and allowed.
  const g2 = new ComputeGraph([norm(X, W, T), BARRIER, mul(T, S, X)]);
  equal(g2.fuse(), 1);
});

Deno.test("fuse repairs barriers the fused dispatch now needs", () => {
  // P writes S concurrently with the norm; the mul (after the barrier) reads S. The fused kernel
  // reads S in the norm's group, so a barrier must separate it from P.
  const g = new ComputeGraph([other("p", [], [S]), norm(X, W, T), BARRIER, mul(T, S, O)]);
  equal(g.fuse(), 1);
  deepStrictEqual(names(g.nodes), ["p", "|", "rms_norm_mul_f32"]);
  // Q overwrites X concurrently with the mul (legal: the norm was done). The fused kernel reads X,
  // so Q must now come after a barrier.
  const g2 = new ComputeGraph([norm(X, W, T), BARRIER, mul(T, S, O), other("q", [], [X])]);
  equal(g2.fuse(), 1);
  deepStrictEqual(names(g2.nodes), ["rms_norm_mul_f32", "|", "q"]);
  deepStrictEqual(findHazards(g2.nodes), []);
});

Deno.test("reorder pulls independent work into the current group", () => {
  const a = other("a", [], [r(1, 0, 64)]);
  const b = other("b", [r(1, 0, 64)], [r(2, 0, 64)]); // depends on a
  const c = other("c", [], [r(3, 0, 64)]); // independent
  const g = new ComputeGraph([a, BARRIER, b, BARRIER, c]);
  equal(g.reorder(), 2); // c moved to index 1, b to index 2
  deepStrictEqual(names(g.nodes), ["a", "c", "b"]);
  const t = recordingTarget();
  equal(g.encodeWithBarriers(t), 1);
  deepStrictEqual(t.log, ["a", "c", "|", "b"]);
});

Deno.test("reorder: the look-ahead skips past conflicting nodes but never past a dependency", () => {
  const a = other("a", [], [r(1, 0, 64)]);
  const b = other("b", [r(1, 0, 64)], [r(2, 0, 64)]); // RAW on a
  const c = other("c", [r(2, 0, 64)], [r(4, 0, 64)]); // RAW on b: must stay after b
  const d = other("d", [], [r(5, 0, 64)]); // free
  const e = other("e", [r(4, 0, 64)], []); // RAW on c
  const g = new ComputeGraph([a, b, c, d, e]);
  g.reorder();
  deepStrictEqual(names(g.nodes), ["a", "d", "b", "c", "e"]);
});

Deno.test("reorder: non-reorderable ops end the look-ahead; empty nodes always join", () => {
  const a = other("a", [], [r(1, 0, 64)]);
  const b = other("b", [r(1, 0, 64)], [r(2, 0, 64)]);
  const sm = other("softmax", [r(7, 0, 64)], [r(8, 0, 64)], K.Softmax);
  const c = other("c", [], [r(3, 0, 64)]);
  const g = new ComputeGraph([a, b, sm, c]);
  equal(g.reorder(), 0); // c is behind the softmax: not pulled up
  deepStrictEqual(names(g.nodes), ["a", "b", "softmax", "c"]);
  const empty = other("marker", [], []);
  const g2 = new ComputeGraph([a, b, empty]);
  g2.reorder();
  deepStrictEqual(names(g2.nodes), ["a", "marker", "b"]);
});

Deno.test("unannotated dispatches are counted and treated as having no memory effect", () => {
  const g = new ComputeGraph([other("a", [], [r(1, 0, 8)]), other("b", [r(1, 0, 8)], []), other("marker", [], [])]);
  equal(g.unannotatedDispatchCount, 1);
  g.reorder();
  deepStrictEqual(names(g.nodes), ["a", "marker", "b"]);
});

Deno.test("counts: length, dispatches, barriers", () => {
  const g = new ComputeGraph();
  g.record(other("a", [], [r(1, 0, 8)]));
  g.record(BARRIER);
  g.record(other("b", [r(1, 0, 8)], []));
  deepStrictEqual([g.length, g.dispatchCount, g.barrierCount, g.unannotatedDispatchCount], [3, 2, 1, 0]);
});

/** Encodes a graph's two dual-buffer chunks the way an executor does; returns each chunk's barriers. */
function encodeDual(g: ComputeGraph, t0: GraphEncodeTarget, t1: GraphEncodeTarget): number[] {
  const [c0, c1] = g.dualBufferChunks();
  const b0 = encodeChunk(c0, t0);
  checkChunk(c1, t1);
  t0.commit();
  return [b0, encodeChunk(c1, t1)];
}

Deno.test("dual buffer: the first max(64, n/10) dispatches go first; the graph itself commits nothing", () => {
  equal(dualBufferSplit(10), 64);
  equal(dualBufferSplit(1000), 100);
  const nodes: CapturedNode[] = [];
  for (let i = 0; i < 700; i++) nodes.push(other(`k${i}`, [r(1, i * 8, i * 8 + 8)], [r(2, i * 8, i * 8 + 8)]));
  const g = new ComputeGraph(nodes);
  const [c0, c1] = g.dualBufferChunks();
  deepStrictEqual([c0.nodes.length, c0.firstDispatch, c1.nodes.length, c1.firstDispatch], [70, 0, 630, 70]);
  const shared: string[] = [];
  const t0 = recordingTarget(shared, "0"), t1 = recordingTarget(shared, "1");
  deepStrictEqual(encodeDual(g, t0, t1), [0, 0]);
  equal(t0.log.filter((x) => x.startsWith("k")).length, 70);
  equal(t1.log.filter((x) => x.startsWith("k")).length, 630);
  ok(shared.indexOf("commit0") < shared.indexOf("1:k70"));
  equal(shared.filter((x) => x.startsWith("commit")).length, 1, "only the caller committed");
});

Deno.test("dual buffer: checkChunk rejects a bad node of the second chunk, naming its graph-wide index", () => {
  const nodes: CapturedNode[] = [];
  for (let i = 0; i < 700; i++) nodes.push(other(`k${i}`, [], [r(2, i * 8, i * 8 + 8)]));
  nodes[500] = { kind: "dispatch", pipeline: { name: "bare" }, opKind: K.Other, reads: [], writes: [] };
  const [c0, c1] = new ComputeGraph(nodes).dualBufferChunks();
  checkChunk(c0, recordingTarget());
  throws(() => checkChunk(c1, recordingTarget()), (e: unknown) => {
    ok(e instanceof MlxError && e.code === "InvalidArgument");
    match(e.message, /node 500 \(bare\) has no bindings or geometry/);
    return true;
  });
});

Deno.test("dual buffer: the split moves to the end of the concurrent group it would cut", () => {
  // 30 groups of 3 independent dispatches, each group reading what the previous one wrote: the
  // 64th dispatch is the first of its group, so the split moves to the 66th (the group's end).
  const nodes: CapturedNode[] = [];
  for (let g = 0; g < 30; g++) {
    for (let j = 0; j < 3; j++) {
      nodes.push(other(`g${g}.${j}`, g === 0 ? [] : [r(g, 0, 24)], [r(g + 1, j * 8, j * 8 + 8)]));
    }
    if (g < 29) nodes.push(BARRIER);
  }
  equal(dualBufferSplitIndex(nodes, 64), 66 + 21); // 66 dispatches and the 21 barriers among them
  const shared: string[] = [];
  const t0 = recordingTarget(shared, "0"), t1 = recordingTarget(shared, "1");
  // 22 groups → 21 barriers in the first buffer, 8 groups → 7 in the second: with the boundary, 29
  // orderings for 30 groups, the dependency bound. (The barrier after group 21 heads the second
  // buffer, where it costs nothing.)
  deepStrictEqual(encodeDual(new ComputeGraph(nodes), t0, t1), [21, 7]);
  equal(t0.log.filter((x) => x.startsWith("g")).length, 66);
  // One wide group: no boundary within another n0 dispatches, so the plain split stays.
  const wide = Array.from({ length: 200 }, (_, i) => other(`w${i}`, [], [r(1, i * 8, i * 8 + 8)]));
  equal(dualBufferSplitIndex(wide, 64), 64);
});

Deno.test("validator: a missing barrier is reported with both dispatches, kernels and bytes", () => {
  const a = other("producer", [], [r(1, 0, 128)]);
  const b = other("consumer", [r(1, 64, 256)], [r(2, 0, 64)]);
  deepStrictEqual(findHazards([a, b]), [{
    kind: "RAW",
    first: { index: 0, kernel: "producer" },
    second: { index: 1, kernel: "consumer" },
    range: [1, 64, 128],
  }]);
  deepStrictEqual(findHazards([a, BARRIER, b]), []);
  const war = findHazards([b, other("clobber", [], [r(1, 100, 120)])]);
  deepStrictEqual(war.map((h) => [h.kind, h.range]), [["WAR", [1, 100, 120]]]);
});

Deno.test("validator: redundant barriers are counted", () => {
  const a = other("a", [], [r(1, 0, 8)]), b = other("b", [r(1, 0, 8)], []), c = other("c", [], [r(3, 0, 8)]);
  equal(countRedundantBarriers([a, BARRIER, b]), 0); // needed (RAW)
  equal(countRedundantBarriers([a, BARRIER, c]), 1); // independent
  equal(countRedundantBarriers([a, BARRIER, BARRIER, b, BARRIER]), 2); // a duplicate and a trailing one
});

Deno.test("encoding a plain-data graph without bindings says what is missing", () => {
  const g = new ComputeGraph([{ kind: "dispatch", pipeline: { name: "a" }, opKind: K.Other, reads: [], writes: [] }]);
  throws(() => g.encodeSequential(recordingTarget()), (e: unknown) => {
    ok(e instanceof MlxError && e.code === "InvalidArgument");
    match(e.message, /node 0 \(a\) has no bindings or geometry/);
    return true;
  });
});

/** A target that logs what it receives. */
function recordingTarget(shared?: string[], tag = ""): GraphEncodeTarget & { log: string[] } {
  const log: string[] = [];
  const note = (s: string) => {
    log.push(s);
    shared?.push(tag ? (s === "commit" ? `commit${tag}` : `${tag}:${s}`) : s);
  };
  return {
    log,
    dispatch: (d) => note(d.pipeline.name),
    memoryBarrier: () => note("|"),
    commit: () => note("commit"),
    resolvePipeline: (p) => p as never,
  };
}

Deno.test("dependency depth: the longest RAW/WAR/WAW chain bounds the barriers from below", () => {
  const a = other("a", [], [r(1, 0, 8)]), b = other("b", [r(1, 0, 8)], [r(2, 0, 8)]);
  const c = other("c", [], [r(3, 0, 8)]), d = other("d", [r(2, 0, 8), r(3, 0, 8)], []);
  equal(dependencyDepth([a, b, c, d]), 3); // a → b → d, c alongside
  equal(barrierLowerBound([a, BARRIER, b, BARRIER, c, BARRIER, d]), 2);
  equal(barrierLowerBound([]), 0);
  const w = other("w", [r(1, 0, 8)], []), war = other("war", [], [r(1, 4, 8)]);
  equal(dependencyDepth([w, war]), 2, "WAR counts");
});

Deno.test("levels reorder: each dispatch in the earliest group its dependencies allow", () => {
  // a → b → c is a chain; d is free; e reads c. Levels: a,d = 1; b = 2; c = 3; e = 4.
  const a = other("a", [], [r(1, 0, 64)]);
  const b = other("b", [r(1, 0, 64)], [r(2, 0, 64)]);
  const c = other("c", [r(2, 0, 64)], [r(4, 0, 64)]);
  const d = other("d", [], [r(5, 0, 64)]);
  const e = other("e", [r(4, 0, 64)], []);
  const out = reorderLevels([a, BARRIER, b, BARRIER, c, BARRIER, d, e]);
  deepStrictEqual(names(out.nodes), ["a", "d", "b", "c", "e"]);
  equal(out.reordered, 3); // d, b and c moved
  deepStrictEqual(names(placeBarriers(out.nodes, false)), ["a", "d", "|", "b", "|", "c", "|", "e"]);
  // Two chains of 70, one after the other: the look-ahead's window cannot reach the second chain
  // from the start of the first; levels run them side by side (69 barriers, the bound).
  const chain = (alloc: number, tag: string) =>
    Array.from(
      { length: 70 },
      (_, k) => other(`${tag}${k}`, [r(alloc, k * 8, k * 8 + 8)], [r(alloc, k * 8 + 8, k * 8 + 16)]),
    );
  const two = [...chain(1, "x"), ...chain(2, "y")];
  const barriers = (nodes: readonly CapturedNode[]) =>
    names(placeBarriers(nodes, false)).filter((x) => x === "|").length;
  equal(barrierLowerBound(two), 69);
  equal(barriers(reorderLevels(two).nodes), 69);
  ok(barriers(reorderNodes(two).nodes) > 69);
  // The same through ComputeGraph: reorder() keeps the look-ahead, reorder("levels") reaches the bound.
  const encoded = (mode?: "lookahead" | "levels") => {
    const g = new ComputeGraph(two);
    g.reorder(mode);
    const target = recordingTarget();
    return g.encodeWithBarriers(target);
  };
  equal(encoded("levels"), 69);
  equal(encoded(), encoded("lookahead"));
  ok(encoded() > 69);
  throws(() => new ComputeGraph(two).reorder("fastest" as "levels"), (e: unknown) => e instanceof MlxError);
});

Deno.test("levels reorder: nothing crosses a non-reorderable op", () => {
  const a = other("a", [r(3, 0, 64)], []);
  const sm = other("softmax", [], [r(3, 0, 64)], K.Softmax); // WAR on a
  const c = other("c", [], [r(4, 0, 64)]); // free, but after the softmax
  deepStrictEqual(names(reorderLevels([a, sm, c]).nodes), ["a", "softmax", "c"]);
  deepStrictEqual(names(placeBarriers(reorderLevels([a, sm, c]).nodes, false)), ["a", "|", "softmax", "c"]);
  // The same with an ordinary op: c joins the first group.
  deepStrictEqual(names(reorderLevels([a, other("w", [], [r(3, 0, 64)]), c]).nodes), ["a", "c", "w"]);
});
