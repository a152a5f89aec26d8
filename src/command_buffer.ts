/**
 * The native command buffer behind a CommandEncoder and its lifecycle: the stream writer it borrows
 * from its device, the hand-over of the stream (decoded, or replayed from a template), its state from
 * encoding to completed, failed or disposed, and the release of the native object (at dispose, at
 * device close, or when its encoder is garbage-collected).
 *
 * @module
 */

import { counterState } from "./counters.ts";
import { MlxError } from "./errors.ts";
import type { StreamRepeats } from "./command_template.ts";
import type { KernelRegistry } from "./kernels.ts";
import type { Profiler } from "./profile.ts";
import { Stat, Status } from "./native/abi.ts";
import type { NativeSymbols } from "./native/ffi.ts";
import { codeOf, lastErrorText } from "./native/status.ts";
import type { StreamWriter } from "./native/stream.ts";

/** What an encoder needs from its device (implemented by MlxDevice). */
export interface EncoderHost {
  /** Native symbols. */
  readonly sym: NativeSymbols;
  /** Native device pointer; throws Disposed after close. */
  devicePtr(): Deno.PointerObject;
  /** Whether the device is closed (its command buffers are gone). */
  readonly closed: boolean;
  /** Whether per-dispatch timings are collected. */
  readonly profileDispatches: boolean;
  /** Receives completed command buffers (null: profiling off). */
  readonly profiler: Profiler | null;
  /** The device's kernel registry (resolves pipelines by name). */
  readonly kernels: KernelRegistry;
  /** Whether command encoders validate hazards at commit by default. */
  readonly validate: boolean;
  /** Microseconds a blocking wait polls the command buffer before it sleeps. */
  readonly waitSpinUs: number;
  /** Borrows a stream writer. */
  takeWriter(): StreamWriter;
  /** Returns a writer. */
  returnWriter(w: StreamWriter): void;
  /** Registers a command buffer whose stream may hold unflushed records. */
  commandBufferOpened(cb: CommandBufferSlot): void;
  /** Unregisters it; with `drain`, frees the buffers whose free was deferred. */
  commandBufferClosed(cb: CommandBufferSlot, drain: boolean): void;
}

// mlxn_cmdbuf_barrier_stats' answer: counts, small group sizes, room for some wide groups (grows).
let statsScratch = new Uint32Array(Stat.COUNT + Stat.SMALL_SIZES + 64);

/** Lifecycle state of a CommandEncoder. */
export type EncoderState = "encoding" | "committed" | "completed" | "failed" | "disposed";

/**
 * @ignore Internal: the native command buffer of an encoder, its stream writer and its lifecycle
 * state. The device tracks it (not the encoder) while its stream may hold unflushed records, to
 * flush it before a buffer is freed and to drop it when the device closes; it never references its
 * encoder, so an encoder dropped without commit or dispose stays collectable, and its finalizer
 * releases the command buffer.
 */
export class CommandBufferSlot {
  /** Lifecycle state (the encoder's). */
  state: EncoderState = "encoding";
  /** The native command buffer; null once freed. */
  ptr: Deno.PointerObject | null;
  /** The stream writer while encoding. */
  writer: StreamWriter | null;
  /** Why the command buffer failed (encoding or execution). */
  error: MlxError | null = null;
  /** Waits in flight on another thread (the native command buffer stays until they return). */
  asyncWaits = 0;
  /** @ignore Position in the device's list of open command buffers; -1 when not in it. */
  openIndex = -1;
  /** The native library rejected the stream while it was being encoded (`error` says why). */
  rejected = false;
  /**
   * The native decoder places barriers (AUTO_BARRIERS, or a TRACK with CHECK was written): its
   * counts are read after every chunk and feed the global counters.
   */
  nativeStats = false;
  /** Barriers of the command buffer, as the native decoder last counted them (with `nativeStats`). */
  barriers = 0;
  /**
   * Set by the encoder's commit just before its final flush: when that flush hands over the whole
   * stream at once, it may replay a template of the same bytes instead of decoding them.
   */
  repeatsAtCommit: StreamRepeats | null = null;
  #handedOver = 0; // chunks and replays the native library took
  #autoBarriers = 0; // the native counts last added to the global counters
  #autoConcurrent = 0;
  readonly #host: EncoderHost;
  readonly #sym: NativeSymbols;

