/**
 * The fusion pass: RMSNorm → barrier(s) → MUL that reads the norm's output becomes one
 * rms_norm_mul dispatch, and RMSNorm → MUL → ADD (the residual) one rms_norm_mul_add (longest match
 * wins). A fusion is applied only when it provably cannot change a result:
 *  - the kernels and dtypes match (rms_norm_<t>, elementwise_mul_<t>, elementwise_add_<t>);
 *  - each intermediate is exactly one operand of the next op, of the same length, and is never read
 *    again before it is completely overwritten (its value is not written by the fused kernel);
 *  - the output does not overlap an input, unless it is exactly an input the fused kernel reads and
 *    writes element by element (the norm input, the scale or the residual) — never the weight;
 * and the fused kernels round every intermediate through the storage dtype, so outputs are
 * bit-identical. Afterwards barriers are repaired wherever the fused dispatch now conflicts with
 * its concurrent group.
 *
 * @module
 */

import { placeBarriers } from "./barriers.ts";
import { type CapturedNode, type DispatchNode, isDispatch, type PipelineRef } from "./nodes.ts";
import { CapturedOpKind } from "./op_kind.ts";
import { type MemRange, rangeCovers, rangesOverlap, sameRange } from "./ranges.ts";

const NORM = /^rms_norm_(f32|f16|bf16)$/;

/** Result of the pass. */
export interface FuseResult {
  /** The new node list. */
  readonly nodes: CapturedNode[];
  /** Fusions applied. */
  readonly fusions: number;
}

/** Index of the next dispatch after `i`, requiring at least one barrier in between; -1 if none. */
function nextAfterBarrier(nodes: readonly CapturedNode[], i: number): number {
  let j = i + 1, barriers = 0;
  while (j < nodes.length && nodes[j]!.kind === "barrier") {
    barriers++;
    j++;
  }
  return barriers > 0 && j < nodes.length ? j : -1;
}

const len = (r: MemRange) => r[2] - r[1];

/** The operand of a binary op that is not `produced`, or null if `produced` is not exactly one of them. */
function otherOperand(op: DispatchNode, produced: MemRange): { other: MemRange; slot: number } | null {
  if (op.reads.length !== 2 || op.writes.length !== 1) return null;
  const a = op.reads[0]!, b = op.reads[1]!;
  const isA = sameRange(a, produced), isB = sameRange(b, produced);
  if (isA === isB) return null; // neither, or both (x·x: the intermediate would be the scale)
  if (len(op.writes[0]!) !== len(produced)) return null;
  const other = isA ? b : a;
  if (len(other) !== len(produced)) return null;
  return { other, slot: isA ? 1 : 0 };
}

/** The dispatches touching each allocation, in node order: a single-use check walks only these. */
class UseIndex {
  readonly #nodes: readonly CapturedNode[];
  #byAlloc: Map<number, number[]> | null = null;

  constructor(nodes: readonly CapturedNode[]) {
    this.#nodes = nodes;
  }

  /** Indices of the dispatches that read or write allocation `alloc`, ascending (built on first use). */
  of(alloc: number): readonly number[] {
    if (this.#byAlloc === null) {
      const m = new Map<number, number[]>();
      const add = (alloc: number, i: number) => {
        const list = m.get(alloc);
        if (list === undefined) m.set(alloc, [i]);
        else if (list[list.length - 1] !== i) list.push(i);
      };
      this.#nodes.forEach((n, i) => {
        if (!isDispatch(n)) return;
        for (const r of n.reads) add(r[0], i);
        for (const w of n.writes) add(w[0], i);
      });
      this.#byAlloc = m;
    }
    return this.#byAlloc.get(alloc) ?? [];
  }
}

/**
 * Whether the value written to `range` by node `producer` is read only by node `consumer`: scanning
 * forward from the consumer, no node reads an overlapping byte before a node overwrites all of it.
 * Only the dispatches that touch the range's allocation are visited, so the pass stays near-linear.
 */
function singleUse(nodes: readonly CapturedNode[], uses: UseIndex, consumer: number, range: MemRange): boolean {
  const list = uses.of(range[0]);
  let lo = 0, hi = list.length; // first entry after the consumer
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (list[mid]! <= consumer) lo = mid + 1;
    else hi = mid;
  }
  for (let k = lo; k < list.length; k++) {
    const n = nodes[list[k]!] as DispatchNode;
    if (n.reads.some((r) => rangesOverlap(r, range))) return false;
    if (n.writes.some((w) => rangeCovers(w, range))) return true;
  }
  return true;
}

/** The output may overlap an input only by being exactly an element-wise one. */
function outputAllowed(out: MemRange, elementwise: readonly MemRange[], shared: readonly MemRange[]): boolean {
  if (shared.some((r) => rangesOverlap(r, out))) return false;
  return elementwise.every((r) => !rangesOverlap(r, out) || sameRange(r, out));
}

