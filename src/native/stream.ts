/**
 * StreamWriter: writes command-stream records (format: native/mlxn.h) into a reusable word buffer
 * and hands full chunks to a sink. No allocation per record.
 *
 * @module
 */

import { Op, recordHeader, RecordWords } from "./abi.ts";

const H_SET_PIPELINE = recordHeader(Op.SET_PIPELINE, RecordWords.SET_PIPELINE);
const H_SET_BUFFER = recordHeader(Op.SET_BUFFER, RecordWords.SET_BUFFER);
const H_SET_TG_MEMORY = recordHeader(Op.SET_TG_MEMORY, RecordWords.SET_TG_MEMORY);
const H_DISPATCH_THREADS = recordHeader(Op.DISPATCH_THREADS, RecordWords.DISPATCH);
const H_DISPATCH_GROUPS = recordHeader(Op.DISPATCH_GROUPS, RecordWords.DISPATCH);
const H_BARRIER = recordHeader(Op.BARRIER, RecordWords.BARRIER);
const TWO_32 = 4294967296;

/** Receives a chunk of `byteLength` bytes at the start of `bytes`. */
export type StreamSink = (bytes: Uint8Array, byteLength: number) => void;

/** Default capacity in words (256 KiB): ~1,800 typical dispatches per chunk. */
export const DEFAULT_STREAM_WORDS = 65536;

/**
 * Writes records; calls the sink when the buffer is full and on {@link StreamWriter.flush}. Callers
 * {@link StreamWriter.reserve} room for a whole group of records first; the record writers then
 * store without further checks (one capacity check per dispatch, not per record).
 */
export class StreamWriter {
  /** The words written so far (valid up to `pos`). */
  readonly words: Uint32Array;
  /** The same memory as bytes. */
  readonly bytes: Uint8Array;
  /** Next free word. */
  pos = 0;
  #sink: StreamSink | undefined;

  /** A writer with `capacityWords` of room. */
  constructor(capacityWords = DEFAULT_STREAM_WORDS) {
    this.words = new Uint32Array(capacityWords);
    this.bytes = new Uint8Array(this.words.buffer);
  }

  /** Sets where full chunks go (the writer is reused across command buffers). */
  attach(sink: StreamSink | undefined): void {
    this.#sink = sink;
    this.pos = 0;
  }

  /** Hands everything written so far to the sink. */
  flush(): void {
    if (this.pos === 0) return;
    const n = this.pos;
    this.pos = 0;
    this.#sink!(this.bytes, n * 4);
  }

  /** Makes room for `n` words (flushing if needed). `n` must not exceed the capacity. */
  reserve(n: number): void {
    if (this.pos + n > this.words.length) this.flush();
  }

  /** Words a SET_BYTES record of `n` bytes takes. */
  static bytesRecordWords(n: number): number {
    return 3 + ((n + 3) >>> 2);
  }

  /** SET_PIPELINE. */
  setPipeline(handle: number): void {
    const w = this.words, p = this.pos;
    w[p] = H_SET_PIPELINE;
    w[p + 1] = handle;
    this.pos = p + 2;
  }

  /** SET_BUFFER: bytes [offset, offset + length) of buffer `handle` at `slot`. */
  setBuffer(slot: number, handle: number, offset: number, length: number): void {
    const w = this.words, p = this.pos;
    w[p] = H_SET_BUFFER;
    w[p + 1] = slot;
    w[p + 2] = handle;
    w[p + 3] = offset >>> 0;
    w[p + 4] = offset >= TWO_32 ? Math.floor(offset / TWO_32) : 0;
    w[p + 5] = length >>> 0;
    w[p + 6] = length >= TWO_32 ? Math.floor(length / TWO_32) : 0;
    this.pos = p + 7;
  }

  /** SET_BYTES: inline constants copied into the record. */
  setBytes(slot: number, data: Uint8Array): void {
    const n = data.byteLength;
    const dataWords = (n + 3) >>> 2;
    const w = this.words, p = this.pos;
    w[p] = recordHeader(Op.SET_BYTES, 3 + dataWords);
    w[p + 1] = slot;
    w[p + 2] = n;
    w[p + 2 + dataWords] = 0; // zero the padding of the last word
    const b = this.bytes, at = (p + 3) * 4;
    if (n <= 32) {
      for (let i = 0; i < n; i++) b[at + i] = data[i];
    } else {
      b.set(data, at);
    }
    this.pos = p + 3 + dataWords;
  }

  /** SET_TG_MEMORY for index 0. */
  setThreadgroupMemory(bytes: number): void {
    const w = this.words, p = this.pos;
    w[p] = H_SET_TG_MEMORY;
    w[p + 1] = 0;
    w[p + 2] = bytes;
    this.pos = p + 3;
  }

  /** DISPATCH_THREADS (grid counts threads) or DISPATCH_GROUPS (grid counts threadgroups). */
  dispatch(
    threads: boolean,
    g0: number,
    g1: number,
    g2: number,
    t0: number,
    t1: number,
    t2: number,
    tag: number,
  ): void {
    const w = this.words, p = this.pos;
    w[p] = threads ? H_DISPATCH_THREADS : H_DISPATCH_GROUPS;
    w[p + 1] = g0;
    w[p + 2] = g1;
    w[p + 3] = g2;
    w[p + 4] = t0;
    w[p + 5] = t1;
    w[p + 6] = t2;
    w[p + 7] = tag;
    this.pos = p + 8;
  }

  /** BARRIER. */
  barrier(): void {
    this.words[this.pos++] = H_BARRIER;
  }
}
