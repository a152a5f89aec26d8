/**
 * Matrix products y = x · Wᵀ: x f32 [M, K], W [N, K], y f32 [M, N]. Dense (f32, bf16 or f16 weights),
 * MLX affine-quantized (4/6/8 bits; the fast kernel when N % 8 = 0, K % 256 = 0 and 4 or 8 bits, as
 * the seed selects its SIMD kernel), ggml blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K;
 * mat-vec for M ≤ 8, else mat-mat) and the MoE variant with per-row experts. Formats: src/quant.ts.
 * Geometry: threadgroups (ceil(N / outputs per group), rows), 128 threads.
 *
 * @module
 */

import type { MlxBuffer } from "../buffer.ts";
import { DType } from "../dtype.ts";
import { MlxError } from "../errors.ts";
import { type KernelRef, kernelRef, type KernelRegistry, type Pipeline, registerContracts } from "../kernels.ts";
import { CommandEncoder } from "../encoder.ts";
import { putBuffer, putWords } from "../dispatch_writer.ts";
import {
  AFFINE_GATHER_PARAMS,
  AFFINE_GENERAL_PARAMS,
  AFFINE_PARAMS,
  DENSE_PARAMS,
  GGML_ID_PARAMS,
  GGML_PARAMS,
  MATMUL_EPILOGUE_NONE,
  MATMUL_EPILOGUE_RESIDUAL,
  MATMUL_EPILOGUE_SWIGLU,
  MATMUL_MODE_CONSTANT_WEIGHTS,
  MATMUL_OUTS as OUTS,
  MATMUL_OUTS_FAST as OUTS_FAST,
  MATMUL_OUTS_SWIGLU as OUTS_SWIGLU,
  matmulContracts,
  packAffineGatherParams,
  packAffineGeneralParams,
  packAffineParams,
  packDenseParams,
  packGgmlIdParams,
  packGgmlParams,
} from "../kernels.gen.ts";
import { type AffineQuantBits, GGML_BLOCK, type GgmlBlockLayout, type GgmlFormat } from "../quant.ts";
import {
  checkBuffer,
  checkU32,
  dispatchReused,
  dispatchReusedSlots,
  type DispatchTarget,
  elementBytes,
  groupsDescriptor,
  isU32,
  kernelName,
  overlapping,
} from "./common.ts";

// Outputs per threadgroup, the dense mode word and the parameter layouts come from the kernel
// descriptions (kernels/spec/kernels.ts), shared with the validators and every backend's bodies.
const THREADS = 128;
const FORMATS: readonly GgmlFormat[] = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k"];

/** Contracts of this family (generated from kernels/spec/kernels.ts). */
export { matmulContracts };
registerContracts(matmulContracts);

const MATMUL_F32 = kernelRef("matmul_f32"),
  MATMUL_BF16 = kernelRef("matmul_bf16"),
  MATMUL_F16 = kernelRef("matmul_f16");
const AFFINE = kernelRef("qmatmul_affine"), AFFINE_FAST = kernelRef("qmatmul_affine_fast");
/** Per ggml format: its block layout, kernel name prefix and its kernels (mat-vec, mat-mat, MoE), made once. */
const GGML_KERNELS: ReadonlyMap<
  string,
  { block: GgmlBlockLayout; prefix: string; mv: KernelRef; mm: KernelRef; id: KernelRef }
> = new Map(
  FORMATS.map((f) => [f, {
    block: GGML_BLOCK[f],
    prefix: `qmatmul_${f}`,
    mv: kernelRef(`qmatmul_${f}_mv`),
    mm: kernelRef(`qmatmul_${f}_mm`),
    id: kernelRef(`qmatmul_id_${f}`),
  }]),
);
const AFFINE_GENERAL = kernelRef("qmatmul_affine_general"), AFFINE_GATHER = kernelRef("qmatmul_affine_gather");

