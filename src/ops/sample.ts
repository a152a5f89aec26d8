/**
 * Token selection and input on the device, so that a token loop never reads logits back:
 * {@link argmax} and seeded {@link sample} pick a token id per row of logits (f32 or bf16) and write
 * it into a u32 ring of generated ids; {@link embedGather} reads ids from that ring and writes the
 * tokens' embedding rows (f32, bf16, q8_0 or q4_0 tables) as f32.
 *
 * Token ring: `ids` holds `ring` slots of `rows` ids (row r of slot s is element s·rows + r). With
 * a `cursor` buffer, each dispatch uses slot cursor[0] % ring, read on the device, so consecutive
 * steps encode identical command streams; without one it uses slot 0 (bind a slice of the ring to
 * choose the slot from the host).
 *
 * Geometry: {@link argmax} and {@link sample} run one threadgroup per row of
 * {@link tokenThreadgroupSize} threads; {@link embedGather} one thread per output element.
 *
 * Step state: a token loop whose passes must encode identical commands keeps the values that change
 * per token in a small u32 device buffer, {@link STEP_STATE_WORDS} words: word 0 is the position of
 * the pass's input token (rope's position and KV-cache row, attention's keys − 1: the `state` option
 * of ropeNeox/ropeNorm, stridedCopy and flashAttnVec; the gather's ring cursor), word 1 is word 0 + 1
 * (the ring cursor the selection writes; the sampler adds it to its counter); words 2 and 3 are
 * reserved (zero). {@link stepAdvance} at the end of each pass adds 1 to words 0 and 1 on the
 * device, so the host writes the state once, before the loop.
 *
 * @module
 */

import type { MlxBuffer } from "../buffer.ts";
import { DType } from "../dtype.ts";
import { MlxError } from "../errors.ts";
import { kernelRef, type KernelRegistry, registerContracts } from "../kernels.ts";
import {
  packArgmaxParams,
  packGatherParams,
  packStepAdvanceParams,
  SAMPLE_TOP_P_OFF,
  sampleContracts,
  STEP_ADVANCE_MAX_WORDS,
  TOKEN_MAX_THREADS,
} from "../kernels.gen.ts";
import { CommandEncoder } from "../encoder.ts";
import { putBuffer, putWords } from "../dispatch_writer.ts";
import {
  checkBuffer,
  checkU32,
  dispatchReusedSlots,
  type DispatchTarget,
  f32Bits,
  groupsDescriptor,
  isU32,
  nextPow2,
  threadsDescriptor,
} from "./common.ts";

/** Table formats {@link embedGather} reads. */
export type EmbeddingFormat = "f32" | "bf16" | "q8_0" | "q4_0";
const GATHER_FORMATS: readonly EmbeddingFormat[] = ["f32", "bf16", "q8_0", "q4_0"];

/** Contracts of this family (generated from kernels/spec/kernels.ts). */
export { sampleContracts };
registerContracts(sampleContracts);

const ARGMAX_F32 = kernelRef("argmax_f32"), ARGMAX_BF16 = kernelRef("argmax_bf16");
const SAMPLE_F32 = kernelRef("sample_f32"), SAMPLE_BF16 = kernelRef("sample_bf16");
const GATHER_F32 = kernelRef("embed_gather_f32"), GATHER_BF16 = kernelRef("embed_gather_bf16");
const GATHER_Q8_0 = kernelRef("embed_gather_q8_0"), GATHER_Q4_0 = kernelRef("embed_gather_q4_0");
const STEP_ADVANCE = kernelRef("step_advance_u32");
const TWO32 = 2 ** 32, TWO64 = 1n << 64n;

