/**
 * The ops' write path for attention, the quantized products and the token ops: flashAttnVec's
 * barrier between its two kernels stays where the descriptor path puts it (hand barriers, automatic
 * barriers, recordings); bad arguments get the ops' messages and publish nothing; a freed buffer
 * drops to the descriptor path's `Disposed` with the same stream either way; calls whose checks pass
 * but whose parameter words are not u32 keep the encoder's refusal.
 */
import { deepStrictEqual, equal, ok, throws } from "node:assert/strict";
import { CommandEncoder, DType, KernelRegistry, type MlxBuffer, MlxError, ops } from "../mod.ts";
import { allContracts } from "../src/kernels.ts";
import type { DispatchTarget } from "../src/ops/common.ts";
import { openDevice } from "./helpers.ts";
import { readable, takeWords, tapStreams } from "./fixtures/stream_tap.ts";
import {
  allBuffers,
  callCounter,
  forwarding,
  type WritePathBuffers,
  writePathBuffers,
} from "./fixtures/write_path_ops.ts";

/** The dispatches direct encoders took on the write path. */
const taken = callCounter(CommandEncoder.prototype, "opDispatch");

function kernelNames(r: KernelRegistry): Map<number, string> {
  const names = new Map<number, string>();
  for (const c of allContracts()) if (r.has(c.name)) names.set(r.get(c.name).handle, c.name);
  return names;
}

const FLASH = { nHeads: 2, nKvHeads: 1, headDim: 64 as const, kvSeqLen: 3, kvCapacity: 4, nwg: 4 };

Deno.test("flashAttnVec on the write path: its barrier sits between its two kernels, as by descriptor", () => {
  for (const autoBarriers of [false, true]) {
    using device = openDevice();
    const chunks = tapStreams(device), registry = new KernelRegistry(device), b = writePathBuffers(device);
    const names = kernelNames(registry);
    const streams: string[][] = [], barriers: number[] = [];
    for (const direct of [true, false]) {
      const enc = device.commandEncoder({ autoBarriers });
      const t = direct ? enc : forwarding(enc), before = taken.count;
      ops.elementwiseAdd(t, registry, b.a, b.b, b.wide.slice(0, 512)); // writes q
      ops.flashAttnVec(t, registry, b.wide.slice(0, 512), b.a, b.b, b.tmp, b.att, FLASH);
      ops.flashAttnVec(t, registry, b.a, b.kv16, b.kv16, b.tmp, b.att, { ...FLASH, state: b.state });
      ops.elementwiseAdd(t, registry, b.att, b.att, b.out); // reads out
      equal(taken.count - before, direct ? 6 : 0);
      enc.commit({ wait: true });
      barriers.push(enc.barrierCount);
      streams.push(readable(takeWords(chunks), names, new Map()));
    }
    deepStrictEqual(streams[0], streams[1], `autoBarriers ${autoBarriers}`);
    deepStrictEqual(barriers[0], barriers[1]);
    // The kernels, dispatches and barriers in order: a hand barrier between each partial and its
    // reduce; with automatic barriers also one before each op that reads what the last one wrote.
    const shape = streams[0]!.filter((r) => r === "barrier" || r.startsWith("groups") || r.startsWith("threads"))
      .map((r) => r.split(" ")[0]);
    // Automatic barriers are the native decoder's (not in the stream words): the stream holds the
    // op's own barrier between each partial and its reduce, and nothing else.
    deepStrictEqual(shape, ["threads", "groups", "barrier", "groups", "groups", "barrier", "groups", "threads"]);
    // With automatic barriers three more: before the first partial (it reads q, just written),
    // before the second (it overwrites tmp, which the first reduce read) and before the last add
    // (it reads out, which the second reduce wrote).
    equal(barriers[0], autoBarriers ? 5 : 2);
    // The reduce is the kernel right after each barrier the op places.
    const pipelines = streams[0]!.filter((r) => r.startsWith("pipeline")).map((r) => r.slice(9));
    deepStrictEqual(pipelines, [
      "elementwise_add_f32",
      "flash_attn_vec_f32",
      "flash_attn_vec_reduce",
      "flash_attn_vec_f16",
      "flash_attn_vec_reduce",
      "elementwise_add_f32",
    ]);
    for (const x of allBuffers(b)) x.dispose();
  }
});

