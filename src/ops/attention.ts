/**
 * Attention: `sdpa` (any number of query rows, causal, GQA, KV cache with a capacity stride; f32 or
 * bf16) and `flashAttnVec` (decode: one query per head, split over `nwg` workgroups per head, then
 * a reduce; K/V f32 or f16; no mask, causal or a sliding window; optional score softcap). The
 * split-then-reduce op places the barrier between its two dispatches itself.
 *
 * @module
 */

import type { MlxBuffer } from "../buffer.ts";
import { DType } from "../dtype.ts";
import { MlxError } from "../errors.ts";
import { kernelRef, type KernelRegistry, type Pipeline, registerContracts } from "../kernels.ts";
import { CommandEncoder } from "../encoder.ts";
import { putBuffer, putWords } from "../dispatch_writer.ts";
import {
  attentionContracts,
  FLASH_MAX_NWG,
  FLASH_REDUCE_MAX_THREADS,
  MAX_HEAD_DIM,
  packFlashParams,
  packFlashReduceParams,
  packSdpaParams,
  SDPA_ROWS,
} from "../kernels.gen.ts";
import {
  checkBuffer,
  checkFinite,
  checkNonNegative,
  checkU32,
  dispatchReused,
  dispatchReusedSlots,
  type DispatchTarget,
  groupsDescriptor,
  isU32,
  overlapping,
} from "./common.ts";

/** Contracts of this family (generated from kernels/spec/kernels.ts). */
export { attentionContracts };
registerContracts(attentionContracts);

const SDPA_F32 = kernelRef("sdpa_f32"), SDPA_BF16 = kernelRef("sdpa_bf16");
const FLASH_F32 = kernelRef("flash_attn_vec_f32"), FLASH_F16 = kernelRef("flash_attn_vec_f16");
const FLASH_REDUCE = kernelRef("flash_attn_vec_reduce");

// Reused descriptors (see DispatchTarget): nothing is allocated per call.
const sdpaWords = [0, 0, 0, 0, 0, 0, 0], sdpaGrid = [0, 0, 0];
const sdpaDescriptor = groupsDescriptor([undefined, undefined, undefined, undefined, sdpaWords]);
sdpaDescriptor.grid = sdpaGrid;
sdpaDescriptor.threadgroup = SDPA_ROWS;
const flashWords = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], flashGrid = [0, 0, 1];
const flashDescriptor = groupsDescriptor([undefined, undefined, undefined, undefined, flashWords, undefined]);
flashDescriptor.grid = flashGrid;
flashDescriptor.threadgroup = 32;
const reduceWords = [0, 0, 0];
const reduceDescriptor = groupsDescriptor([undefined, undefined, reduceWords]);

function checkHeads(op: string, nHeads: number, nKvHeads: number): void {
  checkU32(op, "nHeads", nHeads);
  checkU32(op, "nKvHeads", nKvHeads);
  if (nHeads % nKvHeads !== 0) {
    throw new MlxError("InvalidArgument", `${op}: nKvHeads (${nKvHeads}) must divide nHeads (${nHeads})`);
  }
}

/** Options of {@link sdpa}. */
export interface SdpaOptions {
  /** Batch (default 1). */
  batch?: number;
  /** Query heads. */
  nHeads: number;
  /** Key/value heads (divides nHeads). */
  nKvHeads: number;
  /** Elements per head (≤ 512). */
  headDim: number;
  /** Query rows. */
  seqLen: number;
  /** Valid keys (≥ seqLen); query q sits at position kvSeqLen − seqLen + q. */
  kvSeqLen: number;
  /** Rows allocated per KV head (the cache stride). */
  kvCapacity: number;
  /** Score scale (default 1/√headDim). */
  scale?: number;
}

