/**
 * The cheaper write path keeps what it replaced: `putBuffer`'s inline and out-of-line cases store the
 * records the descriptor path chooses, `rowThreadgroup` by bit length equals the doubling loop, the
 * session methods forward exactly their op's arguments, and a pass that spills the stream writer and switches automatic barriers between ops
 * writes the descriptor path's words.
 */
import { deepStrictEqual, equal, ok, throws } from "node:assert/strict";
import { DType, GraphExecutor, type MlxBuffer, MlxError, ops, SESSION_OPS } from "../mod.ts";
import { putBuffer } from "../src/dispatch_writer.ts";
import { rowThreadgroup } from "../src/kernels.ts";
import type { DispatchTarget } from "../src/ops/common.ts";
import { type AnyOp, MAX_OP_ARGUMENTS, sessionMethod } from "../src/session_ops.ts";
import { H_SET_BUFFER, H_SET_BUFFER64, H_SET_BUFFER_WHOLE, TWO_32 } from "../src/native/stream.ts";
import { openDevice } from "./helpers.ts";
import { tapStreams } from "./fixtures/stream_tap.ts";

/** The fields of a view that putBuffer reads. */
function fakeView(rawHandle: number, byteOffset: number, byteLength: number, whole: boolean): MlxBuffer {
  return { rawHandle, byteOffset, byteLength, isWholeAllocation: whole } as unknown as MlxBuffer;
}

Deno.test("putBuffer: whole, 32-bit and 64-bit ranges, freed views and -1", () => {
  const w = new Uint32Array(16).fill(0xdead);
  equal(putBuffer(w, 1, 3, fakeView(7, 0, 64, true)), 3);
  deepStrictEqual([...w.subarray(1, 3)], [(H_SET_BUFFER_WHOLE | (3 << 8)) >>> 0, 7]);
  w.fill(0xdead);
  equal(putBuffer(w, 0, 2, fakeView(9, 256, 1024, false)), 4);
  deepStrictEqual([...w.subarray(0, 4)], [(H_SET_BUFFER | (2 << 8)) >>> 0, 9, 256, 1024]);
  // A range that ends at 2^32 or later takes the 6-word record; one that ends just below does not.
  w.fill(0xdead);
  equal(putBuffer(w, 0, 1, fakeView(5, TWO_32 - 8, 8, false)), 6);
  deepStrictEqual([...w.subarray(0, 6)], [(H_SET_BUFFER64 | (1 << 8)) >>> 0, 5, TWO_32 - 8, 0, 8, 0]);
  w.fill(0xdead);
  equal(putBuffer(w, 0, 1, fakeView(5, TWO_32 - 9, 8, false)), 4);
  w.fill(0xdead);
  const off = 3 * TWO_32 + 16, len = TWO_32 + 4;
  equal(putBuffer(w, 2, 0, fakeView(4, off, len, false)), 8);
  deepStrictEqual([...w.subarray(2, 8)], [H_SET_BUFFER64 >>> 0, 4, 16, 3, 4, 1]);
  // A whole allocation past 4 GiB keeps the 2-word record.
  equal(putBuffer(w, 0, 0, fakeView(4, 0, 2 * TWO_32, true)), 2);
  // Nothing is written for a freed view or after an earlier -1.
  w.fill(0xdead);
  equal(putBuffer(w, 0, 0, fakeView(0, 0, 64, true)), -1);
  equal(putBuffer(w, 0, 0, fakeView(0, 16, 64, false)), -1);
  equal(putBuffer(w, -1, 0, fakeView(3, 0, 64, true)), -1);
  equal(putBuffer(w, -1, 0, fakeView(3, TWO_32, 64, false)), -1);
  ok(w.every((v) => v === 0xdead));
});

Deno.test("rowThreadgroup by bit length equals the doubling loop", () => {
  const loop = (cols: number) => {
    let p = 1;
    while (p < cols && p < 256) p *= 2;
    return p;
  };
  for (let cols = 0; cols <= 70_000; cols++) equal(rowThreadgroup(cols), loop(cols), `cols ${cols}`);
  for (const cols of [2 ** 31, 2 ** 32 - 1, 2 ** 32, 2 ** 40, -1, -300, 2.5, 255.5, 256.5, NaN, Infinity, -Infinity]) {
    equal(rowThreadgroup(cols), loop(cols), `cols ${cols}`);
  }
});

