/**
 * mlx-native for Deno: GPU compute the way the fastest LLM inference engines drive it. Every
 * dispatch of a forward pass goes through one concurrent compute encoder into one command buffer,
 * written as a binary command stream and handed to a native backend (Metal, CUDA or CPU) in one FFI
 * call per flush; memory barriers separate concurrent groups.
 *
 * @example
 * ```ts
 * import { DType, KernelRegistry, MlxDevice, ops } from "@mlxn/mlx-native";
 *
 * using device = MlxDevice.open(); // needs --allow-ffi
 * const registry = new KernelRegistry(device);
 * using x = device.upload(new Float32Array([1, 2, 3, 4]));
 * using w = device.upload(new Float32Array([1, 1, 1, 1]));
 * using y = device.alloc(16, DType.F32);
 * using enc = device.commandEncoder();
 * ops.rmsNorm(enc, registry, x, w, y, { rows: 1, dim: 4, eps: 1e-6 });
 * enc.commitAndWait();
 * console.log(y.read());
 * ```
 *
 * @module
 */

export { DType, dtypeSize, type HostArray } from "./src/dtype.ts";
export { MlxError, type MlxErrorCode } from "./src/errors.ts";
export { type BackendName, envConfig, type MlxConfig } from "./src/config.ts";
export { counters, type CounterSnapshot } from "./src/counters.ts";
export { type HostData, type MemRange, MlxBuffer } from "./src/buffer.ts";
export { type DeviceInfo, type DeviceOptions, type LiveObjects, MlxDevice } from "./src/device.ts";
export {
  type KernelStats,
  type LabelStats,
  type ProfiledCommandBuffer,
  type ProfiledDispatch,
  Profiler,
  type TraceEvent,
} from "./src/profile.ts";
export {
  type Binding,
  CommandEncoder,
  type CommitOptions,
  type Dims,
  type DispatchDescriptor,
  type DispatchKind,
  type DispatchTiming,
  type EncoderOptions,
  type EncoderState,
  type GroupStats,
  type InlineWords,
  type RangeLike,
} from "./src/encoder.ts";
export {
  type Access,
  type KernelContract,
  type KernelRef,
  kernelRef,
  KernelRegistry,
  Pipeline,
  type SlotSpec,
} from "./src/kernels.ts";
export { CapturedOpKind, isReorderable } from "./src/graph/op_kind.ts";
export {
  type Accesses,
  accessesOf,
  type KernelAccesses,
  type RangedBinding,
  rangesOverlap,
  type SlotAccess,
  type SlotAccesses,
} from "./src/graph/ranges.ts";
export { type ConflictReason, ConflictTracker } from "./src/graph/tracker.ts";
export {
  BARRIER,
  type BarrierNode,
  type CapturedNode,
  type DispatchNode,
  type PipelineRef,
} from "./src/graph/nodes.ts";
export {
  checkChunk,
  ComputeGraph,
  dualBufferSplit,
  dualBufferSplitIndex,
  encodeChunk,
  type EncodeTarget,
  type GraphChunk,
  type GraphDispatch,
  type GraphEncodeTarget,
  type PipelineResolver,
  type ReorderMode,
} from "./src/graph/compute_graph.ts";
export { barrierLowerBound, dependencyDepth, dependsOn } from "./src/graph/analysis.ts";
export {
  type BrokenConstantPromise,
  countRedundantBarriers,
  type DispatchRef,
  findBrokenConstantPromises,
  findHazards,
  formatBrokenPromises,
  formatHazards,
  type Hazard,
  type KernelAccessLookup,
} from "./src/graph/validate.ts";
export {
  type ExecutorOptions,
  type FinishOptions,
  type FinishReport,
  FrozenPass,
  GraphExecutor,
  GraphSession,
  type PendingPass,
  type PlanCacheOutcome,
  SessionOpSurface,
  type SessionOptions,
} from "./src/executor.ts";
export { PlanCache, type PlanCacheStats } from "./src/plan_cache.ts";
export {
  DecodeLoop,
  type DecodeLoopOptions,
  type DecodeRunOptions,
  type DecodeRunReport,
  type DecodeStep,
  type EncodeStep,
  type ReadbackTiming,
  type StepTiming,
} from "./src/decode_loop.ts";
export * as ops from "./src/ops_api.ts";
export type { DispatchTarget } from "./src/ops/common.ts";
export { type OpArguments, SESSION_OPS, type SessionOps } from "./src/session_ops.ts";
export type { NormOptions } from "./src/ops/norm.ts";
export type { StridedCopyOptions } from "./src/ops/elementwise.ts";
export type { RopeNeoxOptions } from "./src/ops/rope.ts";
export type {
  AffineMatmulOptions,
  AffineMoeOptions,
  DenseMatmulOptions,
  GgmlMatmulOptions,
  GgmlMoeOptions,
  MatmulShape,
} from "./src/ops/matmul.ts";
export type { AttentionMask, FlashAttnVecOptions, SdpaOptions } from "./src/ops/attention.ts";
export type { ArgmaxOptions, EmbeddingFormat, EmbedGatherOptions, SampleOptions, TokenRing } from "./src/ops/sample.ts";
export {
  type AffineBits,
  type AffineGroupSize,
  type AffineQuantBits,
  type AffineQuantized,
  type AffineQuantizeOptions,
  type AffineScaleDtype,
  dequantizeAffine,
  dequantizeGgml,
  GGML_BLOCK,
  GGML_FORMATS,
  type GgmlBlockLayout,
  ggmlBytes,
  type GgmlFormat,
  type GgmlQuantFormat,
  quantizeAffine,
  quantizeGgml,
} from "./src/quant.ts";
export { f32Bits } from "./src/ops/common.ts";
export {
  GgufFile,
  type GgufHeader,
  type GgufMetadataEntry,
  type GgufTensorInfo,
  type GgufValue,
  GgufValueType,
} from "./src/io/gguf.ts";
export { type GgmlType, ggmlTypeById, ggmlTypeByName } from "./src/io/ggml_types.ts";
export type { ByteSource, UploadOptions } from "./src/io/source.ts";
export {
  SafetensorsFile,
  type SafetensorsHeader,
  type SafetensorsTensorInfo,
  type SafetensorsUploadOptions,
} from "./src/io/safetensors.ts";
export {
  MlxCheckpoint,
  type MlxQuantization,
  type MlxQuantizedBuffers,
  type MlxQuantizedLayer,
} from "./src/io/mlx_checkpoint.ts";
export { type LlamaConfig, llamaConfigFromGguf, llamaConfigFromMlx } from "./src/io/model_config.ts";
export {
  generate,
  type GenerateOptions,
  type GenerateResult,
  type LlamaModel,
  loadLlama,
  type LoadLlamaOptions,
  type RopeMode,
  type TokenSelection,
} from "./src/model/mod.ts";
export { type RandomLlamaShape, writeRandomLlamaGguf } from "./src/model/random_gguf.ts";
