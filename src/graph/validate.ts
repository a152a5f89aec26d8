/**
 * The hazard validator: for every concurrent group of an encoded sequence, checks the TRUE accesses
 * of each pair of dispatches (from their bindings and the kernels' declared access modes, not from
 * annotations) and reports every missing barrier with both dispatches, the allocation and the
 * overlapping bytes. It can also count redundant barriers (ones whose removal creates no hazard).
 *
 * @module
 */

import { contractOf, type KernelContract } from "../kernels.ts";
import { type CapturedNode, type DispatchNode, isDispatch } from "./nodes.ts";
import { type Accesses, accessesOf, formatRange, type MemRange, rangesOverlap } from "./ranges.ts";

/** A dispatch, identified for a report. */
export interface DispatchRef {
  /** Index among the dispatches of the sequence. */
  readonly index: number;
  /** Kernel name. */
  readonly kernel: string;
}

/** Two dispatches of one concurrent group that touch the same bytes, one of them writing. */
export interface Hazard {
  /** RAW, WAR or WAW, from the later dispatch's point of view. */
  readonly kind: "RAW" | "WAR" | "WAW";
  /** The earlier dispatch. */
  readonly first: DispatchRef;
  /** The later dispatch. */
  readonly second: DispatchRef;
  /** The overlapping bytes. */
  readonly range: MemRange;
}

/** The contract of a dispatch node's kernel, when the node carries bindings to read through it. */
function boundContract(n: DispatchNode): KernelContract | undefined {
  if (!n.bindings) return undefined;
  return (n.pipeline as { contract?: KernelContract }).contract ?? contractOf(n.pipeline.name);
}

/** The true accesses of a dispatch node: from its bindings when it has them, else its annotation. */
export function trueAccesses(n: DispatchNode): Accesses {
  const contract = boundContract(n);
  return contract ? accessesOf(contract, n.bindings!) : n;
}

function intersect(a: MemRange, b: MemRange): MemRange {
  return [a[0], Math.max(a[1], b[1]), Math.min(a[2], b[2])];
}

/** Every conflict between `a` (earlier) and `b` (later). */
function conflictsBetween(a: Accesses, b: Accesses): { kind: Hazard["kind"]; range: MemRange }[] {
  const found: { kind: Hazard["kind"]; range: MemRange }[] = [];
  for (const r of b.reads) {
    for (const w of a.writes) if (rangesOverlap(r, w)) found.push({ kind: "RAW", range: intersect(r, w) });
  }
  for (const w of b.writes) {
    for (const r of a.reads) if (rangesOverlap(w, r)) found.push({ kind: "WAR", range: intersect(w, r) });
    for (const w2 of a.writes) if (rangesOverlap(w, w2)) found.push({ kind: "WAW", range: intersect(w, w2) });
  }
  return found;
}

interface Member {
  readonly ref: DispatchRef;
  readonly acc: Accesses;
}

function groupsOf(nodes: readonly CapturedNode[]): Member[][] {
  const groups: Member[][] = [[]];
  let index = 0;
  for (const n of nodes) {
    if (!isDispatch(n)) {
      if (groups[groups.length - 1].length > 0) groups.push([]);
      continue;
    }
    groups[groups.length - 1].push({ ref: { index: index++, kernel: n.pipeline.name }, acc: trueAccesses(n) });
  }
  return groups.filter((g) => g.length > 0);
}

/** Every hazard of a sequence of dispatches and barriers (empty when it is race-free). */
export function findHazards(nodes: readonly CapturedNode[]): Hazard[] {
  const hazards: Hazard[] = [];
  for (const g of groupsOf(nodes)) {
    for (let j = 1; j < g.length; j++) {
      for (let i = 0; i < j; i++) {
        for (const c of conflictsBetween(g[i].acc, g[j].acc)) {
          hazards.push({ kind: c.kind, first: g[i].ref, second: g[j].ref, range: c.range });
        }
      }
    }
  }
  return hazards;
}