// Reused descriptors (see DispatchTarget): nothing is allocated per call. Slot 2 (3 for the gather)
// holds the inline words, the cursor comes after them.
const TOKEN_BUFFER_SLOTS = 0b1011, GATHER_BUFFER_SLOTS = 0b10111;
const argmaxWords = [0, 0, 0, 0], argmaxGrid = [0, 1, 1], argmaxGroup = [0, 1, 1];
const argmaxDescriptor = groupsDescriptor([undefined, undefined, argmaxWords, undefined]);
argmaxDescriptor.grid = argmaxGrid;
argmaxDescriptor.threadgroup = argmaxGroup;
const sampleWords = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0], sampleGrid = [0, 1, 1], sampleGroup = [0, 1, 1];
const sampleDescriptor = groupsDescriptor([undefined, undefined, sampleWords, undefined]);
sampleDescriptor.grid = sampleGrid;
sampleDescriptor.threadgroup = sampleGroup;
const gatherWords = [0, 0, 0, 0, 0], gatherGrid = [0, 0, 1], gatherGroup = [0, 1, 1];
const gatherDescriptor = threadsDescriptor([undefined, undefined, undefined, gatherWords, undefined]);
gatherDescriptor.grid = gatherGrid;
gatherDescriptor.threadgroup = gatherGroup;

/** Where in the ring of token ids a dispatch reads or writes. */
export interface TokenRing {
  /** Rows (sequences) per step; default 1. */
  rows?: number;
  /** Slots of `rows` ids in the ids buffer; default 1. */
  ring?: number;
  /** u32 buffer whose element 0, modulo `ring`, picks the slot on the device. */
  cursor?: MlxBuffer | undefined;
}

/** Threads per threadgroup of {@link argmax} and {@link sample} for a vocabulary (32 to 1024). */
export function tokenThreadgroupSize(vocab: number): number {
  return Math.max(32, Math.min(TOKEN_MAX_THREADS, nextPow2(Math.ceil(vocab / 4))));
}

/** Whether the ring passes {@link checkRing} (its test for the ops' one-test hot paths). */
function ringValid(ids: MlxBuffer, cursor: MlxBuffer | undefined, rows: number, ring: number): boolean {
  return isU32(rows, 1) && isU32(ring, 1) && ids.dtype === DType.U32 && ids.byteLength >= ring * rows * 4 &&
    (!cursor || (cursor.dtype === DType.U32 && cursor.byteLength >= 4));
}

/** Checks the ring of `o` whose rows and ring (defaults applied) the caller passes. */
function checkRing(op: string, ids: MlxBuffer, o: TokenRing, rows: number, ring: number): void {
  checkU32(op, "rows", rows);
  checkU32(op, "ring", ring);
  checkBuffer(op, "ids", ids, DType.U32, ring * rows);
  if (o.cursor) checkBuffer(op, "cursor", o.cursor, DType.U32, 1);
}

function checkLogits(op: string, logits: MlxBuffer, rows: number, vocab: number): void {
  checkU32(op, "vocab", vocab);
  if (logits.dtype !== DType.F32 && logits.dtype !== DType.BF16) {
    throw new MlxError("InvalidArgument", `${op}: logits must be f32 or bf16, got ${logits.dtype}`);
  }
  checkBuffer(op, "logits", logits, logits.dtype, rows * vocab);
}

/** Options of {@link argmax}. */
export interface ArgmaxOptions extends TokenRing {
  /** Logits per row. */
  vocab: number;
}

/**
 * Writes the index of each row's largest logit into the ring: ties go to the lowest index, −0
 * equals +0. A row holding NaN fails the command buffer (CommandBufferError naming this dispatch);
 * its id is still written, ranking NaN below −inf.
 *
 * @example
 * ```ts ignore
 * ops.argmax(enc, registry, logits, ids, { vocab: 32000 });
 * ```
 */
