/**
 * The capture recorder of a command encoder: in capture mode, dispatches and barriers are recorded
 * in compact form — the very stream words the direct path would write (so the descriptor is checked
 * and its constants and geometry copied as it is recorded) plus a side table of pipelines and bound
 * buffers. Graph nodes are built from that only when asked for ({@link Capture.nodes}): a recorded
 * pass that hits the plan cache never builds any. A node's accesses are derived from its bindings
 * through the kernel contract, merged with any ranges the user added.
 *
 * @module
 */

import { MlxBuffer } from "./buffer.ts";
import type { DispatchDescriptor } from "./dispatch.ts";
import type { Binding } from "./graph/nodes.ts";
import { writeDispatch } from "./dispatch_writer.ts";
import { BARRIER, type CapturedNode, type DispatchNode } from "./graph/nodes.ts";
import type { CapturedOpKind } from "./graph/op_kind.ts";
import { type Accesses, accessesOf, type MemRange, rangeCovers } from "./graph/ranges.ts";
import type { Pipeline } from "./kernels.ts";
import { Op } from "./native/abi.ts";
import { StreamWriter } from "./native/stream.ts";

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

const OP_MASK = 0xff;
const LEN_SHIFT = 16;
const SLOT_SHIFT = 8;

/** The growable arrays of a capture, reused once it is released (captures are short-lived). */
interface Tables {
  store: Uint32Array;
  starts: Int32Array;
  bufferStarts: Int32Array;
  bindingCounts: Uint16Array;
  readonly pipelines: (Pipeline | null)[];
  readonly buffers: MlxBuffer[];
}

const spareTables: Tables[] = [];
const spareWriters: StreamWriter[] = [];
const MAX_SPARE = 4;

function takeTables(): Tables {
  return spareTables.pop() ?? {
    store: new Uint32Array(4096),
    starts: new Int32Array(256),
    bufferStarts: new Int32Array(256),
    bindingCounts: new Uint16Array(256),
    pipelines: [],
    buffers: [],
  };
}

function returnTables(t: Tables): void {
  t.pipelines.length = 0; // drop the references: a spare must not keep buffers alive
  t.buffers.length = 0;
  if (spareTables.length < MAX_SPARE) spareTables.push(t);
}

/**
 * A finished capture in compact form: the stream words of every node (dispatches written with no
 * pipeline assumed set, tagged with their dispatch index; a barrier is one BARRIER word), the
 * pipeline and the buffers of each dispatch, op kinds that differ from the contract's, and the nodes
 * the user annotated with ranges.
 */
export class Capture {
  /** Stream words of the nodes, in order (valid up to `length`). */
  readonly words: Uint32Array;
  /** Words used. */
  readonly length: number;
  /** Nodes recorded (dispatches and barriers). */
  readonly nodeCount: number;
  /** Per node: its first word. */
  readonly starts: Int32Array;
  /** Per node: index of its first buffer in `buffers`. */
  readonly bufferStarts: Int32Array;
  /** Per node: its binding count (0 for a barrier). */
  readonly bindingCounts: Uint16Array;
  /** Per node: its pipeline (null for a barrier). */
  readonly pipelines: readonly (Pipeline | null)[];
  /** Every bound buffer, in node and slot order. */
  readonly buffers: readonly MlxBuffer[];
  /** Op kinds that differ from the pipeline contract's, by node index. */
  readonly opKinds: ReadonlyMap<number, CapturedOpKind>;
  /** Nodes whose accesses include user ranges, by node index. */
  readonly annotated: ReadonlyMap<number, MarkedNode>;
  #nodes: CapturedNode[] | null = null;
  #released = false;

  readonly #tables: Tables;

  /** @internal Made by CaptureRecorder. */
  constructor(
    tables: Tables,
    length: number,
    nodeCount: number,
    opKinds: Map<number, CapturedOpKind>,
    annotated: Map<number, MarkedNode>,
  ) {
    this.#tables = tables;
    this.words = tables.store;
    this.length = length;
    this.nodeCount = nodeCount;
    this.starts = tables.starts;
    this.bufferStarts = tables.bufferStarts;
    this.bindingCounts = tables.bindingCounts;
    this.pipelines = tables.pipelines;
    this.buffers = tables.buffers;
    this.opKinds = opKinds;
    this.annotated = annotated;
  }

  /** The end word of node `i`. */
  end(i: number): number {
    return i + 1 < this.nodeCount ? this.starts[i + 1]! : this.length;
  }

