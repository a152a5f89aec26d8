/**
 * Rotary position embeddings (f32): `rope` rotates adjacent pairs (2i, 2i+1) of one head laid out
 * [seq, headDim]; `ropeNeox` rotates pairs (i, i + ropeDim/2) of [seq · heads, headDim] rows,
 * passes dims ≥ ropeDim through, and optionally divides each frequency by a freq factor.
 *
 * @module
 */

import type { MlxBuffer } from "../buffer.ts";
import { DType } from "../dtype.ts";
import { MlxError } from "../errors.ts";
import { CapturedOpKind } from "../graph/op_kind.ts";
import { type KernelContract, type KernelRegistry, registerContracts } from "../kernels.ts";
import { checkBuffer, checkFinite, checkU32, type DispatchTarget, f32Bits } from "./common.ts";

/** Contracts of this family. */
export const ropeContracts: readonly KernelContract[] = [
  {
    name: "rope_f32",
    opKind: CapturedOpKind.Rope,
    slots: [
      { name: "input", kind: "buffer", access: "read" },
      { name: "output", kind: "buffer", access: "write" },
      { name: "params{theta:f32,head_dim:u32,seq_len:u32}", kind: "bytes", size: 12 },
      { name: "positions", kind: "buffer", access: "read" },
    ],
  },
  {
    name: "rope_neox_f32",
    opKind: CapturedOpKind.Rope,
    slots: [
      { name: "input", kind: "buffer", access: "read" },
      { name: "output", kind: "buffer", access: "write" },
      { name: "params{theta:f32,head_dim:u32,rope_dim:u32}", kind: "bytes", size: 12 },
      { name: "positions", kind: "buffer", access: "read" },
      { name: "params{n_heads:u32,has_freq_factors:u32}", kind: "bytes", size: 8 },
      { name: "freq_factors", kind: "buffer", access: "read", optional: true },
    ],
  },
];
registerContracts(ropeContracts);

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
  checkFinite("rope", "theta", o.theta, { positive: true });
  checkEven("rope", "headDim", o.headDim);
  checkU32("rope", "seqLen", o.seqLen);
  checkBuffer("rope", "input", input, DType.F32, o.seqLen * o.headDim);
  checkBuffer("rope", "output", output, DType.F32, o.seqLen * o.headDim);
  checkBuffer("rope", "positions", positions, DType.U32, o.seqLen);
  const half = o.headDim / 2;
  target.dispatch({
    pipeline: registry.get("rope_f32"),
    bindings: [input, output, [f32Bits(o.theta), o.headDim, o.seqLen], positions],
    grid: [half, o.seqLen, 1],
    threadgroup: [Math.min(half, 256), 1, 1],
    dispatchKind: "threads",
  });
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
  freqFactors?: MlxBuffer;
}

/** NeoX-style rope over [seqLen · nHeads, headDim] rows; row r uses positions[r / nHeads]. */
export function ropeNeox(
  target: DispatchTarget,
  registry: KernelRegistry,
  input: MlxBuffer,
  output: MlxBuffer,
  positions: MlxBuffer,
  o: RopeNeoxOptions,
): void {
  const op = "rope_neox";
  checkFinite(op, "theta", o.theta, { positive: true });
  checkU32(op, "headDim", o.headDim);
  checkEven(op, "ropeDim", o.ropeDim);
  if (o.ropeDim > o.headDim) {
    throw new MlxError("InvalidArgument", `${op}: ropeDim ${o.ropeDim} exceeds headDim ${o.headDim}`);
  }
  checkU32(op, "nHeads", o.nHeads);
  checkU32(op, "seqLen", o.seqLen);
  const rows = o.seqLen * o.nHeads;
  checkBuffer(op, "input", input, DType.F32, rows * o.headDim);
  checkBuffer(op, "output", output, DType.F32, rows * o.headDim);
  checkBuffer(op, "positions", positions, DType.U32, o.seqLen);
  if (o.freqFactors) checkBuffer(op, "freqFactors", o.freqFactors, DType.F32, o.ropeDim / 2);
  const half = o.ropeDim / 2;
  target.dispatch({
    pipeline: registry.get("rope_neox_f32"),
    bindings: [
      input,
      output,
      [f32Bits(o.theta), o.headDim, o.ropeDim],
      positions,
      [o.nHeads, o.freqFactors ? 1 : 0],
      o.freqFactors,
    ],
    grid: [half, rows, 1],
    threadgroup: [Math.min(half, 256), 1, 1],
    dispatchKind: "threads",
  });
}