// Reused descriptors (see DispatchTarget): nothing is allocated per call. The dense product's
// residual sits in slot 4, after its inline words. They serve targets other than a direct or
// recording encoder (the ops' write path, CommandEncoder.opBegin, takes those).
const words = (layout: { readonly words: number }): number[] => new Array<number>(layout.words).fill(0);
const denseWords = words(DENSE_PARAMS), denseGrid = [0, 0, 1];
const denseDescriptor = groupsDescriptor([undefined, undefined, undefined, denseWords, undefined]);
denseDescriptor.grid = denseGrid;
denseDescriptor.threadgroup = THREADS;
const DENSE_BUFFER_SLOTS = 0b10111;
// The seed's affine kernels and the general one share a slot layout: x, w, scales, biases, y, words.
const affineWords = words(AFFINE_PARAMS), affineGeneralWords = words(AFFINE_GENERAL_PARAMS), affineGrid = [0, 0, 1];
const affineDescriptor = groupsDescriptor([undefined, undefined, undefined, undefined, undefined, affineWords]);
affineDescriptor.grid = affineGrid;
const ggmlWords = words(GGML_PARAMS), ggmlGrid = [0, 0, 1];
const ggmlDescriptor = groupsDescriptor([undefined, undefined, undefined, ggmlWords]);
ggmlDescriptor.grid = ggmlGrid;
ggmlDescriptor.threadgroup = THREADS;
const moeWords = words(GGML_ID_PARAMS), moeGrid = [0, 0, 1];
const moeDescriptor = groupsDescriptor([undefined, undefined, undefined, undefined, moeWords]);
moeDescriptor.grid = moeGrid;
moeDescriptor.threadgroup = THREADS;
const gatherWords = words(AFFINE_GATHER_PARAMS), gatherGrid = [0, 0, 1];
const gatherDescriptor = groupsDescriptor([
  undefined,
  undefined,
  undefined,
  undefined,
  undefined,
  undefined,
  gatherWords,
]);
gatherDescriptor.grid = gatherGrid;
gatherDescriptor.threadgroup = THREADS;

/** Shape of a product. */
export interface MatmulShape {
  /** Rows of x and y. */
  m: number;
  /** Rows of W, columns of y. */
  n: number;
  /** Columns of x and W. */
  k: number;
}

function checkShape(op: string, s: MatmulShape): void {
  checkU32(op, "m", s.m);
  checkU32(op, "n", s.n);
  checkU32(op, "k", s.k);
}

function checkBytes(op: string, name: string, buf: MlxBuffer, bytes: number): void {
  if (buf.byteLength < bytes) {
    throw new MlxError("InvalidArgument", `${op}: ${name} holds ${buf.byteLength} bytes, needs ${bytes}`);
  }
}

/** Options of {@link matmul}. */
export interface DenseMatmulOptions extends MatmulShape {
  /**
   * f32 [m, n] added to the product in the same kernel: y = x · Wᵀ + residual (a residual
   * connection's add, one dependent step shorter, bit-identical to matmul then elementwiseAdd). It
   * may be y itself (y += x · Wᵀ) but must not partly overlap it.
   */
  residual?: MlxBuffer | undefined;
  /**
   * SwiGLU in the same kernel: W holds 2n rows, the gate rows then the up rows (one stacked
   * projection), and y[j] = silu(x · W[j]) · (x · W[n + j]). Bit-identical to the product into a
   * [m, 2n] scratch followed by {@link siluMul} of its halves, without the scratch or the second
   * kernel. Not combinable with `residual`.
   */
  swiglu?: boolean;
  /**
   * A promise that no earlier dispatch of this command buffer writes `w` (model weights uploaded
   * once). The GPU backends may then start reading the weights before the dispatches this one
   * depends on have finished, overlapping the weight stream with them (on CUDA: the product's
   * blocks start early under a programmatic edge). Results are the same either way; breaking the
   * promise reads stale weights, and an encoder in validation mode refuses to commit it (a
   * HazardError naming both dispatches). Default false.
   */
  constantWeights?: boolean;
}

/**
 * y = x · Wᵀ with dense f32, bf16 or f16 weights (projections, embeddings, lm-head), optionally with a
 * fused epilogue: a residual add or SwiGLU (see {@link DenseMatmulOptions}).
 */
