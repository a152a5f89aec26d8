/**
 * ComputeGraph: a recorded sequence of dispatches and barriers, its passes (fuse, reorder) and its
 * encodings (as recorded, with barriers recomputed from memory ranges, or split over two command
 * buffers so the GPU starts while the CPU still encodes).
 *
 * @module
 */

import { MlxError } from "../errors.ts";
import { fuseNodes } from "./fuse.ts";
import {
  type Binding,
  type CapturedNode,
  type Dims,
  type DispatchKind,
  type DispatchNode,
  isAnnotated,
  isDispatch,
  type PipelineRef,
} from "./nodes.ts";
import type { CapturedOpKind } from "./op_kind.ts";
import { reorderLevels, reorderNodes } from "./reorder.ts";
import { GroupWalker } from "./tracker.ts";
import { countRedundantBarriers, findHazards, type Hazard, type KernelAccessLookup } from "./validate.ts";

/** The reorder schedules: the seed's 64-node look-ahead, or dependency levels (barriers = DAG depth − 1). */
export type ReorderMode = "lookahead" | "levels";

/** One dispatch as the graph hands it to its target, with the pipeline the target resolved. */
export interface GraphDispatch<P extends PipelineRef = PipelineRef> {
  /** The kernel, as resolved by the target. */
  readonly pipeline: P;
  /** One entry per slot of the kernel, in slot order. */
  readonly bindings: readonly Binding[];
  /** Threads or threadgroups per dimension, per `dispatchKind`. */
  readonly grid: Dims;
  /** Threads per threadgroup. */
  readonly threadgroup: Dims;
  /** Threadgroup memory in bytes. */
  readonly threadgroupMemory?: number | undefined;
  /** How to read `grid`. */
  readonly dispatchKind?: DispatchKind | undefined;
  /** The node's op kind. */
  readonly opKind?: CapturedOpKind | undefined;
}

/**
 * Where a graph is encoded (a CommandEncoder fits, with `P` its Pipeline). The graph only issues
 * dispatches and barriers: whoever owns the command buffers commits them.
 */
export interface EncodeTarget<P extends PipelineRef = PipelineRef> {
  /** Encodes one dispatch. */
  dispatch(d: GraphDispatch<P>): void;
  /** Issues a barrier. */
  memoryBarrier(): void;
  /** Resolves a pipeline reference on the target's device. */
  resolvePipeline(ref: PipelineRef): P;
  /** Throws what `dispatch` would throw for `d`, encoding nothing (optional). */
  checkDispatch?: ((d: GraphDispatch<P>) => void) | undefined;
}

/**
 * An encode target whose command buffer its owner also commits (a CommandEncoder): what an
 * executor hands around. The graph never calls `commit`.
 */
// deno-lint-ignore no-explicit-any -- the default keeps targets whose `dispatch` takes a Pipeline assignable
export interface GraphEncodeTarget<P extends PipelineRef = any> extends EncodeTarget<P> {
  /** Commits the target's command buffer without waiting. */
  commit(label?: string): void;
}

/** Something that resolves kernel names to pipelines (a KernelRegistry). */
export interface PipelineResolver {
  /** The pipeline of a kernel. */
  get(name: string): PipelineRef;
}

/** A run of a graph's nodes that goes into one command buffer. */
export interface GraphChunk {
  /** The nodes, in order. */
  readonly nodes: readonly CapturedNode[];
  /** Index (among the graph's dispatches) of the chunk's first dispatch, for messages. */
  readonly firstDispatch: number;
}

/**
 * The first max(64, n/10) dispatches go into the first command buffer (llama.cpp's split); the
 * split then moves forward to the next concurrent-group boundary (see
 * {@link ComputeGraph.dualBufferChunks}).
 */
export function dualBufferSplit(dispatches: number): number {
  return Math.max(64, Math.floor(dispatches / 10));
}

/**
 * Where the first command buffer of a dual-buffer encode ends (a node index): after `n0`
 * dispatches, moved forward to the first node that starts a new concurrent group under the barrier
 * placement of {@link encodeChunk}, so that the command-buffer boundary, which orders like a
 * barrier, never cuts a group in two. When no boundary comes within another `n0` dispatches (one
 * very wide group), the split stays after `n0` dispatches.
 */
