/**
 * The plan cache: a recorded pass whose topology equals one optimised before replays the cached,
 * optimised command stream (fusion, reorder, barrier placement and the dual-buffer split are skipped)
 * and takes only its bindings from the new pass.
 *
 * The key (a pass's topology) is, per node in order: barrier, or dispatch with its pipeline, op
 * kind, dispatch kind, grid, threadgroup, threadgroup memory, per slot the bound buffer's allocation
 * and byte range (or the inline constants' byte length, or nothing), and its read and write ranges
 * when the user added any (otherwise they follow from the pipeline's contract and the bindings);
 * plus the finish options that shape the optimisation (fuse, reorder, dual buffer). Every decision
 * of the passes depends only on these, never on constant values, so a replay with new constants is
 * what a fresh optimisation would produce. What may differ between hits: the values of inline
 * constants, and which buffer object views a given allocation range.
 *
 * @module
 */

import type { MlxBuffer } from "../buffer.ts";
import type { Binding, Dims, DispatchDescriptor, DispatchKind } from "../encoder.ts";
import type { Pipeline } from "../kernels.ts";
import { type MarkedNode, USER_RANGES } from "../capture_recorder.ts";
import type { GraphEncodeTarget } from "./compute_graph.ts";
import type { CapturedNode } from "./nodes.ts";
import type { MemRange, RangedBinding } from "./ranges.ts";

/** One dispatch of a cached plan: its geometry, and where each binding comes from in a new pass. */
export interface PlanDispatch {
  /** The kernel. */
  readonly pipeline: Pipeline;
  /** Grid, as issued. */
  readonly grid: Dims;
  /** Threadgroup, as issued. */
  readonly threadgroup: Dims;
  /** Threadgroup memory bytes, as issued. */
  readonly threadgroupMemory: number | undefined;
  /** How to read the grid. */
  readonly dispatchKind: DispatchKind | undefined;
  /** Op kind, as issued. */
  readonly opKind: DispatchDescriptor["opKind"];
  /** Per slot: captured node index × 256 + slot index of the binding, or -1 for none. */
  readonly sources: Int32Array;
}

/** A barrier step of a plan. */
const BARRIER_STEP = null;

/** An optimised pass, replayable onto any pass with the same topology. */
export interface CachedPlan {
  /** Dispatches and barriers as they were issued, in order (null = barrier). */
  readonly steps: readonly (PlanDispatch | null)[];
  /** Steps that went into the first command buffer (all of them without the dual-buffer split). */
  readonly firstSteps: number;
  /** Whether the pass was split over two command buffers. */
  readonly dualBuffer: boolean;
  /** Barriers issued per command buffer. */
  readonly barriers: readonly number[];
  /** Fusions the optimisation applied. */
  readonly fusions: number;
  /** Nodes the reorder pass moved. */
  readonly reordered: number;
}

/** Where a plan's dispatches and barriers go: a CommandEncoder. */
export interface PlanTarget {
  /** Encodes one dispatch. */
  dispatch(d: DispatchDescriptor): void;
  /** Issues a barrier. */
  memoryBarrier(): void;
}

const MAX_SLOTS = 256;

/**
 * Builds a pass's topology key as numbers in a reusable typed array, and its hash. Strings (kernel
 * and op kind names) are interned to small integers.
 */
export class Fingerprint {
  #words = new Float64Array(1024);
  #len = 0;
  #hash = 0;
  readonly #names = new Map<string, number>();

  /** Numbers written. */
  get length(): number {
    return this.#len;
  }

  /** 32-bit hash of the numbers. */
  get hash(): number {
    return this.#hash;
  }

  /** The numbers (a view; copy to keep). */
  view(): Float64Array {
    return this.#words.subarray(0, this.#len);
  }

  /**
   * Fingerprints `nodes` (as captured by a session: accesses are listed only for nodes marked
   * USER_RANGES, the others' follow from pipeline and bindings) under `flags` (the finish options
   * that shape the optimisation).
   */
  compute(nodes: readonly CapturedNode[], flags: number): void {
    this.#len = 0;
    this.#push(flags);
    for (let i = 0; i < nodes.length; i++) {
      const n = nodes[i];
      if (n.kind !== "dispatch") {
        this.#push(-1);
        continue;
      }
      this.#push(this.#intern(n.pipeline.name));
      this.#push(this.#intern(n.opKind));
      this.#push(n.dispatchKind === "threads" ? 1 : 0);
      this.#dims(n.grid);
      this.#dims(n.threadgroup);
      this.#push(n.threadgroupMemory ?? 0);
      const b = n.bindings;
      if (b === undefined) this.#push(-1);
      else {
        this.#push(b.length);
        for (let s = 0; s < b.length; s++) this.#binding(b[s]);
      }
      if ((n as MarkedNode)[USER_RANGES] === true) {
        this.#push(1);
        this.#ranges(n.reads);
        this.#ranges(n.writes);
      } else this.#push(0); // derived from the pipeline and binding ranges above
    }
    this.#rehash();
  }

