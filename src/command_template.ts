/**
 * Command templates: a pass's finished command stream decoded and validated once, into a native
 * command buffer that is never committed, then copied into a fresh command buffer for each run
 * (`mlxn_cmdbuf_replay`) without being decoded again; inline constants changed since are patched
 * into the copy and their dispatches validated again (`mlxn_cmdbuf_replay_patched`). Frozen passes,
 * plan-cache hits (src/plan_cache.ts) and the repeated direct passes of a DecodeLoop run
 * ({@link StreamRepeats}) replay through them.
 *
 * A template references every buffer its stream binds (as any uncommitted command buffer does), so
 * a freed buffer's memory would wait for the template to go: when a buffer is freed, the device
 * drops every template that binds it ({@link dropTemplatesBinding}); whoever held the template then
 * encodes its records instead.
 *
 * @module
 */
import { MlxError } from "./errors.ts";
import { isBufferRecord, LEN_SHIFT, Op, OP_MASK, PATCH_WORDS, SLOT_SHIFT, Status, UNLIKE } from "./native/abi.ts";
import type { NativeSymbols } from "./native/ffi.ts";
import { codeOf, lastErrorText } from "./native/status.ts";
import { counterState } from "./counters.ts";

/** The device a template is made on. */
export interface TemplateHost {
  /** Native symbols. */
  readonly sym: NativeSymbols;
  /** Native device pointer; throws Disposed after close. */
  devicePtr(): Deno.PointerObject;
}

/** Finished records of one command buffer, as a plan holds them. */
export interface TemplateRecords {
  /** The stream: whole records. */
  readonly bytes: Uint8Array;
  /** Its words (the same memory). */
  readonly words: Uint32Array;
  /** Dispatches per concurrent group (a barrier between each two). */
  readonly groupSizes: Int32Array;
  /** Dispatches. */
  readonly dispatches: number;
  /** Pipeline handle of the last dispatch. */
  readonly lastPipeline: number;
}

/** What the device's registry holds: the native command buffer and the handles it binds. */
interface TemplateCell {
  readonly sym: NativeSymbols;
  ptr: Deno.PointerObject | null;
  readonly handles: ReadonlySet<number>;
}

// Live templates per device, so that a buffer's free drops those that bind it. Cells, not the
// templates themselves: a template nobody holds is collected and its finalizer frees the cell.
const templatesOf = new WeakMap<object, Set<TemplateCell>>();

function freeCell(host: object, cell: TemplateCell): void {
  const ptr = cell.ptr;
  if (ptr === null) return;
  cell.ptr = null;
  templatesOf.get(host)?.delete(cell);
  cell.sym.mlxn_cmdbuf_free(ptr); // drops its buffer references (a deferred free then completes)
}

const cleanup = new FinalizationRegistry<{ host: object; cell: TemplateCell }>(({ host, cell }) =>
  freeCell(host, cell)
);

/**
 * @ignore Internal: buffer `handle` of `host` was just freed: drop every template that binds it,
 * so that its memory goes now.
 */
export function dropTemplatesBinding(host: object, handle: number): void {
  const set = templatesOf.get(host);
  if (set === undefined || set.size === 0) return;
  for (const cell of set) if (cell.handles.has(handle)) freeCell(host, cell);
}

/** @ignore Internal: the device is closing: drop all its templates. */
export function dropAllTemplates(host: object): void {
  const set = templatesOf.get(host);
  if (set === undefined) return;
  for (const cell of [...set]) freeCell(host, cell);
}

/** Every buffer handle the stream's buffer and TRACK records name. */
function boundHandles(w: Uint32Array): Set<number> {
  const out = new Set<number>();
  for (let at = 0; at < w.length;) {
    const h = w[at]!, op = h & OP_MASK, len = h >>> LEN_SHIFT;
    if (len === 0) break; // malformed: the native decoder has refused it already
    if (isBufferRecord(op)) out.add(w[at + 1]!);
    else if (op === Op.TRACK) { for (let e = at + 1; e < at + len; e += 6) out.add(w[e]!); }
    at += len;
  }
  return out;
}

/**
 * The most constant words a template patches at a replay: one per four dispatches (at least 16, at
 * most 1,024). A patch costs about what decoding its dispatch again saves (JS bookkeeping plus the
 * native validation); past this the template goes and the records are decoded.
 */
function maxPatchedWords(dispatches: number): number {
  return Math.min(1024, Math.max(16, dispatches >> 2));
}

/**
 * @ignore Internal: per word of a stream, where a patch entry puts it once decoded: `dispatch` is the
 * index of the dispatch it reaches (-1: not a whole inline-constant word, or one a later SET_BYTES
 * of the same slot replaces before the dispatch, so that it reaches no kernel), `slotOffset` its
 * `slot << 16 | byte offset`.
 */
export interface PatchSites {
  readonly dispatch: Int32Array;
  readonly slotOffset: Int32Array;
}

