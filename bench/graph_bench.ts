/**
 * Graph-engine costs on the CPU backend: one command buffer for a whole pass vs one per op (the
 * seed's 120-op measurement); on the demo's own decode step, encode cost direct / captured /
 * replayed and the passes; barrier overhead (manual / auto / elided); the tracker by group size.
 *
 *   deno bench --allow-ffi --allow-read --allow-env bench/graph_bench.ts
 */
import { barrierLowerBound, ComputeGraph, ConflictTracker, DType, GraphExecutor, MlxDevice } from "../mod.ts";
import { createLlama } from "../examples/llama.ts";
import type { MemRange } from "../src/graph/ranges.ts";

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

const tracker = new ConflictTracker();
for (const size of [4, 16, 64]) {
  const ranges: MemRange[] = Array.from({ length: size }, (_, i) => [1, i * 64, i * 64 + 64]);
  const probe: MemRange[] = [[2, 0, 64]];
  Deno.bench(`tracker check vs a group of ${size} ranges`, { group: "tracker" }, () => {
    tracker.reset();
    tracker.add(ranges, []);
    tracker.conflicts(probe, probe);
  });
}

// Barrier overhead on 200 small dispatches: placed by hand, placed by the tracker (a dependent
// chain: every dispatch needs one), and elided by the tracker (independent dispatches: none needed).
const chainBufs = Array.from({ length: 201 }, () => device.alloc(64 * 4, DType.F32));
Deno.bench("200-dispatch chain, manual barriers", { group: "barriers", baseline: true }, () => {
  const s = exec.begin();
  for (let i = 0; i < 200; i++) {
    s.elementwiseAdd(chainBufs[i], chainBufs[i], chainBufs[i + 1]);
    s.barrier();
  }
  s.encoder.flush();
  s.dispose();
});
Deno.bench("200-dispatch chain, auto barriers (200 placed)", { group: "barriers" }, () => {
  const s = exec.begin({ autoBarriers: true });
  for (let i = 0; i < 200; i++) s.elementwiseAdd(chainBufs[i], chainBufs[i], chainBufs[i + 1]);
  s.encoder.flush();
  s.dispose();
});
Deno.bench("200 independent dispatches, auto barriers (all elided)", { group: "barriers" }, () => {
  const s = exec.begin({ autoBarriers: true });
  for (let i = 0; i < 200; i++) s.elementwiseAdd(chainBufs[0], chainBufs[0], chainBufs[i + 1]);
  s.encoder.flush();
  s.dispose();
});