export function dualBufferSplitIndex(nodes: readonly CapturedNode[], n0: number): number {
  const walker = new GroupWalker();
  let seen = 0, cut = nodes.length;
  for (let i = 0; i < nodes.length; i++) {
    const n = nodes[i]!;
    if (!isDispatch(n)) {
      walker.barrier();
      continue;
    }
    const first = walker.groupSize === 0;
    const startsGroup = walker.dispatch(n) || first;
    if (seen >= n0 && startsGroup) {
      // Barrier nodes just before the group go with it: at the head of a buffer they cost nothing.
      while (i > 0 && !isDispatch(nodes[i - 1]!)) i--;
      return i;
    }
    if (seen === n0) cut = i; // the plain split, if no boundary comes soon enough
    if (seen >= 2 * n0) return cut;
    seen++;
  }
  return cut;
}

function descriptorOf<P extends PipelineRef>(
  node: DispatchNode,
  target: EncodeTarget<P>,
  index: number,
): GraphDispatch<P> {
  if (!node.bindings || node.grid === undefined || node.threadgroup === undefined) {
    throw new MlxError(
      "InvalidArgument",
      `graph node ${index} (${node.pipeline.name}) has no bindings or geometry: a plain-data graph can be ` +
        `analysed and optimised offline, but only nodes with bindings, grid and threadgroup can be encoded`,
    );
  }
  return {
    pipeline: target.resolvePipeline(node.pipeline),
    bindings: node.bindings,
    grid: node.grid,
    threadgroup: node.threadgroup,
    threadgroupMemory: node.threadgroupMemory,
    dispatchKind: node.dispatchKind,
    opKind: node.opKind,
  };
}

/**
 * Encodes a chunk's nodes with a barrier wherever a dispatch conflicts with its concurrent group
 * (explicit barrier nodes are kept; none before the first dispatch). Returns the barriers issued.
 */
export function encodeChunk<P extends PipelineRef>(chunk: GraphChunk, target: EncodeTarget<P>): number {
  const walker = new GroupWalker();
  let barriers = 0, index = chunk.firstDispatch;
  for (const n of chunk.nodes) {
    if (!isDispatch(n)) {
      if (walker.barrier()) {
        target.memoryBarrier();
        barriers++;
      }
      continue;
    }
    if (walker.dispatch(n)) {
      target.memoryBarrier();
      barriers++;
    }
    target.dispatch(descriptorOf(n, target, index++));
  }
  return barriers;
}

/**
 * Throws what encoding the chunk into `target` would throw (a node without bindings or geometry, or
 * what `target.checkDispatch` rejects), encoding nothing: so a caller can check a later command
 * buffer before it commits an earlier one.
 */
export function checkChunk<P extends PipelineRef>(chunk: GraphChunk, target: EncodeTarget<P>): void {
  let index = chunk.firstDispatch;
  for (const n of chunk.nodes) {
    if (!isDispatch(n)) continue;
    const d = descriptorOf(n, target, index++);
    target.checkDispatch?.(d);
  }
}

/**
 * A recorded forward pass: plain-data nodes, so it can be built, inspected and optimised without a
 * device, then encoded into command encoders.
 *
 * @example
 * ```ts
 * import { ComputeGraph } from "@mlxn/mlx-native";
 * const g = new ComputeGraph([
 *   { kind: "dispatch", pipeline: { name: "a" }, opKind: "Other", reads: [], writes: [[1, 0, 64]] },
 *   { kind: "barrier" },
 *   { kind: "dispatch", pipeline: { name: "b" }, opKind: "Other", reads: [], writes: [[2, 0, 64]] },
 * ]);
 * g.reorder(); // the two writes are independent: one concurrent group, no barrier
 * console.log(g.barrierCount, g.dispatchCount); // 0 2
 * ```
 */
export class ComputeGraph {
  #nodes: CapturedNode[];

  /** A graph of `nodes` (copied). */
  constructor(nodes: readonly CapturedNode[] = []) {
    this.#nodes = [...nodes];
  }

  /** Appends a node. */
  record(node: CapturedNode): void {
    this.#nodes.push(node);
  }

  /** The nodes, in order. */
  get nodes(): readonly CapturedNode[] {
    return this.#nodes;
  }

  /** Number of nodes (dispatches and barriers). */
  get length(): number {
    return this.#nodes.length;
  }