/** @ignore Internal: the {@link PatchSites} of stream words `w`. */
export function constantSites(w: Uint32Array): PatchSites {
  const dispatch = new Int32Array(w.length).fill(-1), slotOffset = new Int32Array(w.length);
  const holder = new Int32Array(OP_MASK + 1).fill(-1); // the SET_BYTES record each slot holds now
  let k = 0;
  for (let at = 0; at < w.length;) {
    const h = w[at]!, op = h & OP_MASK, len = h >>> LEN_SHIFT;
    if (len === 0) break;
    if (op === Op.SET_BYTES) {
      const slot = (h >>> SLOT_SHIFT) & OP_MASK, whole = w[at + 1]! >>> 2; // a partial last word is not patched
      const earlier = holder[slot]!;
      if (earlier >= 0) dispatch.fill(-1, earlier + 2, earlier + 2 + (w[earlier + 1]! >>> 2));
      holder[slot] = at;
      for (let q = 0; q < whole; q++) {
        dispatch[at + 2 + q] = k;
        slotOffset[at + 2 + q] = slot << 16 | 4 * q;
      }
    } else if (op === Op.DISPATCH_THREADS || op === Op.DISPATCH_GROUPS) {
      k++;
      holder.fill(-1); // every dispatch carries its complete binding set
    }
    at += len;
  }
  return { dispatch, slotOffset };
}

/**
 * @ignore Internal: one command buffer's records, decoded and validated once by the native library
 * and replayed by copying ({@link CommandEncoder.appendTemplate}). Its records' inline constants
 * may change afterwards ({@link CommandTemplate.wordChanged}): a replay then patches them and the
 * native library validates the patched dispatches again. Dropped (`ptr` null) when a buffer it
 * binds is freed or the device closes; dispose it when its plan goes.
 */
export class CommandTemplate {
  /** Dispatches per concurrent group. */
  readonly groupSizes: Int32Array;
  /** Dispatches. */
  readonly dispatches: number;
  /** Pipeline handle of the last dispatch. */
  readonly lastPipeline: number;
  readonly #host: object;
  readonly #cell: TemplateCell;
  readonly #words: Uint32Array; // the records' words, with their current constants
  #sites: { dispatch: Int32Array; slotOffset: Int32Array } | null = null; // made at the first change
  #changed: number[] = []; // words whose value may differ from the decoded one
  #marked: Uint8Array | null = null;
  #patch = new Uint32Array(0);

