/**
 * The capture recorder of a command encoder: in capture mode, dispatches and barriers are recorded
 * as the very stream words the direct path writes, through the same writer (so the descriptor is
 * checked and its constants and geometry copied as it is recorded; SET_PIPELINE only where the
 * pipeline changes), plus each SET_PIPELINE record's pipeline. Nothing is kept per node or per
 * binding: node boundaries, bindings and accesses are derived from the words only when asked for
 * ({@link Capture.nodes}), so a recorded pass that hits the plan cache never builds any. A node's
 * bindings are views of the live allocations the words name by handle ({@link HandleViews}): the
 * same bytes as the views the pass bound, not the same objects — except in a capture the caller
 * takes as nodes (`startCapture`), which keeps the views each dispatch bound. While a recording is open, buffers
 * it binds stay allocated even if collected ({@link beginCapture}), as in a command buffer. A node's
 * accesses are derived from its bindings through the kernel contract, merged with any ranges the
 * user added.
 *
 * @module
 */

import { beginCapture, type CaptureLife, endCapture, HandleViews, MlxBuffer, watchCaptures } from "./buffer.ts";
import type { DispatchDescriptor } from "./dispatch.ts";
import type { Binding } from "./graph/nodes.ts";
import { putDispatch, writeDispatch } from "./dispatch_writer.ts";
import { MlxError } from "./errors.ts";
import { BARRIER, type CapturedNode, type DispatchNode } from "./graph/nodes.ts";
import type { CapturedOpKind } from "./graph/op_kind.ts";
import { type Accesses, accessesOf, type MemRange, rangeCovers } from "./graph/ranges.ts";
import type { Pipeline } from "./kernels.ts";
import { isBufferRecord, LEN_SHIFT, Op, OP_MASK, RecordWords, SLOT_SHIFT } from "./native/abi.ts";
import { H_SET_PIPELINE, StreamWriter } from "./native/stream.ts";
import { BarrierPolicy } from "./barrier_policy.ts";

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

/** Per node index, the views its dispatch's descriptor bound, by slot (public captures only). */
type CallerViews = (readonly (MlxBuffer | undefined)[] | undefined)[];

const MAX_SLOTS = 256; // a record's slot is one byte

/** The writer and tables of a capture, reused once it is released (captures are short-lived). */
interface Tables {
  /** Records are written here; while nothing spilled, its words are the capture's. */
  readonly writer: StreamWriter;
  /** Words spilled from the writer when it filled up. */
  store: Uint32Array;
  /** The pipeline of each SET_PIPELINE record, in order. */
  readonly pipelines: Pipeline[];
  /** `store` as bytes (the writer has its own view), for the key comparison. */
  storeBytes: Uint8Array | null;
  /** Whether the recording using these tables is open (they are reused by one after another). */
  readonly life: CaptureLife;
}

const spareTables: Tables[] = [];
const MAX_SPARE = 4;
const NO_OP_KINDS: ReadonlyMap<number, CapturedOpKind> = new Map();
const NO_ANNOTATIONS: ReadonlyMap<number, MarkedNode> = new Map();
const NO_CHANGES: readonly number[] = [];

function takeTables(): Tables {
  const spare = spareTables.pop();
  if (spare !== undefined) return spare;
  const t: Tables = {
    writer: new StreamWriter(),
    store: new Uint32Array(4096),
    pipelines: [],
    storeBytes: null,
    life: { open: false },
  };
  watchCaptures(t, t.life);
  return t;
}

/** Ends the recording `t` belongs to and keeps `t` for the next one. */
function returnTables(t: Tables, pipelines: number): void {
  t.writer.attach(undefined);
  endCapture(t.life);
  // Drop the references, keeping the array's storage. A loop, not Array#fill: after a fill, V8
  // stores into the array several times slower.
  const p = t.pipelines as unknown[];
  for (let i = 0; i < pipelines; i++) p[i] = undefined;
  if (spareTables.length < MAX_SPARE) spareTables.push(t);
}

/**
 * The view bound by the buffer record at `at` (op `op`) of `pipeline`'s dispatch, from the live
 * allocation its handle names; a Disposed error when that allocation was disposed since.
 */
