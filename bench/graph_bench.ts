/**
 * Graph-engine costs on the CPU backend: one command buffer for a whole pass vs one per op (the
 * seed's 120-op measurement); on the demo's own decode step, encode cost direct / captured /
 * replayed and the passes; barrier overhead (manual / auto / elided); the tracker by group width;
 * each graph pass at 100, 1,000 and 10,000 dispatches (per-dispatch cost = time / size).
 *
 *   deno bench --allow-ffi --allow-read --allow-env bench/graph_bench.ts
 */
import { barrierLowerBound, ComputeGraph, ConflictTracker, DType, GraphExecutor, MlxDevice } from "../mod.ts";
import { createLlama } from "../examples/llama.ts";
import type { MemRange } from "../src/graph/ranges.ts";
import { BARRIER, type CapturedNode, CapturedOpKind, type DispatchNode, findHazards } from "../mod.ts";
import { placeBarriers } from "../src/graph/barriers.ts";
import { reorderLevels, reorderNodes } from "../src/graph/reorder.ts";

const device = MlxDevice.open();
const exec = new GraphExecutor(device);
const n = 1024;
const a = device.alloc(n * 4, DType.F32), b = device.alloc(n * 4, DType.F32), c = device.alloc(n * 4, DType.F32);

Deno.bench("120 adds, one command buffer (one session)", { group: "batching", baseline: true }, () => {
  const s = exec.begin();
  for (let i = 0; i < 120; i++) s.elementwiseAdd(a, b, c);
  s.finish();
});

Deno.bench("120 adds, 120 command buffers", { group: "batching" }, () => {
  for (let i = 0; i < 120; i++) {
    const s = exec.begin();
    s.elementwiseAdd(a, b, c);
    s.finish();
  }
});

// The demo's own decode graph (examples/decode.ts defaults: 4 layers, hidden 512, Q4_0), one step.
const model = createLlama(device, {
  layers: 4,
  hidden: 512,
  heads: 8,
  kvHeads: 2,
  ffn: 1408,
  vocab: 2048,
  ctx: 16,
  quant: "q4_0",
  seed: 1234,
});
const demoStep = (s: ReturnType<GraphExecutor["begin"]>) => model.step(s, 3, () => s.barrier());
const recordedNodes = (() => {
  const s = exec.beginRecorded();
  demoStep(s);
  const nodes = s.encoder.takeCapture()!;
  s.dispose();
  return nodes;
})();
const demoDispatches = recordedNodes.filter((n) => n.kind === "dispatch").length;

Deno.bench(`demo step: capture ${recordedNodes.length} nodes (no execution)`, { group: "encode" }, () => {
  const s = exec.beginRecorded();
  demoStep(s);
  s.encoder.takeCapture();
  s.dispose();
});

Deno.bench(
  `demo step: direct encode ${demoDispatches} dispatches (no execution)`,
  { group: "encode", baseline: true },
  () => {
    const s = exec.begin();
    demoStep(s);
    s.encoder.flush();
    s.dispose();
  },
);

Deno.bench("demo step: replay the recorded graph, barriers recomputed (no execution)", { group: "encode" }, () => {
  const enc = device.commandEncoder();
  new ComputeGraph(recordedNodes).encodeWithBarriers(enc);
  enc.flush();
  enc.dispose();
});

Deno.bench("demo step: fuse pass", { group: "passes" }, () => {
  new ComputeGraph(recordedNodes).fuse();
});

Deno.bench("demo step: reorder pass", { group: "passes" }, () => {
  new ComputeGraph(recordedNodes).reorder();
});

Deno.bench("demo step: dependency depth (barrier lower bound)", { group: "passes" }, () => {
  barrierLowerBound(recordedNodes);
});

Deno.bench("demo step: recorded + fuse + reorder + dual buffer, executed", { group: "passes" }, () => {
  const s = exec.beginRecorded();
  demoStep(s);
  s.finish({ fuse: true, reorder: true, dualBuffer: true });
});

