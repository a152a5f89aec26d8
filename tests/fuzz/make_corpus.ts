/**
 * Writes the fuzzer's seed corpus (tests/fuzz/corpus/*.bin): for EVERY kernel of the CPU backend,
 * one valid stream that the fuzz target executes, plus a few multi-dispatch and record-format
 * seeds. Streams use the handles of the target's device (buffers 1..4 of 64 B, 256 B, 4 KiB and
 * 64 KiB) and this build's pipeline handles. Each file starts with the 2-byte chunk split the
 * target reads. Fails when a kernel has no seed.
 *
 *   deno run --allow-ffi --allow-read --allow-write --allow-env tests/fuzz/make_corpus.ts
 */
import { KernelRegistry, MlxDevice } from "../../mod.ts";
import { allContracts } from "../../src/kernels.ts";
import { Op, recordHeader, Track } from "../../src/native/abi.ts";
import { f32Bits } from "../../src/ops/common.ts";

using device = MlxDevice.open({ backend: "cpu" });
const reg = new KernelRegistry(device);
const SMALL = 3, BIG = 4; // the 4 KiB and 64 KiB buffers of the fuzz target

type Words = number[];
const rec = (op: number, slot: number, ...p: number[]): Words => [recordHeader(op, 1 + p.length, slot), ...p];

/** One dispatch: buffer slots get disjoint ranges of the 64 KiB buffer, in slot order. */
function dispatch(
  kernel: string,
  slots: (number | number[])[], // a byte count (a buffer slot) or the words of an inline slot
  groups: [number, number, number],
  tg: [number, number, number],
  kind: "groups" | "threads" = "groups",
  tgMemory = 0,
): Words {
  const w = rec(Op.SET_PIPELINE, 0, reg.get(kernel).handle);
  let off = 0;
  slots.forEach((s, i) => {
    if (typeof s === "number") {
      if (s === 0) return; // an optional slot left unbound
      w.push(...rec(Op.SET_BUFFER, i, BIG, off, s));
      off += Math.ceil(s / 256) * 256;
    } else {
      w.push(...rec(Op.SET_BYTES, i, s.length * 4, ...s));
    }
  });
  if (off > 65536) throw new Error(`${kernel}: the seed needs ${off} bytes, more than 64 KiB`);
  if (tgMemory) w.push(...rec(Op.SET_TG_MEMORY, 0, tgMemory));
  w.push(...rec(kind === "groups" ? Op.DISPATCH_GROUPS : Op.DISPATCH_THREADS, 0, ...groups, ...tg, 0));
  return w;
}

const seeds: Record<string, Words> = {};
const es = { f32: 4, f16: 2, bf16: 2 } as const;
const eps = f32Bits(1e-5);
/** The row kernels (one threadgroup of 64 per row) reduce through one f32 per thread. */
const ROW_TG_MEMORY = 64 * 4;
/** The matrix products: one 32-lane simdgroup per output, 4 (fast affine: 8) per threadgroup. */
const MM_TG: [number, number, number] = [128, 1, 1];