export function matmul(
  target: DispatchTarget,
  registry: KernelRegistry,
  x: MlxBuffer,
  w: MlxBuffer,
  y: MlxBuffer,
  s: DenseMatmulOptions,
): void {
  const m = s.m, n = s.n, k = s.k, wt = w.dtype, r = s.residual, swiglu = s.swiglu === true;
  const yBytes = m * n * 4;
  // Every check in one test on the hot path; anything off goes through checkMatmul, which throws
  // with the precise message.
  if (
    !(isU32(m, 1) && isU32(n, 1) && isU32(k, 1) && (wt === DType.F32 || wt === DType.BF16 || wt === DType.F16) &&
      x.dtype === DType.F32 && x.byteLength >= m * k * 4 &&
      w.byteLength >= (swiglu ? 2 : 1) * n * k * elementBytes(wt) && y.dtype === DType.F32 &&
      y.byteLength >= yBytes &&
      (!r ||
        (!swiglu && r.dtype === DType.F32 && r.byteLength >= yBytes &&
          ((r.allocId === y.allocId && r.byteOffset === y.byteOffset) || !overlapping(r, yBytes, y, yBytes)))))
  ) checkMatmul(x, w, y, s);
  const epilogue = r ? MATMUL_EPILOGUE_RESIDUAL : swiglu ? MATMUL_EPILOGUE_SWIGLU : MATMUL_EPILOGUE_NONE;
  const p = registry.resolve(wt === DType.F32 ? MATMUL_F32 : wt === DType.BF16 ? MATMUL_BF16 : MATMUL_F16);
  const groups = Math.ceil(n / (swiglu ? OUTS_SWIGLU : OUTS));
  packDenseParams(denseWords, m, n, k, epilogue | (s.constantWeights ? MATMUL_MODE_CONSTANT_WEIGHTS : 0));
  if (target instanceof CommandEncoder) { // straight into the stream
    let at = target.opBegin(p);
    if (at >= 0) {
      const ws = target.opWords;
      at = putWords(ws, putBuffer(ws, putBuffer(ws, putBuffer(ws, at, 0, x), 1, w), 2, y), 3, denseWords);
      if (r !== undefined) at = putBuffer(ws, at, 4, r);
      if (at >= 0) return target.opDispatch(at, false, groups, m, 1, THREADS, 1, 1);
    }
  }
  const d = denseDescriptor, b = d.bindings;
  d.pipeline = p;
  b[0] = x;
  b[1] = w;
  b[2] = y;
  b[4] = r;
  denseGrid[0] = groups;
  denseGrid[1] = m;
  dispatchReusedSlots(target, d, DENSE_BUFFER_SLOTS);
}

/** Every check of {@link matmul}, each with its message (the slow path). */
function checkMatmul(x: MlxBuffer, w: MlxBuffer, y: MlxBuffer, s: DenseMatmulOptions): void {
  checkShape("matmul", s);
  if (w.dtype !== DType.F32 && w.dtype !== DType.BF16 && w.dtype !== DType.F16) {
    throw new MlxError("InvalidArgument", `matmul: weights must be f32, bf16 or f16, got ${w.dtype}`);
  }
  const r = s.residual, swiglu = s.swiglu === true;
  if (r && swiglu) {
    throw new MlxError("InvalidArgument", "matmul: residual and swiglu cannot be combined (one epilogue per product)");
  }
  checkBuffer("matmul", "x", x, DType.F32, s.m * s.k);
  checkBuffer("matmul", "w", w, w.dtype, (swiglu ? 2 : 1) * s.n * s.k);
  checkBuffer("matmul", "y", y, DType.F32, s.m * s.n);
  if (r) {
    checkBuffer("matmul", "residual", r, DType.F32, s.m * s.n);
    const bytes = s.m * s.n * 4, same = r.allocId === y.allocId && r.byteOffset === y.byteOffset;
    if (!same && overlapping(r, bytes, y, bytes)) {
      throw new MlxError("InvalidArgument", "matmul: the residual must be y itself or not overlap it");
    }
  }
}

/** Options of {@link quantizedMatmul}. */
export interface AffineMatmulOptions extends MatmulShape {
  /** Bits per weight (MLX's widths). */
  bits: AffineQuantBits;
  /** Values per scale/bias. */
  groupSize: 32 | 64 | 128;
  /** Force a kernel; by default the fast one whenever its shape rules hold. */
  variant?: "scalar" | "fast";
}

/** Whether the fast affine kernel applies (the seed's rule for its SIMD kernel; bf16 scales). */
export function affineFastApplies(o: AffineMatmulOptions): boolean {
  return o.n % 8 === 0 && o.k % 256 === 0 && (o.bits === 4 || o.bits === 8);
}

