/**
 * Barrier placement from memory ranges: where a dispatch conflicts with its concurrent group, a
 * barrier goes before it. Used at encode time (encodeWithBarriers) and to repair explicit-barrier
 * graphs after a pass changed their dispatches.
 *
 * @module
 */

import { BARRIER, type CapturedNode } from "./nodes.ts";
import { GroupWalker } from "./tracker.ts";

/**
 * Returns the nodes with a barrier inserted before every dispatch that conflicts with its concurrent
 * group. Existing barriers are kept (`keepExplicit`) or dropped; consecutive barriers collapse.
 * O(n log n) at worst in the ranges (see ConflictTracker).
 */
export function placeBarriers(nodes: readonly CapturedNode[], keepExplicit: boolean): CapturedNode[] {
  const out: CapturedNode[] = [];
  const walker = new GroupWalker();
  for (const n of nodes) {
    if (n.kind === "barrier") {
      if (keepExplicit && walker.barrier()) out.push(BARRIER);
      continue;
    }
    if (walker.dispatch(n)) out.push(BARRIER);
    out.push(n);
  }
  return out;
}