export function argmax(
  target: DispatchTarget,
  registry: KernelRegistry,
  logits: MlxBuffer,
  ids: MlxBuffer,
  o: ArgmaxOptions,
): void {
  const rows = o.rows ?? 1, ring = o.ring ?? 1, vocab = o.vocab, cursor = o.cursor, t = logits.dtype;
  // Every check in one test on the hot path; anything off goes through checkArgmax, which throws
  // with the precise message.
  if (
    !(ringValid(ids, cursor, rows, ring) && isU32(vocab, 1) && (t === DType.F32 || t === DType.BF16) &&
      logits.byteLength >= rows * vocab * (t === DType.F32 ? 4 : 2))
  ) checkArgmax(logits, ids, o, rows, ring);
  const p = registry.resolve(t === DType.F32 ? ARGMAX_F32 : ARGMAX_BF16), tg = tokenThreadgroupSize(vocab);
  packArgmaxParams(argmaxWords, vocab, rows, ring, cursor ? 1 : 0);
  if (target instanceof CommandEncoder) { // straight into the stream
    let at = target.opBegin(p);
    if (at >= 0) {
      const w = target.opWords;
      at = putWords(w, putBuffer(w, putBuffer(w, at, 0, logits), 1, ids), 2, argmaxWords);
      if (cursor !== undefined) at = putBuffer(w, at, 3, cursor);
      if (at >= 0) return target.opDispatch(at, false, rows, 1, 1, tg, 1, 1);
    }
  }
  const d = argmaxDescriptor, b = d.bindings;
  d.pipeline = p;
  b[0] = logits;
  b[1] = ids;
  b[3] = cursor;
  argmaxGrid[0] = rows;
  argmaxGroup[0] = tg;
  dispatchReusedSlots(target, d, TOKEN_BUFFER_SLOTS);
}

/** Every check of {@link argmax}, each with its message (the slow path). */
function checkArgmax(logits: MlxBuffer, ids: MlxBuffer, o: ArgmaxOptions, rows: number, ring: number): void {
  checkRing("argmax", ids, o, rows, ring);
  checkLogits("argmax", logits, rows, o.vocab);
}

/** Options of {@link sample}. */
export interface SampleOptions extends TokenRing {
  /** Logits per row. */
  vocab: number;
  /** Softmax temperature; 0 picks the argmax. Otherwise in [1e-5, 1e5]. */
  temperature: number;
  /** Keep only the k largest logits (0 or omitted: all). */
  topK?: number;
  /** Keep the smallest prefix holding this share of the weight, in (0, 1] (default 1: all). */
  topP?: number;
  /** Generator key, an integer in [0, 2⁶⁴). */
  seed: number | bigint;
  /** Counter of the first step (u32, default 0); the cursor's value is added on the device. */
  counter?: number;
}

/**
 * Seeded sampling of one token per row, written into the ring. Every backend picks the same token
 * for the same inputs, because the choice is made on integers:
 *
 * 1. m is the row's largest logit (as {@link argmax}). NaN anywhere, or a row of only −inf, fails
 *    the command buffer (the argmax is written). Temperature 0 writes the argmax.
 * 2. Order: tokens by logit descending, then index ascending (−0 equals +0).
 * 3. Weight of a logit x (subnormals read as 0 in x and m): d = f32(f32(m − x) · c), c =
 *    f32(log2(e) / T), d = 0 when x equals m. d ≥ 31 gives weight 0; otherwise q = ⌊d·2¹⁶⌋ and
 *    weight = (E[h] − ⌊(E[h] − E[h+1]) · l / 2⁸⌋) >> ⌊q / 2¹⁶⌋ with h, l the two bytes below bit 16
 *    of q and E[j] = round(2³¹ · 2^(−j/256)): an integer ≈ 2³¹ · e^((x − m)/T).
 * 4. Top-k: the first min(k, vocab) tokens of the order; W = their weight (a u64 sum).
 * 5. Top-p: p as Q31, P = round(p · 2³¹); unless P = 2³¹, target = ⌊W · P / 2³¹⌋ and the candidates
 *    shrink to the shortest prefix (at least one token) whose weight reaches target; S = its weight.
 * 6. Philox4x32-10 with key (seed low, high 32 bits) and counter (counter + cursor[0], row, 0, 0)
 *    gives x0..x3; R = x1·2³² + x0; r = ⌊S · R / 2⁶⁴⌋. The token is the first in the order whose
 *    running weight exceeds r.
 *
 * Tokens whose probability is below 2⁻³¹ of the top token's (d ≥ 31) are never sampled.
 *
 * @example
 * ```ts ignore
 * ops.sample(enc, registry, logits, ids, { vocab: 32000, temperature: 0.8, topK: 40, topP: 0.95, seed: 7, cursor: step });
 * ```
 */
