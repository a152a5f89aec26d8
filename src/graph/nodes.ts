/**
 * Graph nodes: plain data, so a graph can be built, serialised, optimised and inspected without a
 * device. A pipeline may be just `{ name }`; bindings, geometry and threadgroup memory may be omitted
 * for graphs that are only analysed, and are required to encode.
 *
 * @module
 */

import type { Binding, Dims, DispatchKind } from "../encoder.ts";
import type { CapturedOpKind } from "./op_kind.ts";
import type { Accesses, MemRange } from "./ranges.ts";

/** A kernel, by name (a Pipeline from a KernelRegistry also fits). */
export interface PipelineRef {
  /** Kernel name. */
  readonly name: string;
}

/** One captured dispatch. */
export interface DispatchNode extends Accesses {
  /** Discriminant. */
  readonly kind: "dispatch";
  /** The kernel. */
  readonly pipeline: PipelineRef;
  /** One binding per slot (needed to encode). */
  readonly bindings?: readonly Binding[];
  /** Grid (threads or threadgroups, per dispatchKind). */
  readonly grid?: Dims;
  /** Threads per threadgroup. */
  readonly threadgroup?: Dims;
  /** Threadgroup memory bytes. */
  readonly threadgroupMemory?: number;
  /** How to read `grid`. */
  readonly dispatchKind?: DispatchKind;
  /** What it computes, for the passes. */
  readonly opKind: CapturedOpKind;
  /** Ranges read. */
  readonly reads: readonly MemRange[];
  /** Ranges written. */
  readonly writes: readonly MemRange[];
}

/** An explicit memory barrier. */
export interface BarrierNode {
  /** Discriminant. */
  readonly kind: "barrier";
}

/** A node of a ComputeGraph. */
export type CapturedNode = DispatchNode | BarrierNode;

/** The shared barrier node. */
export const BARRIER: BarrierNode = Object.freeze({ kind: "barrier" });

/** Whether a node is a dispatch. */
export function isDispatch(n: CapturedNode): n is DispatchNode {
  return n.kind === "dispatch";
}

/** Whether a dispatch carries any memory annotation. */
export function isAnnotated(n: DispatchNode): boolean {
  return n.reads.length > 0 || n.writes.length > 0;
}