/** The general affine kernels' scale type word: mlxn_ftype (0 f32, 1 f16, 2 bf16); -1 for any other dtype. */
function scaleType(dtype: DType): number {
  return dtype === DType.F32 ? 0 : dtype === DType.F16 ? 1 : dtype === DType.BF16 ? 2 : -1;
}

/** Whether `bits` is one of the affine widths (2, 3, 4, 5, 6, 8). */
function affineBits(bits: number): boolean {
  return bits === 4 || bits === 8 || bits === 6 || bits === 2 || bits === 3 || bits === 5;
}

/** Checks bits, group size and the scales/biases pair; returns the general kernels' scale type. */
function checkAffine(op: string, bits: number, groupSize: number, k: number, scales: MlxBuffer, biases: MlxBuffer) {
  if (!affineBits(bits)) {
    throw new MlxError("InvalidArgument", `${op}: bits must be 2, 3, 4, 5, 6 or 8, got ${bits}`);
  }
  if (groupSize !== 32 && groupSize !== 64 && groupSize !== 128) {
    throw new MlxError("InvalidArgument", `${op}: groupSize must be 32, 64 or 128`);
  }
  if (k % groupSize !== 0) throw new MlxError("InvalidArgument", `${op}: k must be a multiple of groupSize`);
  const type = scaleType(scales.dtype);
  if (type < 0 || biases.dtype !== scales.dtype) {
    throw new MlxError(
      "InvalidArgument",
      `${op}: scales and biases must share one dtype of f32, f16 or bf16 (got ${scales.dtype} and ${biases.dtype})`,
    );
  }
  return type;
}

/**
 * y = x · Wᵀ with MLX affine-quantized W (w = scale·q + bias). Scales and biases are bf16, f16 or
 * f32 (MLX stores them in the weights' dtype); 4, 6 and 8 bits with bf16 scales take the seed's
 * kernels, every other combination a general kernel.
 */
export function quantizedMatmul(
  target: DispatchTarget,
  registry: KernelRegistry,
  x: MlxBuffer,
  w: MlxBuffer,
  scales: MlxBuffer,
  biases: MlxBuffer,
  y: MlxBuffer,
  o: AffineMatmulOptions,
): void {
  const m = o.m, n = o.n, k = o.k, bits = o.bits, gs = o.groupSize, variant = o.variant;
  // The seed's kernels (4, 6 or 8 bits, bf16 scales) in one test on the hot path; anything else goes
  // through the full checks (which throw with the precise message) and may take a general kernel.
  const seed = isU32(m, 1) && isU32(n, 1) && isU32(k, 1) && (bits === 4 || bits === 6 || bits === 8) &&
    (gs === 32 || gs === 64 || gs === 128) && k % gs === 0 && scales.dtype === DType.BF16 &&
    biases.dtype === DType.BF16;
  const applies = seed && n % 8 === 0 && k % 256 === 0 && bits !== 6;
  const fast = variant === "fast" || (variant === undefined && applies);
  const scaleBytes = n * (k / gs) * 2;
  if (
    !(seed && (!fast || applies) && x.dtype === DType.F32 && x.byteLength >= m * k * 4 &&
      w.byteLength >= (n * k * bits) / 8 && scales.byteLength >= scaleBytes && biases.byteLength >= scaleBytes &&
      y.dtype === DType.F32 && y.byteLength >= m * n * 4)
  ) return affineGeneral(target, registry, x, w, scales, biases, y, o);
  const p = registry.resolve(fast ? AFFINE_FAST : AFFINE), groups = Math.ceil(n / (fast ? OUTS_FAST : OUTS));
  const tg = fast ? 256 : THREADS;
  packAffineParams(affineWords, m, n, k, bits, gs);
  if (target instanceof CommandEncoder) { // straight into the stream
    let at = target.opBegin(p);
    if (at >= 0) {
      const ws = target.opWords;
      at = putBuffer(ws, putBuffer(ws, putBuffer(ws, at, 0, x), 1, w), 2, scales);
      at = putWords(ws, putBuffer(ws, putBuffer(ws, at, 3, biases), 4, y), 5, affineWords);
      if (at >= 0) return target.opDispatch(at, false, groups, m, 1, tg, 1, 1);
    }
  }
  affineByDescriptor(target, p, affineWords, x, w, scales, biases, y, groups, m, tg);
}

