/**
 * The plan cache: a recorded pass whose topology equals one optimised before replays the cached,
 * optimised command stream (fusion, reorder, barrier placement and the dual-buffer split are skipped)
 * and takes only its bindings from the new pass.
 *
 * The key (a pass's topology) is, per node in order: barrier, or dispatch with its pipeline,
 * dispatch kind, grid, threadgroup, threadgroup memory, per slot the bound buffer's allocation (its
 * native handle, which names one live allocation) and byte range (or the inline constants' byte
 * length, or nothing), its op kind where it differs from the contract's, and its read and write
 * ranges when the user added any (otherwise they follow from the pipeline's contract and the
 * bindings); plus the finish options that shape the optimisation (fuse, reorder, dual buffer) and
 * where the session placed barriers automatically (its setting, and where it changed; those barriers
 * are not recorded: they follow from the rest of the key). The first part is exactly the capture's stream words (SET_PIPELINE
 * only where the pipeline changes) with the constants' values masked out. Every
 * decision of the passes depends only on these, never on constant values, so a replay with new
 * constants is what a fresh optimisation would produce. What may differ between hits: the values of
 * inline constants, and which buffer object views a given allocation range.
 *
 * @module
 */

import type { Capture } from "./capture_recorder.ts";
import { CommandTemplate, constantSites, type PatchSites, type TemplateHost } from "./command_template.ts";
import { writeDispatch } from "./dispatch_writer.ts";
import type { Binding, Dims, DispatchDescriptor, DispatchKind } from "./encoder.ts";
import { MlxError } from "./errors.ts";
import type { Pipeline } from "./kernels.ts";
import { compareBytes } from "./compare_bytes.ts";
import { KEY_FREE, LEN_SHIFT, Op, OP_MASK, PATCH_WORDS, SLOT_SHIFT, Status, UNLIKE } from "./native/abi.ts";
import type { NativeSymbols } from "./native/ffi.ts";
import { anyLoadedSymbols } from "./native/loader.ts";
import { codeOf, lastErrorText } from "./native/status.ts";
import { StreamWriter } from "./native/stream.ts";
import type { GraphEncodeTarget } from "./graph/compute_graph.ts";
import type { CapturedNode, PipelineRef } from "./graph/nodes.ts";
import type { MemRange } from "./graph/ranges.ts";

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
  readonly sources: readonly number[];
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
  /**
   * The optimised stream itself, one records per command buffer, when every binding and constant was
   * traced to the capture (else null: the steps are replayed through the encoder).
   */
  readonly records: readonly PlanRecords[] | null;
}

/**
 * One command buffer of a plan: its stream words as a fresh encoder would write them, replayed by
 * copying; only the inline constants are patched from the new pass's capture (bindings are part of
 * the key).
 */
export interface PlanRecords {
  /** The stream words. */
  readonly words: Uint32Array;
  /** The same memory as bytes, as the native library takes a stream. */
  readonly bytes: Uint8Array;
  /** Triples (word in `words`, word in the capture, count): where each constant's value comes from. */
  readonly patches: Int32Array;
  /** Dispatches per concurrent group (a barrier between each two). */
  readonly groupSizes: Int32Array;
  /** Dispatches. */
  readonly dispatches: number;
  /** Pipeline handle of the last dispatch. */
  readonly lastPipeline: number;
  /**
   * The records decoded once and replayed by copying (see {@link hitTemplate}); constants that
   * change later are patched at the replay.
   */
  template: PlanTemplate | null;
  /** Hits in a row whose constants changed in no more words than a template patches. */
  unchangedHits: number;
  /** Constant words changed since the last hit (while no template is live). */
  changedWords: number;
  /**
   * Where its template keeps its patch list, set when the plan is cached: views of arrays shared by
   * the plan's records, which the key comparison writes natively (see {@link PlanTemplate}).
   */
  patchSlots?: PatchSlots;
}

/**
 * A template's patch list and the index of each records word's value in it, as views of arrays one
 * plan's records share (each records' views cover its own words and its own bound of entries).
 */
export interface PatchSlots {
  /** Per records word: the index of its value in `all` (-1: none, the template takes no entry for it). */
  readonly valueAt: Int32Array;
  /** The plan's patch array. */
  readonly all: Uint32Array;
  /** Where this records' patch list starts in `all` (its length: PATCH_WORDS × the bound). */
  readonly base: number;
}

