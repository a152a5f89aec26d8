/**
 * The stream's one write path for dispatches: a validated-as-written descriptor becomes SET_PIPELINE,
 * SET_TG_MEMORY, binding and inline-constant records and one DISPATCH record, in a single pass.
 *
 * @module
 */

import { MlxBuffer } from "./buffer.ts";
import type { DispatchDescriptor } from "./dispatch.ts";
import { SLOT_BUFFER } from "./kernels.ts";
import { Limits, Op, RecordWords } from "./native/abi.ts";
import {
  H_BARRIER,
  H_DISPATCH_GROUPS,
  H_DISPATCH_THREADS,
  H_SET_BUFFER,
  H_SET_BUFFER64,
  H_SET_BUFFER_WHOLE,
  H_SET_PIPELINE,
  H_SET_TG_MEMORY,
  setBytesHeader,
  type StreamWriter,
  TWO_32,
} from "./native/stream.ts";

/**
 * Writes one dispatch's records into `writer`: checks the descriptor while writing straight into the
 * stream words, and publishes them (moves the write position) only at the end. On anything off it
 * returns false with nothing written (the encoder's checks then report the error with its message).
 * `currentPipeline` is the pipeline handle already set in the stream (SET_PIPELINE is skipped when it
 * matches); `tag` is the dispatch's index; with `barrierFirst` a BARRIER record goes before the
 * dispatch, in the same all-or-nothing write. The records are stored inline rather than through
 * StreamWriter's record methods (calling those cost ~4.4 ns of the ~50 ns here), and a view that
 * covers its whole allocation is bound with the 2-word SET_BUFFER_WHOLE record.
 */
