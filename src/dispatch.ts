/**
 * The descriptor of one dispatch, as the encoder, the capture recorder and the stream writer take
 * it: a module of its own so that those can share it without importing the encoder.
 *
 * @module
 */

import type { Binding, Dims, DispatchKind } from "./graph/nodes.ts";
import type { CapturedOpKind } from "./graph/op_kind.ts";
import type { Pipeline } from "./kernels.ts";

/** Everything one dispatch needs. */
export interface DispatchDescriptor {
  /** The kernel, from a KernelRegistry. */
  readonly pipeline: Pipeline;
  /** One entry per slot of the kernel's contract, in slot order. */
  readonly bindings: readonly Binding[];
  /** Threads (dispatchKind "threads") or threadgroups ("threadgroups", the default) per dimension. */
  readonly grid: Dims;
  /** Threads per threadgroup. */
  readonly threadgroup: Dims;
  /** How to read `grid`; default "threadgroups". */
  readonly dispatchKind?: DispatchKind | undefined;
  /** Threadgroup memory in bytes (index 0). */
  readonly threadgroupMemory?: number | undefined;
  /** Overrides the contract's op kind (for graph passes). */
  readonly opKind?: CapturedOpKind | undefined;
}