Deno.test("sessionMethod: methods forward exactly the op's arguments", () => {
  {
    const seen: unknown[][] = [];
    const target = { dispatch() {}, memoryBarrier() {} } as DispatchTarget;
    const registry = {} as never;
    const session = { open: true };
    const encoderOf = (s: typeof session, name: string) => {
      if (!s.open) throw new Error(`${name}: closed`);
      return target;
    };
    const op3 = function (t: DispatchTarget, r: unknown, a: unknown, b: unknown, c: unknown) {
      seen.push([t, r, a, b, c]);
    };
    const m = sessionMethod("threeArgs", op3 as AnyOp, encoderOf, () => registry, () => true);
    equal(m.name, "threeArgs");
    equal(m.length, 3);
    m.call(session, 1, "two", undefined);
    m.call(session, 4);
    deepStrictEqual(seen, [[target, registry, 1, "two", undefined], [target, registry, 4, undefined, undefined]]);
    // An op without arguments of its own.
    const op0 = function (t: DispatchTarget, r: unknown) {
      seen.push([t, r as never]);
    };
    sessionMethod("none", op0 as AnyOp, encoderOf, () => registry, () => true).call(session);
    deepStrictEqual(seen.at(-1), [target, registry]);
    // The widest op (MAX_OP_ARGUMENTS, e.g. quantizedMatmulAffineGather): all seven arrive.
    const op7 = function (
      t: DispatchTarget,
      r: unknown,
      ...a: [unknown, unknown, unknown, unknown, unknown, unknown, unknown]
    ) {
      (seen as unknown[][]).push([t, r, ...a]);
    };
    Object.defineProperty(op7, "length", { value: 2 + MAX_OP_ARGUMENTS });
    const m7 = sessionMethod("sevenArgs", op7 as AnyOp, encoderOf, () => registry, () => true);
    equal(m7.length, 7);
    m7.call(session, 1, 2, 3, 4, 5, 6, 7);
    deepStrictEqual(seen.at(-1), [target, registry, 1, 2, 3, 4, 5, 6, 7]);
    // A closed session: the op is not called.
    session.open = false;
    const before = seen.length;
    throws(() => m.call(session, 1, 2, 3), /threeArgs: closed/);
    equal(seen.length, before);
  }
  throws(() =>
    sessionMethod(
      "tooMany",
      ((
        _t: unknown,
        _r: unknown,
        _1: unknown,
        _2: unknown,
        _3: unknown,
        _4: unknown,
        _5: unknown,
        _6: unknown,
        _7: unknown,
        _8: unknown,
      ) => {}) as AnyOp,
      () => ({}) as DispatchTarget,
      () => ({}) as never,
      () => true,
    )
  );
});

Deno.test("session methods: one per op, its arity, no default or rest parameters, closed sessions refuse", () => {
  using device = openDevice();
  const exec = new GraphExecutor(device);
  const s = exec.begin();
  for (const [name, op] of Object.entries(SESSION_OPS)) {
    const src = op.toString(), params = src.slice(src.indexOf("(") + 1, src.indexOf(")"));
    ok(!/=|\.\.\./.test(params), `${name}: a default or rest parameter (${params}) would be cut from the method`);
    const method = (s as unknown as Record<string, (...a: unknown[]) => void>)[name]!;
    equal(method.name, name);
    equal(method.length, op.length - 2, name);
  }
  using a = device.upload(new Float32Array([1, 2, 3])), b = device.upload(new Float32Array([10, 20, 30]));
  using out = device.alloc(12, DType.F32);
  s.elementwiseAdd(a, b, out, 2); // the optional count reaches the op
  s.finish();
  deepStrictEqual([...out.read() as Float32Array].slice(0, 2), [11, 22]);
  throws(() => s.rmsNorm(a, b, out, { rows: 1, dim: 3, eps: 1e-5 }), (e: unknown) => {
    ok(e instanceof MlxError);
    equal(e.code, "InvalidState");
    ok(e.message.startsWith("rmsNorm: "), e.message);
    return true;
  });
});

function concat(chunks: Uint32Array[]): number[] {
  return chunks.flatMap((c) => [...c]);
}

Deno.test("write path: a pass that spills the writer and switches auto barriers writes the descriptor path's words", () => {
  using device = openDevice();
  const registry = device.kernels;
  using x = device.upload(new Float32Array(256).fill(1)), w = device.upload(new Float32Array(256).fill(2));
  using big = device.alloc(256 * 4 * 64, DType.F32);
  const rowsOf = Array.from({ length: 64 }, (_, i) => big.slice(i * 1024, 1024));
  const passes: number[][] = [];
  for (const direct of [true, false]) {
    const chunks = tapStreams(device);
    const enc = device.commandEncoder({ autoBarriers: true });
    const target: DispatchTarget = direct
      ? enc
      : { dispatch: (d) => enc.dispatch(d), memoryBarrier: () => enc.memoryBarrier() };
    // ~6,000 dispatches of 12-16 words: the 65,536-word writer spills a few times mid-op.
    for (let i = 0; i < 6000; i++) {
      if (i % 997 === 0) enc.autoBarriers = !enc.autoBarriers; // an AUTO_BARRIERS record before the next op
      const row = rowsOf[i % 64]!;
      if (i % 3 === 0) ops.rmsNorm(target, registry, x, w, row, { rows: 1, dim: 256, eps: 1e-5 });
      else if (i % 3 === 1) ops.elementwiseMul(target, registry, row, w, x);
      else ops.stridedCopy(target, registry, x, row, { rows: 2, cols: 128 });
    }
    enc.commit({ wait: true });
    ok(chunks.length >= 2, `the pass spilled (${chunks.length} chunks)`);
    passes.push(concat(chunks));
    enc.dispose();
  }
  equal(passes[0]!.length, passes[1]!.length);
  ok(passes[0]!.every((v, i) => v === passes[1]![i]), "the write path's words equal the descriptor path's");
});
