/**
 * Host cost of the decode-path ops (rope, matmul, attention, sampling) against a prebuilt descriptor
 * of the same kernel: 800 calls per pass into one encoder, nothing runs (the pass is flushed to the
 * native encoder and dropped). The ops check their arguments and fill a reused descriptor, so each
 * should cost about what the descriptor path costs. Then one whole decode step of the demo model
 * (examples/llama.ts: 32 layers at small dims, bf16 and Q4_0 weights, hand barriers) through a
 * direct session, against the same dispatches and barriers replayed as prebuilt descriptors into a
 * bare encoder: that ratio is the host cost the ops, the session and the model's own code add (issue
 * 16). Last, what a token pays outside the ops: a view (`slice`), and opening and disposing an
 * encoder or a session. Read the ratios, not the absolute numbers.
 *
 *   deno bench --allow-ffi --allow-read --allow-env bench/op_host_bench.ts
 */
import { DType, f32Bits, GraphExecutor, type GraphSession, MlxDevice, ops } from "../mod.ts";
import { createLlama } from "../examples/llama.ts";
import type { DispatchDescriptor } from "../src/encoder.ts";
import type { DispatchTarget } from "../src/ops/common.ts";
import { SESSION_OPS } from "../src/session_ops.ts";

const N = 800, HD = 64, HEADS = 4, CTX = 16, VOCAB = 256, DIM = 64;
const device = MlxDevice.open({ backend: "cpu" });
const registry = device.kernels;
const f32 = (elements: number) => device.alloc(elements * 4, DType.F32);
const q = f32(HEADS * HD), k = f32(HEADS * CTX * HD), v = f32(HEADS * CTX * HD), o = f32(HEADS * HD);
const x = f32(DIM), wt = f32(DIM * DIM), y = f32(DIM);
const positions = device.upload(new Uint32Array(HEADS).fill(3));
const logits = f32(VOCAB), ids = device.alloc(4, DType.U32);

/** One pass of N calls of `op`, flushed and dropped. */
function pass(op: (t: DispatchTarget) => void): void {
  const enc = device.commandEncoder();
  for (let i = 0; i < N; i++) op(enc);
  enc.flush();
  enc.dispose();
}

/** A baseline and the op it matches, in a group of their own. */
function pair(group: string, descriptor: DispatchDescriptor, op: (t: DispatchTarget) => void): void {
  Deno.bench(`${group}: prebuilt descriptor`, { group, baseline: true }, () => pass((t) => t.dispatch(descriptor)));
  Deno.bench(`${group}: ops.${group}`, { group }, () => pass(op));
}

pair("rope", {
  pipeline: registry.get("rope_f32"),
  bindings: [q, q, [f32Bits(1e4), HD, HEADS], positions],
  grid: [HD / 2, HEADS, 1],
  threadgroup: [HD / 2, 1, 1],
  dispatchKind: "threads",
}, (t) => ops.rope(t, registry, q, q, positions, { theta: 1e4, headDim: HD, seqLen: HEADS }));

pair("matmul", {
  pipeline: registry.get("matmul_f32"),
  bindings: [x, wt, y, [1, DIM, DIM, 0]],
  grid: [DIM / 4, 1, 1],
  threadgroup: 128,
}, (t) => ops.matmul(t, registry, x, wt, y, { m: 1, n: DIM, k: DIM }));

pair("sdpa", {
  pipeline: registry.get("sdpa_f32"),
  bindings: [q, k, v, o, [HEADS, HEADS, HD, 1, CTX, f32Bits(0.125), CTX]],
  grid: [1, HEADS, 1],
  threadgroup: 32,
}, (t) =>
  ops.sdpa(t, registry, q, k, v, o, {
    nHeads: HEADS,
    nKvHeads: HEADS,
    headDim: HD,
    seqLen: 1,
    kvSeqLen: CTX,
    kvCapacity: CTX,
    scale: 0.125,
  }));

