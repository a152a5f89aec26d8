/**
 * Host cost of the decode-path ops (rope, matmul, attention, sampling) against a prebuilt descriptor
 * of the same kernel: 800 calls per pass into one encoder, nothing runs (the pass is flushed to the
 * native encoder and dropped). The ops check their arguments and fill a reused descriptor, so each
 * should cost about what the descriptor path costs. Read the ratios, not the absolute numbers.
 *
 *   deno bench --allow-ffi --allow-read --allow-env bench/op_host_bench.ts
 */
import { DType, f32Bits, MlxDevice, ops } from "../mod.ts";
import type { DispatchDescriptor } from "../src/encoder.ts";
import type { DispatchTarget } from "../src/ops/common.ts";

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
