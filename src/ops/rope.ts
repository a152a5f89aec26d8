/**
 * Rotary position embeddings (f32): `rope` rotates adjacent pairs (2i, 2i+1) of one head laid out
 * [seq, headDim]; `ropeNeox` rotates pairs (i, i + ropeDim/2) of [seq · heads, headDim] rows,
 * passes dims ≥ ropeDim through, optionally divides each frequency by a freq factor, and may write
 * its rows at strides (straight into a KV cache); `ropeNorm` is the same with adjacent pairs (ggml's
 * normal mode).
 *
 * @module
 */

import type { MlxBuffer } from "../buffer.ts";
import { DType } from "../dtype.ts";
import { MlxError } from "../errors.ts";
import { kernelRef, type KernelRegistry, registerContracts } from "../kernels.ts";
import { CommandEncoder } from "../encoder.ts";
import { putBuffer, putWords } from "../dispatch_writer.ts";
import { packRopeHeadsParams, packRopeLayoutParams, packRopeParams, ropeContracts } from "../kernels.gen.ts";
import {
  checkBuffer,
  checkPositive,
  checkU32,
  dispatchReusedSlots,
  type DispatchTarget,
  isU32,
  overlapping,
  threadsDescriptor,
} from "./common.ts";

/** Contracts of this family (generated from kernels/spec/kernels.ts). */
export { ropeContracts };
registerContracts(ropeContracts);

const ROPE = kernelRef("rope_f32"), ROPE_NEOX = kernelRef("rope_neox_f32"), ROPE_NORM = kernelRef("rope_norm_f32");

// Reused descriptors (see DispatchTarget): nothing is allocated per call. Slots 2 and 4 of the NeoX
// bindings are inline words; dispatchReusedSlots empties the other slots after each dispatch.
const ropeWords = [0, 0, 0], ropeGrid = [0, 0, 1], ropeGroup = [0, 1, 1];
const ropeDescriptor = threadsDescriptor([undefined, undefined, ropeWords, undefined]);
ropeDescriptor.grid = ropeGrid;
ropeDescriptor.threadgroup = ropeGroup;
const neoxWords = [0, 0, 0], neoxLayout = [0, 0, 0, 0, 0, 0, 0], neoxGrid = [0, 0, 1], neoxGroup = [0, 1, 1];
const neoxDescriptor = threadsDescriptor([
  undefined,
  undefined,
  neoxWords,
  undefined,
  neoxLayout,
  undefined,
  undefined,
]);
neoxDescriptor.grid = neoxGrid;
neoxDescriptor.threadgroup = neoxGroup;

function checkEven(op: string, name: string, v: number): void {
  checkU32(op, name, v, 2);
  if (v % 2 !== 0) throw new MlxError("InvalidArgument", `${op}: ${name} must be even, got ${v}`);
}

/** Rotates pairs (2i, 2i+1) of each of seqLen rows by positions[row] · theta^(−2i/headDim). */
export function rope(
  target: DispatchTarget,
  registry: KernelRegistry,
  input: MlxBuffer,
  output: MlxBuffer,
  positions: MlxBuffer,
  o: { theta: number; headDim: number; seqLen: number },
): void {
  // Each option read once: what is checked is what is written.
  const theta = o.theta, headDim = o.headDim, seqLen = o.seqLen;
  checkPositive("rope", "theta", theta);
  checkEven("rope", "headDim", headDim);
  checkU32("rope", "seqLen", seqLen);
  checkBuffer("rope", "input", input, DType.F32, seqLen * headDim);
  checkBuffer("rope", "output", output, DType.F32, seqLen * headDim);
  checkBuffer("rope", "positions", positions, DType.U32, seqLen);
  const half = headDim / 2, tg = half < 256 ? half : 256, p = registry.resolve(ROPE);
  packRopeParams(ropeWords, theta, headDim, seqLen);
  if (target instanceof CommandEncoder) { // straight into the stream
    let at = target.opBegin(p);
    if (at >= 0) {
      const w = target.opWords;
      at = putBuffer(w, putWords(w, putBuffer(w, putBuffer(w, at, 0, input), 1, output), 2, ropeWords), 3, positions);
      if (at >= 0) return target.opDispatch(at, true, half, seqLen, 1, tg, 1, 1);
    }
  }
  const d = ropeDescriptor;
  d.pipeline = p;
  d.bindings[0] = input;
  d.bindings[1] = output;
  d.bindings[3] = positions;
  ropeGrid[0] = half;
  ropeGrid[1] = seqLen;
  ropeGroup[0] = tg;
  dispatchReusedSlots(target, d, 0b1011);
}