/**
 * {@link quantizedMatmul} off the hot path: every check with its message, then the general kernel
 * for what the seed's kernels do not take (or the seed's kernel for a call the hot-path test left).
 */
function affineGeneral(
  target: DispatchTarget,
  registry: KernelRegistry,
  x: MlxBuffer,
  w: MlxBuffer,
  scales: MlxBuffer,
  biases: MlxBuffer,
  y: MlxBuffer,
  o: AffineMatmulOptions,
): void {
  const op = "quantized_matmul";
  checkShape(op, o);
  const type = checkAffine(op, o.bits, o.groupSize, o.k, scales, biases);
  const seed = scales.dtype === DType.BF16 && (o.bits === 4 || o.bits === 6 || o.bits === 8);
  const fast = o.variant === "fast" || (o.variant === undefined && seed && affineFastApplies(o));
  if (fast && !(seed && affineFastApplies(o))) {
    throw new MlxError(
      "InvalidArgument",
      `${op}: the fast kernel needs n % 8 = 0, k % 256 = 0, 4 or 8 bits and bf16 scales`,
    );
  }
  const groups = o.k / o.groupSize;
  checkBuffer(op, "x", x, DType.F32, o.m * o.k);
  checkBytes(op, "w", w, (o.n * o.k * o.bits) / 8);
  checkBuffer(op, "scales", scales, scales.dtype, o.n * groups);
  checkBuffer(op, "biases", biases, scales.dtype, o.n * groups);
  checkBuffer(op, "y", y, DType.F32, o.m * o.n);
  if (seed) {
    packAffineParams(affineWords, o.m, o.n, o.k, o.bits, o.groupSize);
    const p = registry.resolve(fast ? AFFINE_FAST : AFFINE);
    const g0 = Math.ceil(o.n / (fast ? OUTS_FAST : OUTS));
    return encodeAffine(target, p, affineWords, x, w, scales, biases, y, g0, o.m, fast ? 256 : THREADS);
  }
  packAffineGeneralParams(affineGeneralWords, o.m, o.n, o.k, o.bits, o.groupSize, type);
  const p = registry.resolve(AFFINE_GENERAL);
  encodeAffine(target, p, affineGeneralWords, x, w, scales, biases, y, Math.ceil(o.n / OUTS), o.m, THREADS);
}

/**
 * Dispatches an affine product whose checks passed (slots x, w, scales, biases, y, then `params`):
 * straight into the stream where the target takes the ops' write path, else by descriptor.
 */
function encodeAffine(
  target: DispatchTarget,
  p: Pipeline,
  params: readonly number[],
  x: MlxBuffer,
  w: MlxBuffer,
  scales: MlxBuffer,
  biases: MlxBuffer,
  y: MlxBuffer,
  g0: number,
  g1: number,
  tg: number,
): void {
  if (target instanceof CommandEncoder) {
    let at = target.opBegin(p);
    if (at >= 0) {
      const ws = target.opWords;
      at = putBuffer(ws, putBuffer(ws, putBuffer(ws, at, 0, x), 1, w), 2, scales);
      at = putWords(ws, putBuffer(ws, putBuffer(ws, at, 3, biases), 4, y), 5, params);
      if (at >= 0) return target.opDispatch(at, false, g0, g1, 1, tg, 1, 1);
    }
  }
  affineByDescriptor(target, p, params, x, w, scales, biases, y, g0, g1, tg);
}

/** {@link encodeAffine} by the reused descriptor (any target; a freed buffer is refused there). */
function affineByDescriptor(
  target: DispatchTarget,
  p: Pipeline,
  params: readonly number[],
  x: MlxBuffer,
  w: MlxBuffer,
  scales: MlxBuffer,
  biases: MlxBuffer,
  y: MlxBuffer,
  g0: number,
  g1: number,
  tg: number,
): void {
  const d = affineDescriptor, b = d.bindings;
  d.pipeline = p;
  b[0] = x;
  b[1] = w;
  b[2] = scales;
  b[3] = biases;
  b[4] = y;
  b[5] = params as number[];
  affineGrid[0] = g0;
  affineGrid[1] = g1;
  d.threadgroup = tg;
  dispatchReused(target, d, 5);
}

