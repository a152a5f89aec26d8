/**
 * Quadratic reference definitions of the graph analyses, written from the rules alone (every pair
 * of dispatches compared), to check the O(n log n) passes against.
 */
import type { CapturedNode, DispatchNode } from "../mod.ts";
import type { MemRange } from "../src/graph/ranges.ts";

/** Shares at least one byte: same allocation, strict overlap, neither range empty. */
export function overlaps(x: MemRange, y: MemRange): boolean {
  return x[0] === y[0] && x[1] < y[2] && y[1] < x[2] && x[1] < x[2] && y[1] < y[2];
}

/** Whether `b` (later) must stay after `a` (earlier): RAW, WAR or WAW. */
export function dependent(a: DispatchNode, b: DispatchNode): boolean {
  return b.reads.some((r) => a.writes.some((w) => overlaps(r, w))) ||
    b.writes.some((w) => a.reads.some((r) => overlaps(w, r)) || a.writes.some((x) => overlaps(w, x)));
}

/**
 * The longest chain of dependencies. A `pinned` dispatch (one nothing may cross) shares the group
 * of the latest dispatch before it at best, and bounds every later one from below the same way.
 */
export function referenceDepth(ds: readonly DispatchNode[], pinned: (d: DispatchNode) => boolean = () => false) {
  const level: number[] = [];
  for (let j = 0; j < ds.length; j++) {
    level[j] = 1;
    for (let i = 0; i < j; i++) {
      if (dependent(ds[i]!, ds[j]!)) level[j] = Math.max(level[j]!, level[i]! + 1);
      if (pinned(ds[j]!) || pinned(ds[i]!)) level[j] = Math.max(level[j]!, level[i]!);
    }
  }
  return Math.max(0, ...level);
}

/** One hazard as the seed's validator listed them: by later dispatch, earlier, then range pairs. */
export function referenceHazards(nodes: readonly CapturedNode[]) {
  const out: { kind: string; first: number; second: number; range: MemRange }[] = [];
  const cut = (x: MemRange, y: MemRange): MemRange => [x[0], Math.max(x[1], y[1]), Math.min(x[2], y[2])];
  const groups: { d: DispatchNode; index: number }[][] = [[]];
  let index = 0;
  for (const n of nodes) {
    if (n.kind === "barrier") groups.push([]);
    else groups[groups.length - 1]!.push({ d: n, index: index++ });
  }
  for (const g of groups) {
    for (let j = 1; j < g.length; j++) {
      for (let i = 0; i < j; i++) {
        const a = g[i]!.d, b = g[j]!.d, first = g[i]!.index, second = g[j]!.index;
        for (const r of b.reads) {
          for (const w of a.writes) if (overlaps(r, w)) out.push({ kind: "RAW", first, second, range: cut(r, w) });
        }
        for (const w of b.writes) {
          for (const r of a.reads) if (overlaps(w, r)) out.push({ kind: "WAR", first, second, range: cut(w, r) });
          for (const x of a.writes) if (overlaps(w, x)) out.push({ kind: "WAW", first, second, range: cut(w, x) });
        }
      }
    }
  }
  return out;
}

/** Barriers removable without a hazard: duplicates, trailing ones, and ones between independent groups. */
export function referenceRedundantBarriers(nodes: readonly CapturedNode[]): number {
  let redundant = 0, pending = 0, seen = false;
  const groups: DispatchNode[][] = [[]];
  for (const n of nodes) {
    if (n.kind === "barrier") {
      if (seen) pending++;
      if (groups[groups.length - 1]!.length > 0) groups.push([]);
      continue;
    }
    if (seen) redundant += Math.max(0, pending - 1);
    seen = true;
    pending = 0;
    groups[groups.length - 1]!.push(n);
  }
  redundant += pending;
  const full = groups.filter((g) => g.length > 0);
  for (let g = 1; g < full.length; g++) {
    if (full[g]!.every((b) => full[g - 1]!.every((a) => !dependent(a, b)))) redundant++;
  }
  return redundant;
}

/** The seed's 64-node look-ahead reorder, over pairwise checks: the permutation it produces. */
export function referenceLookahead(nodes: readonly CapturedNode[]): DispatchNode[] {
  const ds = nodes.filter((n): n is DispatchNode => n.kind === "dispatch");
  const annotated = (d: DispatchNode) => d.reads.length > 0 || d.writes.length > 0;
  const movable = (d: DispatchNode) => d.opKind !== "Sdpa" && d.opKind !== "Softmax";
  const out: DispatchNode[] = [], used = new Set<number>();
  let group: DispatchNode[] = [];
  for (let i0 = 0; i0 < ds.length; i0++) {
    if (used.has(i0)) continue;
    const node0 = ds[i0]!;
    if (annotated(node0) && group.some((g) => dependent(g, node0))) {
      const skipped = [node0];
      for (let i1 = i0 + 1; i1 < Math.min(ds.length, i0 + 64); i1++) {
        if (used.has(i1)) continue;
        const node1 = ds[i1]!;
        if (!movable(node1)) break;
        const free = !annotated(node1) || !group.some((g) => dependent(g, node1));
        if (free && !skipped.some((s) => dependent(s, node1))) {
          group.push(node1);
          out.push(node1);
          used.add(i1);
        } else skipped.push(node1);
      }
      group = [];
    }
    group.push(node0);
    out.push(node0);
    used.add(i0);
  }
  return out;
}