Deno.test("flashAttnVec while recording: dispatch, barrier, dispatch, written like the descriptor", () => {
  using device = openDevice();
  const registry = new KernelRegistry(device), b = writePathBuffers(device);
  const kinds: string[][] = [];
  for (const direct of [true, false]) {
    using enc = device.commandEncoder({ autoBarriers: true });
    enc.startCompactCapture();
    const t = direct ? enc : forwarding(enc), before = taken.count;
    ops.gelu(t, registry, b.a, b.out); // the probe
    ops.flashAttnVec(t, registry, b.a, b.a, b.b, b.tmp, b.att, FLASH);
    equal(taken.count - before, direct ? 2 : 0);
    const capture = enc.takeCompactCapture()!;
    kinds.push(capture.nodes().map((n) => n.kind));
    capture.release();
  }
  deepStrictEqual(kinds[0], ["dispatch", "dispatch", "barrier", "dispatch"]);
  deepStrictEqual(kinds[1], kinds[0]);
  for (const x of allBuffers(b)) x.dispose();
});

/** [label, the call, the error code, the message (exact) or a pattern]. */
type Refusal = [string, (t: DispatchTarget, r: KernelRegistry, b: WritePathBuffers) => void, string, string | RegExp];

const K = 256;
const AFF = { m: 2, n: 8, k: K, bits: 4 as const, groupSize: 64 as const };
const MOE = { tokens: 2, topK: 2, n: 8, k: K, experts: 2 };
const SD = { nHeads: 2, nKvHeads: 1, headDim: 16, seqLen: 2, kvSeqLen: 3, kvCapacity: 4 };
const aff = (b: WritePathBuffers) => [b.x, b.a4.w, b.a4.scales, b.a4.biases] as const;
const gat = (b: WritePathBuffers) => [b.x, b.g4.w, b.g4.scales, b.g4.biases] as const;
const BAD = "InvalidArgument";