/** Options of {@link quantizedMatmulGgml}. */
export interface GgmlMatmulOptions extends MatmulShape {
  /** Block format of W. */
  format: GgmlFormat;
  /** Force a path; by default mat-vec for m ≤ 8, else mat-mat. */
  variant?: "mv" | "mm";
}

function checkFormat(op: string, format: GgmlFormat, k: number): void {
  const blk = GGML_BLOCK[format];
  if (!blk) throw new MlxError("InvalidArgument", `${op}: unknown format ${format} (use ${FORMATS.join(", ")})`);
  if (k % blk.values !== 0) {
    throw new MlxError("InvalidArgument", `${op}: k (${k}) must be a multiple of ${blk.values} for ${format}`);
  }
}

/** y = x · Wᵀ with W in a ggml block format. */
export function quantizedMatmulGgml(
  target: DispatchTarget,
  registry: KernelRegistry,
  x: MlxBuffer,
  w: MlxBuffer,
  y: MlxBuffer,
  o: GgmlMatmulOptions,
): void {
  const m = o.m, n = o.n, k = o.k, kernels = GGML_KERNELS.get(o.format);
  const variant = o.variant ?? (m <= 8 ? "mv" : "mm");
  // Every check in one test on the hot path; anything off goes through checkGgml, which throws with
  // the precise message.
  if (
    !(kernels !== undefined && isU32(m, 1) && isU32(n, 1) && isU32(k, 1) && k % kernels.block.values === 0 &&
      (variant === "mm" || (variant === "mv" && m <= 8)) && x.dtype === DType.F32 && x.byteLength >= m * k * 4 &&
      w.byteLength >= n * (k / kernels.block.values) * kernels.block.bytes && y.dtype === DType.F32 &&
      y.byteLength >= m * n * 4)
  ) checkGgml(x, w, y, o, variant);
  const mv = variant === "mv", groups = Math.ceil(n / OUTS), rows = mv ? 1 : m;
  const p = mv
    ? registry.resolve(kernels!.mv)
    : variant === "mm"
    ? registry.resolve(kernels!.mm)
    : registry.get(kernelName(kernels!.prefix, variant)); // not a variant: KernelNotFound names it
  packGgmlParams(ggmlWords, m, n, k);
  if (target instanceof CommandEncoder) { // straight into the stream
    let at = target.opBegin(p);
    if (at >= 0) {
      const ws = target.opWords;
      at = putWords(ws, putBuffer(ws, putBuffer(ws, putBuffer(ws, at, 0, x), 1, w), 2, y), 3, ggmlWords);
      if (at >= 0) return target.opDispatch(at, false, groups, rows, 1, THREADS, 1, 1);
    }
  }
  const d = ggmlDescriptor, b = d.bindings;
  d.pipeline = p;
  b[0] = x;
  b[1] = w;
  b[2] = y;
  ggmlGrid[0] = groups;
  ggmlGrid[1] = rows;
  dispatchReused(target, d, 3);
}

/** Every check of {@link quantizedMatmulGgml}, each with its message (the slow path). */
function checkGgml(x: MlxBuffer, w: MlxBuffer, y: MlxBuffer, o: GgmlMatmulOptions, variant: string): void {
  const op = "quantized_matmul_ggml";
  checkShape(op, o);
  checkFormat(op, o.format, o.k);
  if (variant === "mv" && o.m > 8) throw new MlxError("InvalidArgument", `${op}: the mat-vec path takes m <= 8`);
  const blk = GGML_BLOCK[o.format];
  checkBuffer(op, "x", x, DType.F32, o.m * o.k);
  checkBytes(op, "w", w, o.n * (o.k / blk.values) * blk.bytes);
  checkBuffer(op, "y", y, DType.F32, o.m * o.n);
}

/** Options of {@link quantizedMatmulIdGgml}. */
export interface GgmlMoeOptions {
  /** Tokens (rows of x). */
  tokens: number;
  /** Experts per token. */
  topK: number;
  /** Output columns per expert. */
  n: number;
  /** Columns of x. */
  k: number;
  /** Experts stacked in W. */
  experts: number;
  /** Block format. */
  format: GgmlFormat;
}

