/**
 * Command templates: a pass's finished command stream decoded and validated once, into a native
 * command buffer that is never committed, then copied into a fresh command buffer for each run
 * (`mlxn_cmdbuf_replay`) without being decoded again. A frozen pass replays through them.
 *
 * A template references every buffer its stream binds (as any uncommitted command buffer does), so
 * a freed buffer's memory would wait for the template to go: when a buffer is freed, the device
 * drops every template that binds it ({@link dropTemplatesBinding}); whoever held the template then
 * encodes its records instead.
 *
 * @module
 */
import { MlxError } from "./errors.ts";
import { Op, Status } from "./native/abi.ts";
import type { NativeSymbols } from "./native/ffi.ts";
import { codeOf, lastErrorText } from "./native/status.ts";

const OP_MASK = 0xff;
const LEN_SHIFT = 16;

/** The device a template is made on. */
export interface TemplateHost {
  /** Native symbols. */
  readonly sym: NativeSymbols;
  /** Native device pointer; throws Disposed after close. */
  devicePtr(): Deno.PointerObject;
}

/** Finished records of one command buffer, as a plan holds them. */
export interface TemplateRecords {
  /** The stream: whole records, automatic barriers off throughout. */
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
    if (op === Op.SET_BUFFER || op === Op.SET_BUFFER_WHOLE || op === Op.SET_BUFFER64) out.add(w[at + 1]!);
    else if (op === Op.TRACK) { for (let e = at + 1; e < at + len; e += 6) out.add(w[e]!); }
    at += len;
  }
  return out;
}

/**
 * @ignore Internal: one command buffer's records, decoded and validated once by the native library
 * and replayed by copying ({@link CommandEncoder.appendTemplate}). Dropped (`live` false) when a
 * buffer it binds is freed or the device closes; dispose it when its plan goes.
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

  /** Decodes `records` into a new template on `host`; an MlxError when the native library refuses them. */
  constructor(host: TemplateHost, records: TemplateRecords) {
    const sym = host.sym;
    const ptr = sym.mlxn_cmdbuf_new(host.devicePtr());
    if (ptr === null) throw new MlxError("OutOfMemory", `command template: ${lastErrorText(sym)}`);
    const rc = sym.mlxn_cmdbuf_encode(ptr, records.bytes, records.bytes.byteLength);
    if (rc !== Status.OK) {
      const err = new MlxError(codeOf(rc), `command template: ${lastErrorText(sym)}`);
      sym.mlxn_cmdbuf_free(ptr);
      throw err;
    }
    this.groupSizes = records.groupSizes;
    this.dispatches = records.dispatches;
    this.lastPipeline = records.lastPipeline;
    this.#host = host;
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

  /** Frees the native command buffer and its buffer references. Disposing twice is harmless. */
  dispose(): void {
    cleanup.unregister(this);
    freeCell(this.#host, this.#cell);
  }
}