pair("argmax", {
  pipeline: registry.get("argmax_f32"),
  bindings: [logits, ids, [VOCAB, 1, 1, 0]],
  grid: [1, 1, 1],
  threadgroup: [64, 1, 1],
  dispatchKind: "threadgroups",
}, (t) => ops.argmax(t, registry, logits, ids, { vocab: VOCAB }));

pair("sample", {
  pipeline: registry.get("sample_f32"),
  bindings: [logits, ids, [VOCAB, 1, 1, 0, f32Bits(Math.LOG2E / 0.8), 40, 2 ** 31, 7, 0, 0]],
  grid: [1, 1, 1],
  threadgroup: [64, 1, 1],
  dispatchKind: "threadgroups",
}, (t) => ops.sample(t, registry, logits, ids, { vocab: VOCAB, temperature: 0.8, topK: 40, seed: 7 }));

// ---- one decode step ------------------------------------------------------------------------------

const exec = new GraphExecutor(device);
const STEP_POSITION = 5;

/** The step's dispatches (descriptors copied) and barriers (null), in order, as a session would encode them. */
function recordStep(step: (s: GraphSession) => void): (DispatchDescriptor | null)[] {
  const list: (DispatchDescriptor | null)[] = [];
  const target: DispatchTarget = {
    dispatch: (d) =>
      list.push({
        ...d,
        bindings: d.bindings.map((b) => (Array.isArray(b) ? [...b] : b)),
        grid: typeof d.grid === "number" ? d.grid : [...d.grid],
        threadgroup: typeof d.threadgroup === "number" ? d.threadgroup : [...d.threadgroup],
      }),
    memoryBarrier: () => list.push(null),
  };
  // A stand-in session: each op method calls the op on the recording target.
  const methods = Object.fromEntries(
    Object.entries(SESSION_OPS).map(([name, op]) => [
      name,
      (...args: unknown[]) => (op as (...a: unknown[]) => void)(target, registry, ...args),
    ]),
  );
  step({ ...methods, barrier: () => target.memoryBarrier() } as unknown as GraphSession);
  return list;
}

for (const quant of ["bf16", "q4_0"] as const) {
  const model = createLlama(device, {
    layers: 32,
    hidden: 256,
    heads: 4,
    kvHeads: 2,
    ffn: 512,
    vocab: 512,
    ctx: 64,
    quant,
    seed: 7,
  });
  const recorded = recordStep((s) => model.step(s, STEP_POSITION, () => s.barrier()));
  const dispatches = recorded.filter((d) => d !== null).length;
  const group = `decode step ${quant}`;
  Deno.bench(`${group}: ${dispatches} prebuilt descriptors + barriers, flushed`, { group, baseline: true }, () => {
    const enc = device.commandEncoder();
    for (const d of recorded) d === null ? enc.memoryBarrier() : enc.dispatch(d);
    enc.flush();
    enc.dispose();
  });
  Deno.bench(`${group}: decode step, host encode (no execution)`, { group }, () => {
    const s = exec.begin({ autoBarriers: false });
    model.step(s, STEP_POSITION, () => s.barrier());
    s.encoder.flush();
    s.dispose();
  });
}

// ---- per-view and per-session costs -------------------------------------------------------------

const whole = f32(1 << 14);
Deno.bench("views: 64 slices of one buffer", { group: "views" }, () => {
  for (let i = 0; i < 64; i++) whole.slice(i * 256, 256);
});
Deno.bench("views: 64 slices with an explicit shape", { group: "views" }, () => {
  for (let i = 0; i < 64; i++) whole.slice(i * 256, 256, { shape: [8, 8] });
});
Deno.bench("lifecycle: encoder open + dispose", { group: "lifecycle", baseline: true }, () => {
  device.commandEncoder().dispose();
});
Deno.bench("lifecycle: session open + dispose", { group: "lifecycle" }, () => {
  exec.begin({ autoBarriers: false }).dispose();
});
Deno.bench("lifecycle: session open + one op + flush + dispose", { group: "lifecycle" }, () => {
  const s = exec.begin({ autoBarriers: false });
  s.elementwiseAdd(x, x, y);
  s.encoder.flush();
  s.dispose();
});
