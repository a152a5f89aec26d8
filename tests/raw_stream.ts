/**
 * Test helpers for driving the native decoder through the raw C ABI: stream words written record by
 * record, and a raw command buffer to encode chunks into and then run or free.
 */
import { equal } from "node:assert/strict";
import type { MlxBuffer, MlxDevice } from "../mod.ts";
import { Op, recordHeader, Stat, Status } from "../src/native/abi.ts";
import { lastErrorText } from "../src/native/status.ts";

/** Stream words, record by record; `at` is the byte offset the next record starts at. */
export class RawWords {
  /** The words written so far (taken by {@link RawWords.take}). */
  readonly w: number[] = [];
  /** Byte offset of the next record. */
  get at(): number {
    return this.w.length * 4;
  }
  /** Appends a record of `op` at `slot` with payload words `p`. */
  rec(op: number, slot: number, ...p: number[]): this {
    this.w.push(recordHeader(op, 1 + p.length, slot), ...p);
    return this;
  }
  /** SET_PIPELINE of `kernel`. */
  pipeline(device: MlxDevice, kernel: string): this {
    return this.rec(Op.SET_PIPELINE, 0, device.kernels.get(kernel).handle);
  }
  /** SET_BUFFER of `byteLength` bytes of `b` at `byteOffset` into `slot`. */
  buffer(slot: number, b: MlxBuffer, byteOffset: number, byteLength: number): this {
    return this.rec(Op.SET_BUFFER, slot, b.handle, byteOffset, byteLength);
  }
  /** SET_BYTES of the u32 words `v` into `slot`. */
  bytes(slot: number, ...v: number[]): this {
    return this.rec(Op.SET_BYTES, slot, v.length * 4, ...v);
  }
  /** DISPATCH_THREADS of `grid` threads in threadgroups of `tg`, tag 0. */
  threads(grid: [number, number, number], tg: [number, number, number]): this {
    return this.rec(Op.DISPATCH_THREADS, 0, ...grid, ...tg, 0);
  }
  /** The words as stream bytes; empties the list. */
  take(): Uint8Array {
    const out = new Uint8Array(Uint32Array.from(this.w.map((x) => x >>> 0)).buffer);
    this.w.length = 0;
    return out;
  }
}

/** A raw command buffer on `device`: encode chunks, then run (commit and wait) or free it unrun. */
export function rawCommandBuffer(device: MlxDevice) {
  const sym = device.sym;
  const cb = sym.mlxn_cmdbuf_new(device.devicePtr())!;
  return {
    /** The native command buffer. */
    ptr: cb,
    /** Replays `from`'s decoded records into this one: the status and the error's message. */
    replay(from: Deno.PointerObject | null): { rc: number; message: string } {
      const rc = sym.mlxn_cmdbuf_replay(cb, from);
      return { rc, message: rc === Status.OK ? "" : lastErrorText(sym) };
    },
    /** Encodes one chunk: the status, the error's byte offset (-1 on success) and its message. */
    encode(chunk: Uint8Array): { rc: number; offset: number; message: string } {
      const rc = sym.mlxn_cmdbuf_encode(cb, chunk, chunk.byteLength);
      const message = rc === Status.OK ? "" : lastErrorText(sym);
      return { rc, offset: rc === Status.OK ? -1 : sym.mlxn_cmdbuf_error_offset(cb), message };
    },
    /** The barrier statistics (Stat.*). */
    stats(): Uint32Array {
      const out = new Uint32Array(Stat.COUNT);
      sym.mlxn_cmdbuf_barrier_stats(cb, out, out.length);
      return out;
    },
    /** Commits, waits and frees it, asserting success. */
    run(): void {
      equal(sym.mlxn_cmdbuf_commit(cb), Status.OK, lastErrorText(sym));
      equal(sym.mlxn_cmdbuf_wait(cb), Status.OK, lastErrorText(sym));
      sym.mlxn_cmdbuf_free(cb);
    },
    /** Frees it unrun. */
    free(): void {
      sym.mlxn_cmdbuf_free(cb);
    },
  };
}