export function writeDispatch(
  writer: StreamWriter,
  d: DispatchDescriptor,
  currentPipeline: number,
  tag: number,
  barrierFirst = false,
): boolean {
  const p = d.pipeline, plan = p.slotPlan, bindings = d.bindings, n = plan.length;
  if (bindings.length > n) return false;
  const grid = d.grid, tg = d.threadgroup;
  let g0: number, g1 = 1, g2 = 1, t0: number, t1 = 1, t2 = 1;
  if (typeof grid === "number") g0 = grid;
  else {
    g0 = grid[0]!;
    if (grid.length > 1) g1 = grid[1]!;
    if (grid.length > 2) g2 = grid[2]!;
  }
  if (typeof tg === "number") t0 = tg;
  else {
    t0 = tg[0]!;
    if (tg.length > 1) t1 = tg[1]!;
    if (tg.length > 2) t2 = tg[2]!;
  }
  // Every dimension a positive u32, tested inline: this function is past V8's inlining budget, so
  // a helper called here would stay a call (so would StreamWriter.reserve and setBytesHeader below).
  if (
    (g0 >>> 0) !== g0 || (g1 >>> 0) !== g1 || (g2 >>> 0) !== g2 || (t0 >>> 0) !== t0 || (t1 >>> 0) !== t1 ||
    (t2 >>> 0) !== t2 || g0 === 0 || g1 === 0 || g2 === 0 || t0 === 0 || t1 === 0 || t2 === 0 ||
    t0 * t1 * t2 > Limits.MAX_THREADS_PER_GROUP
  ) return false;
  const tgMem = d.threadgroupMemory ?? 0;
  if ((tgMem >>> 0) !== tgMem || tgMem > Limits.MAX_TG_MEMORY) return false;
  const w = writer.words;
  if (writer.pos + p.maxDispatchWords + RecordWords.BARRIER > w.length) writer.flush(); // StreamWriter.reserve
  let at = writer.pos;
  if (barrierFirst) w[at++] = H_BARRIER;
  if (currentPipeline !== p.handle) {
    w[at] = H_SET_PIPELINE;
    w[at + 1] = p.handle;
    at += 2;
  }
  if (tgMem > 0) {
    w[at] = H_SET_TG_MEMORY;
    w[at + 1] = tgMem;
    at += 2;
  }
  for (let i = 0; i < n; i++) {
    const b = bindings[i], code = plan[i]!;
    if (code < 0) { // a buffer slot
      if (b instanceof MlxBuffer) {
        const h = b.rawHandle, off = b.byteOffset, len = b.byteLength;
        if (h === 0) return false;
        if (b.isWholeAllocation) { // the common case: half the words
          w[at] = H_SET_BUFFER_WHOLE | (i << 8);
          w[at + 1] = h;
          at += 2;
        } else if (off + len < TWO_32) {
          w[at] = H_SET_BUFFER | (i << 8);
          w[at + 1] = h;
          w[at + 2] = off;
          w[at + 3] = len;
          at += 4;
        } else {
          w[at] = H_SET_BUFFER64 | (i << 8);
          w[at + 1] = h;
          w[at + 2] = off >>> 0;
          w[at + 3] = Math.floor(off / TWO_32);
          w[at + 4] = len >>> 0;
          w[at + 5] = Math.floor(len / TWO_32);
          at += 6;
        }
      } else if (b !== undefined || code === SLOT_BUFFER) return false;
    } else if (Array.isArray(b)) { // inline bytes as u32 words
      const len = b.length;
      if (len === 0 || len * 4 > Limits.MAX_INLINE_BYTES || (code !== 0 && len * 4 !== code)) return false;
      w[at] = (((RecordWords.SET_BYTES_HEADER + len) << 16) | (i << 8) | Op.SET_BYTES) >>> 0; // setBytesHeader
      w[at + 1] = len * 4;
      at += 2;
      for (let k = 0; k < len; k++) {
        const v = b[k];
        if ((v >>> 0) !== v) return false;
        w[at + k] = v;
      }
      at += len;
    } else if (b instanceof Uint32Array) {
      const len = b.length;
      if (len === 0 || len * 4 > Limits.MAX_INLINE_BYTES || (code !== 0 && len * 4 !== code)) return false;
      w[at] = setBytesHeader(len) | (i << 8);
      w[at + 1] = len * 4;
      w.set(b, at + 2);
      at += 2 + len;
    } else if (b instanceof Uint8Array) {
      const n = b.byteLength, dataWords = (n + 3) >>> 2;
      if (n === 0 || n > Limits.MAX_INLINE_BYTES || (code !== 0 && n !== code)) return false;
      w[at] = setBytesHeader(dataWords) | (i << 8);
      w[at + 1] = n;
      w[at + 1 + dataWords] = 0; // zero the padding of the last word
      writer.bytes.set(b, (at + 2) * 4);
      at += 2 + dataWords;
    } else return false;
  }
  w[at] = d.dispatchKind === "threads" ? H_DISPATCH_THREADS : H_DISPATCH_GROUPS;
  w[at + 1] = g0;
  w[at + 2] = g1;
  w[at + 3] = g2;
  w[at + 4] = t0;
  w[at + 5] = t1;
  w[at + 6] = t2;
  w[at + 7] = tag;
  writer.pos = at + 8;
  return true;
}

/**
 * Stores the binding record of view `b` at `slot` at word `at` of `w` (the ops' write path, see
 * CommandEncoder.opBegin) and returns the word after it; -1 when `at` is -1 or the view's allocation
 * was freed (the op then dispatches a descriptor, which reports it). The record is SET_BUFFER_WHOLE,
 * SET_BUFFER or SET_BUFFER64, as {@link writeDispatch} chooses.
 */
export function putBuffer(w: Uint32Array, at: number, slot: number, b: MlxBuffer): number {
  // Kept small so that V8 inlines it into every op (called 2-5 times each): a freed view, a range
  // past 4 GiB and -1 go out of line. That path is never taken in a normal pass, so it is not
  // inlined here either (inlined, it made this function too big to inline into the ops).
  const h = b.rawHandle;
  if (h !== 0 && at >= 0) {
    if (b.isWholeAllocation) {
      w[at] = H_SET_BUFFER_WHOLE | (slot << 8);
      w[at + 1] = h;
      return at + 2;
    }
    const off = b.byteOffset, len = b.byteLength;
    if (off + len < TWO_32) {
      w[at] = H_SET_BUFFER | (slot << 8);
      w[at + 1] = h;
      w[at + 2] = off;
      w[at + 3] = len;
      return at + 4;
    }
  }
  return putRareBuffer(w, at, slot, b);
}