const REFUSALS: Refusal[] = [
  [
    "affine m",
    (t, r, b) => ops.quantizedMatmul(t, r, ...aff(b), b.qout, { ...AFF, m: 0 }),
    BAD,
    "quantized_matmul: m must be an integer >= 1, got 0",
  ],
  [
    "affine bits",
    (t, r, b) => ops.quantizedMatmul(t, r, ...aff(b), b.qout, { ...AFF, bits: 7 as 4 }),
    BAD,
    "quantized_matmul: bits must be 2, 3, 4, 5, 6 or 8, got 7",
  ],
  [
    "affine group",
    (t, r, b) => ops.quantizedMatmul(t, r, ...aff(b), b.qout, { ...AFF, groupSize: 16 as 64 }),
    BAD,
    "quantized_matmul: groupSize must be 32, 64 or 128",
  ],
  [
    "affine k",
    (t, r, b) => ops.quantizedMatmul(t, r, ...aff(b), b.qout, { ...AFF, k: 96 }),
    BAD,
    "quantized_matmul: k must be a multiple of groupSize",
  ],
  [
    "affine scales",
    (t, r, b) => ops.quantizedMatmul(t, r, b.x, b.a4.w, b.a4f.scales, b.a4.biases, b.qout, AFF),
    BAD,
    "quantized_matmul: scales and biases must share one dtype of f32, f16 or bf16 (got f32 and bf16)",
  ],
  [
    "affine fast",
    (t, r, b) => ops.quantizedMatmul(t, r, ...aff(b), b.qout, { ...AFF, n: 4, variant: "fast" }),
    BAD,
    "quantized_matmul: the fast kernel needs n % 8 = 0, k % 256 = 0, 4 or 8 bits and bf16 scales",
  ],
  [
    "affine x",
    (t, r, b) => ops.quantizedMatmul(t, r, b.half, b.a4.w, b.a4.scales, b.a4.biases, b.qout, AFF),
    BAD,
    "quantized_matmul: x must be f32, got f16",
  ],
  [
    "affine w",
    (t, r, b) => ops.quantizedMatmul(t, r, b.x, b.a4.w, b.a4.scales, b.a4.biases, b.qout, { ...AFF, n: 16 }),
    BAD,
    "quantized_matmul: w holds 1024 bytes, needs 2048",
  ],
  [
    "affine y",
    (t, r, b) => ops.quantizedMatmul(t, r, ...aff(b), b.out.slice(0, 32), AFF),
    BAD,
    "quantized_matmul: y holds 32 bytes, needs 64 (16 × f32)",
  ],
  [
    "general y",
    (t, r, b) =>
      ops.quantizedMatmul(t, r, b.x, b.a3.w, b.a3.scales, b.a3.biases, b.out.slice(0, 32), {
        ...AFF,
        bits: 3 as 4,
        groupSize: 128,
      }),
    BAD,
    "quantized_matmul: y holds 32 bytes, needs 64 (16 × f32)",
  ],
  [
    "ggml format",
    (t, r, b) => ops.quantizedMatmulGgml(t, r, b.x, b.ggml.q4_0, b.qout, { m: 1, n: 8, k: K, format: "q9" as "q4_0" }),
    BAD,
    "quantized_matmul_ggml: unknown format q9 (use q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k)",
  ],
  [
    "ggml k",
    (t, r, b) => ops.quantizedMatmulGgml(t, r, b.x, b.ggml.q4_0, b.qout, { m: 1, n: 8, k: 100, format: "q4_0" }),
    BAD,
    "quantized_matmul_ggml: k (100) must be a multiple of 32 for q4_0",
  ],
  [
    "ggml mv",
    (t, r, b) =>
      ops.quantizedMatmulGgml(t, r, b.x, b.ggml.q4_0, b.qout, { m: 9, n: 8, k: K, format: "q4_0", variant: "mv" }),
    BAD,
    "quantized_matmul_ggml: the mat-vec path takes m <= 8",
  ],
  [
    "ggml w",
    (t, r, b) => ops.quantizedMatmulGgml(t, r, b.x, b.ggml.q8_0, b.qout, { m: 1, n: 9, k: K, format: "q8_0" }),
    BAD,
    "quantized_matmul_ggml: w holds 2176 bytes, needs 2448",
  ],
  [
    "ggml variant",
    (t, r, b) =>
      ops.quantizedMatmulGgml(t, r, b.x, b.ggml.q4_0, b.qout, {
        m: 1,
        n: 8,
        k: K,
        format: "q4_0",
        variant: "xx" as "mv",
      }),
    "KernelNotFound",
    /qmatmul_q4_0_xx/,
  ],
  [
    "moe topK",
    (t, r, b) => ops.quantizedMatmulIdGgml(t, r, b.x, b.moeQ4_0, b.route, b.qout, { ...MOE, topK: 0, format: "q4_0" }),
    BAD,
    "quantized_matmul_id_ggml: topK must be an integer >= 1, got 0",
  ],
  [
    "moe k",
    (t, r, b) => ops.quantizedMatmulIdGgml(t, r, b.x, b.moeQ6_K, b.route, b.qout, { ...MOE, k: 32, format: "q6_k" }),
    BAD,
    "quantized_matmul_id_ggml: k (32) must be a multiple of 256 for q6_k",
  ],
  [
    "moe ids",
    (t, r, b) => ops.quantizedMatmulIdGgml(t, r, b.x, b.moeQ4_0, b.a, b.qout, { ...MOE, format: "q4_0" }),
    BAD,
    "quantized_matmul_id_ggml: ids must be u32, got f32",
  ],
  [
    "moe w",
    (t, r, b) =>
      ops.quantizedMatmulIdGgml(t, r, b.x, b.moeQ4_0, b.route, b.qout, { ...MOE, experts: 3, format: "q4_0" }),
    BAD,
    "quantized_matmul_id_ggml: w holds 2304 bytes, needs 3456",
  ],
  [
    "gather experts",
    (t, r, b) =>
      ops.quantizedMatmulAffineGather(t, r, ...gat(b), b.route, b.qout, {
        ...MOE,
        experts: 1.5,
        bits: 4,
        groupSize: 64,
      }),
    BAD,
    "quantized_matmul_affine_gather: experts must be an integer >= 1, got 1.5",
  ],
  [
    "gather bits",
    (t, r, b) =>
      ops.quantizedMatmulAffineGather(t, r, ...gat(b), b.route, b.qout, { ...MOE, bits: 7 as 4, groupSize: 64 }),
    BAD,
    "quantized_matmul_affine_gather: bits must be 2, 3, 4, 5, 6 or 8, got 7",
  ],
  [
    "gather scales",
    (t, r, b) =>
      ops.quantizedMatmulAffineGather(t, r, b.x, b.g4.w, b.q8, b.q8, b.route, b.qout, {
        ...MOE,
        bits: 4,
        groupSize: 64,
      }),
    BAD,
    "quantized_matmul_affine_gather: scales and biases must share one dtype of f32, f16 or bf16 (got u8 and u8)",
  ],
  [
    "gather ids",
    (t, r, b) =>
      ops.quantizedMatmulAffineGather(t, r, ...gat(b), b.route, b.qout, { ...MOE, tokens: 3, bits: 4, groupSize: 64 }),
    BAD,
    "quantized_matmul_affine_gather: ids holds 16 bytes, needs 24 (6 × u32)",
  ],
  [
    "gather biases",
    (t, r, b) =>
      ops.quantizedMatmulAffineGather(t, r, b.x, b.g4.w, b.g4.scales, b.a4.biases, b.route, b.qout, {
        ...MOE,
        bits: 4,
        groupSize: 64,
      }),
    BAD,
    "quantized_matmul_affine_gather: biases holds 64 bytes, needs 128 (64 × bf16)",
  ],
  [
    "sdpa heads",
    (t, r, b) => ops.sdpa(t, r, b.a, b.a, b.b, b.att, { ...SD, nKvHeads: 3 }),
    BAD,
    "sdpa: nKvHeads (3) must divide nHeads (2)",
  ],
  [
    "sdpa headDim",
    (t, r, b) => ops.sdpa(t, r, b.a, b.a, b.b, b.att, { ...SD, headDim: 1024 }),
    BAD,
    "sdpa: headDim must be <= 512",
  ],
  [
    "sdpa lengths",
    (t, r, b) => ops.sdpa(t, r, b.a, b.a, b.b, b.att, { ...SD, kvSeqLen: 1 }),
    BAD,
    "sdpa: need seqLen (2) <= kvSeqLen (1) <= kvCapacity (4)",
  ],
  [
    "sdpa scale",
    (t, r, b) => ops.sdpa(t, r, b.a, b.a, b.b, b.att, { ...SD, scale: NaN }),
    BAD,
    "sdpa: scale must be finite, got NaN",
  ],
  [
    "sdpa dtype",
    (t, r, b) => ops.sdpa(t, r, b.half, b.half, b.half, b.half, { ...SD, nHeads: 1, seqLen: 1 }),
    BAD,
    "sdpa: dtype must be f32 or bf16",
  ],
  ["sdpa k", (t, r, b) => ops.sdpa(t, r, b.a, b.bf, b.b, b.att, SD), BAD, "sdpa: k must be f32, got bf16"],
  [
    "sdpa out",
    (t, r, b) => ops.sdpa(t, r, b.a, b.a, b.b, b.out, { ...SD, batch: 3 }),
    BAD,
    "sdpa: out holds 256 bytes, needs 768 (192 × f32)",
  ],
  [
    "sdpa kvSeqLen word",
    (t, r, b) => ops.sdpa(t, r, b.a, b.a, b.b, b.att, { ...SD, kvSeqLen: 2.5 }),
    BAD,
    /word 4 is 2\.5, not a u32/,
  ],
  [
    "flash headDim",
    (t, r, b) => ops.flashAttnVec(t, r, b.a, b.a, b.b, b.tmp, b.att, { ...FLASH, headDim: 100 as 64 }),
    BAD,
    "flash_attn_vec: headDim must be 64, 128, 256 or 512, got 100",
  ],
  [
    "flash mask",
    (t, r, b) => ops.flashAttnVec(t, r, b.a, b.a, b.b, b.tmp, b.att, { ...FLASH, mask: "x" as "none" }),
    BAD,
    "flash_attn_vec: mask must be none, causal or sliding",
  ],
  [
    "flash window",
    (t, r, b) => ops.flashAttnVec(t, r, b.a, b.a, b.b, b.tmp, b.att, { ...FLASH, mask: "sliding" }),
    BAD,
    "flash_attn_vec: slidingWindow must be an integer >= 1, got 0",
  ],
  [
    "flash softcap",
    (t, r, b) => ops.flashAttnVec(t, r, b.a, b.a, b.b, b.tmp, b.att, { ...FLASH, softcap: -1 }),
    BAD,
    "flash_attn_vec: softcap must be >= 0, got -1",
  ],
  [
    "flash nwg",
    (t, r, b) => ops.flashAttnVec(t, r, b.a, b.a, b.b, b.tmp, b.att, { ...FLASH, nwg: 300 }),
    BAD,
    "flash_attn_vec: nwg must be <= 256",
  ],
  [
    "flash tmp",
    (t, r, b) => ops.flashAttnVec(t, r, b.a, b.a, b.b, b.tmp, b.att, { ...FLASH, nwg: 8 }),
    BAD,
    "flash_attn_vec: tmp holds 2112 bytes, needs 4224 (1056 × f32)",
  ],
  [
    "flash state",
    (t, r, b) =>
      ops.flashAttnVec(t, r, b.a, b.a, b.b, b.tmp, b.att, {
        ...FLASH,
        state: b.tmp.slice(64, 4, { dtype: DType.U32 }),
      }),
    BAD,
    "flash_attn_vec: the step state must not lie in tmp",
  ],
  [
    "flash kv",
    (t, r, b) => ops.flashAttnVec(t, r, b.a, b.bf, b.bf, b.tmp, b.att, FLASH),
    BAD,
    "flash_attn_vec: K/V must be f32 or f16, got bf16",
  ],
  [
    "flash window word",
    (t, r, b) => ops.flashAttnVec(t, r, b.a, b.a, b.b, b.tmp, b.att, { ...FLASH, mask: "none", slidingWindow: -1 }),
    BAD,
    /word 7 is -1, not a u32/,
  ],
  [
    "argmax rows",
    (t, r, b) => ops.argmax(t, r, b.a, b.ring, { vocab: 64, rows: 0 }),
    BAD,
    "argmax: rows must be an integer >= 1, got 0",
  ],
  [
    "argmax logits",
    (t, r, b) => ops.argmax(t, r, b.route, b.ring, { vocab: 4 }),
    BAD,
    "argmax: logits must be f32 or bf16, got u32",
  ],
  [
    "argmax cursor",
    (t, r, b) => ops.argmax(t, r, b.a, b.ring, { vocab: 64, cursor: b.a }),
    BAD,
    "argmax: cursor must be u32, got f32",
  ],
  [
    "argmax vocab",
    (t, r, b) => ops.argmax(t, r, b.a, b.ring, { vocab: 1000 }),
    BAD,
    "argmax: logits holds 2560 bytes, needs 4000 (1000 × f32)",
  ],
  [
    "argmax ids",
    (t, r, b) => ops.argmax(t, r, b.a, b.ring, { vocab: 64, rows: 3, ring: 3 }),
    BAD,
    "argmax: ids holds 32 bytes, needs 36 (9 × u32)",
  ],
  [
    "sample temperature",
    (t, r, b) => ops.sample(t, r, b.a, b.ring, { vocab: 64, temperature: 1e-7, seed: 1 }),
    BAD,
    "sample: temperature must be 0 (greedy) or in [1e-5, 1e5], got 1e-7",
  ],
  [
    "sample topK",
    (t, r, b) => ops.sample(t, r, b.a, b.ring, { vocab: 64, temperature: 1, topK: -1, seed: 1 }),
    BAD,
    "sample: topK must be an integer >= 0, got -1",
  ],
  [
    "sample topP",
    (t, r, b) => ops.sample(t, r, b.a, b.ring, { vocab: 64, temperature: 1, topP: 0, seed: 1 }),
    BAD,
    "sample: topP must be in (0, 1], got 0",
  ],
  [
    "sample counter",
    (t, r, b) => ops.sample(t, r, b.a, b.ring, { vocab: 64, temperature: 1, counter: 1.5, seed: 1 }),
    BAD,
    "sample: counter must be an integer >= 0, got 1.5",
  ],
  [
    "sample seed",
    (t, r, b) => ops.sample(t, r, b.a, b.ring, { vocab: 64, temperature: 1, seed: -1 }),
    BAD,
    "sample: seed must be an integer in [0, 2^64), got -1",
  ],
  [
    "sample big seed",
    (t, r, b) => ops.sample(t, r, b.a, b.ring, { vocab: 64, temperature: 1, seed: 1n << 64n }),
    BAD,
    "sample: seed must be an integer in [0, 2^64), got 18446744073709551616",
  ],
  [
    "sample logits",
    (t, r, b) => ops.sample(t, r, b.half, b.ring, { vocab: 4, temperature: 1, seed: 1 }),
    BAD,
    "sample: logits must be f32 or bf16, got f16",
  ],
  [
    "gather format",
    (t, r, b) => ops.embedGather(t, r, b.q8, b.tok, b.emb, { dim: 32, vocab: 8, format: "q5_0" as "q8_0" }),
    BAD,
    "embed_gather: table format q5_0 is not one of f32, bf16, q8_0, q4_0",
  ],
  [
    "gather table",
    (t, r, b) => ops.embedGather(t, r, b.bf, b.tok, b.emb, { dim: 16, vocab: 8, format: "f32" }),
    BAD,
    "embed_gather: a f32 table must be a f32 buffer, got bf16",
  ],
  [
    "gather dim",
    (t, r, b) => ops.embedGather(t, r, b.q8, b.tok, b.emb, { dim: 16, vocab: 8, format: "q8_0" }),
    BAD,
    "embed_gather: dim must be a multiple of 32 for q8_0, got 16",
  ],
  [
    "gather vocab",
    (t, r, b) => ops.embedGather(t, r, b.b, b.tok, b.emb, { dim: 16, vocab: 100 }),
    BAD,
    "embed_gather: table holds 2560 bytes, needs 6400",
  ],
  [
    "gather output",
    (t, r, b) => ops.embedGather(t, r, b.b, b.tok, b.emb, { dim: 32, vocab: 20, rows: 4 }),
    BAD,
    "embed_gather: output holds 256 bytes, needs 512 (128 × f32)",
  ],
  [
    "gather ring",
    (t, r, b) => ops.embedGather(t, r, b.b, b.tok, b.emb, { dim: 16, vocab: 40, ring: 0 }),
    BAD,
    "embed_gather: ring must be an integer >= 1, got 0",
  ],
  [
    "advance words",
    (t, r, b) => ops.stepAdvance(t, r, b.step, { words: 65 }),
    BAD,
    "step_advance: words must be at most 64, got 65",
  ],
  [
    "advance zero",
    (t, r, b) => ops.stepAdvance(t, r, b.step, { words: 0 }),
    BAD,
    "step_advance: words must be an integer >= 1, got 0",
  ],
  [
    "advance add",
    (t, r, b) => ops.stepAdvance(t, r, b.step, { add: -1 }),
    BAD,
    "step_advance: add must be an integer >= 0, got -1",
  ],
  ["advance state", (t, r, b) => ops.stepAdvance(t, r, b.a), BAD, "step_advance: state must be u32, got f32"],
  [
    "advance size",
    (t, r, b) => ops.stepAdvance(t, r, b.step, { words: 5 }),
    BAD,
    "step_advance: state holds 16 bytes, needs 20 (5 × u32)",
  ],
];