for (const [t, size] of Object.entries(es)) {
  const n = 256, bytes = n * size;
  for (const op of ["elementwise_add", "elementwise_mul", "silu_mul"]) {
    seeds[`${op}_${t}`] = dispatch(`${op}_${t}`, [bytes, bytes, bytes, [n]], [n, 1, 1], [64, 1, 1], "threads");
  }
  for (const op of ["gelu", "silu"]) {
    seeds[`${op}_${t}`] = dispatch(`${op}_${t}`, [bytes, bytes], [n, 1, 1], [64, 1, 1], "threads");
  }
  const rows = 4, dim = 64, rb = rows * dim * size, wb = dim * size;
  seeds[`rms_norm_${t}`] = dispatch(
    `rms_norm_${t}`,
    [rb, wb, rb, [eps, dim]],
    [rows, 1, 1],
    [64, 1, 1],
    "groups",
    ROW_TG_MEMORY,
  );
  seeds[`rms_norm_mul_${t}`] = dispatch(
    `rms_norm_mul_${t}`,
    [rb, wb, rb, rb, [eps, dim]],
    [rows, 1, 1],
    [64, 1, 1],
    "groups",
    ROW_TG_MEMORY,
  );
  seeds[`rms_norm_mul_add_${t}`] = dispatch(
    `rms_norm_mul_add_${t}`,
    [rb, wb, rb, rb, rb, [eps, dim]],
    [2, 2, 1],
    [64, 1, 1],
    "groups",
    ROW_TG_MEMORY,
  );
}
seeds.softcap_f32 = dispatch("softcap_f32", [1024, 1024, [f32Bits(30), 256]], [256, 1, 1], [64, 1, 1], "threads");
seeds.axpby_f32 = dispatch(
  "axpby_f32",
  [1024, 1024, 1024, [f32Bits(2), f32Bits(-1), 256, 0]],
  [256, 1, 1],
  [64, 1, 1],
  "threads",
);
seeds.scale_f32 = dispatch("scale_f32", [256, 256, [f32Bits(2), 64]], [64, 1, 1], [64, 1, 1], "threads");
seeds.strided_copy_f32 = dispatch(
  "strided_copy_f32",
  [224, 128, [4, 8, 16, 8, 0, 0, 0]],
  [8, 4, 1],
  [8, 1, 1],
  "threads",
);
// With a step state (zero: position 0): rows move by 8 elements per position, 4 positions bound.
seeds.strided_copy_f32_state = dispatch(
  "strided_copy_f32",
  [224, 224, [4, 8, 16, 8, 1, 8, 4], 16],
  [8, 4, 1],
  [8, 1, 1],
  "threads",
);
seeds.debug_fault = dispatch("debug_fault", [4, [0]], [1, 1, 1], [1, 1, 1]);
seeds.debug_fault_failing = dispatch("debug_fault", [4, [1]], [1, 1, 1], [1, 1, 1]);
seeds.rms_norm_no_scale_f32 = dispatch(
  "rms_norm_no_scale_f32",
  [1024, 1024, [eps, 64]],
  [4, 1, 1],
  [64, 1, 1],
  "groups",
  ROW_TG_MEMORY,
);
seeds.softmax_f32 = dispatch("softmax_f32", [1024, 1024, [64]], [2, 2, 1], [64, 1, 1], "groups", ROW_TG_MEMORY);
seeds.rope_f32 = dispatch("rope_f32", [1024, 1024, [f32Bits(1e4), 64, 4], 16], [32, 4, 1], [32, 1, 1], "threads");
for (const op of ["rope_neox_f32", "rope_norm_f32"]) {
  seeds[op] = dispatch(
    op,
    [2048, 2048, [f32Bits(1e4), 64, 32], 16, [2, 1, 64, 128, 0, 0, 0], 64, 0],
    [16, 8, 1],
    [16, 1, 1],
    "threads",
  );
  // With a step state instead of positions: rows move by 64 elements per position, 2 positions bound.
  seeds[`${op}_state`] = dispatch(
    op,
    [2048, 2304, [f32Bits(1e4), 64, 32], 0, [2, 1, 64, 128, 1, 64, 2], 64, 16],
    [16, 8, 1],
    [16, 1, 1],
    "threads",
  );
}