  /** Takes a writer and registers with the host as open. */
  constructor(host: EncoderHost, ptr: Deno.PointerObject) {
    this.#host = host;
    this.#sym = host.sym;
    this.ptr = ptr;
    const w = this.writer = host.takeWriter();
    w.attach((bytes, len) => this.#encodeChunk(bytes, len));
    host.commandBufferOpened(this);
  }

  /** Hands every record written so far to the native library now (encoding only). */
  flush(): void {
    if (this.state === "encoding") this.writer!.flush();
  }

  /** Hands every record written so far, then `stream` (whole records), to the native library now. */
  encodeNow(stream: Uint8Array): void {
    this.writer!.flush();
    if (stream.byteLength > 0) this.#encodeChunk(stream, stream.byteLength);
  }

  /**
   * Reads the native decoder's barrier statistics (`cap` words of them: Stat.COUNT for the counts,
   * more for the group sizes) into the module's scratch array, adds what changed to the global
   * counters and returns the number of words the whole answer takes.
   */
  readStats(cap: number): number {
    let out = statsScratch;
    if (out.length < cap) out = statsScratch = new Uint32Array(cap);
    const total = this.#sym.mlxn_cmdbuf_barrier_stats(this.ptr!, out, cap);
    const auto = out[Stat.AUTO_BARRIERS]!, concurrent = out[Stat.AUTO_CONCURRENT]!;
    counterState.autoBarriers += auto - this.#autoBarriers;
    counterState.barriers += auto - this.#autoBarriers;
    counterState.autoConcurrent += concurrent - this.#autoConcurrent;
    this.#autoBarriers = auto;
    this.#autoConcurrent = concurrent;
    this.barriers = out[Stat.BARRIERS]!;
    return total;
  }

  /**
   * Ends the stream: the writer goes back to the host, which stops tracking this command buffer
   * (and, unless `quiet`, frees the buffers whose free it deferred).
   */
  closeStream(quiet = false): void {
    const w = this.writer;
    if (w === null) return;
    this.writer = null;
    w.attach(undefined);
    this.#host.returnWriter(w);
    this.#host.commandBufferClosed(this, !quiet);
  }

  /** Records the outcome and frees the native command buffer unless a wait still needs it. */
  finish(err: MlxError | null): void {
    this.error = err;
    this.state = err ? "failed" : "completed";
    this.freeNativeIfIdle();
  }

  /** Frees the native command buffer once it is neither committed nor waited on. */
  freeNativeIfIdle(): void {
    const ptr = this.ptr;
    if (ptr === null || this.asyncWaits > 0 || this.state === "committed") return;
    this.ptr = null;
    this.#sym.mlxn_cmdbuf_free(ptr); // also after device close: the native side only detached it
  }

  /** The device is closing: an open command buffer is dropped without running. */
  abandon(): void {
    if (this.state !== "encoding") return;
    this.closeStream(true); // the device is closing: it frees every buffer itself
    this.state = "disposed";
    this.freeNativeIfIdle();
  }

  /** Its encoder was garbage-collected: release whatever it still held. */
  collected(): void {
    this.closeStream(true); // a finalizer flushes nothing (a failing flush would have nowhere to throw)
    const ptr = this.ptr;
    if (ptr === null) return;
    this.ptr = null;
    this.#sym.mlxn_cmdbuf_free(ptr); // a committed one is waited for first (native)
  }

  /**
   * Hands every record written so far to the native library, then copies the template's decoded
   * records after them (`mlxn_cmdbuf_replay`: the command buffer must hold nothing decoded yet),
   * with the inline constants of a patch list of `patchWords` words changed.
   */
  replayNow(template: Deno.PointerObject, patch: Uint32Array, patchWords: number): void {
    this.writer!.flush();
    this.#handedOver++;
    const sym = this.#sym;
    this.#settle(
      patchWords === 0
        ? sym.mlxn_cmdbuf_replay(this.ptr!, template)
        : sym.mlxn_cmdbuf_replay_patched(this.ptr!, template, patch, patchWords),
    );
  }

  #encodeChunk(bytes: Uint8Array, byteLength: number): void {
    const repeats = this.repeatsAtCommit, whole = this.#handedOver++ === 0;
    this.repeatsAtCommit = null;
    if (repeats !== null && whole) {
      // The whole pass in one chunk, at commit: a stream like one the loop saw replays its template.
      const rc = repeats.encodeInto(this.ptr!, bytes, byteLength);
      if (rc !== null) return this.#settle(rc);
    }
    this.#settle(this.#sym.mlxn_cmdbuf_encode(this.ptr!, bytes, byteLength));
  }

  /** After the native library took (or refused) more of the stream. */
  #settle(rc: number): void {
    if (rc === Status.OK) {
      if (this.nativeStats) this.readStats(Stat.COUNT); // one call per chunk: the counters stay current
    } else {
      const err = new MlxError(codeOf(rc), lastErrorText(this.#sym));
      // The native command buffer is now in its sticky error state; nothing more can be encoded.
      // Quietly: this may run inside the device's flush of every stream, which must not recurse.
      this.closeStream(true);
      this.rejected = true;
      this.finish(err);
      throw err;
    }
  }
}

/** The words of the last barrier statistics read by {@link CommandBufferSlot.readStats}. */
export function barrierStatsWords(): Uint32Array {
  return statsScratch;
}