// The tracker's cost per dispatch by the width of the concurrent group. Every run checks and adds
// 800 dispatches, as 800/W groups of W (reset between groups), so equal times mean a flat cost per
// dispatch. Each dispatch reads two ranges and writes one.
const TRACKED = 800;
type Access = { reads: MemRange[]; writes: MemRange[] };
const layouts: Record<string, (k: number) => Access> = {
  // own input and output allocations, one shared weight
  "separate allocations": (k) => ({ reads: [[1, 0, 4096], [10 + k, 0, 256]], writes: [[2000 + k, 0, 256]] }),
  // slice k of one input buffer and of one output buffer, in address order
  "disjoint slices of one buffer": (k) => ({
    reads: [[1, 0, 4096], [2, k * 256, k * 256 + 256]],
    writes: [[3, k * 256, k * 256 + 256]],
  }),
};
const shuffled = Array.from({ length: TRACKED }, (_, k) => k);
for (let i = TRACKED - 1, seed = 7; i > 0; i--) {
  seed = (seed * 1103515245 + 12345) & 0x7fffffff;
  const j = seed % (i + 1);
  [shuffled[i], shuffled[j]] = [shuffled[j]!, shuffled[i]!];
}
const disjoint = layouts["disjoint slices of one buffer"]!;
layouts["disjoint slices of one buffer, shuffled"] = (k) => disjoint(shuffled[k]!);
for (const [layout, access] of Object.entries(layouts)) {
  const dispatches = Array.from({ length: TRACKED }, (_, k) => access(k));
  for (const width of [1, 10, 100, 800]) {
    const tracker = new ConflictTracker();
    Deno.bench(`tracker, ${layout}: 800 dispatches in groups of ${width}`, {
      group: `tracker: ${layout}`,
      baseline: width === 1,
    }, () => {
      for (let g = 0; g < TRACKED; g += width) {
        tracker.reset();
        for (let k = g; k < g + width; k++) {
          const d = dispatches[k]!;
          if (tracker.conflicts(d.reads, d.writes)) throw new Error("the layout has no conflict");
          tracker.add(d.reads, d.writes);
        }
      }
    });
  }
}

// Barrier overhead on 200 small dispatches: placed by hand, placed by the tracker (a dependent
// chain: every dispatch needs one), and elided by the tracker (independent dispatches: none needed).
const chainBufs = Array.from({ length: 201 }, () => device.alloc(64 * 4, DType.F32));
Deno.bench("200-dispatch chain, manual barriers", { group: "barriers", baseline: true }, () => {
  const s = exec.begin();
  for (let i = 0; i < 200; i++) {
    s.elementwiseAdd(chainBufs[i]!, chainBufs[i]!, chainBufs[i + 1]!);
    s.barrier();
  }
  s.encoder.flush();
  s.dispose();
});
Deno.bench("200-dispatch chain, auto barriers (200 placed)", { group: "barriers" }, () => {
  const s = exec.begin({ autoBarriers: true });
  for (let i = 0; i < 200; i++) s.elementwiseAdd(chainBufs[i]!, chainBufs[i]!, chainBufs[i + 1]!);
  s.encoder.flush();
  s.dispose();
});
Deno.bench("200 independent dispatches, auto barriers (all elided)", { group: "barriers" }, () => {
  const s = exec.begin({ autoBarriers: true });
  for (let i = 0; i < 200; i++) s.elementwiseAdd(chainBufs[0]!, chainBufs[0]!, chainBufs[i + 1]!);
  s.encoder.flush();
  s.dispose();
});

// ---- pass scaling ---------------------------------------------------------------------------------
// Plain-data graphs of 100, 1,000 and 10,000 dispatches: (a) decoder layers as the demo records them
// (explicit barrier after each op, activations reused by every layer, weights per layer, a norm → mul
// pair per block for fusion); (b) one wide group: every dispatch writes its own slice of one buffer.