// Matrix products: M = 2, N = 8.
for (const [t, size] of [["f32", 4], ["bf16", 2], ["f16", 2]] as const) {
  const K = 32, x = 2 * K * 4, w = 8 * K * size, y = 2 * 8 * 4;
  seeds[`matmul_${t}`] = dispatch(`matmul_${t}`, [x, w, y, [2, 8, K, 0]], [2, 2, 1], MM_TG);
  seeds[`matmul_${t}_residual`] = dispatch(`matmul_${t}`, [x, w, y, [2, 8, K, 1], y], [2, 2, 1], MM_TG);
  seeds[`matmul_${t}_swiglu`] = dispatch(`matmul_${t}`, [x, 2 * w, y, [2, 8, K, 2 | 0x100]], [4, 2, 1], MM_TG);
}
for (const bits of [4, 6, 8]) {
  const K = 64, gs = 32;
  seeds[`qmatmul_affine_${bits}`] = dispatch(
    "qmatmul_affine",
    [2 * K * 4, 8 * K * bits / 8, 8 * (K / gs) * 2, 8 * (K / gs) * 2, 64, [2, 8, K, bits, gs]],
    [2, 2, 1],
    MM_TG,
  );
}
seeds.qmatmul_affine_fast = dispatch(
  "qmatmul_affine_fast",
  [2 * 256 * 4, 8 * 256 / 2, 8 * 8 * 2, 8 * 8 * 2, 64, [2, 8, 256, 4, 32]],
  [1, 2, 1],
  [256, 1, 1],
);
// Any width and scale dtype (0 f32, 1 f16, 2 bf16), and its MoE gather (2 tokens, top_k 2, 2 experts).
for (const [bits, st, ss] of [[2, 0, 4], [3, 1, 2], [5, 2, 2], [6, 1, 2]] as const) {
  const K = 64, gs = 32, s = 8 * (K / gs) * ss;
  seeds[`qmatmul_affine_general_${bits}`] = dispatch(
    "qmatmul_affine_general",
    [2 * K * 4, 8 * K / 8 * bits, s, s, 64, [2, 8, K, bits, gs, st]],
    [2, 2, 1],
    MM_TG,
  );
  seeds[`qmatmul_affine_gather_${bits}`] = dispatch(
    "qmatmul_affine_gather",
    [2 * K * 4, 2 * 8 * K / 8 * bits, 2 * s, 2 * s, 16, 4 * 8 * 4, [4, 8, K, 2, 2, bits, gs, st]],
    [2, 4, 1],
    MM_TG,
  );
}
const GGML_FORMATS = [
  ["q4_0", 32, 18],
  ["q8_0", 32, 34],
  ["q6_k", 256, 210],
  ["q4_1", 32, 20],
  ["q5_0", 32, 22],
  ["q5_1", 32, 24],
  ["q4_k", 256, 144],
  ["q5_k", 256, 176],
] as const;
for (const [f, bv, bb] of GGML_FORMATS) {
  const K = bv, x = 2 * K * 4, w = 8 * bb, y = 64;
  seeds[`qmatmul_${f}_mv`] = dispatch(`qmatmul_${f}_mv`, [x, w, y, [2, 8, K]], [2, 1, 1], MM_TG);
  seeds[`qmatmul_${f}_mm`] = dispatch(`qmatmul_${f}_mm`, [x, w, y, [2, 8, K]], [2, 2, 1], MM_TG);
  // MoE: 2 tokens, top_k 2, 2 experts; the zero-filled ids pick expert 0.
  seeds[`qmatmul_id_${f}`] = dispatch(`qmatmul_id_${f}`, [x, 2 * w, 16, 4 * 8 * 4, [4, 8, K, 2, 2]], [2, 4, 1], MM_TG);
}
for (const [t, size] of [["f32", 4], ["bf16", 2]] as const) {
  // batch 1, 2 heads over 1 kv head, head_dim 16, seq 2 of kv 4, capacity 8
  const q = 2 * 2 * 16 * size, kv = 8 * 16 * size;
  seeds[`sdpa_${t}`] = dispatch(`sdpa_${t}`, [q, kv, kv, q, [2, 1, 16, 2, 4, f32Bits(0.25), 8]], [1, 2, 1], [32, 1, 1]);
}
for (const [t, size] of [["f32", 4], ["f16", 2]] as const) {
  // 2 heads, 1 kv head, head_dim 64, kv 8 of capacity 16, sliding window 4, softcap 30, 2 workgroups
  const kv = 16 * 64 * size, tmp = 2 * 2 * 66 * 4;
  seeds[`flash_attn_vec_${t}`] = dispatch(
    `flash_attn_vec_${t}`,
    [512, kv, kv, tmp, [2, 1, 64, 8, 16, f32Bits(0.125), 2, 4, f32Bits(30), 2, 0]],
    [2, 2, 1],
    [32, 1, 1],
  );
  // Keys from a step state (position 0 of at most 8).
  seeds[`flash_attn_vec_${t}_state`] = dispatch(
    `flash_attn_vec_${t}`,
    [512, kv, kv, tmp, [2, 1, 64, 8, 16, f32Bits(0.125), 2, 4, f32Bits(30), 2, 1], 16],
    [2, 2, 1],
    [32, 1, 1],
  );
}
seeds.flash_attn_vec_reduce = dispatch("flash_attn_vec_reduce", [2 * 2 * 66 * 4, 512, [2, 64, 2]], [2, 1, 1], [
  32,
  1,
  1,
]);