/** Causal scaled dot-product attention. Q/O [batch, nHeads, seq, hd]; K/V [batch, nKvHeads, cap, hd]. */
export function sdpa(
  target: DispatchTarget,
  registry: KernelRegistry,
  q: MlxBuffer,
  k: MlxBuffer,
  v: MlxBuffer,
  out: MlxBuffer,
  o: SdpaOptions,
): void {
  const batch = o.batch ?? 1, nh = o.nHeads, nkv = o.nKvHeads, hd = o.headDim, seq = o.seqLen;
  const kvLen = o.kvSeqLen, cap = o.kvCapacity, scale = o.scale ?? 1 / Math.sqrt(hd), t = q.dtype;
  const es = t === DType.BF16 ? 2 : 4, qBytes = batch * nh * seq * hd * es, kvBytes = batch * nkv * cap * hd * es;
  // Every check in one test on the hot path (with every parameter word a u32); anything off goes
  // through checkSdpa, which throws with the precise message, and then the descriptor path.
  const hot = isU32(nh, 1) && isU32(nkv, 1) && nh % nkv === 0 && isU32(batch, 1) && isU32(hd, 1) &&
    hd <= MAX_HEAD_DIM && isU32(seq, 1) && seq <= kvLen && isU32(kvLen, 1) && kvLen <= cap && isU32(cap, 1) &&
    Number.isFinite(scale) && (t === DType.F32 || t === DType.BF16) && q.byteLength >= qBytes &&
    k.dtype === t && k.byteLength >= kvBytes && v.dtype === t && v.byteLength >= kvBytes && out.dtype === t &&
    out.byteLength >= qBytes;
  if (!hot) checkSdpa(q, k, v, out, o, batch, scale);
  const p = registry.resolve(t === DType.F32 ? SDPA_F32 : SDPA_BF16), groups = Math.ceil(seq / SDPA_ROWS);
  packSdpaParams(sdpaWords, nh, nkv, hd, seq, kvLen, scale, cap);
  if (hot && target instanceof CommandEncoder) { // straight into the stream
    let at = target.opBegin(p);
    if (at >= 0) {
      const w = target.opWords;
      at = putBuffer(w, putBuffer(w, putBuffer(w, putBuffer(w, at, 0, q), 1, k), 2, v), 3, out);
      at = putWords(w, at, 4, sdpaWords);
      if (at >= 0) return target.opDispatch(at, false, batch, nh, groups, SDPA_ROWS, 1, 1);
    }
  }
  const d = sdpaDescriptor, b = d.bindings;
  d.pipeline = p;
  b[0] = q;
  b[1] = k;
  b[2] = v;
  b[3] = out;
  sdpaGrid[0] = batch;
  sdpaGrid[1] = nh;
  sdpaGrid[2] = groups;
  dispatchReused(target, d, 4);
}

/** Every check of {@link sdpa}, each with its message (the slow path). */
function checkSdpa(
  q: MlxBuffer,
  k: MlxBuffer,
  v: MlxBuffer,
  out: MlxBuffer,
  o: SdpaOptions,
  batch: number,
  scale: number,
): void {
  const op = "sdpa";
  checkHeads(op, o.nHeads, o.nKvHeads);
  checkU32(op, "batch", batch);
  checkU32(op, "headDim", o.headDim);
  if (o.headDim > MAX_HEAD_DIM) throw new MlxError("InvalidArgument", `${op}: headDim must be <= ${MAX_HEAD_DIM}`);
  checkU32(op, "seqLen", o.seqLen);
  if (!(o.seqLen <= o.kvSeqLen && o.kvSeqLen <= o.kvCapacity)) {
    throw new MlxError(
      "InvalidArgument",
      `${op}: need seqLen (${o.seqLen}) <= kvSeqLen (${o.kvSeqLen}) <= kvCapacity (${o.kvCapacity})`,
    );
  }
  checkFinite(op, "scale", scale);
  const t = q.dtype;
  if (t !== DType.F32 && t !== DType.BF16) throw new MlxError("InvalidArgument", `${op}: dtype must be f32 or bf16`);
  checkBuffer(op, "q", q, t, batch * o.nHeads * o.seqLen * o.headDim);
  checkBuffer(op, "k", k, t, batch * o.nKvHeads * o.kvCapacity * o.headDim);
  checkBuffer(op, "v", v, t, batch * o.nKvHeads * o.kvCapacity * o.headDim);
  checkBuffer(op, "out", out, t, batch * o.nHeads * o.seqLen * o.headDim);
}

/** Mask of {@link flashAttnVec}. */
export type AttentionMask = "none" | "causal" | "sliding";

/** Options of {@link flashAttnVec}. */
export interface FlashAttnVecOptions {
  /** Query heads. */
  nHeads: number;
  /** Key/value heads. */
  nKvHeads: number;
  /** 64, 128, 256 or 512. */
  headDim: 64 | 128 | 256 | 512;
  /** Valid keys; the query sits at position kvSeqLen − 1. */
  kvSeqLen: number;
  /** Rows allocated per KV head. */
  kvCapacity: number;
  /** Score scale (default 1/√headDim). */
  scale?: number;
  /** Default "causal" (for one decode query: every cached key). */
  mask?: AttentionMask;
  /** Keys within this distance of the query (mask "sliding"). */
  slidingWindow?: number;
  /** Scores become softcap·tanh(score/softcap) when > 0. */
  softcap?: number;
  /** Workgroups per head (default 32). */
  nwg?: number;
  /**
   * A step state (u32, see `stepAdvance`): the valid keys are state[0] + 1, read on the device (the
   * query at position state[0]), and `kvSeqLen` becomes their bound: a state[0] ≥ kvSeqLen fails the
   * dispatch, which reads and writes nothing. Consecutive token passes then encode identical commands.
   */
  state?: MlxBuffer | undefined;
}