Deno.test("bad arguments get the ops' messages and publish nothing, on every target", () => {
  using device = openDevice();
  const chunks = tapStreams(device), registry = new KernelRegistry(device), b = writePathBuffers(device);
  for (const mode of ["direct", "recording", "descriptor"] as const) {
    for (const [label, call, code, message] of REFUSALS) {
      using enc = device.commandEncoder({ autoBarriers: true });
      if (mode === "recording") enc.startCompactCapture();
      const t = mode === "descriptor" ? forwarding(enc) : enc;
      ops.gelu(t, registry, b.a, b.out);
      throws(
        () => call(t, registry, b),
        (e) =>
          e instanceof MlxError && e.code === code &&
          (typeof message === "string" ? e.message === message : message.test(e.message)),
        `${mode} ${label}`,
      );
      if (mode === "recording") {
        const c = enc.takeCompactCapture()!;
        equal(c.nodeCount, 1, `${mode} ${label}`);
        c.release();
      } else {
        equal(enc.dispatchCount, 1, `${mode} ${label}`);
        enc.flush();
        // one SET_PIPELINE, two bindings, one DISPATCH (and the automatic-barrier switch)
        const records = readable(takeWords(chunks), new Map(), new Map());
        deepStrictEqual(records.filter((r) => !r.startsWith("op")).map((r) => r.split(" ")[0]), [
          "pipeline",
          "s0",
          "s1",
          "threads",
        ], `${mode} ${label}`);
      }
    }
  }
  for (const x of allBuffers(b)) x.dispose();
});

