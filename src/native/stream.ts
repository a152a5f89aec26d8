/**
 * StreamWriter: writes command-stream records (format: native/mlxn.h) into a reusable word buffer
 * and hands full chunks to a sink. No allocation per record.
 *
 * @module
 */

import { Op, recordHeader, RecordWords } from "./abi.ts";

/** Header words of the fixed-size records (slot 0; OR in `slot << 8`). */
export const H_SET_PIPELINE: number = recordHeader(Op.SET_PIPELINE, RecordWords.SET_PIPELINE);
/** @see H_SET_PIPELINE */
export const H_SET_BUFFER: number = recordHeader(Op.SET_BUFFER, RecordWords.SET_BUFFER);
/** @see H_SET_PIPELINE */
export const H_SET_BUFFER_WHOLE: number = recordHeader(Op.SET_BUFFER_WHOLE, RecordWords.SET_BUFFER_WHOLE);
/** @see H_SET_PIPELINE */
export const H_SET_BUFFER64: number = recordHeader(Op.SET_BUFFER64, RecordWords.SET_BUFFER64);
/** @see H_SET_PIPELINE */
export const H_SET_TG_MEMORY: number = recordHeader(Op.SET_TG_MEMORY, RecordWords.SET_TG_MEMORY);
/** @see H_SET_PIPELINE */
export const H_DISPATCH_THREADS: number = recordHeader(Op.DISPATCH_THREADS, RecordWords.DISPATCH);
/** @see H_SET_PIPELINE */
export const H_DISPATCH_GROUPS: number = recordHeader(Op.DISPATCH_GROUPS, RecordWords.DISPATCH);
/** Header word of a BARRIER record. */
export const H_BARRIER: number = recordHeader(Op.BARRIER, RecordWords.BARRIER);
/** AUTO_BARRIERS record turning the decoder's automatic barriers on. */
export const H_AUTO_BARRIERS_ON: number = recordHeader(Op.AUTO_BARRIERS, RecordWords.AUTO_BARRIERS, 1);
/** AUTO_BARRIERS record turning them off. */
export const H_AUTO_BARRIERS_OFF: number = recordHeader(Op.AUTO_BARRIERS, RecordWords.AUTO_BARRIERS, 0);
/** Header word of a TRACK record of `n` ranges. */
export function trackHeader(n: number): number {
  return recordHeader(Op.TRACK, RecordWords.TRACK_HEADER + RecordWords.TRACK_ENTRY * n);
}
/** SET_BYTES header for `words` data words at slot 0 (OR in `slot << 8`). */
export function setBytesHeader(dataWords: number): number {
  return recordHeader(Op.SET_BYTES, RecordWords.SET_BYTES_HEADER + dataWords);
}
/** Views ending below this fit a 32-bit SET_BUFFER record. */
export const TWO_32 = 4294967296;

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
    return RecordWords.SET_BYTES_HEADER + ((n + 3) >>> 2);
  }

  /** SET_PIPELINE. */
  setPipeline(handle: number): void {
    const w = this.words, p = this.pos;
    w[p] = H_SET_PIPELINE;
    w[p + 1] = handle;
    this.pos = p + 2;
  }

  /** Words the binding of a view takes (SET_BUFFER, or SET_BUFFER64 past 4 GiB). */
  static bufferRecordWords(offset: number, length: number): number {
    return offset + length < TWO_32 ? RecordWords.SET_BUFFER : RecordWords.SET_BUFFER64;
  }

  /** SET_BUFFER / SET_BUFFER64: bytes [offset, offset + length) of buffer `handle` at `slot`. */
  setBuffer(slot: number, handle: number, offset: number, length: number): void {
    const w = this.words, p = this.pos;
    if (offset + length < TWO_32) {
      w[p] = H_SET_BUFFER | (slot << 8);
      w[p + 1] = handle;
      w[p + 2] = offset;
      w[p + 3] = length;
      this.pos = p + 4;
    } else {
      w[p] = H_SET_BUFFER64 | (slot << 8);
      w[p + 1] = handle;
      w[p + 2] = offset >>> 0;
      w[p + 3] = Math.floor(offset / TWO_32);
      w[p + 4] = length >>> 0;
      w[p + 5] = Math.floor(length / TWO_32);
      this.pos = p + 6;
    }
  }

  /** SET_BYTES: inline constants copied into the record. */
  setBytes(slot: number, data: Uint8Array): void {
    const n = data.byteLength;
    const dataWords = (n + 3) >>> 2;
    const w = this.words, p = this.pos;
    w[p] = recordHeader(Op.SET_BYTES, 2 + dataWords, slot);
    w[p + 1] = n;
    w[p + 1 + dataWords] = 0; // zero the padding of the last word
    const b = this.bytes, at = (p + 2) * 4;
    if (n <= 32) {
      for (let i = 0; i < n; i++) b[at + i] = data[i]!;
    } else {
      b.set(data, at);
    }
    this.pos = p + 2 + dataWords;
  }

  /** SET_BYTES from little-endian 32-bit words (no byte shuffling). */
  setWords(slot: number, data: ArrayLike<number>): void {
    const n = data.length;
    const w = this.words, p = this.pos;
    w[p] = recordHeader(Op.SET_BYTES, 2 + n, slot);
    w[p + 1] = n * 4;
    for (let i = 0; i < n; i++) w[p + 2 + i] = data[i]!;
    this.pos = p + 2 + n;
  }

  /** SET_TG_MEMORY for index 0. */
  setThreadgroupMemory(bytes: number): void {
    const w = this.words, p = this.pos;
    w[p] = H_SET_TG_MEMORY;
    w[p + 1] = bytes;
    this.pos = p + 2;
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