/** Options of {@link ropeNeox}. */
export interface RopeNeoxOptions {
  /** Frequency base. */
  theta: number;
  /** Elements per head row. */
  headDim: number;
  /** Leading dims that rotate (even, ≤ headDim); the rest pass through. */
  ropeDim: number;
  /** Heads per token (rows per position). */
  nHeads: number;
  /** Tokens. */
  seqLen: number;
  /** Optional f32 [ropeDim/2] divisors of each frequency. */
  freqFactors?: MlxBuffer | undefined;
  /**
   * Elements between consecutive heads of one token in `output` (default headDim). With
   * `outTokenStride`, this places each row anywhere: for a KV cache laid out [heads, capacity,
   * headDim], bind `output` at the token's position and pass capacity · headDim and headDim, and
   * rope writes K straight into the cache (no copy after it). Rows must not overlap, and a strided
   * output must not overlap the input.
   */
  outHeadStride?: number;
  /** Elements between consecutive tokens' rows in `output` (default nHeads · headDim). */
  outTokenStride?: number;
  /**
   * A step state (u32, see `stepAdvance`): token t's position is read on the device as state[0] + t
   * (`positions` is not read and may be omitted), and every output row moves by state[0] ·
   * `outPosStride` elements, so `output` can bind a whole KV cache once and consecutive token passes
   * encode identical commands. A state[0] ≥ `maxPositions` fails the dispatch, which writes nothing.
   */
  state?: MlxBuffer | undefined;
  /** Elements the output rows move per position of the state (default 0; a [heads, capacity, headDim] cache: headDim). */
  outPosStride?: number | undefined;
  /** Positions the state may hold (required with `state`): `output` must hold the rows of position maxPositions − 1. */
  maxPositions?: number | undefined;
}

/** Whether rows of `hd` elements at t·ts + h·hs (t < tokens, h < heads) are pairwise disjoint. */
function rowsDisjoint(tokens: number, heads: number, hd: number, hs: number, ts: number): boolean {
  const headsFit = heads === 1 || hs >= hd, tokensFit = tokens === 1 || ts >= hd;
  if (!headsFit || !tokensFit) return false;
  if (tokens === 1 || heads === 1) return true;
  return ts >= (heads - 1) * hs + hd || hs >= (tokens - 1) * ts + hd; // token-major or head-major
}

/** NeoX-style rope over [seqLen · nHeads, headDim] rows; row r uses positions[r / nHeads]. */
export function ropeNeox(
  target: DispatchTarget,
  registry: KernelRegistry,
  input: MlxBuffer,
  output: MlxBuffer,
  positions: MlxBuffer | undefined,
  o: RopeNeoxOptions,
): void {
  ropeHeads("rope_neox", target, registry, input, output, positions, o);
}

/**
 * ggml's normal-mode rope (what llama.cpp uses for llama-architecture GGUFs): as {@link ropeNeox}
 * (rows, positions, partial rotation, freq factors, strided output) but rotating adjacent pairs
 * (2i, 2i+1) for i < ropeDim/2, at angle positions[t] · theta^(−2i/ropeDim) / freqFactors[i].
 */
export function ropeNorm(
  target: DispatchTarget,
  registry: KernelRegistry,
  input: MlxBuffer,
  output: MlxBuffer,
  positions: MlxBuffer | undefined,
  o: RopeNeoxOptions,
): void {
  ropeHeads("rope_norm", target, registry, input, output, positions, o);
}