/**
 * The most constant words a plan's template patches at a replay: one per dispatch (at least 16).
 * Copying a decoded dispatch costs about 40% of decoding it again (CPU backend, 800 axpby
 * dispatches: 12 µs against 30 µs); patching its one changed word costs about 10 ns more natively
 * (the dispatch validated again) and a few ns in the key comparison that keeps the patch list. At
 * two words per dispatch the replay costs what decoding does, so one is the bound.
 */
export function maxPlanPatchWords(dispatches: number): number {
  return Math.max(16, dispatches);
}

/**
 * @ignore Internal: the template of one plan records, whose patch list the key comparison keeps up
 * to date as it writes changed constants into the records: one entry per word changed since
 * decoding, holding its current value ({@link PlanTemplate.valueAt} says where), so a replay takes
 * the list as it stands.
 */
export class PlanTemplate extends CommandTemplate {
  /** The patch list's words (entries of {@link PATCH_WORDS}: dispatch, slot, byte offset, value). */
  readonly patch: Uint32Array;
  /**
   * Per records word: the index of its value in the plan's patch array (`slots.all`; the template's
   * own patch list when made without slots), or -1 (no entry yet).
   */
  readonly valueAt: Int32Array;
  readonly #all: Uint32Array;
  readonly #base: number;
  readonly #words: Uint32Array;
  readonly #sites: PatchSites;
  readonly #bound: number;
  readonly #entryWord: Int32Array; // per entry: the records word whose value it holds
  #entries = 0;

  /**
   * Decodes `records` (with the constants they hold now) on `host`; its patch list goes into
   * `slots` (the records' own, by default), else into arrays of its own.
   */
  constructor(host: TemplateHost, records: PlanRecords, slots: PatchSlots | undefined = records.patchSlots) {
    super(host, records);
    this.#words = records.words;
    this.#sites = constantSites(records.words);
    this.#bound = maxPlanPatchWords(records.dispatches);
    this.#entryWord = new Int32Array(this.#bound);
    const size = PATCH_WORDS * this.#bound;
    if (slots !== undefined && slots.valueAt.length === records.words.length && slots.all.length >= slots.base + size) {
      this.#all = slots.all;
      this.#base = slots.base;
      this.valueAt = slots.valueAt.fill(-1);
    } else {
      this.#all = new Uint32Array(size);
      this.#base = 0;
      this.valueAt = new Int32Array(records.words.length).fill(-1);
    }
    this.patch = this.#all.subarray(this.#base, this.#base + size);
  }

