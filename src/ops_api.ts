/**
 * The op dispatchers a user calls (`ops.rmsNorm(enc, registry, …)`) and their option types, by
 * name: the public `ops` namespace of mod.ts. Kernel contract tables, geometry helpers and argument
 * checks stay in src/ops/.
 *
 * @module
 */

export type { DispatchTarget } from "./ops/common.ts";
export { f32Bits } from "./ops/common.ts";
export {
  axpby,
  elementwiseAdd,
  elementwiseMul,
  gelu,
  silu,
  siluMul,
  softcap,
  stridedCopy,
  type StridedCopyOptions,
} from "./ops/elementwise.ts";
export { type NormOptions, rmsNorm, rmsNormMul, rmsNormMulAdd, rmsNormNoScale, softmax } from "./ops/norm.ts";
export { rope, ropeNeox, type RopeNeoxOptions, ropeNorm } from "./ops/rope.ts";
export {
  type AffineMatmulOptions,
  type AffineMoeOptions,
  type DenseMatmulOptions,
  type GgmlMatmulOptions,
  type GgmlMoeOptions,
  matmul,
  type MatmulShape,
  quantizedMatmul,
  quantizedMatmulAffineGather,
  quantizedMatmulGgml,
  quantizedMatmulIdGgml,
} from "./ops/matmul.ts";
export {
  type AttentionMask,
  flashAttnVec,
  type FlashAttnVecOptions,
  flashAttnVecScratchBytes,
  sdpa,
  type SdpaOptions,
} from "./ops/attention.ts";
export {
  argmax,
  type ArgmaxOptions,
  type EmbeddingFormat,
  embedGather,
  type EmbedGatherOptions,
  sample,
  type SampleOptions,
  STEP_STATE_WORDS,
  stepAdvance,
  type StepAdvanceOptions,
  type TokenRing,
} from "./ops/sample.ts";