  /** Whether `other` holds exactly the numbers of the last computation. */
  equals(other: Float64Array): boolean {
    const n = this.#len;
    if (other.length !== n) return false;
    const w = this.#words;
    for (let i = 0; i < n; i++) if (w[i] !== other[i]) return false;
    return true;
  }

  #binding(b: Binding): void {
    if (b === undefined) this.#push(0);
    else if (Array.isArray(b)) {
      this.#push(2);
      this.#push(b.length * 4);
    } else if (b instanceof Uint8Array || b instanceof Uint32Array) {
      this.#push(2);
      this.#push(b.byteLength);
    } else {
      this.#push(1);
      const m = b as MlxBuffer;
      if (typeof m.allocId === "number") { // read the fields: range() would allocate
        this.#push(m.allocId);
        this.#push(m.byteOffset);
        this.#push(m.byteOffset + m.byteLength);
      } else {
        const r = (b as RangedBinding).range();
        this.#push(r[0]);
        this.#push(r[1]);
        this.#push(r[2]);
      }
    }
  }

  #ranges(list: readonly MemRange[]): void {
    this.#push(list.length);
    for (let i = 0; i < list.length; i++) {
      const r = list[i];
      this.#push(r[0]);
      this.#push(r[1]);
      this.#push(r[2]);
    }
  }

  #dims(d: Dims | undefined): void {
    if (d === undefined) {
      this.#push(-1);
      return;
    }
    if (typeof d === "number") {
      this.#push(d);
      this.#push(1);
      this.#push(1);
      return;
    }
    this.#push(d.length > 0 ? d[0] : 1);
    this.#push(d.length > 1 ? d[1] : 1);
    this.#push(d.length > 2 ? d[2] : 1);
  }

  #intern(name: string): number {
    let id = this.#names.get(name);
    if (id === undefined) {
      id = this.#names.size;
      this.#names.set(name, id);
    }
    return id;
  }

  #push(v: number): void {
    if (this.#len === this.#words.length) {
      const w = new Float64Array(this.#words.length * 2);
      w.set(this.#words);
      this.#words = w;
    }
    this.#words[this.#len++] = v;
  }

  /** FNV-1a over the numbers' bytes, read as 32-bit words (one tight loop after the writes). */
  #rehash(): void {
    const ints = new Int32Array(this.#words.buffer, 0, this.#len * 2);
    let h = 0x811c9dc5;
    for (let i = 0; i < ints.length; i++) h = Math.imul(h ^ ints[i], 0x01000193);
    this.#hash = h;
  }
}

interface Entry {
  readonly key: Float64Array;
  readonly plan: CachedPlan;
}

/** Hit and miss counts of a cache. */
export interface PlanCacheStats {
  /** Lookups that found a plan. */
  readonly hits: number;
  /** Lookups that found none. */
  readonly misses: number;
  /** Plans held now. */
  readonly size: number;
  /** Most plans held (least recently used ones are evicted). */
  readonly capacity: number;
}

/**
 * Optimised plans by topology, least recently used evicted first.
 *
 * @example
 * ```ts
 * import { GraphExecutor, MlxDevice } from "@mlxn/mlx-native";
 * using device = MlxDevice.open();
 * const exec = new GraphExecutor(device, { planCacheSize: 8 });
 * using a = device.upload(new Float32Array([1, 2]));
 * for (let step = 0; step < 2; step++) {
 *   using s = exec.beginRecorded();
 *   s.axpby(a, a, a, { alpha: step, beta: 1 });
 *   console.log(s.finish({ fuse: true, reorder: true }).planCache); // "miss", then "hit"
 * }
 * ```
 */
export class PlanCache {
  /** Most plans held. */
  readonly capacity: number;
  readonly #byHash = new Map<number, Entry[]>();
  readonly #lru = new Map<Entry, number>(); // insertion order = recency; value = hash
  #hits = 0;
  #misses = 0;

  /** A cache holding at most `capacity` plans (0 holds none). */
  constructor(capacity: number) {
    this.capacity = capacity;
  }

  /** @internal The plan for the fingerprinted topology, or undefined (counted as a hit or a miss). */
  lookup(fp: Fingerprint): CachedPlan | undefined {
    const list = this.#byHash.get(fp.hash);
    if (list !== undefined) {
      for (const e of list) {
        if (!fp.equals(e.key)) continue;
        this.#lru.delete(e);
        this.#lru.set(e, fp.hash);
        this.#hits++;
        return e.plan;
      }
    }
    this.#misses++;
    return undefined;
  }