// Token kernels: 2 rows of a 64-token vocabulary (zero logits: every token ties), one threadgroup of
// 64 per row; token ids in a ring of 2 slots. Gathers: 2 rows of dim 64 from a vocabulary of 4.
for (const [t, size] of [["f32", 4], ["bf16", 2]] as const) {
  seeds[`argmax_${t}`] = dispatch(`argmax_${t}`, [2 * 64 * size, 16, [64, 2, 2, 0], 0], [2, 1, 1], [64, 1, 1]);
  seeds[`sample_${t}`] = dispatch(
    `sample_${t}`,
    [2 * 64 * size, 16, [64, 2, 2, 0, f32Bits(1.4427), 8, 1 << 30, 7, 11, 0], 0],
    [2, 1, 1],
    [64, 1, 1],
  );
}
for (const [f, tableBytes] of [["f32", 4 * 64 * 4], ["bf16", 4 * 64 * 2], ["q8_0", 4 * 2 * 34], ["q4_0", 4 * 2 * 18]]) {
  seeds[`embed_gather_${f}`] = dispatch(
    `embed_gather_${f}`,
    [tableBytes as number, 16, 2 * 64 * 4, [2, 64, 4, 2, 0], 0],
    [64, 2, 1],
    [64, 1, 1],
    "threads",
  );
}

seeds.step_advance_u32 = dispatch("step_advance_u32", [16, [4, 1]], [1, 1, 1], [1, 1, 1], "threads");

// Record formats and multi-dispatch command buffers: barriers, whole-buffer and 64-bit bindings,
// threadgroup memory, a pipeline carried over between dispatches.
seeds.chain_with_barriers = [
  ...rec(Op.SET_PIPELINE, 0, reg.get("elementwise_add_f32").handle),
  ...rec(Op.SET_BUFFER, 0, SMALL, 0, 1024),
  ...rec(Op.SET_BUFFER, 1, SMALL, 1024, 1024),
  ...rec(Op.SET_BUFFER, 2, BIG, 0, 1024),
  ...rec(Op.SET_BYTES, 3, 4, 256),
  ...rec(Op.DISPATCH_THREADS, 0, 256, 1, 1, 64, 1, 1, 0),
  ...rec(Op.BARRIER, 0),
  ...rec(Op.SET_PIPELINE, 0, reg.get("rms_norm_f32").handle),
  ...rec(Op.SET_BUFFER, 0, BIG, 0, 1024),
  ...rec(Op.SET_BUFFER, 1, 2, 0, 256),
  ...rec(Op.SET_BUFFER, 2, BIG, 4096, 1024),
  ...rec(Op.SET_BYTES, 3, 8, eps, 64),
  ...rec(Op.SET_TG_MEMORY, 0, 256),
  ...rec(Op.DISPATCH_GROUPS, 0, 4, 1, 1, 64, 1, 1, 1),
  ...rec(Op.BARRIER, 0),
  ...rec(Op.SET_PIPELINE, 0, reg.get("gelu_f32").handle),
  ...rec(Op.SET_BUFFER64, 0, BIG, 4096, 0, 1024, 0),
  ...rec(Op.SET_BUFFER_WHOLE, 1, SMALL),
  ...rec(Op.DISPATCH_THREADS, 0, 256, 1, 1, 64, 1, 1, 2),
  ...rec(Op.SET_BUFFER_WHOLE, 0, 1),
  ...rec(Op.SET_BUFFER_WHOLE, 1, 1),
  ...rec(Op.DISPATCH_THREADS, 0, 16, 1, 1, 16, 1, 1, 3),
];