/** One call of each op, with `gone` (a freed buffer) bound where `slot` says. */
function withFreed(
  t: DispatchTarget,
  r: KernelRegistry,
  b: WritePathBuffers,
  gone: { f32: MlxBuffer; u32: MlxBuffer },
  op: number,
): void {
  const f = gone.f32, u = gone.u32;
  switch (op) {
    case 0:
      return ops.quantizedMatmul(t, r, b.x, b.a4.w, b.a4.scales, b.a4.biases, f, AFF);
    case 1:
      return ops.quantizedMatmul(t, r, b.x, b.a3.w, b.a3.scales, b.a3.biases, f, { ...AFF, bits: 3, groupSize: 128 });
    case 2:
      return ops.quantizedMatmulGgml(t, r, f, b.ggml.q4_k, b.qout, { m: 1, n: 8, k: K, format: "q4_k" });
    case 3:
      return ops.quantizedMatmulGgml(t, r, b.x, b.ggml.q5_1, f, { m: 9, n: 8, k: K, format: "q5_1" });
    case 4:
      return ops.quantizedMatmulIdGgml(t, r, b.x, b.moeQ4_0, u, b.qout, { ...MOE, format: "q4_0" });
    case 5:
      return ops.quantizedMatmulAffineGather(t, r, b.x, b.g4.w, b.g4.scales, b.g4.biases, u, b.qout, {
        ...MOE,
        bits: 4,
        groupSize: 64,
      });
    case 6:
      return ops.sdpa(t, r, b.a, b.a, f, b.att, SD);
    case 7: // the partial refuses: nothing is published
      return ops.flashAttnVec(t, r, b.a, b.a, b.b, b.tmp, b.att, { ...FLASH, state: u });
    case 8: // the reduce refuses: the partial and the barrier are published, as by descriptor
      return ops.flashAttnVec(t, r, b.a, b.a, b.b, b.tmp, f, FLASH);
    case 9:
      return ops.argmax(t, r, b.a, b.ring, { vocab: 64, cursor: u });
    case 10:
      return ops.sample(t, r, f, b.ring, { vocab: 64, temperature: 0.5, seed: 3 });
    case 11:
      return ops.embedGather(t, r, b.b, u, b.emb, { dim: 16, vocab: 40 });
    case 12:
      return ops.stepAdvance(t, r, u);
  }
}