  /**
   * Decodes `records` into a new template on `host`; an MlxError when the native library refuses them.
   * With `keepStream` the native template keeps a copy of the stream, so that a stream like it can
   * replay it (`mlxn_cmdbuf_replay_like`).
   */
  constructor(host: TemplateHost, records: TemplateRecords, keepStream = false) {
    const sym = host.sym;
    const ptr = sym.mlxn_cmdbuf_new(host.devicePtr());
    if (ptr === null) throw new MlxError("OutOfMemory", `command template: ${lastErrorText(sym)}`);
    const rc = keepStream
      ? sym.mlxn_cmdbuf_encode_template(ptr, records.bytes, records.bytes.byteLength)
      : sym.mlxn_cmdbuf_encode(ptr, records.bytes, records.bytes.byteLength);
    if (rc !== Status.OK) {
      const err = new MlxError(codeOf(rc), `command template: ${lastErrorText(sym)}`);
      sym.mlxn_cmdbuf_free(ptr);
      throw err;
    }
    this.groupSizes = records.groupSizes;
    this.dispatches = records.dispatches;
    this.lastPipeline = records.lastPipeline;
    this.#host = host;
    this.#words = records.words;
    this.#cell = { sym, ptr, handles: boundHandles(records.words) };
    let set = templatesOf.get(host);
    if (set === undefined) templatesOf.set(host, set = new Set());
    set.add(this.#cell);
    cleanup.register(this, { host, cell: this.#cell }, this);
  }

  /** The native command buffer to replay; null once dropped or disposed. */
  get ptr(): Deno.PointerObject | null {
    return this.#cell.ptr;
  }

  /**
   * Word `index` of the records (an inline-constant value) now differs from what was decoded: later
   * replays patch it. False when it cannot be patched (not a whole constant word, or too many
   * changed already): drop the template then.
   */
  wordChanged(index: number): boolean {
    const sites = this.#sites ??= constantSites(this.#words);
    if (sites.dispatch[index]! < 0) return false;
    const marked = this.#marked ??= new Uint8Array(this.#words.length);
    if (marked[index] === 0) {
      if (this.#changed.length >= maxPatchedWords(this.dispatches)) return false;
      marked[index] = 1;
      this.#changed.push(index);
    }
    return true;
  }

  /**
   * The patch list of the constants changed since decoding, with their current values, and its
   * length in words (0: replay as decoded). The array is reused by the next call.
   */
  patchList(): [Uint32Array, number] {
    const changed = this.#changed, n = changed.length;
    if (n === 0) return [this.#patch, 0];
    if (this.#patch.length < n * PATCH_WORDS) this.#patch = new Uint32Array(n * PATCH_WORDS * 2);
    const out = this.#patch, { dispatch, slotOffset } = this.#sites!, w = this.#words;
    for (let i = 0, o = 0; i < n; i++, o += PATCH_WORDS) {
      const at = changed[i]!, so = slotOffset[at]!;
      out[o] = dispatch[at]!;
      out[o + 1] = so >>> 16;
      out[o + 2] = so & 0xffff;
      out[o + 3] = w[at]!;
    }
    return [out, n * PATCH_WORDS];
  }

  /** Frees the native command buffer and its buffer references. Disposing twice is harmless. */
  dispose(): void {
    cleanup.unregister(this);
    freeCell(this.#host, this.#cell);
  }
}

/** Stream lengths remembered (a decode loop alternates few distinct passes). */
const REPEAT_ENTRIES = 4;
/** Templates of one length remade without a replay in between before that length rests. */
const REPEAT_REMAKES = 4;
/** Passes of that length then encoded without a template. */
const REPEAT_BACKOFF = 64;

const NO_GROUPS = new Int32Array(0);

/** What is remembered of a stream length. */
interface RepeatEntry {
  readonly byteLength: number;
  template: CommandTemplate | null; // of an earlier stream of this length, which it keeps
  unlike: number; // passes since the last replay that were not like the template
  remakes: number; // templates made since the last replay
  skip: number;
}

/**
 * @ignore Internal: the direct passes of a loop (a DecodeLoop's run, or an executor's sessions begun
 * with `reuse`). From the second pass of a stream length on, the pass replays a template of an
 * earlier one of that length when it differs from it only in what a replay patches: inline
 * constants and the offsets and lengths of buffer views (a token's position in its constants and in
 * the KV-cache rows it writes). The native library compares the streams, patches the copy and
 * validates the patched dispatches again; any other difference decodes the pass. A length whose
 * passes keep differing otherwise rests for a while.
 */
export class StreamRepeats {
  readonly #host: TemplateHost;
  readonly #entries: RepeatEntry[] = []; // most recent first

  /** Remembers the streams of direct passes on `host`. */
  constructor(host: TemplateHost) {
    this.#host = host;
  }

  /**
   * Encodes the whole pass at the start of `bytes` (`byteLength` bytes) into the empty native
   * command buffer `cb` through a template: the native status, or null when the caller must decode
   * the stream itself.
   */
  encodeInto(cb: Deno.PointerObject, bytes: Uint8Array, byteLength: number): number | null {
    const entries = this.#entries;
    let i = 0;
    while (i < entries.length && entries[i]!.byteLength !== byteLength) i++;
    if (i === entries.length) {
      if (entries.length === REPEAT_ENTRIES) entries.pop()!.template?.dispose();
      entries.unshift({ byteLength, template: null, unlike: 0, remakes: 0, skip: 0 });
      return null; // a length seen once: a template is made when it comes again
    }
    const e = entries[i]!;
    if (i > 0) {
      entries.splice(i, 1);
      entries.unshift(e);
    }
    if (e.skip > 0) {
      e.skip--;
      return null;
    }
    const sym = this.#host.sym, template = e.template?.ptr;
    if (template) {
      const rc = sym.mlxn_cmdbuf_replay_like(cb, template, bytes, byteLength);
      if (rc !== UNLIKE) {
        e.unlike = e.remakes = 0;
        if (rc === Status.OK) counterState.passReplays++;
        return rc; // replayed, or refused (cb failed: the status says why)
      }
      // Not like it: the second such pass in a row makes the template anew from the stream (the
      // pass changed for good); a length remade over and over rests.
      if (++e.unlike < 2) return null;
      if (e.remakes >= REPEAT_REMAKES) {
        e.template!.dispose();
        e.template = null;
        e.unlike = e.remakes = 0;
        e.skip = REPEAT_BACKOFF;
        return null;
      }
    }
    e.template?.dispose();
    e.template = null;
    e.unlike = 0;
    e.remakes++;
    try {
      // The words view the caller's buffer: a stream-kept template is never patched through them.
      e.template = new CommandTemplate(this.#host, {
        bytes: bytes.subarray(0, byteLength),
        words: new Uint32Array(bytes.buffer, bytes.byteOffset, byteLength >>> 2),
        groupSizes: NO_GROUPS,
        dispatches: 0,
        lastPipeline: 0,
      }, true);
    } catch {
      return null; // decoding the stream itself reports what is wrong with it, at its offset
    }
    const rc = sym.mlxn_cmdbuf_replay(cb, e.template.ptr!);
    if (rc === Status.OK) counterState.passReplays++;
    return rc;
  }

  /** Drops every remembered stream and template. */
  clear(): void {
    for (const e of this.#entries) e.template?.dispose();
    this.#entries.length = 0;
  }
}

/**
 * @ignore Internal: session options (an object made for one DecodeLoop run) whose sessions' direct
 * encoders use these stream repeats.
 */
export const sessionRepeats: WeakMap<object, StreamRepeats> = new WeakMap();