  /** The graph nodes (built once, on first call). */
  nodes(): CapturedNode[] {
    if (this.#nodes !== null) return this.#nodes;
    const out: CapturedNode[] = new Array(this.nodeCount);
    for (let i = 0; i < this.nodeCount; i++) out[i] = this.node(i);
    return this.#nodes = out;
  }

  /** Node `i`, built from its words. */
  node(i: number): CapturedNode {
    const user = this.annotated.get(i);
    if (user !== undefined) return user;
    return this.#plainNode(i);
  }

  /** Node `i` from its words alone (no user ranges). */
  plainNode(i: number): MarkedNode {
    const n = this.#plainNode(i);
    if (n.kind !== "dispatch") throw new Error("not a dispatch node");
    return n;
  }

  /** Word offset of the inline constants bound at `slot` of node `i` (-1 if none). */
  constantOffset(i: number, slot: number): number {
    const w = this.words;
    for (let at = this.starts[i]!, end = this.end(i); at < end;) {
      const h = w[at]!;
      if ((h & OP_MASK) === Op.SET_BYTES && ((h >>> SLOT_SHIFT) & OP_MASK) === slot) return at;
      at += h >>> LEN_SHIFT;
    }
    return -1;
  }

  /** Hands the word buffer back for reuse (the capture must not be read afterwards). */
  release(): void {
    if (this.#released) return;
    this.#released = true;
    returnTables(this.#tables);
  }

  #plainNode(i: number): CapturedNode {
    const pipeline = this.pipelines[i] ?? null;
    if (pipeline === null) return BARRIER;
    const w = this.words;
    const bindings: Binding[] = new Array(this.bindingCounts[i]);
    let k = this.bufferStarts[i]!;
    let grid: number | number[] = 1, threadgroup: number | number[] = 1;
    let tgMemory: number | undefined = undefined, threads = false;
    for (let at = this.starts[i]!, end = this.end(i); at < end;) {
      const h = w[at]!, op = h & OP_MASK, len = h >>> LEN_SHIFT, slot = (h >>> SLOT_SHIFT) & OP_MASK;
      if (op === Op.SET_BUFFER || op === Op.SET_BUFFER_WHOLE || op === Op.SET_BUFFER64) {
        bindings[slot] = this.buffers[k++];
      } else if (op === Op.SET_BYTES) {
        const n = w[at + 1]!;
        if (n % 4 === 0) { // copied word by word: a subarray view costs more than the copy
          const words: number[] = [];
          for (let q = at + 2, end = at + 2 + n / 4; q < end; q++) words.push(w[q]!);
          bindings[slot] = words;
        } else bindings[slot] = new Uint8Array(w.buffer, w.byteOffset + (at + 2) * 4, n).slice();
      } else if (op === Op.SET_TG_MEMORY) {
        tgMemory = w[at + 1];
      } else if (op === Op.DISPATCH_THREADS || op === Op.DISPATCH_GROUPS) {
        threads = op === Op.DISPATCH_THREADS;
        grid = dims(w[at + 1]!, w[at + 2]!, w[at + 3]!);
        threadgroup = dims(w[at + 4]!, w[at + 5]!, w[at + 6]!);
      }
      at += len;
    }
    const acc = accessesOf(pipeline.contract, bindings);
    return {
      kind: "dispatch",
      pipeline,
      bindings,
      grid,
      threadgroup,
      threadgroupMemory: tgMemory,
      dispatchKind: threads ? "threads" : "threadgroups",
      opKind: this.opKinds.get(i) ?? pipeline.contract.opKind,
      reads: acc.reads,
      writes: acc.writes,
    };
  }
}

function dims(a: number, b: number, c: number): number | number[] {
  return b === 1 && c === 1 ? a : [a, b, c];
}

/** Records dispatches and barriers in compact form, with annotations for the next dispatch. */
export class CaptureRecorder {
  #writer: StreamWriter | null;
  readonly #t: Tables = takeTables();
  #stored = 0; // words moved from the writer into the store
  #count = 0;
  #opKinds = new Map<number, CapturedOpKind>();
  #annotated = new Map<number, MarkedNode>();
  #lastDispatch = -1;
  #pendingOpKind: CapturedOpKind | undefined;
  #pendingRanges: Accesses | undefined;

  /** An empty recorder. */
  constructor() {
    this.#writer = spareWriters.pop() ?? new StreamWriter();
    this.#writer.attach((_bytes, byteLength) => this.#spill(byteLength >>> 2));
  }

  /** Nodes recorded so far. */
  get length(): number {
    return this.#count;
  }

  /**
   * Records a dispatch (a barrier first, with `barrierFirst`), consuming the annotations. Returns
   * false with nothing recorded when the descriptor is not valid (the encoder then says why).
   */
  dispatch(d: DispatchDescriptor, barrierFirst = false): boolean {
    const wr = this.#writer!;
    wr.reserve(d.pipeline.maxDispatchWords + 1);
    let start = this.#stored + wr.pos;
    if (!writeDispatch(wr, d, 0, this.#dispatchIndex(), barrierFirst)) return false;
    if (barrierFirst) {
      this.#node(start, null, 0, 0);
      start++;
    }
    const i = this.#count;
    const bindings = d.bindings;
    const buffers = this.#t.buffers;
    this.#node(start, d.pipeline, bindings.length, buffers.length);
    for (let s = 0; s < bindings.length; s++) {
      const b = bindings[s];
      if (b instanceof MlxBuffer) buffers.push(b);
    }
    const kind = this.#pendingOpKind ?? d.opKind;
    if (kind !== undefined && kind !== d.pipeline.contract.opKind) this.#opKinds.set(i, kind);
    this.#lastDispatch = i;
    if (this.#pendingRanges !== undefined) {
      const plain = dispatchNode(d, undefined, this.#pendingRanges, kind);
      this.#annotated.set(i, plain);
    }
    this.#pendingOpKind = undefined;
    this.#pendingRanges = undefined;
    return true;
  }

  /** Records a barrier (none before the first node). */
  barrier(): void {
    if (this.#count === 0) return;
    const wr = this.#writer!;
    wr.reserve(1);
    this.#node(this.#stored + wr.pos, null, 0, 0);
    wr.barrier();
  }

  /** The recorded pass, without a trailing barrier; the recorder is empty afterwards. */
  take(): Capture {
    const wr = this.#writer!;
    wr.flush();
    wr.attach(undefined);
    if (spareWriters.length < MAX_SPARE) spareWriters.push(wr);
    let count = this.#count, length = this.#stored;
    if (count > 0 && this.#t.pipelines[count - 1] === null) {
      count--;
      length = this.#t.starts[count]!;
    }
    const c = new Capture(this.#t, length, count, this.#opKinds, this.#annotated);
    this.#writer = null;
    return c;
  }

  /** Drops what was recorded and hands the buffers back for reuse (the recorder is done). */
  discard(): void {
    const wr = this.#writer;
    if (wr === null) return;
    this.#writer = null;
    wr.attach(undefined);
    if (spareWriters.length < MAX_SPARE) spareWriters.push(wr);
    returnTables(this.#t);
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
    const i = this.#lastDispatch;
    if (i < 0) return;
    const n = this.#currentNode(i);
    this.#annotated.set(i, { ...n, ...mergeAccesses(n, extra), [USER_RANGES]: true } as MarkedNode);
  }

  /** Gives the last recorded dispatch these ranges if it has none. */
  annotateLastDispatchIfMissing(reads: readonly MemRange[], writes: readonly MemRange[]): void {
    const i = this.#lastDispatch;
    if (i < 0) return;
    const n = this.#currentNode(i);
    if (n.reads.length === 0 && n.writes.length === 0) {
      this.#annotated.set(i, { ...n, reads: [...reads], writes: [...writes], [USER_RANGES]: true } as MarkedNode);
    }
  }

  /** Node `i` as recorded so far (words still in the writer are spilled first). */
  #currentNode(i: number): MarkedNode {
    const a = this.#annotated.get(i);
    if (a !== undefined) return a;
    this.#writer!.flush();
    return this.#view().plainNode(i);
  }

  #view(): Capture {
    return new Capture(this.#t, this.#stored, this.#count, this.#opKinds, this.#annotated);
  }

  #dispatchIndex(): number {
    return this.#count; // a tag only: dispatches are re-tagged when the plan is encoded
  }

  #node(start: number, pipeline: Pipeline | null, bindings: number, bufferStart: number): void {
    const i = this.#count, t = this.#t;
    if (i === t.starts.length) {
      t.starts = grow32(t.starts);
      t.bufferStarts = grow32(t.bufferStarts);
      const c = new Uint16Array(i * 2);
      c.set(t.bindingCounts);
      t.bindingCounts = c;
    }
    t.starts[i] = start;
    t.bufferStarts[i] = bufferStart;
    t.bindingCounts[i] = bindings;
    t.pipelines.push(pipeline);
    this.#count = i + 1;
  }

  /** Moves `n` words from the writer into the store. */
  #spill(n: number): void {
    const t = this.#t;
    let s = t.store;
    if (this.#stored + n > s.length) {
      const g = new Uint32Array(Math.max(s.length * 2, this.#stored + n));
      g.set(s.subarray(0, this.#stored));
      t.store = s = g;
    }
    s.set(this.#writer!.words.subarray(0, n), this.#stored);
    this.#stored += n;
  }
}

function grow32(a: Int32Array): Int32Array<ArrayBuffer> {
  const g = new Int32Array(a.length * 2);
  g.set(a);
  return g;
}
