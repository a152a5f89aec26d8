/**
 * Graph analysis: the dependency depth of a sequence of dispatches — the longest chain of
 * RAW/WAR/WAW dependencies. Any schedule in one command buffer needs at least depth − 1 barriers,
 * so it is the lower bound to compare barrier counts with.
 *
 * @module
 */

import { type CapturedNode, type DispatchNode, isDispatch } from "./nodes.ts";
import { rangesOverlap } from "./ranges.ts";

/** Whether `b` (later) depends on `a` (earlier): RAW, WAR or WAW on overlapping bytes. */
export function dependsOn(a: DispatchNode, b: DispatchNode): boolean {
  for (const r of b.reads) for (const w of a.writes) if (rangesOverlap(r, w)) return true;
  for (const w of b.writes) {
    for (const r of a.reads) if (rangesOverlap(w, r)) return true;
    for (const w2 of a.writes) if (rangesOverlap(w, w2)) return true;
  }
  return false;
}

/** Length of the longest dependency chain among the dispatches (barriers ignored). */
export function dependencyDepth(nodes: readonly CapturedNode[]): number {
  const ds = nodes.filter(isDispatch);
  const depth = new Array<number>(ds.length).fill(1);
  let max = ds.length > 0 ? 1 : 0;
  for (let j = 0; j < ds.length; j++) {
    for (let i = 0; i < j; i++) {
      if (depth[i] + 1 > depth[j] && dependsOn(ds[i], ds[j])) depth[j] = depth[i] + 1;
    }
    max = Math.max(max, depth[j]);
  }
  return max;
}

/** The fewest barriers any valid single-command-buffer schedule of these dispatches can use. */
export function barrierLowerBound(nodes: readonly CapturedNode[]): number {
  return Math.max(0, dependencyDepth(nodes) - 1);
}