/** Barriers that separate two groups with no conflict between them (removable without a hazard). */
export function countRedundantBarriers(nodes: readonly CapturedNode[]): number {
  const groups = groupsOf(nodes);
  let barriers = 0;
  let seenDispatch = false, pendingBarriers = 0;
  for (const n of nodes) {
    if (isDispatch(n)) {
      if (seenDispatch) barriers += Math.max(0, pendingBarriers - 1); // duplicates are redundant
      seenDispatch = true;
      pendingBarriers = 0;
    } else if (seenDispatch) pendingBarriers++;
  }
  barriers += pendingBarriers; // trailing barriers separate nothing
  for (let g = 1; g < groups.length; g++) {
    const independent = groups[g].every((b) => groups[g - 1].every((a) => conflictsBetween(a.acc, b.acc).length === 0));
    if (independent) barriers++;
  }
  return barriers;
}

/** A dispatch that promised a buffer constant, and an earlier dispatch that writes it. */
export interface BrokenConstantPromise {
  /** The dispatch that promised (see SlotSpec.constantIf). */
  readonly promised: DispatchRef;
  /** Its slot's name. */
  readonly slot: string;
  /** The earlier dispatch writing it. */
  readonly writer: DispatchRef;
  /** The bytes both touch. */
  readonly range: MemRange;
}

/** u32 word `word` of an inline-bytes binding (an array of words or a byte view), or 0. */
function bytesWord(b: unknown, word: number): number {
  if (Array.isArray(b)) return (b[word] ?? 0) >>> 0;
  if (ArrayBuffer.isView(b) && b.byteLength >= 4 * word + 4) {
    return new DataView(b.buffer, b.byteOffset, b.byteLength).getUint32(4 * word, true);
  }
  return 0;
}

/**
 * Every constant-buffer promise of a command buffer's sequence that an earlier dispatch breaks by
 * writing that buffer, barriers or not (the promised reads may start before any producer ends).
 */
export function findBrokenConstantPromises(nodes: readonly CapturedNode[]): BrokenConstantPromise[] {
  const broken: BrokenConstantPromise[] = [];
  const writesByAlloc = new Map<number, { ref: DispatchRef; range: MemRange }[]>(); // earlier writes
  let index = 0;
  for (const n of nodes) {
    if (!isDispatch(n)) continue;
    const ref = { index: index++, kernel: n.pipeline.name };
    boundContract(n)?.slots.forEach((s, i) => {
      const c = s.constantIf, b = n.bindings![i];
      if (!c || !(bytesWord(n.bindings![c.slot], c.word) & c.mask)) return;
      const r = (b as { range?: () => MemRange } | undefined)?.range?.();
      for (const w of (r && writesByAlloc.get(r[0])) ?? []) {
        if (rangesOverlap(r!, w.range)) {
          broken.push({ promised: ref, slot: s.name, writer: w.ref, range: intersect(r!, w.range) });
        }
      }
    });
    for (const range of trueAccesses(n).writes) {
      const list = writesByAlloc.get(range[0]) ?? [];
      list.push({ ref, range });
      writesByAlloc.set(range[0], list);
    }
  }
  return broken;
}

/** A readable multi-line report of broken constant promises. */
export function formatBrokenPromises(broken: readonly BrokenConstantPromise[]): string {
  return broken.map((b) =>
    `dispatch ${b.promised.index} (${b.promised.kernel}) promised its ${b.slot} constant, but dispatch ` +
    `${b.writer.index} (${b.writer.kernel}) writes ${formatRange(b.range)} earlier in the command buffer`
  ).join("\n");
}

/** A readable multi-line report of hazards. */
export function formatHazards(hazards: readonly Hazard[]): string {
  return hazards.map((h) =>
    `${h.kind}: dispatch ${h.first.index} (${h.first.kernel}) and dispatch ${h.second.index} (${h.second.kernel}) ` +
    `both touch ${formatRange(h.range)} with no barrier between them`
  ).join("\n");
}