/** Bytes of the scratch buffer flashAttnVec needs: nHeads · nwg · (headDim + 2) f32. */
export function flashAttnVecScratchBytes(o: Pick<FlashAttnVecOptions, "nHeads" | "headDim" | "nwg">): number {
  return o.nHeads * (o.nwg ?? 32) * (o.headDim + 2) * 4;
}

/**
 * Decode attention for one query per head: partial results of `nwg` workgroups per head go to
 * `tmp`, a barrier, then a reduce writes `out` [nHeads, headDim] f32. K/V f32 or f16
 * [nKvHeads, kvCapacity, headDim]; q f32 [nHeads, headDim].
 */
export function flashAttnVec(
  target: DispatchTarget,
  registry: KernelRegistry,
  q: MlxBuffer,
  k: MlxBuffer,
  v: MlxBuffer,
  tmp: MlxBuffer,
  out: MlxBuffer,
  o: FlashAttnVecOptions,
): void {
  const nh = o.nHeads, nkv = o.nKvHeads, hd = o.headDim, kvLen = o.kvSeqLen, cap = o.kvCapacity;
  const nwg = o.nwg ?? 32, scale = o.scale ?? 1 / Math.sqrt(hd), softcap = o.softcap ?? 0;
  const mask = o.mask ?? "causal", window = o.slidingWindow ?? 0, state = o.state, kvType = k.dtype;
  const maskCode = mask === "none" ? 0 : mask === "causal" ? 1 : mask === "sliding" ? 2 : -1;
  const kvBytes = nkv * cap * hd * (kvType === DType.F16 ? 2 : 4), tmpBytes = nh * nwg * (hd + 2) * 4;
  // Every check in one test on the hot path (with every parameter word a u32); anything off goes
  // through checkFlashAttnVec, which throws with the precise message, and then the descriptor path.
  const hot = isU32(nh, 1) && isU32(nkv, 1) && nh % nkv === 0 &&
    (hd === 64 || hd === 128 || hd === 256 || hd === 512) && isU32(kvLen, 1) && kvLen <= cap && isU32(cap, 1) &&
    isU32(nwg, 1) && nwg <= FLASH_MAX_NWG && Number.isFinite(scale) && softcap >= 0 && softcap < Infinity &&
    maskCode >= 0 && isU32(window, mask === "sliding" ? 1 : 0) && (kvType === DType.F32 || kvType === DType.F16) &&
    q.dtype === DType.F32 && q.byteLength >= nh * hd * 4 && k.byteLength >= kvBytes && v.dtype === kvType &&
    v.byteLength >= kvBytes && tmp.dtype === DType.F32 && tmp.byteLength >= tmpBytes && out.dtype === DType.F32 &&
    out.byteLength >= nh * hd * 4 &&
    (!state || (state.dtype === DType.U32 && state.byteLength >= 4 && !overlapping(tmp, tmpBytes, state, 4)));
  if (!hot) checkFlashAttnVec(q, k, v, tmp, out, o);
  const pf = registry.resolve(kvType === DType.F32 ? FLASH_F32 : FLASH_F16), pr = registry.resolve(FLASH_REDUCE);
  packFlashParams(flashWords, nh, nkv, hd, kvLen, cap, scale, maskCode, window, softcap, nwg, state ? 1 : 0);
  packFlashReduceParams(reduceWords, nh, hd, nwg);
  const tg = hd < FLASH_REDUCE_MAX_THREADS ? hd : FLASH_REDUCE_MAX_THREADS;
  if (hot && target instanceof CommandEncoder) { // straight into the stream
    let at = target.opBegin(pf);
    if (at >= 0) {
      const w = target.opWords;
      at = putBuffer(w, putBuffer(w, putBuffer(w, putBuffer(w, at, 0, q), 1, k), 2, v), 3, tmp);
      at = putWords(w, at, 4, flashWords);
      if (state !== undefined) at = putBuffer(w, at, 5, state);
      if (at >= 0) {
        target.opDispatch(at, false, nh, nwg, 1, 32, 1, 1);
        target.memoryBarrier(); // the reduce reads every workgroup's partial result
        at = target.opBegin(pr);
        if (at >= 0) {
          const w = target.opWords;
          at = putWords(w, putBuffer(w, putBuffer(w, at, 0, tmp), 1, out), 2, reduceWords);
          if (at >= 0) return target.opDispatch(at, false, nh, 1, 1, tg, 1, 1);
        }
        return reduceByDescriptor(target, pr, tmp, out, nh, tg);
      }
    }
  }
  const d = flashDescriptor, b = d.bindings;
  d.pipeline = pf;
  b[0] = q;
  b[1] = k;
  b[2] = v;
  b[3] = tmp;
  b[5] = state;
  flashGrid[0] = nh;
  flashGrid[1] = nwg;
  dispatchReusedSlots(target, d, 0b101111);
  target.memoryBarrier(); // the reduce reads every workgroup's partial result
  reduceByDescriptor(target, pr, tmp, out, nh, tg);
}