/** {@link putBuffer}'s out-of-line cases: -1 (freed view, or `at` -1), else SET_BUFFER64. */
function putRareBuffer(w: Uint32Array, at: number, slot: number, b: MlxBuffer): number {
  const h = b.rawHandle;
  if (h === 0 || at < 0) return -1;
  const off = b.byteOffset, len = b.byteLength;
  w[at] = H_SET_BUFFER64 | (slot << 8);
  w[at + 1] = h;
  w[at + 2] = off >>> 0;
  w[at + 3] = Math.floor(off / TWO_32);
  w[at + 4] = len >>> 0;
  w[at + 5] = Math.floor(len / TWO_32);
  return at + 6;
}

/** SET_BYTES header of one u32 word at slot 0 (OR in `slot << 8`). */
const H_SET_WORD = (((RecordWords.SET_BYTES_HEADER + 1) << 16) | Op.SET_BYTES) >>> 0;

/**
 * Stores a SET_BYTES record of the one u32 word `v` at `slot` at word `at` of `w` (the ops' write
 * path) and returns the word after it; -1 when `at` is -1. `v` must be a u32.
 */
export function putWord(w: Uint32Array, at: number, slot: number, v: number): number {
  if (at < 0) return -1;
  w[at] = H_SET_WORD | (slot << 8);
  w[at + 1] = 4;
  w[at + 2] = v;
  return at + 3;
}

/**
 * Stores a SET_BYTES record of the u32 words `src` (1 to 64 of them) at `slot` at word `at` of `w`
 * (the ops' write path) and returns the word after it; -1 when `at` is -1.
 */
export function putWords(w: Uint32Array, at: number, slot: number, src: readonly number[]): number {
  if (at < 0) return -1;
  const n = src.length;
  w[at] = H_SET_BYTES_EMPTY + (n << 16) + (slot << 8); // the fields do not overlap: + is |
  w[at + 1] = n * 4;
  let i = at + 2;
  for (let k = 0; k < n; k++) w[i++] = src[k]!;
  return i;
}

/** SET_BYTES header of no data words at slot 0 (add `n << 16` and `slot << 8`): one constant, less bytecode. */
const H_SET_BYTES_EMPTY = ((RecordWords.SET_BYTES_HEADER << 16) | Op.SET_BYTES) >>> 0;

/**
 * Stores a SET_TG_MEMORY record of `bytes` (index 0) at word `at` of `w` (the ops' write path; it
 * goes right after CommandEncoder.opBegin, before the bindings, as {@link writeDispatch}
 * orders it) and returns the word after it; nothing for 0 bytes; -1 when `at` is -1.
 */
export function putTgMemory(w: Uint32Array, at: number, bytes: number): number {
  if (at < 0 || bytes === 0) return at;
  w[at] = H_SET_TG_MEMORY;
  w[at + 1] = bytes;
  return at + 2;
}

/**
 * Stores a dispatch's DISPATCH record at word `at` of `w` (the ops' write path: the record after its
 * bindings; `threads`: the grid counts threads) tagged `tag`, and returns the word after it.
 * Dimensions are positive u32 with at most the threadgroup limit (the op checked them).
 */
export function putDispatch(
  w: Uint32Array,
  at: number,
  threads: boolean,
  g0: number,
  g1: number,
  g2: number,
  t0: number,
  t1: number,
  t2: number,
  tag: number,
): number {
  w[at] = threads ? H_DISPATCH_THREADS : H_DISPATCH_GROUPS;
  w[at + 1] = g0;
  w[at + 2] = g1;
  w[at + 3] = g2;
  w[at + 4] = t0;
  w[at + 5] = t1;
  w[at + 6] = t2;
  w[at + 7] = tag;
  return at + 8;
}