// Automatic barriers: the decoder tracks the dispatches (a RAW on the 4 KiB buffer, then disjoint
// writes), user ranges with and without CHECK (one past a barrier), tracking turned off and on.
const track = (flags: number, ...ranges: [number, number, number][]): Words => [
  recordHeader(Op.TRACK, 1 + 6 * ranges.length),
  ...ranges.flatMap(([h, off, len]) => [h, flags, off, 0, len, 0]),
];
const addInto = (a: [number, number], b: [number, number], out: [number, number], tag: number): Words => [
  ...rec(Op.SET_BUFFER, 0, SMALL, ...a),
  ...rec(Op.SET_BUFFER, 1, SMALL, ...b),
  ...rec(Op.SET_BUFFER, 2, SMALL, ...out),
  ...rec(Op.SET_BYTES, 3, 4, 64),
  ...rec(Op.DISPATCH_THREADS, 0, 64, 1, 1, 64, 1, 1, tag),
];
seeds.auto_barriers = [
  ...rec(Op.AUTO_BARRIERS, 1),
  ...rec(Op.SET_PIPELINE, 0, reg.get("elementwise_add_f32").handle),
  ...addInto([0, 256], [256, 256], [512, 256], 0),
  ...addInto([512, 256], [256, 256], [768, 256], 1), // reads what dispatch 0 wrote: a barrier
  ...addInto([0, 256], [256, 256], [1536, 256], 2), // disjoint: same group
  ...addInto([0, 256], [256, 256], [1024, 256], 3),
  ...track(Track.READ | Track.CHECK, [SMALL, 1100, 8], [BIG, 0, 64]), // reads bytes dispatch 3 wrote
  ...track(Track.WRITE, [BIG, 64, 64], [BIG, 256, 64], [BIG, 128, 64]),
  ...track(Track.READ | Track.WRITE | Track.CHECK, [BIG, 200, 0], [1, 0, 64]),
  ...rec(Op.AUTO_BARRIERS, 0),
  ...addInto([0, 256], [256, 256], [512, 256], 4),
  ...rec(Op.BARRIER, 0),
  ...rec(Op.AUTO_BARRIERS, 1),
  ...addInto([512, 256], [256, 256], [2048, 256], 5),
];

// The decoder's carried state and the host acting between chunks (the target's lead bits, see
// tests/fuzz/fuzz_stream.c): each seed names the record its second chunk starts at and its mode.
const REPLACE = 0x4000, EXTRA = 0x8000; // buffer 4 replaced / buffer 5 allocated between the chunks
const STALE = 6, NEW = 5; // the freed buffer 4 and the new 256 B buffer, as the second chunk names them
const leads: Record<string, { at: number; mode: number }> = {};
const copyInto = (src: number[], dst: number[], state?: number[]): Words => [
  ...rec(Op.SET_PIPELINE, 0, reg.get("strided_copy_f32").handle),
  ...rec(Op.SET_BUFFER, 0, ...src),
  ...rec(Op.SET_BUFFER, 1, ...dst),
  ...rec(Op.SET_BYTES, 2, 28, 1, 4, 4, 4, state ? 1 : 0, 4, 4),
  ...(state ? rec(Op.SET_BUFFER, 3, ...state) : []),
];
const copyRun = (tag: number) => rec(Op.DISPATCH_THREADS, 0, 4, 1, 1, 4, 1, 1, tag);
/** The index of the n-th record (from 0) whose opcode is op. */
const recordAt = (words: Words, op: number, n = 0): number => {
  for (let i = 0; i < words.length; i += words[i]! >>> 16) if ((words[i]! & 0xff) === op && n-- === 0) return i;
  throw new Error(`no record ${op}`);
};
// Bindings end the first chunk, their dispatch starts the second; then an optional slot bound by
// one dispatch and left unbound by the next, in the same pending record's place.
seeds.pending_across_chunks = [
  ...copyInto([BIG, 0, 16], [BIG, 256, 64], [BIG, 1024, 4]),
  ...copyRun(0),
  ...copyInto([BIG, 0, 16], [BIG, 512, 16]),
  ...copyRun(1),
];
leads.pending_across_chunks = { at: recordAt(seeds.pending_across_chunks, Op.DISPATCH_THREADS), mode: 0 };
// Buffer 4 bound in the first chunk, freed and replaced between the chunks: the dispatch reads the
// freed memory its command buffer keeps alive, and the next one binds the replacement.
seeds.replace_between_chunks = [
  ...rec(Op.AUTO_BARRIERS, 1),
  ...copyInto([BIG, 0, 16], [SMALL, 0, 16]),
  ...copyRun(0),
  ...copyInto([SMALL, 0, 16], [BIG, 64, 16]),
  ...copyRun(1),
];
leads.replace_between_chunks = {
  at: recordAt(seeds.replace_between_chunks, Op.DISPATCH_THREADS),
  mode: REPLACE,
};
// The freed buffer's handle in the second chunk: refused as stale, in a binding and in a TRACK.
seeds.replace_stale_handle = [
  ...copyInto([BIG, 0, 16], [SMALL, 0, 16]),
  ...copyRun(0),
  ...track(Track.READ, [STALE, 0, 16]),
  ...copyInto([STALE, 0, 16], [SMALL, 64, 16]),
  ...copyRun(1),
];
leads.replace_stale_handle = { at: recordAt(seeds.replace_stale_handle, Op.TRACK), mode: REPLACE };
// A buffer allocated between the chunks (the table grows while tracking), tracked and bound with
// automatic barriers, freed before the commit.
seeds.extra_between_chunks = [
  ...rec(Op.AUTO_BARRIERS, 1),
  ...copyInto([BIG, 0, 16], [SMALL, 0, 16]),
  ...copyRun(0),
  ...track(Track.WRITE | Track.CHECK, [NEW, 0, 16], [SMALL, 32, 16]),
  ...copyInto([SMALL, 0, 16], [NEW, 16, 16]),
  ...copyRun(1),
  ...copyInto([NEW, 16, 16], [NEW, 64, 16]),
  ...copyRun(2),
];
leads.extra_between_chunks = { at: recordAt(seeds.extra_between_chunks, Op.TRACK), mode: EXTRA };
// Inline constants of every tail length (1 to 3 bytes past a whole word; 16-byte copies up to 64
// bytes, one copy past that), left pending at the stream's end after a dispatch that runs.
seeds.set_bytes_tails = [
  ...copyInto([BIG, 0, 16], [BIG, 256, 16]),
  ...copyRun(0),
  ...[1, 2, 3, 5, 13, 15, 17, 29, 45, 61, 63, 64, 65, 127, 4095].flatMap((n) =>
    rec(Op.SET_BYTES, n % 31, n, ...Array.from({ length: Math.ceil(n / 4) }, (_, i) => 0x01010101 * (i + 1)))
  ),
];
// Slots a dispatch carries but the kernel does not take, past MLXN_KERNEL_SLOTS and within it.
seeds.slots_past_signature = [
  ...copyInto([BIG, 0, 16], [BIG, 256, 16]),
  ...rec(Op.SET_BUFFER_WHOLE, 12, 1),
  ...rec(Op.SET_BYTES, 30, 4, 7),
  ...copyRun(0),
];