/** Dispatches flashAttnVec's reduce by descriptor (its parameter words already packed). */
function reduceByDescriptor(
  target: DispatchTarget,
  p: Pipeline,
  tmp: MlxBuffer,
  out: MlxBuffer,
  nh: number,
  tg: number,
): void {
  const r = reduceDescriptor;
  r.pipeline = p;
  r.bindings[0] = tmp;
  r.bindings[1] = out;
  r.grid = nh;
  r.threadgroup = tg;
  dispatchReused(target, r, 2);
}

/** Every check of {@link flashAttnVec}, each with its message (the slow path). */
function checkFlashAttnVec(
  q: MlxBuffer,
  k: MlxBuffer,
  v: MlxBuffer,
  tmp: MlxBuffer,
  out: MlxBuffer,
  o: FlashAttnVecOptions,
): void {
  const op = "flash_attn_vec";
  checkHeads(op, o.nHeads, o.nKvHeads);
  const hd = o.headDim;
  if (hd !== 64 && hd !== 128 && hd !== 256 && hd !== 512) {
    throw new MlxError("InvalidArgument", `${op}: headDim must be 64, 128, 256 or 512, got ${o.headDim}`);
  }
  checkU32(op, "kvSeqLen", o.kvSeqLen);
  if (o.kvSeqLen > o.kvCapacity) {
    throw new MlxError("InvalidArgument", `${op}: kvSeqLen (${o.kvSeqLen}) exceeds kvCapacity (${o.kvCapacity})`);
  }
  const nwg = o.nwg ?? 32, scale = o.scale ?? 1 / Math.sqrt(o.headDim), softcap = o.softcap ?? 0;
  checkU32(op, "nwg", nwg);
  if (nwg > FLASH_MAX_NWG) throw new MlxError("InvalidArgument", `${op}: nwg must be <= ${FLASH_MAX_NWG}`);
  checkFinite(op, "scale", scale);
  checkNonNegative(op, "softcap", softcap);
  const mask = o.mask ?? "causal";
  const maskCode = mask === "none" ? 0 : mask === "causal" ? 1 : mask === "sliding" ? 2 : -1;
  if (maskCode < 0) throw new MlxError("InvalidArgument", `${op}: mask must be none, causal or sliding`);
  const window = o.slidingWindow ?? 0;
  if (mask === "sliding") checkU32(op, "slidingWindow", window);
  const kvType = k.dtype;
  if (kvType !== DType.F32 && kvType !== DType.F16) {
    throw new MlxError("InvalidArgument", `${op}: K/V must be f32 or f16, got ${kvType}`);
  }
  checkBuffer(op, "q", q, DType.F32, o.nHeads * o.headDim);
  checkBuffer(op, "k", k, kvType, o.nKvHeads * o.kvCapacity * o.headDim);
  checkBuffer(op, "v", v, kvType, o.nKvHeads * o.kvCapacity * o.headDim);
  checkBuffer(op, "tmp", tmp, DType.F32, o.nHeads * nwg * (o.headDim + 2));
  checkBuffer(op, "out", out, DType.F32, o.nHeads * o.headDim);
  const state = o.state;
  if (state) {
    checkBuffer(op, "state", state, DType.U32, 1);
    if (overlapping(tmp, o.nHeads * nwg * (o.headDim + 2) * 4, state, 4)) {
      throw new MlxError("InvalidArgument", `${op}: the step state must not lie in tmp`);
    }
  }
}
