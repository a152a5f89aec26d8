/**
 * Barrier placement from memory ranges: where a dispatch conflicts with its concurrent group, a
 * barrier goes before it. Used at encode time (encodeWithBarriers) and to repair explicit-barrier
 * graphs after a pass changed their dispatches.
 *
 * @module
 */

import { BARRIER, type CapturedNode } from "./nodes.ts";
import { ConflictTracker } from "./tracker.ts";

/**
 * Returns the nodes with a barrier inserted before every dispatch that conflicts with its concurrent
 * group. Existing barriers are kept (`keepExplicit`) or dropped; consecutive barriers collapse.
 */
export function placeBarriers(nodes: readonly CapturedNode[], keepExplicit: boolean): CapturedNode[] {
  const out: CapturedNode[] = [];
  const tracker = new ConflictTracker();
  let groupSize = 0;
  const barrier = () => {
    if (groupSize > 0) out.push(BARRIER);
    tracker.reset();
    groupSize = 0;
  };
  for (const n of nodes) {
    if (n.kind === "barrier") {
      if (keepExplicit) barrier();
      continue;
    }
    if (groupSize > 0 && tracker.conflicts(n.reads, n.writes)) barrier();
    tracker.add(n.reads, n.writes);
    out.push(n);
    groupSize++;
  }
  return out;
}