function boundView(views: HandleViews, w: Uint32Array, at: number, op: number, pipeline: Pipeline): MlxBuffer {
  const h = w[at]!, handle = w[at + 1]!;
  let view: MlxBuffer | undefined;
  if (op === Op.SET_BUFFER_WHOLE) view = views.view(handle, 0, -1);
  else if (op === Op.SET_BUFFER) view = views.view(handle, w[at + 2]!, w[at + 3]!);
  else view = views.view(handle, w[at + 2]! + w[at + 3]! * 2 ** 32, w[at + 4]! + w[at + 5]! * 2 ** 32);
  if (view !== undefined) return view;
  const slot = (h >>> SLOT_SHIFT) & OP_MASK;
  throw new MlxError(
    "Disposed",
    `${pipeline.name}: slot ${slot} (${pipeline.contract.slots[slot]?.name}) binds a disposed buffer`,
  );
}

/** Whether the `len` words at `a` and at `b` are equal (two records: the same binding). */
function sameRecord(w: Uint32Array, a: number, b: number, len: number): boolean {
  for (let k = 0; k < len; k++) if (w[a + k] !== w[b + k]) return false;
  return true;
}

/** The views among `bindings`, by slot (a copy: the caller may reuse its array). */
function viewsOf(bindings: readonly unknown[]): (MlxBuffer | undefined)[] {
  const out: (MlxBuffer | undefined)[] = new Array(bindings.length);
  for (let i = 0; i < bindings.length; i++) {
    const b = bindings[i];
    out[i] = b instanceof MlxBuffer ? b : undefined;
  }
  return out;
}

/** The first buffer among `bindings`, if any. */
function firstBuffer(bindings: readonly unknown[]): MlxBuffer | null {
  for (let i = 0; i < bindings.length; i++) if (bindings[i] instanceof MlxBuffer) return bindings[i] as MlxBuffer;
  return null;
}

/**
 * A finished capture: the stream words of every node (a dispatch's records tagged with its node
 * index, SET_PIPELINE only where the pipeline changes; a barrier is one BARRIER word), the pipeline
 * of each SET_PIPELINE record, op kinds that differ from the contract's, and the nodes the user
 * annotated with ranges. Until {@link Capture.release}, the allocations the words name stay
 * allocated even if their views are collected.
 */
export class Capture {
  /** Stream words of the nodes, in order (valid up to `length`). */
  readonly words: Uint32Array;
  /** The memory of `words`, as bytes (valid up to `4 * length`). */
  readonly bytes: Uint8Array;
  /** Words used. */
  readonly length: number;
  /** Nodes recorded (dispatches and barriers). */
  readonly nodeCount: number;
  /** The pipeline of each SET_PIPELINE record, in order. */
  readonly pipelines: readonly Pipeline[];
  /** SET_PIPELINE records. */
  readonly pipelineCount: number;
  /** A buffer the pass binds (the device of all of them), or null when it binds none (or released). */
  #probe: MlxBuffer | null;
  /** Op kinds that differ from the pipeline contract's, by node index. */
  readonly opKinds: ReadonlyMap<number, CapturedOpKind>;
  /** Nodes whose accesses include user ranges, by node index. */
  readonly annotated: ReadonlyMap<number, MarkedNode>;
  /**
   * Recording started with automatic barriers: {@link Capture.nodes} places a barrier before every
   * dispatch recorded under them whose accesses conflict with its concurrent group (none were
   * recorded per dispatch).
   */
  readonly autoBarriers: boolean;
  /**
   * Where the setting was changed while recording, as pairs (the index of the next node, 1 = on /
   * 0 = off). A change keeps the concurrent group's tracked accesses, as on a direct encoder.
   */
  readonly autoChanges: readonly number[];
  #nodes: CapturedNode[] | null = null;
  #starts: Int32Array | null = null; // per node, its first word (derived with the nodes)
  /** Per dispatch node, the views its descriptor bound (public captures: nodes bind the caller's views). */
  #callerViews: CallerViews | null;
  #released = false;
  readonly #tables: Tables;