function ropeHeads(
  op: "rope_neox" | "rope_norm",
  target: DispatchTarget,
  registry: KernelRegistry,
  input: MlxBuffer,
  output: MlxBuffer,
  positions: MlxBuffer | undefined,
  o: RopeNeoxOptions,
): void {
  const hd = o.headDim, nh = o.nHeads, seq = o.seqLen, ropeDim = o.ropeDim;
  const hs = o.outHeadStride ?? hd, ts = o.outTokenStride ?? nh * hd;
  const state = o.state, ps = o.outPosStride ?? 0, maxPos = o.maxPositions ?? 0, freq = o.freqFactors;
  const rows = seq * nh, inBytes = rows * hd * 4;
  // With a state, the furthest rows are those of position maxPositions − 1.
  const outBytes = ((seq - 1) * ts + (nh - 1) * hs + hd + (state ? (maxPos - 1) * ps : 0)) * 4;
  // Every check in one test on the hot path (no freq factors; a decode step's dense or cache rows);
  // anything else, valid or not, goes through checkRopeHeads, which throws with the precise message.
  if (
    !(o.theta > 0 && o.theta < Infinity && isU32(hd, 1) && isU32(ropeDim, 2) && (ropeDim & 1) === 0 &&
      ropeDim <= hd && isU32(nh, 1) && isU32(seq, 1) && isU32(hs, 0) && isU32(ts, 0) && isU32(ps, 0) &&
      freq === undefined && input.dtype === DType.F32 && input.byteLength >= inBytes &&
      output.dtype === DType.F32 && output.byteLength >= outBytes &&
      (state
        ? isU32(maxPos, 1) && state.dtype === DType.U32 && state.byteLength >= 4 &&
          !overlapping(output, outBytes, state, 4)
        : ps === 0 && maxPos === 0 && positions !== undefined && positions.dtype === DType.U32 &&
          positions.byteLength >= seq * 4) &&
      rowsDisjoint(seq, nh, hd, hs, ts) &&
      ((hs === hd && (ts === nh * hd || seq === 1)) || !overlapping(input, inBytes, output, outBytes)))
  ) checkRopeHeads(op, input, output, positions, o);
  const half = ropeDim / 2, tg = half < 256 ? half : 256;
  const p = registry.resolve(op === "rope_neox" ? ROPE_NEOX : ROPE_NORM), pos = state ? undefined : positions;
  packRopeHeadsParams(neoxWords, o.theta, hd, ropeDim);
  packRopeLayoutParams(neoxLayout, nh, freq ? 1 : 0, hs, ts, state ? 1 : 0, ps, maxPos);
  if (target instanceof CommandEncoder) { // straight into the stream
    let at = target.opBegin(p);
    if (at >= 0) {
      const w = target.opWords;
      at = putWords(w, putBuffer(w, putBuffer(w, at, 0, input), 1, output), 2, neoxWords);
      if (pos !== undefined) at = putBuffer(w, at, 3, pos);
      at = putWords(w, at, 4, neoxLayout);
      if (freq !== undefined) at = putBuffer(w, at, 5, freq);
      if (state !== undefined) at = putBuffer(w, at, 6, state);
      if (at >= 0) return target.opDispatch(at, true, half, rows, 1, tg, 1, 1);
    }
  }
  const d = neoxDescriptor, b = d.bindings;
  d.pipeline = p;
  b[0] = input;
  b[1] = output;
  b[3] = pos;
  b[5] = freq;
  b[6] = state;
  neoxGrid[0] = half;
  neoxGrid[1] = rows;
  neoxGroup[0] = tg;
  dispatchReusedSlots(target, d, 0b1101011);
}

/** Every check of {@link ropeHeads}, each with its message (the slow path). */
function checkRopeHeads(
  op: string,
  input: MlxBuffer,
  output: MlxBuffer,
  positions: MlxBuffer | undefined,
  o: RopeNeoxOptions,
): void {
  checkPositive(op, "theta", o.theta);
  checkU32(op, "headDim", o.headDim);
  checkEven(op, "ropeDim", o.ropeDim);
  if (o.ropeDim > o.headDim) {
    throw new MlxError("InvalidArgument", `${op}: ropeDim ${o.ropeDim} exceeds headDim ${o.headDim}`);
  }
  checkU32(op, "nHeads", o.nHeads);
  checkU32(op, "seqLen", o.seqLen);
  const rows = o.seqLen * o.nHeads;
  const hs = o.outHeadStride ?? o.headDim, ts = o.outTokenStride ?? o.nHeads * o.headDim;
  checkU32(op, "outHeadStride", hs, 0);
  checkU32(op, "outTokenStride", ts, 0);
  const dense = hs === o.headDim && (ts === o.nHeads * o.headDim || o.seqLen === 1);
  if (!rowsDisjoint(o.seqLen, o.nHeads, o.headDim, hs, ts)) {
    throw new MlxError(
      "InvalidArgument",
      `${op}: output rows overlap (outHeadStride ${hs}, outTokenStride ${ts}, headDim ${o.headDim}); ` +
        "use strides that give each row its own headDim elements",
    );
  }
  checkBuffer(op, "input", input, DType.F32, rows * o.headDim);
  const state = o.state, ps = o.outPosStride ?? 0, maxPos = o.maxPositions ?? 0;
  checkU32(op, "outPosStride", ps, 0);
  if (state) {
    checkU32(op, "maxPositions", maxPos);
    checkBuffer(op, "state", state, DType.U32, 1);
  } else if (ps !== 0 || maxPos !== 0) {
    throw new MlxError("InvalidArgument", `${op}: outPosStride and maxPositions need a step state (pass state)`);
  }
  // With a state, the furthest rows are those of position maxPositions − 1.
  const outElems = (o.seqLen - 1) * ts + (o.nHeads - 1) * hs + o.headDim + (state ? (maxPos - 1) * ps : 0);
  checkBuffer(op, "output", output, DType.F32, outElems);
  if (!dense && overlapping(input, rows * o.headDim * 4, output, outElems * 4)) {
    throw new MlxError(
      "InvalidArgument",
      `${op}: a strided output must not overlap the input (rotate in place densely)`,
    );
  }
  if (state) {
    if (overlapping(output, outElems * 4, state, 4)) {
      throw new MlxError("InvalidArgument", `${op}: the step state must not lie in the output`);
    }
  } else if (positions) checkBuffer(op, "positions", positions, DType.U32, o.seqLen);
  else throw new MlxError("InvalidArgument", `${op}: pass positions (u32 [seqLen]) or a step state`);
  if (o.freqFactors) checkBuffer(op, "freqFactors", o.freqFactors, DType.F32, o.ropeDim / 2);
}