  /** Number of dispatch nodes. */
  get dispatchCount(): number {
    return this.#nodes.reduce((n, x) => n + (isDispatch(x) ? 1 : 0), 0);
  }

  /** Number of barrier nodes. */
  get barrierCount(): number {
    return this.#nodes.length - this.dispatchCount;
  }

  /** Dispatches without any read/write annotation (the reorder pass cannot reason about them). */
  get unannotatedDispatchCount(): number {
    return this.#nodes.reduce((n, x) => n + (isDispatch(x) && !isAnnotated(x) ? 1 : 0), 0);
  }

  /**
   * Fuses RMSNorm → MUL (→ ADD) sequences into single dispatches (see src/graph/fuse.ts for the
   * exact conditions). With a registry, fused nodes get real pipelines. Returns the fusion count.
   */
  fuse(registry?: PipelineResolver): number {
    const r = fuseNodes(this.#nodes, registry ? (name) => registry.get(name) : undefined);
    this.#nodes = r.nodes;
    return r.fusions;
  }

  /**
   * Reorders dispatches to enlarge concurrent groups. `"lookahead"` (the default) is the seed's greedy
   * 64-node look-ahead with its exact permutation; `"levels"` places every dispatch in the earliest
   * concurrent group its hazards allow, so the barriers number the hazard DAG's depth − 1 (the
   * lower bound). Strips barriers: encode the result with {@link ComputeGraph.encodeWithBarriers}.
   * Returns how many nodes moved.
   * A dispatch with no read/write ranges is taken to have no memory effect and may move freely:
   * dispatches recorded through a session always carry their ranges (derived from the kernel
   * contracts), so only hand-built nodes can be unannotated — see `unannotatedDispatchCount`.
   */
  reorder(mode: ReorderMode = "lookahead"): number {
    if (mode !== "lookahead" && mode !== "levels") {
      throw new MlxError("InvalidArgument", `reorder mode must be "lookahead" or "levels", got ${String(mode)}`);
    }
    const r = mode === "levels" ? reorderLevels(this.#nodes) : reorderNodes(this.#nodes);
    this.#nodes = r.nodes;
    return r.reordered;
  }

  /** Encodes the nodes as recorded (barrier nodes become barriers). Returns the barriers issued. */
  encodeSequential<P extends PipelineRef>(target: EncodeTarget<P>): number {
    const walker = new GroupWalker({ recompute: false }); // the groups as placed
    let barriers = 0, index = 0;
    for (const n of this.#nodes) {
      if (isDispatch(n)) {
        walker.dispatch(n);
        target.dispatch(descriptorOf(n, target, index++));
      } else if (walker.barrier()) {
        target.memoryBarrier();
        barriers++;
      }
    }
    return barriers;
  }

  /** Encodes with barriers recomputed from memory ranges. Returns the barriers issued. */
  encodeWithBarriers<P extends PipelineRef>(target: EncodeTarget<P>): number {
    return encodeChunk({ nodes: this.#nodes, firstDispatch: 0 }, target);
  }

  /**
   * The graph as two command-buffer chunks: the first max(64, n/10) dispatches, up to the end of
   * their concurrent group ({@link dualBufferSplitIndex}), then the rest. Queue order makes the
   * split safe. The caller encodes each with {@link encodeChunk} (barriers recomputed inside it)
   * and commits the first before it encodes the second, so the GPU starts early; checking the
   * second first ({@link checkChunk}) keeps the pair all or nothing.
   */
  dualBufferChunks(): [GraphChunk, GraphChunk] {
    const split = dualBufferSplitIndex(this.#nodes, dualBufferSplit(this.dispatchCount));
    let seen = 0;
    for (let i = 0; i < split; i++) if (isDispatch(this.#nodes[i]!)) seen++;
    return [
      { nodes: this.#nodes.slice(0, split), firstDispatch: 0 },
      { nodes: this.#nodes.slice(split), firstDispatch: seen },
    ];
  }

  /**
   * Every hazard of the graph as it stands (barrier nodes as placed); `lookup` gives the slot
   * accesses of kernels whose nodes' pipelines carry none.
   */
  hazards(lookup?: KernelAccessLookup): Hazard[] {
    return findHazards(this.#nodes, lookup);
  }

  /** Barriers whose removal would create no hazard. */
  redundantBarriers(lookup?: KernelAccessLookup): number {
    return countRedundantBarriers(this.#nodes, lookup);
  }
}
