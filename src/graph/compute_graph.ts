/**
 * ComputeGraph: a recorded sequence of dispatches and barriers, its passes (fuse, reorder) and its
 * encodings (as recorded, with barriers recomputed from memory ranges, or split over two command
 * buffers so the GPU starts while the CPU still encodes).
 *
 * @module
 */

import type { DispatchDescriptor } from "../encoder.ts";
import { MlxError } from "../errors.ts";
import type { Pipeline } from "../kernels.ts";
import { fuseNodes } from "./fuse.ts";
import { type CapturedNode, type DispatchNode, isAnnotated, isDispatch, type PipelineRef } from "./nodes.ts";
import { reorderLevels, reorderNodes } from "./reorder.ts";

/** The reorder schedules: the seed's 64-node look-ahead, or dependency levels (barriers = DAG depth − 1). */
export type ReorderMode = "lookahead" | "levels";
import { ConflictTracker } from "./tracker.ts";
import { countRedundantBarriers, findHazards, type Hazard } from "./validate.ts";

/** Where a graph is encoded: a CommandEncoder. */
export interface GraphEncodeTarget {
  /** Encodes one dispatch. */
  dispatch(d: DispatchDescriptor): void;
  /** Issues a barrier. */
  memoryBarrier(): void;
  /** Commits without waiting. */
  commit(label?: string): void;
  /** Resolves a pipeline reference on the target's device. */
  resolvePipeline(ref: PipelineRef): Pipeline;
  /** Throws what `dispatch` would throw for `d`, encoding nothing (optional). */
  checkDispatch?(d: DispatchDescriptor): void;
}

/** Something that resolves kernel names to pipelines (a KernelRegistry). */
export interface PipelineResolver {
  /** The pipeline of a kernel. */
  get(name: string): Pipeline;
}

/**
 * The first max(64, n/10) dispatches go into the first command buffer (llama.cpp's split); the
 * split then moves forward to the next concurrent-group boundary (see
 * {@link ComputeGraph.encodeDualBuffer}).
 */
export function dualBufferSplit(dispatches: number): number {
  return Math.max(64, Math.floor(dispatches / 10));
}

/**
 * Where the first command buffer of a dual-buffer encode ends (a node index): after `n0`
 * dispatches, moved forward to the first node that starts a new concurrent group under the barrier
 * placement of {@link encodeChunkWithBarriers}, so that the command-buffer boundary, which orders
 * like a barrier, never cuts a group in two. When no boundary comes within another `n0` dispatches
 * (one very wide group), the split stays after `n0` dispatches.
 */
export function dualBufferSplitIndex(nodes: readonly CapturedNode[], n0: number): number {
  const tracker = new ConflictTracker();
  let seen = 0, inGroup = 0, cut = nodes.length;
  for (let i = 0; i < nodes.length; i++) {
    const n = nodes[i];
    if (!isDispatch(n)) {
      tracker.reset();
      inGroup = 0;
      continue;
    }
    const startsGroup = inGroup === 0 || (isAnnotated(n) && tracker.conflicts(n.reads, n.writes));
    if (seen >= n0 && startsGroup) {
      // Barrier nodes just before the group go with it: at the head of a buffer they cost nothing.
      while (i > 0 && !isDispatch(nodes[i - 1])) i--;
      return i;
    }
    if (seen === n0) cut = i; // the plain split, if no boundary comes soon enough
    if (seen >= 2 * n0) return cut;
    if (startsGroup && inGroup > 0) {
      tracker.reset();
      inGroup = 0;
    }
    tracker.add(n.reads, n.writes);
    inGroup++;
    seen++;
  }
  return cut;
}

function descriptorOf(node: DispatchNode, target: GraphEncodeTarget, index: number): DispatchDescriptor {
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

/** Encodes nodes with barriers where ranges conflict (explicit barrier nodes are kept). */
function encodeChunkWithBarriers(nodes: readonly CapturedNode[], target: GraphEncodeTarget, first: number): number {
  const tracker = new ConflictTracker();
  let barriers = 0, inGroup = 0, index = first;
  for (const n of nodes) {
    if (!isDispatch(n)) {
      if (inGroup > 0) {
        target.memoryBarrier();
        barriers++;
      }
      tracker.reset();
      inGroup = 0;
      continue;
    }
    if (isAnnotated(n) && inGroup > 0 && tracker.conflicts(n.reads, n.writes)) {
      target.memoryBarrier();
      barriers++;
      tracker.reset();
      inGroup = 0;
    }
    tracker.add(n.reads, n.writes);
    target.dispatch(descriptorOf(n, target, index++));
    inGroup++;
  }
  return barriers;
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
  encodeSequential(target: GraphEncodeTarget): number {
    let barriers = 0, index = 0, inGroup = 0;
    for (const n of this.#nodes) {
      if (isDispatch(n)) {
        target.dispatch(descriptorOf(n, target, index++));
        inGroup++;
      } else if (inGroup > 0) {
        target.memoryBarrier();
        barriers++;
        inGroup = 0;
      }
    }
    return barriers;
  }

  /** Encodes with barriers recomputed from memory ranges. Returns the barriers issued. */
  encodeWithBarriers(target: GraphEncodeTarget): number {
    return encodeChunkWithBarriers(this.#nodes, target, 0);
  }

  /**
   * Encodes the first max(64, n/10) dispatches, up to the end of their concurrent group
   * ({@link dualBufferSplitIndex}), into `first` and commits it, then the rest into `second`
   * (not committed: the caller commits it). Queue order makes the split safe; barriers are
   * recomputed inside each chunk. All or nothing: every dispatch of the second chunk is checked
   * (`second.checkDispatch`) before `first` is committed, so a bad node runs nothing. Returns the
   * barriers of each command buffer.
   */
  encodeDualBuffer(first: GraphEncodeTarget, second: GraphEncodeTarget): [number, number] {
    const split = dualBufferSplitIndex(this.#nodes, dualBufferSplit(this.dispatchCount));
    let seen = 0;
    for (let i = 0; i < split; i++) if (isDispatch(this.#nodes[i])) seen++;
    const b0 = encodeChunkWithBarriers(this.#nodes.slice(0, split), first, 0);
    if (second.checkDispatch) {
      for (let i = split, index = seen; i < this.#nodes.length; i++) {
        const n = this.#nodes[i];
        if (isDispatch(n)) second.checkDispatch(descriptorOf(n, second, index++));
      }
    }
    first.commit();
    const b1 = encodeChunkWithBarriers(this.#nodes.slice(split), second, seen);
    return [b0, b1];
  }

  /** Every hazard of the graph as it stands (barrier nodes as placed). */
  hazards(): Hazard[] {
    return findHazards(this.#nodes);
  }

  /** Barriers whose removal would create no hazard. */
  redundantBarriers(): number {
    return countRedundantBarriers(this.#nodes);
  }
}