/**
 * MoE expert-routed product: W stacks `experts` matrices [N, K]; ids u32 [tokens·topK]; output row
 * r (of tokens·topK) = x[r / topK] · W[ids[r]]ᵀ. An id ≥ experts fails the command buffer.
 */
export function quantizedMatmulIdGgml(
  target: DispatchTarget,
  registry: KernelRegistry,
  x: MlxBuffer,
  w: MlxBuffer,
  ids: MlxBuffer,
  y: MlxBuffer,
  o: GgmlMoeOptions,
): void {
  const tokens = o.tokens, topK = o.topK, n = o.n, k = o.k, experts = o.experts, kernels = GGML_KERNELS.get(o.format);
  const rows = tokens * topK;
  // Every check in one test on the hot path (with the row count a u32, as the grid needs); anything
  // off goes through checkMoe, which throws with the precise message, and then the descriptor path.
  const hot = kernels !== undefined && isU32(tokens, 1) && isU32(topK, 1) && isU32(n, 1) && isU32(k, 1) &&
    isU32(experts, 1) && k % kernels.block.values === 0 && isU32(rows, 1) && x.dtype === DType.F32 &&
    x.byteLength >= tokens * k * 4 && w.byteLength >= experts * n * (k / kernels.block.values) * kernels.block.bytes &&
    ids.dtype === DType.U32 && ids.byteLength >= rows * 4 && y.dtype === DType.F32 && y.byteLength >= rows * n * 4;
  if (!hot) checkMoe(x, w, ids, y, o);
  const p = registry.resolve(kernels!.id), groups = Math.ceil(n / OUTS);
  packGgmlIdParams(moeWords, rows, n, k, topK, experts);
  if (hot && target instanceof CommandEncoder) { // straight into the stream
    let at = target.opBegin(p);
    if (at >= 0) {
      const ws = target.opWords;
      at = putBuffer(ws, putBuffer(ws, putBuffer(ws, at, 0, x), 1, w), 2, ids);
      at = putWords(ws, putBuffer(ws, at, 3, y), 4, moeWords);
      if (at >= 0) return target.opDispatch(at, false, groups, rows, 1, THREADS, 1, 1);
    }
  }
  const d = moeDescriptor, b = d.bindings;
  d.pipeline = p;
  b[0] = x;
  b[1] = w;
  b[2] = ids;
  b[3] = y;
  moeGrid[0] = groups;
  moeGrid[1] = rows;
  dispatchReused(target, d, 4);
}

/** Every check of {@link quantizedMatmulIdGgml}, each with its message (the slow path). */
function checkMoe(x: MlxBuffer, w: MlxBuffer, ids: MlxBuffer, y: MlxBuffer, o: GgmlMoeOptions): void {
  const op = "quantized_matmul_id_ggml";
  checkU32(op, "tokens", o.tokens);
  checkU32(op, "topK", o.topK);
  checkU32(op, "n", o.n);
  checkU32(op, "k", o.k);
  checkU32(op, "experts", o.experts);
  checkFormat(op, o.format, o.k);
  const rows = o.tokens * o.topK, blk = GGML_BLOCK[o.format];
  checkBuffer(op, "x", x, DType.F32, o.tokens * o.k);
  checkBytes(op, "w", w, o.experts * o.n * (o.k / blk.values) * blk.bytes);
  checkBuffer(op, "ids", ids, DType.U32, rows);
  checkBuffer(op, "y", y, DType.F32, rows * o.n);
}

/** Options of {@link quantizedMatmulAffineGather}. */
export interface AffineMoeOptions {
  /** Tokens (rows of x). */
  tokens: number;
  /** Experts per token. */
  topK: number;
  /** Output columns per expert. */
  n: number;
  /** Columns of x. */
  k: number;
  /** Experts stacked in W, scales and biases. */
  experts: number;
  /** Bits per weight. */
  bits: AffineQuantBits;
  /** Values per scale/bias. */
  groupSize: 32 | 64 | 128;
}

/**
 * MoE expert-routed product with MLX affine weights (MLX's gather_qmm): W, scales and biases stack
 * `experts` matrices ([E, N, K·bits/8] bytes, [E, N, K/groupSize] bf16/f16/f32); ids u32
 * [tokens·topK]; output row r = x[r / topK] · W[ids[r]]ᵀ. An id ≥ experts fails the command buffer.
 */
