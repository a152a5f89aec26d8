/**
 * The capture recorder of a command encoder: in capture mode, dispatches and barriers become graph
 * nodes instead of stream records. A node's accesses are derived from its bindings through the
 * kernel contract, merged with any ranges the user added; its inline constants and geometry are
 * copied, so later edits of the caller's arrays do not change what the graph runs.
 *
 * @module
 */

import type { Binding, DispatchDescriptor } from "./encoder.ts";
import { BARRIER, type CapturedNode, type DispatchNode } from "./graph/nodes.ts";
import type { CapturedOpKind } from "./graph/op_kind.ts";
import { type Accesses, accessesOf, type MemRange, rangeCovers } from "./graph/ranges.ts";

/**
 * Marks a captured node whose accesses include ranges the user gave (barrierBetween, trackDispatch,
 * setPendingRanges, annotateLastDispatchIfMissing). Any other captured node's accesses are exactly
 * those its pipeline's contract derives from its bindings, so a topology key need not repeat them.
 */
export const USER_RANGES: unique symbol = Symbol("mlxn.userRanges");

/** A captured dispatch node, possibly marked {@link USER_RANGES}. */
export type MarkedNode = DispatchNode & { readonly [USER_RANGES]?: true };

/** A binding as it stands now: inline constants are copied, buffers kept. */
function snapshotBinding(b: Binding): Binding {
  if (Array.isArray(b)) return b.slice();
  if (b instanceof Uint32Array || b instanceof Uint8Array) return b.slice();
  return b;
}

/**
 * The contract-derived accesses plus any user range they do not already cover: user annotations can
 * widen what a dispatch is known to touch, never hide what its bindings touch.
 */
export function mergeAccesses(derived: Accesses, extra: Accesses): Accesses {
  const add = (base: readonly MemRange[], more: readonly MemRange[]): readonly MemRange[] => {
    const missing = more.filter((r) => !base.some((b) => rangeCovers(b, r)));
    return missing.length === 0 ? base : [...base, ...missing];
  };
  return { reads: add(derived.reads, extra.reads), writes: add(derived.writes, extra.writes) };
}

/**
 * The graph node of a dispatch: a snapshot of its bindings and geometry, its accesses (`derived`
 * when already computed, merged with `extra`), and its op kind (`opKind` overrides).
 */
export function dispatchNode(
  d: DispatchDescriptor,
  derived: Accesses | undefined,
  extra: Accesses | undefined,
  opKind: CapturedOpKind | undefined,
): MarkedNode {
  const base = derived ?? accessesOf(d.pipeline.contract, d.bindings);
  const acc = extra ? mergeAccesses(base, extra) : base;
  const node: MarkedNode = {
    kind: "dispatch",
    pipeline: d.pipeline,
    bindings: d.bindings.map(snapshotBinding),
    grid: typeof d.grid === "number" ? d.grid : d.grid.slice(),
    threadgroup: typeof d.threadgroup === "number" ? d.threadgroup : d.threadgroup.slice(),
    threadgroupMemory: d.threadgroupMemory,
    dispatchKind: d.dispatchKind ?? "threadgroups",
    opKind: opKind ?? d.opKind ?? d.pipeline.contract.opKind,
    reads: acc.reads,
    writes: acc.writes,
  };
  return extra ? { ...node, [USER_RANGES]: true } as MarkedNode : node;
}

/** Records dispatches and barriers as graph nodes, with annotations for the next dispatch. */
export class CaptureRecorder {
  #nodes: CapturedNode[] = [];
  #pendingOpKind: CapturedOpKind | undefined;
  #pendingRanges: Accesses | undefined;

  /** Nodes recorded so far. */
  get length(): number {
    return this.#nodes.length;
  }

  /** Records a dispatch (its accesses `derived` if already computed), consuming the annotations. */
  dispatch(d: DispatchDescriptor, derived?: Accesses): void {
    this.#nodes.push(dispatchNode(d, derived, this.#pendingRanges, this.#pendingOpKind));
    this.#pendingOpKind = undefined;
    this.#pendingRanges = undefined;
  }

  /** Records a barrier (none before the first node). */
  barrier(): void {
    if (this.#nodes.length > 0) this.#nodes.push(BARRIER);
  }

  /** The recorded nodes, without a trailing barrier; the recorder is empty afterwards. */
  take(): CapturedNode[] {
    const nodes = this.#nodes;
    this.#nodes = [];
    this.#pendingOpKind = undefined;
    this.#pendingRanges = undefined;
    if (nodes.length > 0 && nodes[nodes.length - 1].kind === "barrier") nodes.pop();
    return nodes;
  }

  /** Sets the op kind of the next dispatch. */
  setOpKind(kind: CapturedOpKind): void {
    this.#pendingOpKind = kind;
  }

  /** Adds ranges to the next dispatch's accesses. */
  addPendingRanges(extra: Accesses): void {
    const p = this.#pendingRanges;
    this.#pendingRanges = p ? mergeAccesses(p, extra) : { reads: [...extra.reads], writes: [...extra.writes] };
  }

  /** Merges ranges into the last recorded dispatch's accesses. */
  mergeIntoLastDispatch(extra: Accesses): void {
    const nodes = this.#nodes;
    for (let i = nodes.length - 1; i >= 0; i--) {
      const n = nodes[i];
      if (n.kind !== "dispatch") continue;
      nodes[i] = { ...n, ...mergeAccesses(n, extra), [USER_RANGES]: true } as MarkedNode;
      return;
    }
  }

  /** Gives the last recorded dispatch these ranges if it has none. */
  annotateLastDispatchIfMissing(reads: readonly MemRange[], writes: readonly MemRange[]): void {
    const nodes = this.#nodes;
    for (let i = nodes.length - 1; i >= 0; i--) {
      const n = nodes[i];
      if (n.kind !== "dispatch") continue;
      if (n.reads.length === 0 && n.writes.length === 0) {
        nodes[i] = { ...n, reads: [...reads], writes: [...writes], [USER_RANGES]: true } as MarkedNode;
      }
      return;
    }
  }
}