export function sample(
  target: DispatchTarget,
  registry: KernelRegistry,
  logits: MlxBuffer,
  ids: MlxBuffer,
  o: SampleOptions,
): void {
  const rows = o.rows ?? 1, ring = o.ring ?? 1, vocab = o.vocab, cursor = o.cursor, lt = logits.dtype;
  const t = o.temperature, topK = o.topK ?? 0, topP = o.topP ?? 1, counter = o.counter ?? 0, seed = o.seed;
  // A number seed is split without BigInt arithmetic (no allocation per call); -1: not a valid seed.
  let seedLo = -1, seedHi = -1;
  if (typeof seed === "number") {
    if (Number.isSafeInteger(seed) && seed >= 0) {
      seedHi = Math.floor(seed / TWO32);
      seedLo = seed - seedHi * TWO32;
    }
  } else if (typeof seed === "bigint" && seed >= 0n && seed < TWO64) {
    seedLo = Number(seed & 0xffffffffn);
    seedHi = Number(seed >> 32n);
  }
  // Every check in one test on the hot path; anything off goes through checkSample, which throws
  // with the precise message.
  if (
    !(ringValid(ids, cursor, rows, ring) && isU32(vocab, 1) && (lt === DType.F32 || lt === DType.BF16) &&
      logits.byteLength >= rows * vocab * (lt === DType.F32 ? 4 : 2) && (t === 0 || (t >= 1e-5 && t <= 1e5)) &&
      isU32(topK, 0) && topP > 0 && topP <= 1 && isU32(counter, 0) && seedLo >= 0)
  ) checkSample(logits, ids, o, rows, ring);
  const c = t === 0 ? 0 : Math.fround(Math.LOG2E / t);
  const pq = Math.max(1, Math.min(SAMPLE_TOP_P_OFF, Math.round(topP * SAMPLE_TOP_P_OFF)));
  const p = registry.resolve(lt === DType.F32 ? SAMPLE_F32 : SAMPLE_BF16), tg = tokenThreadgroupSize(vocab);
  const w = sampleWords;
  w[0] = vocab;
  w[1] = rows;
  w[2] = ring;
  w[3] = cursor ? 1 : 0;
  w[4] = f32Bits(c);
  w[5] = topK;
  w[6] = pq;
  w[7] = seedLo;
  w[8] = seedHi;
  w[9] = counter;
  if (target instanceof CommandEncoder) { // straight into the stream
    let at = target.opBegin(p);
    if (at >= 0) {
      const ws = target.opWords;
      at = putWords(ws, putBuffer(ws, putBuffer(ws, at, 0, logits), 1, ids), 2, w);
      if (cursor !== undefined) at = putBuffer(ws, at, 3, cursor);
      if (at >= 0) return target.opDispatch(at, false, rows, 1, 1, tg, 1, 1);
    }
  }
  const d = sampleDescriptor, b = d.bindings;
  d.pipeline = p;
  b[0] = logits;
  b[1] = ids;
  b[3] = cursor;
  sampleGrid[0] = rows;
  sampleGroup[0] = tg;
  dispatchReusedSlots(target, d, TOKEN_BUFFER_SLOTS);
}

/** Every check of {@link sample}, each with its message (the slow path). */
function checkSample(logits: MlxBuffer, ids: MlxBuffer, o: SampleOptions, rows: number, ring: number): void {
  const op = "sample";
  checkRing(op, ids, o, rows, ring);
  checkLogits(op, logits, rows, o.vocab);
  const t = o.temperature;
  if (!Number.isFinite(t) || (t !== 0 && (t < 1e-5 || t > 1e5))) {
    throw new MlxError("InvalidArgument", `${op}: temperature must be 0 (greedy) or in [1e-5, 1e5], got ${t}`);
  }
  checkU32(op, "topK", o.topK ?? 0, 0);
  const topP = o.topP ?? 1;
  if (!(topP > 0 && topP <= 1)) throw new MlxError("InvalidArgument", `${op}: topP must be in (0, 1], got ${topP}`);
  checkU32(op, "counter", o.counter ?? 0, 0);
  const seed = o.seed;
  if (
    !(typeof seed === "number" && Number.isSafeInteger(seed) && seed >= 0) &&
    !(typeof seed === "bigint" && seed >= 0n && seed < TWO64)
  ) throw new MlxError("InvalidArgument", `${op}: seed must be an integer in [0, 2^64), got ${o.seed}`);
}