export function quantizedMatmulAffineGather(
  target: DispatchTarget,
  registry: KernelRegistry,
  x: MlxBuffer,
  w: MlxBuffer,
  scales: MlxBuffer,
  biases: MlxBuffer,
  ids: MlxBuffer,
  y: MlxBuffer,
  o: AffineMoeOptions,
): void {
  const tokens = o.tokens, topK = o.topK, n = o.n, k = o.k, experts = o.experts, bits = o.bits, gs = o.groupSize;
  const rows = tokens * topK, type = scaleType(scales.dtype);
  const scaleBytes = experts * n * (k / gs) * elementBytes(scales.dtype);
  // Every check in one test on the hot path (with the row count a u32, as the grid needs); anything
  // off goes through checkAffineGather, which throws with the precise message, and then the
  // descriptor path.
  const hot = isU32(tokens, 1) && isU32(topK, 1) && isU32(n, 1) && isU32(k, 1) && isU32(experts, 1) &&
    affineBits(bits) && (gs === 32 || gs === 64 || gs === 128) && k % gs === 0 && type >= 0 &&
    biases.dtype === scales.dtype && isU32(rows, 1) && x.dtype === DType.F32 && x.byteLength >= tokens * k * 4 &&
    w.byteLength >= (experts * n * k * bits) / 8 && scales.byteLength >= scaleBytes &&
    biases.byteLength >= scaleBytes && ids.dtype === DType.U32 && ids.byteLength >= rows * 4 &&
    y.dtype === DType.F32 && y.byteLength >= rows * n * 4;
  if (!hot) checkAffineGather(x, w, scales, biases, ids, y, o);
  const p = registry.resolve(AFFINE_GATHER), groups = Math.ceil(n / OUTS);
  packAffineGatherParams(gatherWords, rows, n, k, topK, experts, bits, gs, type);
  if (hot && target instanceof CommandEncoder) { // straight into the stream
    let at = target.opBegin(p);
    if (at >= 0) {
      const ws = target.opWords;
      at = putBuffer(ws, putBuffer(ws, putBuffer(ws, at, 0, x), 1, w), 2, scales);
      at = putBuffer(ws, putBuffer(ws, putBuffer(ws, at, 3, biases), 4, ids), 5, y);
      at = putWords(ws, at, 6, gatherWords);
      if (at >= 0) return target.opDispatch(at, false, groups, rows, 1, THREADS, 1, 1);
    }
  }
  const d = gatherDescriptor, b = d.bindings;
  d.pipeline = p;
  b[0] = x;
  b[1] = w;
  b[2] = scales;
  b[3] = biases;
  b[4] = ids;
  b[5] = y;
  gatherGrid[0] = groups;
  gatherGrid[1] = rows;
  dispatchReused(target, d, 6);
}

/** Every check of {@link quantizedMatmulAffineGather}, each with its message (the slow path). */
function checkAffineGather(
  x: MlxBuffer,
  w: MlxBuffer,
  scales: MlxBuffer,
  biases: MlxBuffer,
  ids: MlxBuffer,
  y: MlxBuffer,
  o: AffineMoeOptions,
): void {
  const op = "quantized_matmul_affine_gather";
  checkU32(op, "tokens", o.tokens);
  checkU32(op, "topK", o.topK);
  checkU32(op, "n", o.n);
  checkU32(op, "k", o.k);
  checkU32(op, "experts", o.experts);
  checkAffine(op, o.bits, o.groupSize, o.k, scales, biases);
  const rows = o.tokens * o.topK, groups = o.k / o.groupSize;
  checkBuffer(op, "x", x, DType.F32, o.tokens * o.k);
  checkBytes(op, "w", w, (o.experts * o.n * o.k * o.bits) / 8);
  checkBuffer(op, "scales", scales, scales.dtype, o.experts * o.n * groups);
  checkBuffer(op, "biases", biases, scales.dtype, o.experts * o.n * groups);
  checkBuffer(op, "ids", ids, DType.U32, rows);
  checkBuffer(op, "y", y, DType.F32, rows * o.n);
}