  /** @internal Stores a plan for the fingerprinted topology, evicting the least recently used beyond capacity. */
  store(fp: Fingerprint, plan: CachedPlan): void {
    if (this.capacity === 0) return;
    const e: Entry = { key: fp.view().slice(), plan };
    const list = this.#byHash.get(fp.hash);
    if (list) list.push(e);
    else this.#byHash.set(fp.hash, [e]);
    this.#lru.set(e, fp.hash);
    while (this.#lru.size > this.capacity) {
      const [old, hash] = this.#lru.entries().next().value!;
      this.#lru.delete(old);
      const l = this.#byHash.get(hash)!;
      l.splice(l.indexOf(old), 1);
      if (l.length === 0) this.#byHash.delete(hash);
    }
  }

  /** Forgets every plan (the counts stay). */
  clear(): void {
    this.#byHash.clear();
    this.#lru.clear();
  }

  /** Hit and miss counts. */
  stats(): PlanCacheStats {
    return { hits: this.#hits, misses: this.#misses, size: this.#lru.size, capacity: this.capacity };
  }
}

/**
 * Records what an optimised encode issues, so it can be cached: wraps a target and maps every
 * binding back to the captured node and slot it came from (by identity).
 */
export class PlanRecorder {
  /** What was issued, in order (null = barrier). */
  readonly steps: (PlanDispatch | null)[] = [];
  /** Steps issued before the first command buffer was committed (-1: no commit seen). */
  firstSteps = -1;
  /** False once a binding could not be traced to a captured node (the plan is then not cached). */
  traceable = true;
  readonly #sourceOf = new Map<object, number>();

  /** A recorder for an encode of `nodes` (the captured nodes, before any pass). */
  constructor(nodes: readonly CapturedNode[]) {
    for (let i = 0; i < nodes.length; i++) {
      const n = nodes[i];
      if (n.kind !== "dispatch" || n.bindings === undefined) continue;
      if (n.bindings.length > MAX_SLOTS) this.traceable = false;
      for (let s = 0; s < n.bindings.length; s++) {
        const b = n.bindings[s];
        if (typeof b === "object" && !this.#sourceOf.has(b)) this.#sourceOf.set(b, i * MAX_SLOTS + s);
      }
    }
  }

  /**
   * Wraps `target`: everything issued through the wrapper is forwarded and recorded; a commit marks
   * the end of the first command buffer.
   */
  wrap(target: GraphEncodeTarget): GraphEncodeTarget {
    return {
      dispatch: (d) => {
        target.dispatch(d);
        this.#recordDispatch(d);
      },
      memoryBarrier: () => {
        target.memoryBarrier();
        this.steps.push(BARRIER_STEP);
      },
      commit: (label) => {
        this.firstSteps = this.steps.length;
        target.commit(label);
      },
      resolvePipeline: (ref) => target.resolvePipeline(ref),
      checkDispatch: target.checkDispatch ? (d) => target.checkDispatch!(d) : undefined,
    };
  }

  #recordDispatch(d: DispatchDescriptor): void {
    const sources = new Int32Array(d.bindings.length);
    for (let s = 0; s < d.bindings.length; s++) {
      const b = d.bindings[s];
      if (b === undefined) {
        sources[s] = -1;
        continue;
      }
      const src = this.#sourceOf.get(b);
      if (src === undefined) this.traceable = false;
      sources[s] = src ?? -1;
    }
    this.steps.push({
      pipeline: d.pipeline,
      grid: copyDims(d.grid),
      threadgroup: copyDims(d.threadgroup),
      threadgroupMemory: d.threadgroupMemory,
      dispatchKind: d.dispatchKind,
      opKind: d.opKind,
      sources,
    });
  }
}

function copyDims(d: Dims): Dims {
  return typeof d === "number" ? d : d.slice();
}

/** The descriptor of plan step `step` with the bindings of the pass `nodes`. */
export function planDescriptor(step: PlanDispatch, nodes: readonly CapturedNode[]): DispatchDescriptor {
  const src = step.sources;
  const bindings: Binding[] = new Array(src.length);
  for (let s = 0; s < src.length; s++) {
    const k = src[s];
    if (k < 0) continue;
    const node = nodes[(k / MAX_SLOTS) | 0];
    bindings[s] = node.kind === "dispatch" ? node.bindings![k % MAX_SLOTS] : undefined;
  }
  return {
    pipeline: step.pipeline,
    bindings,
    grid: step.grid,
    threadgroup: step.threadgroup,
    threadgroupMemory: step.threadgroupMemory,
    dispatchKind: step.dispatchKind,
    opKind: step.opKind,
  };
}

/** Issues steps [from, to) of a plan into `target` with the bindings of `nodes`. */
export function replaySteps(
  plan: CachedPlan,
  nodes: readonly CapturedNode[],
  target: PlanTarget,
  from: number,
  to: number,
): void {
  const steps = plan.steps;
  for (let i = from; i < to; i++) {
    const st = steps[i];
    if (st === BARRIER_STEP) target.memoryBarrier();
    else target.dispatch(planDescriptor(st, nodes));
  }
}