/** Options of {@link embedGather}. */
export interface EmbedGatherOptions extends TokenRing {
  /** Values per embedding row (a multiple of 32 for q8_0 and q4_0). */
  dim: number;
  /** Rows of the table; an id ≥ vocab fails the command buffer. */
  vocab: number;
  /** The table's format: f32 and bf16 follow its dtype; a u8 table needs "q8_0" or "q4_0". */
  format?: EmbeddingFormat;
}

function rowBytes(format: EmbeddingFormat, dim: number): number {
  return format === "f32" ? dim * 4 : format === "bf16" ? dim * 2 : (dim / 32) * (format === "q8_0" ? 34 : 18);
}

/**
 * output[r] = table[ids[slot·rows + r]] as f32, for r < rows, with the ids read on the device. An id
 * ≥ vocab fails the command buffer (CommandBufferError naming this dispatch) and that output row is
 * written as zeros; nothing is read outside the table.
 *
 * @example
 * ```ts ignore
 * ops.embedGather(enc, registry, table, ids, x, { dim: 2048, vocab: 32000, format: "q8_0", cursor: step, ring: 64 });
 * ```
 */
export function embedGather(
  target: DispatchTarget,
  registry: KernelRegistry,
  table: MlxBuffer,
  ids: MlxBuffer,
  output: MlxBuffer,
  o: EmbedGatherOptions,
): void {
  const rows = o.rows ?? 1, ring = o.ring ?? 1, dim = o.dim, vocab = o.vocab, cursor = o.cursor;
  const f = o.format ?? table.dtype;
  const ref = f === "f32"
    ? GATHER_F32
    : f === "bf16"
    ? GATHER_BF16
    : f === "q8_0"
    ? GATHER_Q8_0
    : f === "q4_0"
    ? GATHER_Q4_0
    : undefined;
  const quant = f === "q8_0" || f === "q4_0";
  // Every check in one test on the hot path; anything off goes through checkEmbedGather, which
  // throws with the precise message.
  if (
    !(ringValid(ids, cursor, rows, ring) && isU32(dim, 1) && isU32(vocab, 1) && ref !== undefined &&
      table.dtype === (f === "f32" ? DType.F32 : f === "bf16" ? DType.BF16 : DType.U8) &&
      (!quant || dim % 32 === 0) && table.byteLength >= vocab * rowBytes(f as EmbeddingFormat, dim) &&
      output.dtype === DType.F32 && output.byteLength >= rows * dim * 4)
  ) checkEmbedGather(table, ids, output, o, rows, ring);
  const p = registry.resolve(ref!), pow = nextPow2(dim), tg = pow < 256 ? pow : 256;
  packGatherParams(gatherWords, rows, dim, vocab, ring, cursor ? 1 : 0);
  if (target instanceof CommandEncoder) { // straight into the stream
    let at = target.opBegin(p);
    if (at >= 0) {
      const w = target.opWords;
      at = putWords(w, putBuffer(w, putBuffer(w, putBuffer(w, at, 0, table), 1, ids), 2, output), 3, gatherWords);
      if (cursor !== undefined) at = putBuffer(w, at, 4, cursor);
      if (at >= 0) return target.opDispatch(at, true, dim, rows, 1, tg, 1, 1);
    }
  }
  const d = gatherDescriptor, b = d.bindings;
  d.pipeline = p;
  b[0] = table;
  b[1] = ids;
  b[2] = output;
  b[4] = cursor;
  gatherGrid[0] = dim;
  gatherGrid[1] = rows;
  gatherGroup[0] = tg;
  dispatchReusedSlots(target, d, GATHER_BUFFER_SLOTS);
}

