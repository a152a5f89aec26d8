/**
 * The native tracker's reads that change nothing: a read inside the bytes its allocation already had
 * touched in the group is not added again, and every other read still is. Each case is a three-
 * dispatch pass with automatic barriers whose barrier count follows from the placement rule (a write
 * conflicts with any byte read or written earlier in its group), so a read wrongly taken as covered
 * loses the barrier of the write after it.
 */
import { equal } from "node:assert/strict";
import { DType, GraphExecutor, type MlxBuffer } from "../mod.ts";
import { openDevice } from "./helpers.ts";

const N = 16; // elements each dispatch computes; the tracked ranges are the bound views

/** Reads `reads[i]` (as `a`) into a private output per dispatch, then writes `written`; barriers placed. */
function barriersOf(exec: GraphExecutor, x: MlxBuffer, reads: MlxBuffer[], written: MlxBuffer): number {
  const s = exec.begin({ autoBarriers: true });
  try {
    const outs = reads.map(() => exec.device.alloc(N * 4, DType.F32));
    reads.forEach((r, i) => s.elementwiseAdd(r, x, outs[i]!, N));
    s.elementwiseAdd(x, x, written, N);
    s.encoder.flush();
    const count = s.encoder.barrierCount;
    for (const o of outs) o.dispose();
    return count;
  } finally {
    s.dispose();
  }
}

Deno.test("a read reaching before or past the bytes already read is tracked: the write into them waits", () => {
  using device = openDevice();
  const exec = new GraphExecutor(device);
  using x = device.upload(new Float32Array(64).fill(1));
  using w = device.alloc(256 * 4, DType.F32);
  const view = (from: number, elems: number) => w.slice(from * 4, elems * 4);
  // [64, 128) read first; then [0, 128) (starts before it); then a write of [0, 16).
  equal(barriersOf(exec, x, [view(64, 64), view(0, 128)], view(0, 16)), 1);
  // [64, 128) read first; then [64, 192) (ends past it); then a write of [176, 192).
  equal(barriersOf(exec, x, [view(64, 64), view(64, 128)], view(176, 16)), 1);
  // [64, 128) read first; then [0, 256) (covers it); then a write of [240, 256).
  equal(barriersOf(exec, x, [view(64, 64), view(0, 256)], view(240, 16)), 1);
});

Deno.test("a read inside the bytes already read adds nothing new: writes beside them share the group", () => {
  using device = openDevice();
  const exec = new GraphExecutor(device);
  using x = device.upload(new Float32Array(64).fill(1));
  using w = device.alloc(256 * 4, DType.F32);
  const view = (from: number, elems: number) => w.slice(from * 4, elems * 4);
  // [0, 128) then [32, 64) inside it: a write of [128, 144) touches neither.
  equal(barriersOf(exec, x, [view(0, 128), view(32, 32)], view(128, 16)), 0);
  // The same reads, then a write into the inner range: a write-after-read conflict.
  equal(barriersOf(exec, x, [view(0, 128), view(32, 32)], view(40, 16)), 1);
  // The same reads, then a write into the outer range only.
  equal(barriersOf(exec, x, [view(0, 128), view(32, 32)], view(100, 16)), 1);
  // The same range read twice, then a write just past it.
  equal(barriersOf(exec, x, [view(0, 64), view(0, 64)], view(64, 16)), 0);
});

Deno.test("reads after writes of the same allocation in the group: a read of written bytes waits, others do not", () => {
  using device = openDevice();
  const exec = new GraphExecutor(device);
  using x = device.upload(new Float32Array(64).fill(1));
  using w = device.alloc(256 * 4, DType.F32);
  const view = (from: number, elems: number) => w.slice(from * 4, elems * 4);
  const s = exec.begin({ autoBarriers: true });
  try {
    s.elementwiseAdd(x, x, view(0, 16), N); // writes [0, 16)
    s.elementwiseAdd(x, x, view(16, 16), N); // writes [16, 32): same group
    s.elementwiseAdd(view(64, 16), x, view(128, 16), N); // reads [64, 80), writes [128, 144): same group
    s.elementwiseAdd(view(64, 16), x, view(160, 16), N); // the same read again: same group
    s.elementwiseAdd(view(8, 16), x, view(192, 16), N); // reads [8, 24), written: a barrier
    s.encoder.flush();
    equal(s.encoder.barrierCount, 1);
  } finally {
    s.dispose();
  }
});

Deno.test("an in-place dispatch (its output among its inputs): what it wrote and what it read both count", () => {
  using device = openDevice();
  const exec = new GraphExecutor(device);
  using x = device.upload(new Float32Array(64).fill(1));
  using w = device.alloc(256 * 4, DType.F32), o = device.alloc(N * 4, DType.F32);
  const view = (from: number, elems: number) => w.slice(from * 4, elems * 4);
  const pass = (second: (s: ReturnType<GraphExecutor["begin"]>) => void) => {
    const s = exec.begin({ autoBarriers: true });
    try {
      s.elementwiseAdd(view(0, 32), x, view(0, 16), N); // reads [0, 32), writes [0, 16)
      second(s);
      s.encoder.flush();
      return s.encoder.barrierCount;
    } finally {
      s.dispose();
    }
  };
  equal(pass((s) => s.elementwiseAdd(view(8, 16), x, o, N)), 1); // reads written bytes
  equal(pass((s) => s.elementwiseAdd(view(16, 16), x, o, N)), 0); // reads bytes only read
  equal(pass((s) => s.elementwiseAdd(x, x, view(16, 16), N)), 1); // writes bytes read
  equal(pass((s) => s.elementwiseAdd(x, x, view(32, 16), N)), 0); // writes untouched bytes
  equal(pass((s) => s.elementwiseAdd(view(0, 16), x, view(0, 16), N)), 1); // the same in-place again
  // An output beside its input (the decoder refuses a partial overlap): the group's bytes grow to
  // cover both, on either side.
  const beside = (read: MlxBuffer, written: MlxBuffer, next: (s: ReturnType<GraphExecutor["begin"]>) => void) => {
    const s = exec.begin({ autoBarriers: true });
    try {
      s.elementwiseAdd(read, x, written, 8);
      next(s);
      s.encoder.flush();
      return s.encoder.barrierCount;
    } finally {
      s.dispose();
    }
  };
  equal(beside(view(0, 8), view(8, 8), (s) => s.elementwiseAdd(x, x, view(12, 4), 4)), 1); // writes written bytes
  equal(beside(view(8, 8), view(0, 8), (s) => s.elementwiseAdd(x, x, view(0, 4), 4)), 1); // the same, before
  equal(beside(view(8, 8), view(0, 8), (s) => s.elementwiseAdd(x, x, view(16, 4), 4)), 0); // just past both
});
