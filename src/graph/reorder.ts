/**
 * The reorder passes. Both strip barriers; barriers are recomputed from ranges when the result is
 * encoded.
 *
 * The look-ahead (llama.cpp's ggml_metal_graph_optimize_reorder, as in the seed): each node either
 * joins the current concurrent group or, when it conflicts, first pulls up to 64 later nodes into
 * the group — a candidate must be clear of the group and of every node skipped so far,
 * non-reorderable ops end the look-ahead, and nodes with no memory effect always join.
 *
 * Levels: every dispatch goes to the earliest concurrent group its dependencies allow (its
 * dependency level), so the groups number exactly the dependency depth — the fewest any schedule
 * can have. A non-reorderable op keeps its place relative to every other dispatch, as in the
 * look-ahead: it lands no earlier than anything before it, and nothing after it lands earlier.
 *
 * @module
 */

import { dependencyLevels } from "./analysis.ts";
import { type CapturedNode, type DispatchNode, isAnnotated, isDispatch } from "./nodes.ts";
import { isReorderable } from "./op_kind.ts";
import { ConflictTracker } from "./tracker.ts";

/** How far ahead a conflicting node looks for independent work. */
export const REORDER_LOOKAHEAD = 64;

/** Result of the pass. */
export interface ReorderResult {
  /** Dispatch nodes in their new order (no barriers). */
  readonly nodes: DispatchNode[];
  /** How many nodes ended at a different position. */
  readonly reordered: number;
}

/** Runs the look-ahead pass. */
export function reorderNodes(input: readonly CapturedNode[]): ReorderResult {
  const nodes = input.filter(isDispatch);
  const n = nodes.length;
  const order: number[] = [];
  const used = new Uint8Array(n);
  const group = new ConflictTracker(); // the current concurrent group
  const skipped = new ConflictTracker(); // nodes passed over during one look-ahead
  for (let i0 = 0; i0 < n; i0++) {
    if (used[i0]) continue;
    const node0 = nodes[i0]!;
    if (isAnnotated(node0) && group.conflicts(node0.reads, node0.writes)) {
      skipped.reset();
      skipped.add(node0.reads, node0.writes);
      const end = Math.min(n, i0 + REORDER_LOOKAHEAD);
      for (let i1 = i0 + 1; i1 < end; i1++) {
        if (used[i1]) continue;
        const node1 = nodes[i1]!;
        if (!isReorderable(node1.opKind)) break;
        const free = !isAnnotated(node1) || !group.conflicts(node1.reads, node1.writes);
        if (free && !skipped.conflicts(node1.reads, node1.writes)) {
          group.add(node1.reads, node1.writes);
          order.push(i1);
          used[i1] = 1;
        } else {
          skipped.add(node1.reads, node1.writes);
        }
      }
      group.reset();
    }
    group.add(node0.reads, node0.writes);
    order.push(i0);
    used[i0] = 1;
  }
  let reordered = 0;
  for (let p = 0; p < order.length; p++) if (order[p] !== p) reordered++;
  return { nodes: order.map((i) => nodes[i]!), reordered };
}

/**
 * Runs the levels pass: dispatches sorted by dependency level, in recorded order within a level.
 * Same-level dispatches never conflict, so barriers placed from ranges number depth − 1. O(n log n).
 */
export function reorderLevels(input: readonly CapturedNode[]): ReorderResult {
  const nodes = input.filter(isDispatch);
  // A non-reorderable op sits at the highest level so far, and every later dispatch at its level
  // or above; in recorded order within a level, so it keeps its place relative to every dispatch.
  const levels = dependencyLevels(nodes, (i) => !isReorderable(nodes[i]!.opKind));
  const order = Array.from(nodes.keys());
  order.sort((a, b) => levels[a]! - levels[b]! || a - b);
  let reordered = 0;
  for (let p = 0; p < order.length; p++) if (order[p] !== p) reordered++;
  return { nodes: order.map((i) => nodes[i]!), reordered };
}