/** Every check of {@link embedGather}, each with its message (the slow path). */
function checkEmbedGather(
  table: MlxBuffer,
  ids: MlxBuffer,
  output: MlxBuffer,
  o: EmbedGatherOptions,
  rows: number,
  ring: number,
): void {
  const op = "embed_gather";
  checkRing(op, ids, o, rows, ring);
  checkU32(op, "dim", o.dim);
  checkU32(op, "vocab", o.vocab);
  const format = o.format ?? table.dtype;
  if (!(GATHER_FORMATS as readonly string[]).includes(format)) {
    throw new MlxError("InvalidArgument", `${op}: table format ${format} is not one of ${GATHER_FORMATS.join(", ")}`);
  }
  const f = format as EmbeddingFormat;
  const dtype = f === "f32" ? DType.F32 : f === "bf16" ? DType.BF16 : DType.U8;
  if (table.dtype !== dtype) {
    throw new MlxError("InvalidArgument", `${op}: a ${f} table must be a ${dtype} buffer, got ${table.dtype}`);
  }
  if ((f === "q8_0" || f === "q4_0") && o.dim % 32 !== 0) {
    throw new MlxError("InvalidArgument", `${op}: dim must be a multiple of 32 for ${f}, got ${o.dim}`);
  }
  const need = o.vocab * rowBytes(f, o.dim);
  if (table.byteLength < need) {
    throw new MlxError("InvalidArgument", `${op}: table holds ${table.byteLength} bytes, needs ${need}`);
  }
  checkBuffer(op, "output", output, DType.F32, rows * o.dim);
}

/** u32 words of a token loop's step state (see the module documentation for the layout). */
export const STEP_STATE_WORDS = 4;

/** Words of the step state {@link stepAdvance} advances by default: the position and the output cursor. */
const ADVANCED_WORDS = 2;

const advanceWords = [0, 0];
const NO_ADVANCE_OPTIONS: StepAdvanceOptions = Object.freeze({});
const advanceDescriptor = threadsDescriptor([undefined, advanceWords]);
advanceDescriptor.grid = 1;
advanceDescriptor.threadgroup = 1;

/** Options of {@link stepAdvance}. */
export interface StepAdvanceOptions {
  /** Leading u32 words to advance (default 2: the position and the output cursor), 1 … 64. */
  words?: number | undefined;
  /** Added to each word, mod 2³² (default 1). */
  add?: number | undefined;
}

/**
 * Adds `add` to the first `words` u32 words of `state` on the device (one thread): the last dispatch
 * of a token pass, so the next pass reads the next position without the host writing anything.
 */
export function stepAdvance(
  target: DispatchTarget,
  registry: KernelRegistry,
  state: MlxBuffer,
  options?: StepAdvanceOptions,
): void {
  // No default parameter: a session binds the op by its length, which a default would cut.
  const o = options ?? NO_ADVANCE_OPTIONS, words = o.words ?? ADVANCED_WORDS, add = o.add ?? 1;
  // Every check in one test on the hot path; anything off goes through checkStepAdvance, which
  // throws with the precise message.
  if (
    !(isU32(words, 1) && words <= STEP_ADVANCE_MAX_WORDS && isU32(add, 0) && state.dtype === DType.U32 &&
      state.byteLength >= words * 4)
  ) checkStepAdvance(state, words, add);
  const p = registry.resolve(STEP_ADVANCE);
  packStepAdvanceParams(advanceWords, words, add);
  if (target instanceof CommandEncoder) { // straight into the stream
    let at = target.opBegin(p);
    if (at >= 0) {
      const w = target.opWords;
      at = putWords(w, putBuffer(w, at, 0, state), 1, advanceWords);
      if (at >= 0) return target.opDispatch(at, true, 1, 1, 1, 1, 1, 1);
    }
  }
  const d = advanceDescriptor;
  d.pipeline = p;
  d.bindings[0] = state;
  dispatchReusedSlots(target, d, 0b1);
}

/** Every check of {@link stepAdvance}, each with its message (the slow path). */
function checkStepAdvance(state: MlxBuffer, words: number, add: number): void {
  const op = "step_advance";
  checkU32(op, "words", words);
  if (words > STEP_ADVANCE_MAX_WORDS) {
    throw new MlxError("InvalidArgument", `${op}: words must be at most ${STEP_ADVANCE_MAX_WORDS}, got ${words}`);
  }
  checkU32(op, "add", add, 0);
  checkBuffer(op, "state", state, DType.U32, words);
}