function fusedPipeline(name: string, resolve?: (name: string) => PipelineRef): PipelineRef {
  return resolve ? resolve(name) : { name };
}

/** Runs the pass. `resolve` maps a fused kernel name to a pipeline (e.g. registry.get). */
export function fuseNodes(nodes: readonly CapturedNode[], resolve?: (name: string) => PipelineRef): FuseResult {
  const out: CapturedNode[] = [];
  const uses = new UseIndex(nodes);
  let fusions = 0;
  let i = 0;
  while (i < nodes.length) {
    const norm = nodes[i]!;
    const m = isDispatch(norm) && norm.opKind === CapturedOpKind.RmsNorm ? NORM.exec(norm.pipeline.name) : null;
    const fused = m ? tryFuse(nodes, uses, i, m[1]!, resolve) : null;
    if (!fused) {
      out.push(norm);
      i++;
      continue;
    }
    out.push(fused.node);
    fusions++;
    i = fused.next;
  }
  // A fused dispatch reads the norm's inputs later and writes the result earlier than the pair
  // did: put a barrier wherever that now conflicts with a neighbour in its concurrent group.
  return { nodes: fusions > 0 ? placeBarriers(out, true) : out, fusions };
}

function tryFuse(
  nodes: readonly CapturedNode[],
  uses: UseIndex,
  i: number,
  dtype: string,
  resolve?: (name: string) => PipelineRef,
): { node: DispatchNode; next: number } | null {
  const norm = nodes[i] as DispatchNode;
  if (norm.reads.length !== 2 || norm.writes.length !== 1) return null;
  const input = norm.reads[0]!, weight = norm.reads[1]!;
  const normOut = norm.writes[0]!;
  const j = nextAfterBarrier(nodes, i);
  if (j < 0) return null;
  const mul = nodes[j]!;
  if (!isDispatch(mul) || mul.opKind !== CapturedOpKind.ElemMul || mul.pipeline.name !== `elementwise_mul_${dtype}`) {
    return null;
  }
  const mulArgs = otherOperand(mul, normOut);
  if (!mulArgs) return null;
  const scale = mulArgs.other, mulOut = mul.writes[0]!;
  const normOutDead = sameRange(mulOut, normOut) || singleUse(nodes, uses, j, normOut);
  if (!normOutDead || (rangesOverlap(mulOut, normOut) && !sameRange(mulOut, normOut))) return null;

  // Longest match first: … → barrier(s) → ADD(mulOut, residual).
  const k = nextAfterBarrier(nodes, j);
  const add = k >= 0 ? nodes[k] : undefined;
  if (
    add && isDispatch(add) && add.opKind === CapturedOpKind.ElemAdd && add.pipeline.name === `elementwise_add_${dtype}`
  ) {
    const addArgs = otherOperand(add, mulOut);
    const result = add.writes[0]!;
    if (
      addArgs && (sameRange(result, mulOut) || singleUse(nodes, uses, k, mulOut)) &&
      (!rangesOverlap(result, mulOut) || sameRange(result, mulOut)) &&
      (!rangesOverlap(result, normOut) || sameRange(result, normOut)) &&
      outputAllowed(result, [input, scale, addArgs.other], [weight])
    ) {
      const residual = addArgs.other;
      const b = norm.bindings && mul.bindings && add.bindings
        ? [
          norm.bindings[0],
          norm.bindings[1],
          mul.bindings[mulArgs.slot],
          add.bindings[addArgs.slot],
          add.bindings[2],
          norm.bindings[3],
        ]
        : undefined;
      return {
        node: fusedNode(norm, `rms_norm_mul_add_${dtype}`, resolve, b, [input, weight, scale, residual], result),
        next: k + 1,
      };
    }
  }
  if (!outputAllowed(mulOut, [input, scale], [weight])) return null;
  const b = norm.bindings && mul.bindings
    ? [norm.bindings[0], norm.bindings[1], mul.bindings[mulArgs.slot], mul.bindings[2], norm.bindings[3]]
    : undefined;
  return { node: fusedNode(norm, `rms_norm_mul_${dtype}`, resolve, b, [input, weight, scale], mulOut), next: j + 1 };
}

function fusedNode(
  norm: DispatchNode,
  name: string,
  resolve: ((name: string) => PipelineRef) | undefined,
  bindings: DispatchNode["bindings"],
  reads: MemRange[],
  write: MemRange,
): DispatchNode {
  return {
    kind: "dispatch",
    pipeline: fusedPipeline(name, resolve),
    bindings,
    grid: norm.grid,
    threadgroup: norm.threadgroup,
    threadgroupMemory: norm.threadgroupMemory,
    dispatchKind: norm.dispatchKind,
    opKind: CapturedOpKind.RmsNormMul,
    reads,
    writes: [write],
  };
}