  /**
   * Word `index` of the records (an inline constant) now holds a value that may differ from what was
   * decoded: the next replay patches it to that value. False when it cannot be patched (not a whole
   * constant word, or the bound reached): drop the template then.
   */
  override wordChanged(index: number): boolean {
    let v = this.valueAt[index]!;
    if (v < 0) {
      const k = this.#sites.dispatch[index]!;
      if (k < 0 || this.#entries === this.#bound) return false;
      // Entries stay in dispatch order (usually appended), so that the native replay validates each
      // patched dispatch right after its entries: one after a dispatch past k moves up.
      const patch = this.patch, entryWord = this.#entryWord;
      let e = this.#entries++;
      for (; e > 0 && patch[PATCH_WORDS * (e - 1)]! > k; e--) {
        patch.copyWithin(PATCH_WORDS * e, PATCH_WORDS * (e - 1), PATCH_WORDS * e);
        const moved = entryWord[e] = entryWord[e - 1]!;
        this.valueAt[moved] = this.#base + PATCH_WORDS * e + 3;
      }
      const o = PATCH_WORDS * e, so = this.#sites.slotOffset[index]!;
      patch[o] = k;
      patch[o + 1] = so >>> 16;
      patch[o + 2] = so & 0xffff;
      entryWord[e] = index;
      v = this.valueAt[index] = this.#base + o + 3;
    }
    this.#all[v] = this.#words[index]!;
    return true;
  }

  /** Frees the native template; its records words take no patch entries any more. */
  override dispose(): void {
    super.dispose();
    this.valueAt.fill(-1);
  }

  /** The patch list (entries of the words changed since decoding, current values) and its length in words. */
  override patchList(): [Uint32Array, number] {
    return [this.patch, this.#entries * PATCH_WORDS];
  }
}

/**
 * The template to replay `r` through on a hit, or null (the records are then encoded): made at a
 * hit that finds the records as the hit before left them, or at the third hit in a row whose
 * constants changed in few enough words to patch, so a pass whose constants change in more words
 * every time never pays for one. Once made, constants that change are patched at the replay (up to
 * a bound; past it the template goes and is made again).
 */
export function hitTemplate(host: TemplateHost, r: PlanRecords): CommandTemplate | null {
  if (r.template?.ptr) return r.template;
  const changed = r.changedWords;
  r.changedWords = 0;
  if (changed > maxPlanPatchWords(r.dispatches)) {
    r.unchangedHits = 0;
    return null;
  }
  const hits = ++r.unchangedHits;
  if (hits < (changed === 0 ? 2 : 3)) return null;
  r.template = new PlanTemplate(host, r);
  return r.template;
}

/** Drops a records' template: made again once its records repeat. */
function forgetTemplate(r: PlanRecords): void {
  r.template?.dispose();
  r.template = null;
  r.unchangedHits = 0;
}

/** Drops the templates of a plan that left the cache. */
function forgetTemplates(records: readonly PlanRecords[] | null | undefined): void {
  if (records) { for (const r of records) forgetTemplate(r); }
}

/** The live template of `r`, if any (one dropped natively is forgotten). */
function liveTemplate(r: PlanRecords | undefined): PlanTemplate | null {
  const t = r?.template ?? null;
  if (t === null || t.ptr !== null) return t;
  forgetTemplate(r!);
  return null;
}

/**
 * Word `at` of `r` (a constant) took a value its template holds no patch entry for: it takes one, or
 * goes. False when it went.
 */
function templateTook(r: PlanRecords, t: PlanTemplate, at: number): boolean {
  if (t.wordChanged(at)) return true;
  forgetTemplate(r);
  return false;
}

/** {@link PlanRecords.changedWords} after a template was dropped: above any bound. */
const TEMPLATE_DROPPED = 2 ** 31;

/** Where a plan's dispatches and barriers go: a CommandEncoder. */
export interface PlanTarget {
  /** Encodes one dispatch. */
  dispatch(d: DispatchDescriptor): void;
  /** Issues a barrier. */
  memoryBarrier(): void;
}

const MAX_SLOTS = 256;
// Unrecorded topologies remembered per shape (see PlanCache.shouldRecord).
const SIGHTINGS_PER_SHAPE = 4;

/**
 * A recorded pass's topology key: the capture's stream words (pipeline, buffer handle and byte
 * range per slot, inline-constant byte lengths, threadgroup memory, geometry, barriers) with the
 * inline constants' values left out, plus, as numbers in a reusable array, the finish flags, the op
 * kinds that differ from their contracts' and the ranges the user added. Strings are interned.
 */
export class Fingerprint {
  #extra = new Float64Array(64);
  #len = 0;
  #hash = 0;
  #capture: Capture | null = null;
  readonly #names = new Map<string, number>();
  #changed = new Uint32Array(0); // records words a key comparison wrote (mlxn_key_compare's list)
  readonly #counted = new Uint32Array(1);

  /** Extra numbers written. */
  get length(): number {
    return this.#len;
  }

  /** 32-bit hash of the key. */
  get hash(): number {
    return this.#hash;
  }

  /** The extra numbers (a view; copy to keep). */
  view(): Float64Array {
    return this.#extra.subarray(0, this.#len);
  }

  /** The capture last fingerprinted. */
  get capture(): Capture {
    return this.#capture!;
  }

  /** Fingerprints `capture` under `flags` (the finish options that shape the optimisation). */
  compute(capture: Capture, flags: number): void {
    this.#capture = capture;
    this.#len = 0;
    this.#push(flags);
    this.#push(capture.autoBarriers ? 1 : 0); // its barriers follow from the rest of the key
    const changes = capture.autoChanges; // and where the setting changed
    this.#push(changes.length);
    for (let i = 0; i < changes.length; i++) this.#push(changes[i]!);
    this.#push(capture.nodeCount);
    if (capture.opKinds.size > 0) {
      for (const [i, kind] of capture.opKinds) {
        this.#push(i);
        this.#push(this.#intern(kind));
      }
    }
    this.#push(-1);
    if (capture.annotated.size > 0) {
      for (const [i, n] of capture.annotated) {
        this.#push(i);
        this.#push(this.#intern(n.opKind));
        this.#ranges(n.reads);
        this.#ranges(n.writes);
      }
    }
    // The hash covers the shape only (sizes and extra numbers): equal keys are then told apart by
    // one exact comparison, which needs no walk over the records.
    let h = 0x811c9dc5;
    h = Math.imul(h ^ capture.length, 0x01000193);
    for (let i = 0; i < this.#len; i++) h = Math.imul(h ^ (this.#extra[i]! | 0), 0x01000193);
    this.#hash = h;
  }

  /**
   * Whether the stored key is the last computation's: its extra numbers, and its capture words equal
   * to the new capture's except at inline-constant values, compared in one native call
   * (`mlxn_key_compare`: the words at memory speed, the key's map telling constants from the rest).
   * Sound without parsing the new words: every word but a constant's value is compared, headers
   * included, so equal headers from the first word on make every record the same length and the
   * constant values lie at the same places in both. On a hit, each constant that differs was copied
   * into the key and, where the key's map says so, into the plan's records (the key always holds the
   * records' constants); here the records' live templates take the changed words into their patch
   * lists. On a miss nothing was copied: the key and its records stay a consistent pair. Allocates
   * nothing once its scratch list is as long as the largest key's constants.
   */
  equals(key: Sighting, records: readonly PlanRecords[] | null | undefined): boolean {
    const n = this.#len, extra = key.extra;
    if (extra.length !== n) return false;
    const x = this.#extra;
    for (let i = 0; i < n; i++) if (x[i] !== extra[i]) return false;
    const c = this.#capture!, stored = key.words, length = stored.length;
    if (c.length !== length) return false;
    // The same pass with the same constants (a state-driven step): memcmp says so fastest (and stops
    // at the first difference otherwise); the records hold these constants already.
    const bytes = 4 * length;
    if (compareBytes.call(c.bytes, key.bytes, 0, bytes, 0, bytes) === 0) return true;
    let changed = this.#changed;
    if (changed.length < key.constantCount) changed = this.#changed = new Uint32Array(key.constantCount);
    // A template dropped natively gives its slots back first: its words are then counted, not patched.
    if (records) { for (let i = 0; i < records.length; i++) liveTemplate(records[i]); }
    const counted = this.#counted;
    const rc = keyCompare(c.words, stored, length, key, changed, counted);
    if (rc === UNLIKE) return false;
    if (rc !== Status.OK) throw new MlxError(codeOf(rc), `plan cache key comparison: ${keyCompareError()}`);
    const nc = counted[0]!;
    if (nc > 0 && records) tookChanged(records, changed, nc);
    return true;
  }

  #ranges(list: readonly MemRange[]): void {
    this.#push(list.length);
    for (let i = 0; i < list.length; i++) {
      const r = list[i]!;
      this.#push(r[0]);
      this.#push(r[1]);
      this.#push(r[2]);
    }
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
    if (this.#len === this.#extra.length) {
      const w = new Float64Array(this.#extra.length * 2);
      w.set(this.#extra);
      this.#extra = w;
    }
    this.#extra[this.#len++] = v;
  }
}

/**
 * A topology key: the capture's words, which of them hold inline-constant values and where each
 * one's value goes on a hit, and the extra numbers. The words are mutable: a hit leaves the pass's
 * constants in them.
 */
export interface Sighting {
  /** The capture's words (their inline constants: those last written into the records). */
  readonly words: Uint32Array;
  /** The same memory as bytes. */
  readonly bytes: Uint8Array;
  /** Bit `i % 32` of word `i >>> 5`: word `i` of `words` holds an inline constant's value. */
  readonly constantBits: Uint32Array;
  /**
   * Per constant word (`mlxn_key_compare`'s map): KEY_FREE (the records do not take it) or the word
   * of {@link Sighting.recordWords} that takes its value.
   */
  readonly map: Uint32Array;
  /** Words of `words` that hold inline-constant values. */
  readonly constantCount: number;
  /** The plan's records words, both command buffers' in one array (empty for a key without records). */
  readonly recordWords: Uint32Array;
  /** Per word of `recordWords`: the index of its value in `patch`, or -1 (no template entry). */
  readonly valueAt: Int32Array;
  /** The patch lists of the records' templates (see {@link PatchSlots}). */
  readonly patch: Uint32Array;
  /** The key's extra numbers. */
  readonly extra: Float64Array;
}

const NO_WORDS = new Uint32Array(0);
const NO_SLOTS = new Int32Array(0);

/**
 * The key of the last fingerprinted capture, copied, with its constants mapped into `records`
 * (from their patch lists; the records of both command buffers must share one array, as
 * {@link sharedRecords} makes them); null when a capture word would feed two record words (the
 * records then cannot be patched while comparing).
 */
function keyOf(fp: Fingerprint, records: readonly PlanRecords[] | null | undefined): Sighting | null {
  const c = fp.capture, words = c.words.slice(0, c.length);
  const map = new Uint32Array(words.length).fill(KEY_FREE);
  const constantBits = new Uint32Array((words.length + 31) >>> 5);
  let constantCount = 0;
  for (let i = 0; i < words.length;) {
    const h = words[i]!, len = h >>> LEN_SHIFT;
    if ((h & OP_MASK) === Op.SET_BYTES) {
      for (let k = i + 2; k < i + len; k++) constantBits[k >>> 5]! |= 1 << (k & 31);
      constantCount += len - 2;
    }
    i += len;
  }
  let base = 0;
  for (const r of records ?? []) {
    const p = r.patches;
    for (let i = 0; i < p.length; i += 3) {
      const to = p[i]!, from = p[i + 1]!, n = p[i + 2]!;
      for (let k = 0; k < n; k++) {
        const at = from + k;
        if (((constantBits[at >>> 5]! >>> (at & 31)) & 1) === 0 || map[at] !== KEY_FREE) return null;
        map[at] = base + to + k;
      }
    }
    base += r.words.length;
  }
  const first = records?.[0], slots = first?.patchSlots;
  const recordWords = first === undefined
    ? NO_WORDS
    : new Uint32Array(first.words.buffer, first.words.byteOffset, base);
  const valueAt = slots === undefined ? NO_SLOTS : new Int32Array(slots.valueAt.buffer, slots.valueAt.byteOffset, base);
  const patch = slots?.all ?? NO_WORDS;
  const bytes = new Uint8Array(words.buffer, words.byteOffset, words.byteLength);
  return { words, bytes, constantBits, map, constantCount, recordWords, valueAt, patch, extra: fp.view().slice() };
}

/**
 * `records` with their words in one array, the first command buffer's then the second's, and their
 * patch slots in arrays they share: a key comparison writes them all natively through one map.
 */
function sharedRecords(records: readonly PlanRecords[]): readonly PlanRecords[] {
  let total = 0, entries = 0;
  for (const r of records) {
    total += r.words.length;
    entries += PATCH_WORDS * maxPlanPatchWords(r.dispatches);
  }
  const all = records.length === 1 ? records[0]!.words : new Uint32Array(total);
  const valueAt = new Int32Array(total).fill(-1), patch = new Uint32Array(entries);
  let at = 0, base = 0;
  return records.map((r) => {
    const n = r.words.length, words = records.length === 1 ? r.words : all.subarray(at, at + n);
    if (words !== r.words) words.set(r.words);
    const patchSlots = { valueAt: valueAt.subarray(at, at + n), all: patch, base };
    at += n;
    base += PATCH_WORDS * maxPlanPatchWords(r.dispatches);
    r.template?.dispose();
    const bytes = new Uint8Array(all.buffer, words.byteOffset, words.byteLength);
    return { ...r, words, bytes, patchSlots, template: null, unchangedHits: 0, changedWords: 0 };
  });
}

/**
 * The records words `changed[0..n)` (counted over both command buffers) took new values that no
 * template's patch list holds yet: each records' live template takes an entry for them (and goes
 * past its bound); records without a live template count them for {@link hitTemplate}.
 */
function tookChanged(records: readonly PlanRecords[], changed: Uint32Array, n: number): void {
  const p0 = records[0]!, p1 = records[1], split = p0.words.length;
  let t0 = liveTemplate(p0), t1 = liveTemplate(p1);
  if (t0 === null && p1 === undefined) {
    p0.changedWords += n;
    return;
  }
  let n0 = 0, n1 = 0;
  for (let i = 0; i < n; i++) {
    const t = changed[i]!;
    if (t < split) {
      if (t0 === null) n0++;
      else if (!templateTook(p0, t0, t)) {
        t0 = null;
        n0 = TEMPLATE_DROPPED;
      }
    } else if (t1 === null) n1++;
    else if (!templateTook(p1!, t1, t - split)) {
      t1 = null;
      n1 = TEMPLATE_DROPPED;
    }
  }
  if (n0 > 0) p0.changedWords += n0;
  if (n1 > 0) p1!.changedWords += n1;
}

let keySymbols: NativeSymbols | null = null;

/** `mlxn_key_compare` of a library loaded in this process (a capture exists only once a device does). */
function keyCompare(
  now: Uint32Array,
  words: Uint32Array,
  n: number,
  key: Sighting,
  changed: Uint32Array,
  counted: Uint32Array,
): number {
  const sym = keySymbols ??= anyLoadedSymbols();
  if (sym === null) throw new MlxError("InvalidState", "no native library is loaded: open a device first");
  const records = key.recordWords, patch = key.patch;
  return sym.mlxn_key_compare(
    now,
    words,
    n,
    key.constantBits,
    key.map,
    records,
    records.length,
    key.valueAt,
    patch,
    patch.length,
    changed,
    changed.length,
    counted,
  );
}

function keyCompareError(): string {
  return keySymbols === null ? "no native library" : lastErrorText(keySymbols);
}

interface Entry extends Sighting {
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
  // Topologies that missed without being recorded (see shouldRecord), at most `capacity`.
  readonly #seenByHash = new Map<number, Sighting[]>();
  readonly #seenLru = new Map<Sighting, number>();
  #hits = 0;
  #misses = 0;

  /** A cache holding at most `capacity` plans (0 holds none). */
  constructor(capacity: number) {
    this.capacity = capacity;
  }

  /** @ignore The plan for the fingerprinted topology, or undefined (counted as a hit or a miss). */
  lookup(fp: Fingerprint): CachedPlan | undefined {
    const list = this.#byHash.get(fp.hash);
    if (list !== undefined) {
      for (const e of list) {
        if (!fp.equals(e, e.plan.records)) continue;
        this.#lru.delete(e);
        this.#lru.set(e, fp.hash);
        this.#hits++;
        return e.plan;
      }
    }
    this.#misses++;
    return undefined;
  }

  /**
   * @ignore Stores a plan for the fingerprinted topology, evicting the least recently used beyond
   * capacity. Its records (if any) take the constants of later hits while their keys are compared.
   */
  store(fp: Fingerprint, plan: CachedPlan): void {
    if (this.capacity === 0) return;
    if (plan.records) plan = { ...plan, records: sharedRecords(plan.records) };
    let key = keyOf(fp, plan.records);
    if (key === null) { // cannot happen with the passes as they are; replayed through the steps then
      plan = { ...plan, records: null };
      key = keyOf(fp, null)!;
    }
    const e: Entry = { ...key, plan };
    const list = this.#byHash.get(fp.hash);
    if (list) list.push(e);
    else this.#byHash.set(fp.hash, [e]);
    this.#lru.set(e, fp.hash);
    while (this.#lru.size > this.capacity) {
      const [old, hash] = this.#lru.entries().next().value!;
      this.#lru.delete(old);
      forgetTemplates(old.plan.records);
      const l = this.#byHash.get(hash)!;
      l.splice(l.indexOf(old), 1);
      if (l.length === 0) this.#byHash.delete(hash);
    }
  }

  /**
   * @ignore Whether a pass that just missed should have its optimised plan recorded and stored.
   * Yes for a topology whose shape (the key's hash: sizes, flags, annotations) has no plan yet, and
   * for one seen before; no for a new topology of a known shape, which is remembered instead — so a
   * pass whose ranges change every time (a K/V-cache write moving by one row per token) pays for
   * recording once, not on every pass, and a topology that repeats hits from its third pass on.
   */
  shouldRecord(fp: Fingerprint): boolean {
    if (this.capacity === 0) return false;
    const hash = fp.hash, seen = this.#seenByHash.get(hash);
    if (seen === undefined && !this.#byHash.has(hash)) return true;
    if (seen !== undefined) {
      for (const e of seen) {
        if (!fp.equals(e, null)) continue;
        this.#forgetSeen(e, hash);
        return true;
      }
    }
    const e = keyOf(fp, null)!;
    if (seen) {
      // A few per shape bound the comparisons a miss costs.
      if (seen.length === SIGHTINGS_PER_SHAPE) this.#forgetSeen(seen[0]!, hash);
      seen.push(e);
    } else this.#seenByHash.set(hash, [e]);
    this.#seenLru.set(e, hash);
    while (this.#seenLru.size > this.capacity) {
      const [old, h] = this.#seenLru.entries().next().value!;
      this.#forgetSeen(old, h);
    }
    return false;
  }

  #forgetSeen(e: Sighting, hash: number): void {
    this.#seenLru.delete(e);
    const l = this.#seenByHash.get(hash)!;
    l.splice(l.indexOf(e), 1);
    if (l.length === 0) this.#seenByHash.delete(hash);
  }

  /** Forgets every plan and every topology seen (the counts stay). */
  clear(): void {
    for (const e of this.#lru.keys()) forgetTemplates(e.plan.records);
    this.#byHash.clear();
    this.#lru.clear();
    this.#seenByHash.clear();
    this.#seenLru.clear();
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
  readonly #nodes: readonly CapturedNode[];
  // A dispatch issued with a captured node's own bindings array (every node no pass rewrote) takes
  // its sources from that node, slot by slot; only others (fused dispatches) look each binding up.
  readonly #nodeOf = new Map<readonly Binding[], number>();
  #sourceOf: Map<object, number> | null = null;

  /** A recorder for an encode of `nodes` (the captured nodes, before any pass). */
  constructor(nodes: readonly CapturedNode[]) {
    this.#nodes = nodes;
    for (let i = 0; i < nodes.length; i++) {
      const n = nodes[i]!;
      if (n.kind !== "dispatch" || n.bindings === undefined) continue;
      if (n.bindings.length > MAX_SLOTS) this.traceable = false;
      this.#nodeOf.set(n.bindings, i);
    }
  }

  /** The first captured node and slot binding each object (built on first need). */
  #sources(): Map<object, number> {
    if (this.#sourceOf !== null) return this.#sourceOf;
    const map = new Map<object, number>(), nodes = this.#nodes;
    for (let i = 0; i < nodes.length; i++) {
      const n = nodes[i]!;
      if (n.kind !== "dispatch" || n.bindings === undefined) continue;
      for (let s = 0; s < n.bindings.length; s++) {
        const b = n.bindings[s];
        if (typeof b === "object" && !map.has(b)) map.set(b, i * MAX_SLOTS + s);
      }
    }
    return this.#sourceOf = map;
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
    // A plain array: a typed array costs ~0.7 µs to create in Deno, more than the rest of a step.
    const sources: number[] = [], bindings = d.bindings, node = this.#nodeOf.get(bindings);
    if (node !== undefined) {
      for (let s = 0; s < bindings.length; s++) sources.push(bindings[s] === undefined ? -1 : node * MAX_SLOTS + s);
    } else {
      const sourceOf = this.#sources();
      for (let s = 0; s < bindings.length; s++) {
        const b = bindings[s];
        if (b === undefined) {
          sources.push(-1);
          continue;
        }
        const src = sourceOf.get(b);
        if (src === undefined) this.traceable = false;
        sources.push(src ?? -1);
      }
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
    const k = src[s]!;
    if (k < 0) continue;
    const node = nodes[(k / MAX_SLOTS) | 0]!;
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
  plan: Pick<CachedPlan, "steps">,
  nodes: readonly CapturedNode[],
  target: PlanTarget,
  from: number,
  to: number,
): void {
  const steps = plan.steps;
  for (let i = from; i < to; i++) {
    const st = steps[i]!;
    if (st === BARRIER_STEP) target.memoryBarrier();
    else target.dispatch(planDescriptor(st, nodes));
  }
}

// The writer and word store of the last finished RecordsBuilder, for the next one (a builder
// that is never finished keeps its own).
let spareBuilder: { readonly writer: StreamWriter; readonly store: Uint32Array } | null = null;

/**
 * A graph encode target that writes the stream words an encoder would write (one command buffer,
 * first dispatch tagged 0), so that they can be cached and replayed by copying.
 */
export class RecordsBuilder implements GraphEncodeTarget {
  // Borrowed from the spare below and handed back by finish(): a writer is 256 KiB to create.
  readonly #writer: StreamWriter = spareBuilder?.writer ?? new StreamWriter();
  #store: Uint32Array = spareBuilder?.store ?? new Uint32Array(4096);
  #stored = 0;
  #pipeline = 0;
  #dispatches = 0;
  #groupSize = 0;
  readonly #groups: number[] = [];
  readonly #cuts: number[] = [];
  readonly #resolve: (ref: PipelineRef) => Pipeline;
  readonly #check: (d: DispatchDescriptor) => void;

  /** A builder resolving pipelines with `resolve`; `check` throws what is wrong with a descriptor. */
  constructor(resolve: (ref: PipelineRef) => Pipeline, check: (d: DispatchDescriptor) => void) {
    spareBuilder = null;
    this.#resolve = resolve;
    this.#check = check;
    this.#writer.attach((_bytes, byteLength) => this.#spill(byteLength >>> 2));
  }

  /** Writes one dispatch. */
  dispatch(d: DispatchDescriptor): void {
    const w = this.#writer;
    if (!writeDispatch(w, d, this.#pipeline, this.#dispatches)) {
      this.#check(d);
      throw new MlxError("InvalidArgument", `${d.pipeline.name}: the dispatch could not be encoded`);
    }
    this.#pipeline = d.pipeline.handle;
    this.#dispatches++;
    this.#groupSize++;
    this.#cuts.push(this.#stored + w.pos);
  }

  /** Writes a barrier (none before the first dispatch, as an encoder does). */
  memoryBarrier(): void {
    const w = this.#writer;
    if (this.#dispatches > 0) {
      w.reserve(1);
      w.barrier();
      this.#groups.push(this.#groupSize);
      this.#groupSize = 0;
    }
    this.#cuts.push(this.#stored + w.pos);
  }

  /** Not supported: a cached stream is one command buffer. */
  commit(): void {
    throw new MlxError("InvalidState", "a plan's records are one command buffer");
  }

  /** Resolves a pipeline reference. */
  resolvePipeline(ref: PipelineRef): Pipeline {
    return this.#resolve(ref);
  }

  /**
   * The records, with the constants of each step traced to `capture` through the plan `steps` (the
   * same dispatches, recorded by a PlanRecorder); null when a constant cannot be traced.
   */
  finish(steps: readonly (PlanDispatch | null)[], capture: Capture): PlanRecords | null {
    this.#writer.flush();
    this.#writer.attach(undefined);
    const words = this.#store.slice(0, this.#stored);
    spareBuilder = { writer: this.#writer, store: this.#store };
    const cuts = Int32Array.from(this.#cuts);
    if (cuts.length !== steps.length) return null;
    const patches: number[] = [];
    for (let k = 0; k < steps.length; k++) {
      const st = steps[k];
      if (!st) continue;
      for (let at = k > 0 ? cuts[k - 1]! : 0, end = cuts[k]!; at < end;) {
        const h = words[at]!, len = h >>> LEN_SHIFT;
        if ((h & OP_MASK) === Op.SET_BYTES) {
          const src = st.sources[(h >>> SLOT_SHIFT) & OP_MASK];
          if (src === undefined || src < 0) return null;
          const from = capture.constantOffset((src / MAX_SLOTS) | 0, src % MAX_SLOTS);
          if (from < 0 || capture.words[from]! >>> LEN_SHIFT !== len) return null;
          patches.push(at + 2, from + 2, len - 2);
        }
        at += len;
      }
    }
    return {
      words,
      bytes: new Uint8Array(words.buffer, words.byteOffset, words.byteLength),
      patches: Int32Array.from(patches),
      groupSizes: Int32Array.from([...this.#groups, this.#groupSize]),
      dispatches: this.#dispatches,
      lastPipeline: this.#pipeline,
      template: null,
      unchangedHits: 0,
      changedWords: 0,
    };
  }

  #spill(n: number): void {
    let s = this.#store;
    if (this.#stored + n > s.length) {
      const g = new Uint32Array(Math.max(s.length * 2, this.#stored + n));
      g.set(s.subarray(0, this.#stored));
      this.#store = s = g;
    }
    s.set(this.#writer.words.subarray(0, n), this.#stored);
    this.#stored += n;
  }
}
