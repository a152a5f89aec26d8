/**
 * The hazard validator: for every concurrent group of an encoded sequence, checks the TRUE accesses
 * of each pair of dispatches (from their bindings and the kernels' declared access modes, not from
 * annotations) and reports every missing barrier with both dispatches, the allocation and the
 * overlapping bytes. It can also count redundant barriers (ones whose removal creates no hazard).
 * Every pass is O(n log n) in the dispatches, plus the size of what it reports.
 *
 * @module
 */

import { type CapturedNode, type DispatchNode, isDispatch } from "./nodes.ts";
import {
  type Accesses,
  accessesOf,
  checkRanges,
  conflictKind,
  formatRange,
  type KernelAccesses,
  type MemRange,
  rangesOverlap,
} from "./ranges.ts";
import { ByteIntervals, ConflictTracker, GroupWalker } from "./tracker.ts";

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

/**
 * The slot accesses of a kernel by name, for nodes whose pipeline carries none (a plain `{ name }`
 * built by hand): the caller hands in what it knows, e.g. `(name) => contracts.get(name)`.
 */
export type KernelAccessLookup = (kernel: string) => KernelAccesses | undefined;

/** The slot accesses of a dispatch node's kernel, when the node carries bindings to read through them. */
function boundContract(n: DispatchNode, lookup?: KernelAccessLookup): KernelAccesses | undefined {
  if (!n.bindings) return undefined;
  return n.pipeline.contract ?? lookup?.(n.pipeline.name);
}

/**
 * The true accesses of a dispatch node: from its bindings through its kernel's slot accesses (its
 * pipeline's, else `lookup`'s) when it has both, else its annotation.
 */
export function trueAccesses(n: DispatchNode, lookup?: KernelAccessLookup): Accesses {
  const contract = boundContract(n, lookup);
  return contract && n.bindings ? accessesOf(contract, n.bindings) : n;
}

function intersect(a: MemRange, b: MemRange): MemRange {
  return [a[0], Math.max(a[1], b[1]), Math.min(a[2], b[2])];
}

/** One range of one dispatch of a group, for the sweep. */
interface Access {
  readonly range: MemRange;
  readonly dispatch: number; // index among the dispatches of the sequence
  readonly writes: boolean;
  readonly pos: number; // position in the dispatch's reads or writes
}

/** The dispatches of a sequence with their true accesses (checked), and its concurrent groups. */
interface Walked {
  readonly refs: DispatchRef[];
  readonly accesses: Accesses[];
  /** Group g holds dispatches [bounds[g], bounds[g + 1]). */
  readonly bounds: number[];
}

/** Splits a sequence at its barrier nodes (the groups as placed) and checks every range once. */
function walk(nodes: readonly CapturedNode[], lookup?: KernelAccessLookup): Walked {
  const refs: DispatchRef[] = [], accesses: Accesses[] = [], bounds = [0];
  const walker = new GroupWalker({ recompute: false });
  for (const n of nodes) {
    if (!isDispatch(n)) {
      if (walker.barrier()) bounds.push(refs.length);
      continue;
    }
    const ref = { index: refs.length, kernel: n.pipeline.name }, acc = trueAccesses(n, lookup);
    const where = `dispatch ${ref.index} (${ref.kernel})`;
    checkRanges(acc.reads, `${where} reads`);
    checkRanges(acc.writes, `${where} writes`);
    walker.dispatch(acc);
    refs.push(ref);
    accesses.push(acc);
  }
  if (walker.barrier()) bounds.push(refs.length);
  return { refs, accesses, bounds };
}

/** Sort key of a hazard: later dispatch, earlier dispatch, then the pairwise order of the ranges. */
interface Found {
  readonly hazard: Hazard;
  readonly key: readonly number[];
}

function compareKeys(a: Found, b: Found): number {
  for (let i = 0; i < a.key.length; i++) if (a.key[i] !== b.key[i]) return a.key[i]! - b.key[i]!;
  return 0;
}

/**
 * Every conflicting pair of one allocation's accesses within one group, by a sweep in address
 * order: an access meets only the earlier-starting ones still open at its start, all of which
 * overlap it, and reads are matched against writes only — O(k log k + hazards) for k accesses.
 */