function layers(dispatches: number): CapturedNode[] {
  const out: CapturedNode[] = [];
  const act = (id: number): MemRange => [id, 0, 4096];
  const op = (name: string, opKind: CapturedOpKind, reads: MemRange[], writes: MemRange[]) => {
    if (out.length > 0) out.push(BARRIER);
    out.push({ kind: "dispatch", pipeline: { name }, opKind, reads, writes });
  };
  const [x, t, n, q, k, v, att, o, g, u] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].map(act);
  for (let layer = 0; out.length < 2 * dispatches; layer++) {
    const w = (i: number): MemRange => [1000 + 16 * layer + i, 0, 65536];
    const cache = (i: number): MemRange => [100000 + 2 * layer + i, 0, 65536];
    const K = CapturedOpKind;
    for (const [wn, ws, mm] of [[0, 1, [2, 3, 4]], [5, 6, [7, 8]]] as const) {
      op("rms_norm_f32", K.RmsNorm, [x!, w(wn)], [t!]);
      op("elementwise_mul_f32", K.ElemMul, [t!, w(ws)], [n!]);
      if (mm.length === 3) {
        op("matmul_q", K.MatMul, [n!, w(2)], [q!]);
        op("matmul_k", K.MatMul, [n!, w(3)], [k!]);
        op("matmul_v", K.MatMul, [n!, w(4)], [v!]);
        op("rope", K.Rope, [q!], [q!]);
        op("rope_k", K.Rope, [k!], [cache(0)]);
        op("copy_v", K.Other, [v!], [cache(1)]);
        op("sdpa", K.Sdpa, [q!, cache(0), cache(1)], [att!]);
        op("matmul_o", K.MatMul, [att!, w(9)], [o!]);
      } else {
        op("matmul_gate", K.MatMul, [n!, w(7)], [g!]);
        op("matmul_up", K.MatMul, [n!, w(8)], [u!]);
        op("gelu", K.Activation, [g!], [g!]);
        op("elementwise_mul_f32", K.ElemMul, [g!, u!], [g!]);
        op("matmul_down", K.MatMul, [g!, w(10)], [o!]);
      }
      op("elementwise_add_f32", K.ElemAdd, [x!, o!], [x!]);
    }
  }
  return trim(out, dispatches);
}

function wideGroup(dispatches: number): CapturedNode[] {
  return Array.from({ length: dispatches }, (_, i): DispatchNode => ({
    kind: "dispatch",
    pipeline: { name: "k" },
    opKind: CapturedOpKind.Other,
    reads: [[1, 0, 4096]],
    writes: [[2, i * 256, i * 256 + 256]],
  }));
}

/** One wide group whose writes are gapped slices of one buffer in shuffled order: none touch. */
function wideGroupShuffled(dispatches: number): CapturedNode[] {
  const order = Array.from({ length: dispatches }, (_, i) => i);
  for (let i = dispatches - 1, seed = 11; i > 0; i--) {
    seed = (seed * 1103515245 + 12345) & 0x7fffffff;
    const j = seed % (i + 1);
    [order[i], order[j]] = [order[j]!, order[i]!];
  }
  return order.map((p): DispatchNode => ({
    kind: "dispatch",
    pipeline: { name: "k" },
    opKind: CapturedOpKind.Other,
    reads: [[1, 0, 4096]],
    writes: [[2, p * 512, p * 512 + 256]],
  }));
}

/** The first `dispatches` dispatches of a node list (with the barriers among them). */
function trim(nodes: CapturedNode[], dispatches: number): CapturedNode[] {
  let seen = 0, end = 0;
  while (end < nodes.length && (seen < dispatches || nodes[end]!.kind === "barrier")) {
    if (nodes[end]!.kind === "dispatch") seen++;
    end++;
  }
  return nodes.slice(0, end);
}

const passes: [string, (nodes: CapturedNode[]) => unknown][] = [
  ["fuse", (nodes) => new ComputeGraph(nodes).fuse()],
  ["reorder (look-ahead)", (nodes) => reorderNodes(nodes)],
  ["reorder (levels)", (nodes) => reorderLevels(nodes)],
  ["barrier placement", (nodes) => placeBarriers(nodes, false)],
  ["hazard validation", (nodes) => findHazards(nodes)],
  ["dependency depth", (nodes) => barrierLowerBound(nodes)],
];
for (
  const [shape, make] of [
    ["decoder layers", layers],
    ["one wide group", wideGroup],
    ["one wide group, shuffled gapped slices", wideGroupShuffled],
  ] as const
) {
  for (const size of [100, 1000, 10000]) {
    const nodes = make(size);
    for (const [pass, run] of passes) {
      Deno.bench(
        `${pass}, ${shape}: ${size} dispatches`,
        { group: `pass: ${pass}, ${shape}`, baseline: size === 100 },
        () => {
          run(nodes);
        },
      );
    }
  }
}