  /** @internal Made by CaptureRecorder. */
  constructor(
    tables: Tables,
    spilled: boolean,
    length: number,
    nodeCount: number,
    pipelineCount: number,
    probe: MlxBuffer | null,
    opKinds: ReadonlyMap<number, CapturedOpKind>,
    annotated: ReadonlyMap<number, MarkedNode>,
    autoBarriers: boolean,
    autoChanges: readonly number[],
    callerViews: CallerViews | null = null,
  ) {
    this.#tables = tables;
    this.#callerViews = callerViews;
    this.autoBarriers = autoBarriers;
    this.autoChanges = autoChanges;
    if (spilled) {
      const s = tables.store;
      let bytes = tables.storeBytes;
      if (bytes === null || bytes.buffer !== s.buffer) bytes = tables.storeBytes = new Uint8Array(s.buffer);
      this.words = s;
      this.bytes = bytes;
    } else {
      this.words = tables.writer.words;
      this.bytes = tables.writer.bytes;
    }
    this.length = length;
    this.nodeCount = nodeCount;
    this.pipelines = tables.pipelines;
    this.pipelineCount = pipelineCount;
    this.#probe = probe;
    this.opKinds = opKinds;
    this.annotated = annotated;
  }

  /**
   * The graph nodes (built once, on first call): the recorded ones, with, under automatic barriers,
   * a barrier before each dispatch whose accesses conflict with its group.
   */
  nodes(): CapturedNode[] {
    if (this.#nodes !== null) return this.#nodes;
    const [nodes, starts] = this.#recordedNodes();
    const changes = this.autoChanges;
    if (!this.autoBarriers && changes.length === 0) {
      this.#starts = starts;
      return this.#nodes = nodes;
    }
    const out: CapturedNode[] = [], outStarts: number[] = [];
    const policy = new BarrierPolicy(true);
    let auto = this.autoBarriers, next = 0;
    try {
      for (let i = 0; i < nodes.length; i++) {
        const n = nodes[i]!;
        // A switch keeps the group (as on a direct encoder): only barriers forget it.
        for (; next < changes.length && changes[next] === i; next += 2) auto = changes[next + 1] === 1;
        if (n.kind !== "dispatch") policy.forget();
        else if (auto) {
          // Exactly the encoder's rule: derived accesses staged from the bindings, merged with
          // any user ranges (checked and tracked as ranges).
          const user = this.annotated.has(i);
          const conflict = user
            ? policy.conflicts(n.reads, n.writes)
            : policy.stageDispatch((n.pipeline as Pipeline).contract, n.bindings!);
          if (conflict && out.length > 0) {
            out.push(BARRIER);
            outStarts.push(starts[i]!);
            policy.forget();
          }
          if (user) policy.track(n.reads, n.writes);
          else policy.trackStaged();
        }
        out.push(n);
        outStarts.push(starts[i]!);
      }
    } finally {
      policy.release();
    }
    this.#starts = Int32Array.from(outStarts);
    return this.#nodes = out;
  }

  /** The nodes as recorded, and the first word of each. */
  #recordedNodes(): [CapturedNode[], Int32Array] {
    const out: CapturedNode[] = new Array(this.nodeCount);
    const starts = new Int32Array(this.nodeCount);
    const w = this.words, pipelines = this.pipelines;
    const opKinds = this.opKinds.size > 0 ? this.opKinds : null;
    const annotated = this.annotated.size > 0 ? this.annotated : null;
    const views = this.#probe === null ? null : new HandleViews(this.#probe);
    const callerViews = this.#callerViews;
    // The view last made for each slot, its range and the record it was made from: consecutive
    // dispatches often bind the same bytes there.
    const last: MlxBuffer[] = [], lastRange: MemRange[] = [], lastAt = new Int32Array(MAX_SLOTS).fill(-1);
    const ranges: (MemRange | undefined)[] = []; // of the node's buffer slots

    let node = 0, at = 0, start = 0, p = -1;
    let bindings: Binding[] = [];
    let tgMemory: number | undefined = undefined;
    while (at < this.length) {
      const h = w[at]!, op = h & OP_MASK, len = h >>> LEN_SHIFT, slot = (h >>> SLOT_SHIFT) & OP_MASK;
      if (op === Op.SET_PIPELINE) p++;
      else if (isBufferRecord(op)) {
        const prev = lastAt[slot]!, mine = callerViews?.[node]?.[slot];
        if (mine !== undefined) { // the view the caller bound (same bytes as the record's)
          last[slot] = mine;
          lastRange[slot] = mine.range();
          lastAt[slot] = -1;
        } else if (prev < 0 || !sameRecord(w, prev, at, len)) {
          const view = last[slot] = boundView(views!, w, at, op, pipelines[p]!);
          lastRange[slot] = view.range();
          lastAt[slot] = at;
        }
        bindings[slot] = last[slot];
        ranges[slot] = lastRange[slot];
      } else if (op === Op.SET_BYTES) bindings[slot] = inlineBinding(w, at);
      else if (op === Op.SET_TG_MEMORY) tgMemory = w[at + 1];
      else if (op === Op.BARRIER) {
        starts[node] = at;
        out[node++] = BARRIER;
        start = at + len;
      } else if (op === Op.DISPATCH_THREADS || op === Op.DISPATCH_GROUPS) {
        const pipeline = pipelines[p]!, slots = pipeline.contract.slots;
        // accessesOf, with each view's range made once (nothing mutates a node's ranges).
        const reads: MemRange[] = [], writes: MemRange[] = [];
        for (let i = 0; i < slots.length; i++) {
          const r = ranges[i];
          if (r === undefined) continue;
          ranges[i] = undefined;
          if (r[2] === r[1]) continue; // zero bytes touch nothing
          const access = slots[i]!.access ?? "readwrite";
          if (access !== "write") reads.push(r);
          if (access !== "read") writes.push(r);
        }
        const user = annotated?.get(node);
        starts[node] = start;
        out[node] = user ?? {
          kind: "dispatch",
          pipeline,
          bindings,
          grid: dims(w[at + 1]!, w[at + 2]!, w[at + 3]!),
          threadgroup: dims(w[at + 4]!, w[at + 5]!, w[at + 6]!),
          threadgroupMemory: tgMemory,
          dispatchKind: op === Op.DISPATCH_THREADS ? "threads" : "threadgroups",
          opKind: opKinds?.get(node) ?? pipeline.contract.opKind,
          reads,
          writes,
        };
        node++;
        start = at + len;
        bindings = [];
        tgMemory = undefined;
      }
      at += len;
    }
    return [out, starts];
  }

