/**
 * Graph nodes: plain data, so a graph can be built, serialised, optimised and inspected without a
 * device. A pipeline may be just `{ name }`; bindings, geometry and threadgroup memory may be omitted
 * for graphs that are only analysed, and are required to encode. A node carries its kernel's slot
 * accesses as data (on its pipeline), so no pass looks a kernel up anywhere.
 *
 * @module
 */

import type { CapturedOpKind } from "./op_kind.ts";
import type { Accesses, KernelAccesses, MemRange, RangedBinding } from "./ranges.ts";

/** Inline constants as u32 words (`f32Bits(x)` for an f32 field). */
export type InlineWords = readonly number[];

/**
 * A slot's argument: a buffer (view) — to the graph, anything that reports its byte range; an
 * MlxBuffer to encode —, inline constants, or nothing (optional slots).
 *
 * Inline constants are little-endian 32-bit words, given as a plain array of u32 values (the fast
 * form: no typed-array allocation per dispatch; use `f32Bits(x)` for floats) or as a Uint32Array,
 * or as raw bytes in a Uint8Array.
 */
export type Binding = RangedBinding | InlineWords | Uint8Array | Uint32Array | undefined;

/** Up to three dimensions; missing ones are 1. */
export type Dims = number | readonly number[];

/** Whether `grid` counts threads or threadgroups. */
export type DispatchKind = "threads" | "threadgroups";

/** A kernel, by name (a Pipeline from a KernelRegistry also fits). */
export interface PipelineRef {
  /** Kernel name. */
  readonly name: string;
  /**
   * The kernel's slots and how it accesses them (a Pipeline carries its contract here): what the
   * validator reads a node's true accesses through, from its bindings. Without it, a node's
   * `reads`/`writes` annotation stands for its accesses.
   */
  readonly contract?: KernelAccesses | undefined;
}

/** One captured dispatch. */
export interface DispatchNode extends Accesses {
  /** Discriminant. */
  readonly kind: "dispatch";
  /** The kernel. */
  readonly pipeline: PipelineRef;
  /** One binding per slot (needed to encode). */
  readonly bindings?: readonly Binding[] | undefined;
  /** Grid (threads or threadgroups, per dispatchKind). */
  readonly grid?: Dims | undefined;
  /** Threads per threadgroup. */
  readonly threadgroup?: Dims | undefined;
  /** Threadgroup memory bytes. */
  readonly threadgroupMemory?: number | undefined;
  /** How to read `grid`. */
  readonly dispatchKind?: DispatchKind | undefined;
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