const missing = allContracts().map((c) => c.name).filter((name) => {
  try {
    reg.get(name);
  } catch {
    return false; // not a kernel of the CPU backend
  }
  return !Object.values(seeds).some((words) => dispatchesKernel(words, name));
});
if (missing.length > 0) throw new Error(`no seed for: ${missing.join(", ")}`);

function dispatchesKernel(words: Words, name: string): boolean {
  const h = reg.get(name).handle;
  for (let i = 0; i < words.length; i += words[i]! >>> 16) {
    if ((words[i]! & 0xff) === Op.SET_PIPELINE && words[i + 1] === h) return true;
  }
  return false;
}

const dir = new URL("./corpus/", import.meta.url);
Deno.mkdirSync(dir, { recursive: true });
for (const entry of Deno.readDirSync(dir)) {
  if (entry.name.endsWith(".bin")) Deno.removeSync(new URL(entry.name, dir));
}
for (const [name, words] of Object.entries(seeds)) {
  const body = new Uint8Array(Uint32Array.from(words).buffer);
  const file = new Uint8Array(2 + body.length);
  // Split at the record boundary nearest the middle (a record never spans two chunks), or where
  // the seed says, with its mode bits above the split's 14 bits.
  let split = 0;
  for (let i = 0; i < words.length; i += words[i]! >>> 16) {
    if (Math.abs(i * 4 - body.length / 2) < Math.abs(split - body.length / 2)) split = i * 4;
  }
  const lead = leads[name] ? leads[name].at * 4 | leads[name].mode : split;
  if ((lead & 0x3fff) !== (leads[name] ? leads[name].at * 4 : split)) throw new Error(`${name}: split too far`);
  file.set([lead & 0xff, lead >> 8], 0);
  file.set(body, 2);
  Deno.writeFileSync(new URL(`${name}.bin`, dir), file);
}
console.log(`wrote ${Object.keys(seeds).length} seeds to ${dir.pathname}`);