function sweep(list: Access[], refs: readonly DispatchRef[], out: Found[]): void {
  list.sort((a, b) => a.range[1] - b.range[1]);
  const openReads: Access[] = [], openWrites: Access[] = [];
  const meet = (open: Access[], x: Access) => {
    let kept = 0;
    for (const y of open) {
      if (y.range[2] <= x.range[1]) continue; // ended before x starts: closed for good
      open[kept++] = y;
      if (y.dispatch === x.dispatch) continue;
      const [early, late] = y.dispatch < x.dispatch ? [y, x] : [x, y];
      const kind = conflictKind(early.writes, late.writes)!;
      out.push({
        hazard: {
          kind,
          first: refs[early.dispatch]!,
          second: refs[late.dispatch]!,
          range: intersect(late.range, early.range),
        },
        key: [late.dispatch, early.dispatch, late.writes ? 1 : 0, late.pos, early.writes ? 1 : 0, early.pos],
      });
    }
    open.length = kept;
  };
  for (const x of list) {
    meet(openWrites, x);
    if (x.writes) meet(openReads, x);
    (x.writes ? openWrites : openReads).push(x);
  }
}

/**
 * Every hazard of a sequence of dispatches and barriers (empty when it is race-free), ordered by the
 * later dispatch, then the earlier one. A node's accesses come from its bindings when its pipeline
 * (or `lookup`) gives the kernel's slot accesses, else from its annotation. Throws InvalidArgument
 * for a malformed range.
 */
export function findHazards(nodes: readonly CapturedNode[], lookup?: KernelAccessLookup): Hazard[] {
  const { refs, accesses, bounds } = walk(nodes, lookup);
  const found: Found[] = [];
  for (let g = 0; g + 1 < bounds.length; g++) {
    if (bounds[g + 1]! - bounds[g]! < 2) continue;
    const byAlloc = new Map<number, Access[]>();
    const note = (range: MemRange, dispatch: number, writes: boolean, pos: number) => {
      if (range[1] === range[2]) return; // touches nothing
      let list = byAlloc.get(range[0]);
      if (!list) byAlloc.set(range[0], list = []);
      list.push({ range, dispatch, writes, pos });
    };
    for (let d = bounds[g]!; d < bounds[g + 1]!; d++) {
      accesses[d]!.reads.forEach((r, pos) => note(r, d, false, pos));
      accesses[d]!.writes.forEach((r, pos) => note(r, d, true, pos));
    }
    for (const list of byAlloc.values()) if (list.length > 1) sweep(list, refs, found);
  }
  return found.sort(compareKeys).map((f) => f.hazard);
}

/** Barriers that separate two groups with no conflict between them (removable without a hazard). */
export function countRedundantBarriers(nodes: readonly CapturedNode[], lookup?: KernelAccessLookup): number {
  const { accesses, bounds } = walk(nodes, lookup);
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
  const earlier = new ConflictTracker();
  for (let g = 1; g + 1 < bounds.length; g++) {
    earlier.reset();
    for (let d = bounds[g - 1]!; d < bounds[g]!; d++) earlier.add(accesses[d]!.reads, accesses[d]!.writes);
    let independent = true;
    for (let d = bounds[g]!; d < bounds[g + 1]! && independent; d++) {
      independent = !earlier.conflicts(accesses[d]!.reads, accesses[d]!.writes);
    }
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
export function findBrokenConstantPromises(
  nodes: readonly CapturedNode[],
  lookup?: KernelAccessLookup,
): BrokenConstantPromise[] {
  const broken: BrokenConstantPromise[] = [];
  // Earlier writes per allocation: the bytes (a quick no for the common, clean case) and the list
  // (scanned only to name the writers of a promise that is broken).
  const writesByAlloc = new Map<number, { bytes: ByteIntervals; list: { ref: DispatchRef; range: MemRange }[] }>();
  let index = 0;
  for (const n of nodes) {
    if (!isDispatch(n)) continue;
    const ref = { index: index++, kernel: n.pipeline.name };
    const bindings = n.bindings ?? [];
    boundContract(n, lookup)?.slots.forEach((s, i) => {
      const c = s.constantIf, b = bindings[i];
      if (!c || !(bytesWord(bindings[c.slot], c.word) & c.mask)) return;
      const r = (b as { range?: () => MemRange } | undefined)?.range?.();
      const written = r && writesByAlloc.get(r[0]);
      if (!r || !written || !written.bytes.intersects(r[1], r[2])) return;
      for (const w of written.list) {
        if (rangesOverlap(r, w.range)) {
          broken.push({ promised: ref, slot: s.name, writer: w.ref, range: intersect(r, w.range) });
        }
      }
    });
    for (const range of trueAccesses(n, lookup).writes) {
      let written = writesByAlloc.get(range[0]);
      if (!written) writesByAlloc.set(range[0], written = { bytes: new ByteIntervals(), list: [] });
      written.bytes.add(range[1], range[2]);
      written.list.push({ ref, range });
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