Deno.test("a freed buffer drops to the descriptor path's Disposed: the same stream on both paths", () => {
  for (const autoBarriers of [false, true]) {
    using device = openDevice();
    const chunks = tapStreams(device), registry = new KernelRegistry(device), b = writePathBuffers(device);
    const names = kernelNames(registry);
    const gone = { f32: device.alloc(4096 * 4, DType.F32), u32: device.alloc(64 * 4, DType.U32) };
    gone.f32.dispose();
    gone.u32.dispose();
    for (let op = 0; op <= 12; op++) {
      const streams: string[][] = [], counts: number[] = [];
      for (const direct of [true, false]) {
        const enc = device.commandEncoder({ autoBarriers });
        const t = direct ? enc : forwarding(enc);
        ops.gelu(t, registry, b.a, b.out);
        throws(
          () => withFreed(t, registry, b, gone, op),
          (e) => e instanceof MlxError && e.code === "Disposed",
          `op ${op}`,
        );
        ops.silu(t, registry, b.a, b.out); // a SET_PIPELINE of its own: nothing refused was kept
        counts.push(enc.dispatchCount);
        enc.commit({ wait: true });
        streams.push(readable(takeWords(chunks), names, new Map()));
      }
      deepStrictEqual(streams[0], streams[1], `op ${op} autoBarriers ${autoBarriers}`);
      deepStrictEqual(counts, op === 8 ? [3, 3] : [2, 2], `op ${op}`);
    }
    for (const x of allBuffers(b)) x.dispose();
  }
});

Deno.test("a bigint seed encodes the same words as the equal number seed", () => {
  using device = openDevice();
  const chunks = tapStreams(device), registry = new KernelRegistry(device), b = writePathBuffers(device);
  const words: Uint32Array[] = [];
  for (const seed of [2 ** 40 + 9, 2n ** 40n + 9n, 2 ** 40 + 10]) {
    const enc = device.commandEncoder();
    ops.sample(enc, registry, b.a, b.ring, { vocab: 64, temperature: 0.7, seed });
    enc.commit({ wait: true });
    words.push(takeWords(chunks));
  }
  deepStrictEqual(words[1], words[0]);
  ok(words[2]!.some((w, i) => w !== words[0]![i]));
  for (const x of allBuffers(b)) x.dispose();
});
