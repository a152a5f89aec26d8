/**
 * Graph-engine costs on the CPU backend: one command buffer for a whole pass vs one per op (the
 * seed's 120-op measurement), encode cost per dispatch direct / captured / replayed, the conflict
 * tracker per check, and the passes on a decode-shaped graph.
 *
 *   deno bench --allow-ffi --allow-read --allow-env bench/graph_bench.ts
 */
import { ComputeGraph, ConflictTracker, DType, GraphExecutor, MlxDevice } from "../mod.ts";
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

// A decode-shaped graph: per layer norm → barrier → mul → barrier → add, plus independent work.
const dim = 64, rows = 16, layers = 32;
const bufs = Array.from({ length: 8 }, () => device.alloc(rows * dim * 4, DType.F32));
const w = device.alloc(dim * 4, DType.F32);
function layerPass(s: ReturnType<GraphExecutor["begin"]>) {
  for (let l = 0; l < layers; l++) {
    s.rmsNorm(bufs[0], w, bufs[1], { rows, dim, eps: 1e-5 });
    s.barrier();
    s.elementwiseMul(bufs[1], bufs[2], bufs[3]);
    s.barrier();
    s.elementwiseAdd(bufs[3], bufs[0], bufs[0]);
    s.gelu(bufs[4 + (l % 4)], bufs[4 + ((l + 1) % 4)]);
    s.barrier();
  }
}
const recordedNodes = (() => {
  const s = exec.beginRecorded();
  layerPass(s);
  const nodes = s.encoder.takeCapture()!;
  s.dispose();
  return nodes;
})();

Deno.bench(`capture ${recordedNodes.length} nodes (no execution)`, { group: "encode" }, () => {
  const s = exec.beginRecorded();
  layerPass(s);
  s.encoder.takeCapture();
  s.dispose();
});

Deno.bench(`direct encode ${layers * 4} dispatches (no execution)`, { group: "encode", baseline: true }, () => {
  const s = exec.begin();
  layerPass(s);
  s.encoder.flush();
  s.dispose();
});

Deno.bench(`replay the recorded graph with recomputed barriers (no execution)`, { group: "encode" }, () => {
  const enc = device.commandEncoder();
  new ComputeGraph(recordedNodes).encodeWithBarriers(enc);
  enc.flush();
  enc.dispose();
});

Deno.bench("fuse pass", { group: "passes" }, () => {
  new ComputeGraph(recordedNodes).fuse();
});

Deno.bench("reorder pass", { group: "passes" }, () => {
  new ComputeGraph(recordedNodes).reorder();
});

Deno.bench("fuse + reorder + finish (executes)", { group: "passes" }, () => {
  const s = exec.beginRecorded();
  layerPass(s);
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