  /** Word offset of the inline constants bound at `slot` of node `i` (-1 if none). */
  constantOffset(i: number, slot: number): number {
    if (this.#starts === null) this.nodes();
    const w = this.words, starts = this.#starts!;
    const end = i + 1 < starts.length ? starts[i + 1]! : this.length;
    for (let at = starts[i]!; at < end;) {
      const h = w[at]!;
      if ((h & OP_MASK) === Op.SET_BYTES && ((h >>> SLOT_SHIFT) & OP_MASK) === slot) return at;
      at += h >>> LEN_SHIFT;
    }
    return -1;
  }

  /**
   * Every view the pass binds, in record order (views of the allocations the words name, which
   * they keep alive); a Disposed error when one of those allocations was disposed.
   */
  boundBuffers(): MlxBuffer[] {
    const out: MlxBuffer[] = [], w = this.words, views = this.#probe === null ? null : new HandleViews(this.#probe);
    for (let at = 0, p = -1; at < this.length; at += w[at]! >>> LEN_SHIFT) {
      const op = w[at]! & OP_MASK;
      if (op === Op.SET_PIPELINE) p++;
      else if (isBufferRecord(op)) out.push(boundView(views!, w, at, op, this.pipelines[p]!));
    }
    return out;
  }

  /** Hands the words and tables back for reuse (the capture must not be read afterwards). */
  release(): void {
    if (this.#released) return;
    this.#released = true;
    // Whoever still holds the capture (a fingerprint does) must not keep its buffers alive.
    this.#nodes = null;
    this.#starts = null;
    this.#probe = null;
    this.#callerViews = null;
    returnTables(this.#tables, this.pipelineCount);
  }
}

/** The inline constants of the SET_BYTES record at `at`, copied. */
function inlineBinding(w: Uint32Array, at: number): Binding {
  const n = w[at + 1]!;
  if (n % 4 !== 0) return new Uint8Array(w.buffer, w.byteOffset + (at + 2) * 4, n).slice();
  const words: number[] = []; // word by word: a subarray view costs more than the copy
  for (let q = at + 2, end = at + 2 + n / 4; q < end; q++) words.push(w[q]!);
  return words;
}

function dims(a: number, b: number, c: number): number | number[] {
  return b === 1 && c === 1 ? a : [a, b, c];
}

/** Records dispatches and barriers in compact form, with annotations for the next dispatch. */
export class CaptureRecorder {
  readonly #t: Tables = takeTables();
  #open = true;
  #stored = 0; // words moved from the writer into the store
  #count = 0; // nodes
  #pipeline = 0; // handle set by the last SET_PIPELINE record
  #pipelines = 0; // SET_PIPELINE records
  #probe: MlxBuffer | null = null; // a buffer bound in the pass: the device of all of them
  #lastStart = -1; // first word of the last dispatch (its index and buffers are derived from it)
  #barrierEnd = -1; // the word after the last barrier
  #opKinds: Map<number, CapturedOpKind> | null = null;
  #annotated: Map<number, MarkedNode> | null = null;
  #pending = false; // an op kind or ranges wait for the next dispatch
  #pendingOpKind: CapturedOpKind | undefined;
  #pendingRanges: Accesses | undefined;
  readonly #autoBarriers: boolean;
  #autoChanges: number[] | null = null;
  #opStart = 0; // the first word of the op dispatch being written (see opBegin)
  #opPipeline: Pipeline | null = null; // its pipeline
  /** Per node, the views its descriptor bound; null: nodes bind views derived from the words. */
  readonly #callerViews: CallerViews | null;

  /**
   * An empty recorder; `autoBarriers`: whether the dispatches recorded first get automatic barriers;
   * `keepCallerViews`: nodes bind the very views the descriptors bound (a capture the caller takes as
   * nodes), at one small array per dispatch; otherwise views of the same bytes are derived from the
   * words when nodes are needed (the plan cache's captures, which usually never need them).
   */
  constructor(autoBarriers = false, keepCallerViews = false) {
    this.#autoBarriers = autoBarriers;
    this.#callerViews = keepCallerViews ? [] : null;
    beginCapture(this.#t.life);
    this.#t.writer.attach((_bytes, byteLength) => this.#spill(byteLength >>> 2));
  }

  /** Automatic barriers on or off for the dispatches recorded from now on. */
  setAutoBarriers(on: boolean): void {
    (this.#autoChanges ??= []).push(this.#count, on ? 1 : 0);
  }

  /** Nodes recorded so far. */
  get length(): number {
    return this.#count;
  }

  /**
   * Records a dispatch, consuming the annotations. Returns false with nothing recorded when the
   * descriptor is not valid (the encoder then says why).
   */
  dispatch(d: DispatchDescriptor): boolean {
    const t = this.#t, wr = t.writer, p = d.pipeline;
    // The dispatch's first word, counted over the store and the writer: a spill the write makes
    // first moves the writer's words to the store without changing that count.
    const at = this.#stored + wr.pos, i = this.#count;
    if (!writeDispatch(wr, d, this.#pipeline, i)) return false;
    if (p.handle !== this.#pipeline) {
      this.#pipeline = p.handle;
      t.pipelines[this.#pipelines++] = p;
    }
    // The words name buffers by handle; one view is kept to tell which device's handles they are.
    if (this.#probe === null) this.#probe = firstBuffer(d.bindings);
    if (this.#callerViews !== null) this.#callerViews[i] = viewsOf(d.bindings);
    this.#count = i + 1;
    this.#lastStart = at;
    if (this.#pending || d.opKind !== undefined) this.#annotate(d, i);
    return true;
  }

  /**
   * The ops' write path (see CommandEncoder.opBegin): makes room for one dispatch of `p` in the
   * recorder's writer and returns the word of {@link CaptureRecorder.opWords} its binding records
   * start at (after a SET_PIPELINE record when the pipeline changes); nothing is published until
   * {@link CaptureRecorder.opDispatch}. -1 where the dispatch needs its descriptor: the caller's views
   * are kept per node, annotations wait for the next dispatch, or no buffer names the pass's device
   * yet (the descriptor's first buffer becomes that probe).
   */
  opBegin(p: Pipeline): number {
    if (this.#pending || this.#probe === null || this.#callerViews !== null) return -1;
    const wr = this.#t.writer, words = wr.words;
    // The room writeDispatch makes (StreamWriter.reserve): a spill keeps `#stored + pos` as it was.
    if (wr.pos + p.maxDispatchWords + RecordWords.BARRIER > words.length) wr.flush();
    let at = wr.pos;
    this.#opStart = this.#stored + at;
    if (p.handle !== this.#pipeline) {
      words[at] = H_SET_PIPELINE;
      words[at + 1] = p.handle;
      at += 2;
    }
    this.#opPipeline = p;
    return at;
  }

  /** The words the ops' write path stores into (valid after an opBegin that did not return -1). */
  get opWords(): Uint32Array {
    return this.#t.writer.words;
  }

  /**
   * Ends a dispatch of the ops' write path whose binding records end at word `at`: writes its
   * DISPATCH record tagged with its node index and publishes every record since
   * {@link CaptureRecorder.opBegin}, with the bookkeeping {@link CaptureRecorder.dispatch} does
   * (opBegin refused everything else that needs: annotations, caller views, the probe).
   */
  opDispatch(
    at: number,
    threads: boolean,
    g0: number,
    g1: number,
    g2: number,
    t0: number,
    t1: number,
    t2: number,
  ): void {
    const t = this.#t, wr = t.writer, p = this.#opPipeline!, i = this.#count;
    wr.pos = putDispatch(wr.words, at, threads, g0, g1, g2, t0, t1, t2, i);
    if (p.handle !== this.#pipeline) {
      this.#pipeline = p.handle;
      t.pipelines[this.#pipelines++] = p;
    }
    this.#count = i + 1;
    this.#lastStart = this.#opStart;
  }

  /** Gives dispatch `i` its op kind and the pending ranges. */
  #annotate(d: DispatchDescriptor, i: number): void {
    const kind = this.#pendingOpKind ?? d.opKind;
    if (kind !== undefined && kind !== d.pipeline.contract.opKind) (this.#opKinds ??= new Map()).set(i, kind);
    if (this.#pendingRanges !== undefined) {
      (this.#annotated ??= new Map()).set(i, dispatchNode(d, undefined, this.#pendingRanges, kind));
    }
    this.#pendingOpKind = undefined;
    this.#pendingRanges = undefined;
    this.#pending = false;
  }

  /** Records a barrier (none before the first node). */
  barrier(): void {
    if (this.#count === 0) return;
    const wr = this.#t.writer;
    wr.reserve(RecordWords.BARRIER);
    wr.barrier();
    this.#barrierEnd = this.#stored + wr.pos;
    this.#count++;
  }

  /**
   * The recorded pass, without a trailing barrier; the recorder is done afterwards. The nodes
   * recorded under automatic barriers get their barriers where accesses conflict.
   */
  take(): Capture {
    const t = this.#t, wr = t.writer;
    this.#open = false;
    const spilled = this.#stored > 0;
    if (spilled) wr.flush();
    let count = this.#count, length = spilled ? this.#stored : wr.pos;
    if (this.#barrierEnd === length) { // the last node is a barrier
      count--;
      length--;
    }
    wr.attach(undefined);
    // Exactly the pipelines recorded (entries past them are left over from an earlier capture).
    if (t.pipelines.length !== this.#pipelines) t.pipelines.length = this.#pipelines;
    return new Capture(
      t,
      spilled,
      length,
      count,
      this.#pipelines,
      this.#probe,
      this.#opKinds ?? NO_OP_KINDS,
      this.#annotated ?? NO_ANNOTATIONS,
      this.#autoBarriers,
      this.#autoChanges ?? NO_CHANGES,
      this.#callerViews,
    );
  }

  /** Drops what was recorded and hands the tables back for reuse (the recorder is done). */
  discard(): void {
    if (!this.#open) return;
    this.#open = false;
    returnTables(this.#t, this.#pipelines);
  }

  /** Sets the op kind of the next dispatch. */
  setOpKind(kind: CapturedOpKind): void {
    this.#pendingOpKind = kind;
    this.#pending = true;
  }

  /** Adds ranges to the next dispatch's accesses. */
  addPendingRanges(extra: Accesses): void {
    this.#pending = true;
    const p = this.#pendingRanges;
    this.#pendingRanges = p ? mergeAccesses(p, extra) : { reads: [...extra.reads], writes: [...extra.writes] };
  }

  /** Merges ranges into the last recorded dispatch's accesses. */
  mergeIntoLastDispatch(extra: Accesses): void {
    if (this.#lastStart < 0) return;
    const [i, n] = this.#lastNode();
    (this.#annotated ??= new Map()).set(i, { ...n, ...mergeAccesses(n, extra), [USER_RANGES]: true } as MarkedNode);
  }

  /** Gives the last recorded dispatch these ranges if it has none. */
  annotateLastDispatchIfMissing(reads: readonly MemRange[], writes: readonly MemRange[]): void {
    if (this.#lastStart < 0) return;
    const [i, n] = this.#lastNode();
    if (n.reads.length === 0 && n.writes.length === 0) {
      (this.#annotated ??= new Map()).set(i, {
        ...n,
        reads: [...reads],
        writes: [...writes],
        [USER_RANGES]: true,
      } as MarkedNode);
    }
  }

  /**
   * The last recorded dispatch's node index and node as it stands (its words are spilled to the
   * store first): parsed from its first word; the barriers after it are one word each.
   */
  #lastNode(): [number, MarkedNode] {
    const t = this.#t;
    t.writer.flush();
    const w = t.store, end = this.#stored, start = this.#lastStart;
    let at = start;
    for (let op = 0; op !== Op.DISPATCH_THREADS && op !== Op.DISPATCH_GROUPS; at += w[at]! >>> LEN_SHIFT) {
      op = w[at]! & OP_MASK;
    }
    const i = this.#count - 1 - (end - at); // the words after it are its trailing barriers
    const a = this.#annotated?.get(i);
    if (a !== undefined) return [i, a];
    const pipeline = t.pipelines[this.#pipelines - 1]!;
    const bindings: Binding[] = [];
    const views = this.#probe === null ? null : new HandleViews(this.#probe); // null: no buffer record
    let tgMemory: number | undefined = undefined;
    let grid: number | number[] = 1, threadgroup: number | number[] = 1, threads = false;
    for (let q = start; q < at;) {
      const h = w[q]!, op = h & OP_MASK, len = h >>> LEN_SHIFT, slot = (h >>> SLOT_SHIFT) & OP_MASK;
      if (isBufferRecord(op)) bindings[slot] = this.#callerViews?.[i]?.[slot] ?? boundView(views!, w, q, op, pipeline);
      else if (op === Op.SET_BYTES) bindings[slot] = inlineBinding(w, q);
      else if (op === Op.SET_TG_MEMORY) tgMemory = w[q + 1];
      else if (op === Op.DISPATCH_THREADS || op === Op.DISPATCH_GROUPS) {
        threads = op === Op.DISPATCH_THREADS;
        grid = dims(w[q + 1]!, w[q + 2]!, w[q + 3]!);
        threadgroup = dims(w[q + 4]!, w[q + 5]!, w[q + 6]!);
      }
      q += len;
    }
    const acc = accessesOf(pipeline.contract, bindings);
    return [i, {
      kind: "dispatch",
      pipeline,
      bindings,
      grid,
      threadgroup,
      threadgroupMemory: tgMemory,
      dispatchKind: threads ? "threads" : "threadgroups",
      opKind: this.#opKinds?.get(i) ?? pipeline.contract.opKind,
      reads: acc.reads,
      writes: acc.writes,
    }];
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
    s.set(t.writer.words.subarray(0, n), this.#stored);
    this.#stored += n;
  }
}
