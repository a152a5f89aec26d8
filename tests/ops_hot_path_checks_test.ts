/**
 * The decode-path ops test all their arguments in one combined expression and run the individual
 * checks only when it fails: every bad argument must still be refused with its own message, and
 * nothing may be dispatched. Each case starts from a valid call (which dispatches) and changes one
 * thing.
 */
import { equal, ok, throws } from "node:assert/strict";
import { DType, type MlxBuffer, MlxError, ops } from "../mod.ts";
import type { DispatchDescriptor } from "../src/encoder.ts";
import type { DispatchTarget } from "../src/ops/common.ts";
import { testContext } from "./helpers.ts";

/** Counts dispatches; keeps nothing. */
class CountingTarget implements DispatchTarget {
  dispatches = 0;
  dispatch(_d: DispatchDescriptor): void {
    this.dispatches++;
  }
  memoryBarrier(): void {}
}

type Call = (t: DispatchTarget) => void;

/** The valid call dispatches `n` times; each bad call throws InvalidArgument matching its pattern and dispatches nothing. */
function refuses(valid: Call, n: number, bad: [string, Call, RegExp][]): void {
  const t = new CountingTarget();
  valid(t);
  equal(t.dispatches, n, "the valid call dispatches");
  for (const [what, call, message] of bad) {
    const before = t.dispatches;
    throws(() => call(t), (e: unknown) => {
      ok(e instanceof MlxError, `${what}: ${e}`);
      equal(e.code, "InvalidArgument", what);
      ok(message.test(e.message), `${what}: message '${e.message}' should match ${message}`);
      return true;
    });
    equal(t.dispatches, before, `${what}: nothing dispatched`);
  }
}

Deno.test("rmsNorm, matmul and the quantized products refuse each bad argument with its message", () => {
  using ctx = testContext({ backend: "cpu" });
  const { device, registry: r } = ctx;
  const f32 = (n: number) => device.alloc(n * 4, DType.F32);
  const x = f32(128), w = f32(128), y = f32(128), h = device.alloc(128 * 2, DType.F16);
  const norm = { rows: 2, dim: 64, eps: 1e-5 };
  refuses((t) => ops.rmsNorm(t, r, x, w, y, norm), 1, [
    ["rows 0", (t) => ops.rmsNorm(t, r, x, w, y, { ...norm, rows: 0 }), /rows must be an integer >= 1/],
    ["dim 1.5", (t) => ops.rmsNorm(t, r, x, w, y, { ...norm, dim: 1.5 }), /dim must be an integer/],
    ["eps −1", (t) => ops.rmsNorm(t, r, x, w, y, { ...norm, eps: -1 }), /eps must be >= 0/],
    ["eps NaN", (t) => ops.rmsNorm(t, r, x, w, y, { ...norm, eps: NaN }), /eps must be finite/],
    ["u32 input", (t) => ops.rmsNorm(t, r, device.alloc(512, DType.U32), w, y, norm), /dtype u32 is not supported/],
    ["f16 weight", (t) => ops.rmsNorm(t, r, x, h, y, norm), /weight must be f32, got f16/],
    ["short output", (t) => ops.rmsNorm(t, r, x, w, f32(100), norm), /output holds 400 bytes, needs 512/],
    ["short input", (t) => ops.rmsNorm(t, r, x.slice(0, 256), w, y, norm), /input holds 256 bytes/],
  ]);

  const wt = device.alloc(2 * 32 * 64 * 2, DType.BF16), xm = f32(64), ym = f32(32);
  const mm = { m: 1, n: 32, k: 64 };
  refuses((t) => ops.matmul(t, r, xm, wt, ym, { ...mm, residual: ym, constantWeights: true }), 1, [
    ["n 0", (t) => ops.matmul(t, r, xm, wt, ym, { ...mm, n: 0 }), /n must be an integer >= 1/],
    ["k −4", (t) => ops.matmul(t, r, xm, wt, ym, { ...mm, k: -4 }), /k must be an integer >= 1/],
    ["u32 weights", (t) => ops.matmul(t, r, xm, device.alloc(8192, DType.U32), ym, mm), /weights must be f32/],
    ["residual + swiglu", (t) => ops.matmul(t, r, xm, wt, ym, { ...mm, residual: ym, swiglu: true }), /cannot be/],
    ["bf16 x", (t) => ops.matmul(t, r, device.alloc(128, DType.BF16), wt, ym, mm), /x must be f32, got bf16/],
    ["short weights", (t) => ops.matmul(t, r, xm, wt.slice(0, 64), ym, mm), /w holds 64 bytes/],
    ["swiglu needs 2n rows", (t) => ops.matmul(t, r, xm, wt, ym, { ...mm, n: 64, swiglu: true }), /w holds/],
    ["short y", (t) => ops.matmul(t, r, xm, wt, f32(16), mm), /y holds 64 bytes, needs 128/],
    ["f16 residual", (t) => ops.matmul(t, r, xm, wt, ym, { ...mm, residual: h }), /residual must be f32/],
    ["short residual", (t) => ops.matmul(t, r, xm, wt, ym, { ...mm, residual: f32(8) }), /residual holds/],
    [
      "residual partly over y",
      (t) => ops.matmul(t, r, xm, wt, y.slice(0, 128), { ...mm, residual: y.slice(4, 128) }),
      /residual must be y itself or not overlap/,
    ],
  ]);

  const q4 = device.alloc(32 * (64 / 32) * 18, DType.U8);
  const gg = { m: 1, n: 32, k: 64, format: "q4_0" } as const;
  refuses((t) => ops.quantizedMatmulGgml(t, r, xm, q4, ym, gg), 1, [
    ["m 0", (t) => ops.quantizedMatmulGgml(t, r, xm, q4, ym, { ...gg, m: 0 }), /m must be an integer >= 1/],
    ["format", (t) => ops.quantizedMatmulGgml(t, r, xm, q4, ym, { ...gg, format: "q3" as "q4_0" }), /unknown format/],
    ["k 48", (t) => ops.quantizedMatmulGgml(t, r, xm, q4, ym, { ...gg, k: 48 }), /must be a multiple of 32/],
    [
      "mv with m 9",
      (t) => ops.quantizedMatmulGgml(t, r, f32(9 * 64), q4, f32(9 * 32), { ...gg, m: 9, variant: "mv" }),
      /m <= 8/,
    ],
    ["f16 x", (t) => ops.quantizedMatmulGgml(t, r, h, q4, ym, gg), /x must be f32, got f16/],
    ["short w", (t) => ops.quantizedMatmulGgml(t, r, xm, q4.slice(0, 100), ym, gg), /w holds 100 bytes, needs 1152/],
    ["short y", (t) => ops.quantizedMatmulGgml(t, r, xm, q4, f32(31), gg), /y holds 124 bytes/],
  ]);

  const aw = device.alloc(32 * 256 / 2, DType.U8), sc = device.alloc(32 * 4 * 2, DType.BF16);
  const bi = device.alloc(32 * 4 * 2, DType.BF16),
    xa = f32(256),
    af = { m: 1, n: 32, k: 256, bits: 4, groupSize: 64 } as const;
  refuses((t) => ops.quantizedMatmul(t, r, xa, aw, sc, bi, ym, af), 1, [
    ["bits 7", (t) => ops.quantizedMatmul(t, r, xa, aw, sc, bi, ym, { ...af, bits: 7 as 4 }), /bits must be 2, 3, 4/],
    ["groupSize 16", (t) => ops.quantizedMatmul(t, r, xa, aw, sc, bi, ym, { ...af, groupSize: 16 as 64 }), /groupSize/],
    ["f16 biases", (t) => ops.quantizedMatmul(t, r, xa, aw, sc, h, ym, af), /scales and biases must share one dtype/],
    [
      "fast kernel with n 12",
      (t) => ops.quantizedMatmul(t, r, xa, aw, sc, bi, ym, { ...af, n: 12, variant: "fast" }),
      /fast kernel needs/,
    ],
    ["short w", (t) => ops.quantizedMatmul(t, r, xa, aw.slice(0, 64), sc, bi, ym, af), /w holds 64 bytes/],
    ["short scales", (t) => ops.quantizedMatmul(t, r, xa, aw, sc.slice(0, 64), bi, ym, af), /scales holds 64 bytes/],
    ["short y", (t) => ops.quantizedMatmul(t, r, xa, aw, sc, bi, f32(8), af), /y holds 32 bytes/],
  ]);
});

Deno.test("ropeNeox, stridedCopy and flashAttnVec refuse each bad argument with its message", () => {
  using ctx = testContext({ backend: "cpu" });
  const { device, registry: r } = ctx;
  const f32 = (n: number) => device.alloc(n * 4, DType.F32);
  const hd = 64, ctxLen = 8, kv = 2;
  const q = f32(4 * hd), qr = f32(4 * hd), cache = f32(kv * ctxLen * hd), pos = device.alloc(4, DType.U32);
  const state = device.alloc(16, DType.U32);
  const row: MlxBuffer = cache.slice(3 * hd * 4, ((kv - 1) * ctxLen + 1) * hd * 4);
  const rope = { theta: 1e4, headDim: hd, ropeDim: hd, seqLen: 1, nHeads: kv, outHeadStride: ctxLen * hd };
  refuses((t) => ops.ropeNeox(t, r, q, row, pos, rope), 1, [
    ["theta 0", (t) => ops.ropeNeox(t, r, q, row, pos, { ...rope, theta: 0 }), /theta must be > 0/],
    ["ropeDim 63", (t) => ops.ropeNeox(t, r, q, row, pos, { ...rope, ropeDim: 63 }), /ropeDim must be even/],
    ["ropeDim 128", (t) => ops.ropeNeox(t, r, q, row, pos, { ...rope, ropeDim: 128 }), /exceeds headDim/],
    ["nHeads 0", (t) => ops.ropeNeox(t, r, q, row, pos, { ...rope, nHeads: 0 }), /nHeads must be an integer/],
    ["rows overlap", (t) => ops.ropeNeox(t, r, q, row, pos, { ...rope, outHeadStride: 32 }), /output rows overlap/],
    ["no positions", (t) => ops.ropeNeox(t, r, q, row, undefined, rope), /pass positions/],
    ["f32 positions", (t) => ops.ropeNeox(t, r, q, row, f32(1), rope), /positions must be u32/],
    ["short output", (t) => ops.ropeNeox(t, r, q, cache.slice(0, 1024), pos, rope), /output holds 1024 bytes/],
    ["u32 input", (t) => ops.ropeNeox(t, r, state, row, pos, rope), /input must be f32/],
    [
      "posStride without state",
      (t) => ops.ropeNeox(t, r, q, row, pos, { ...rope, outPosStride: hd }),
      /need a step state/,
    ],
    [
      "state in the output",
      (t) => ops.ropeNeox(t, r, q, cache, undefined, { ...rope, state: cache.slice(0, 4), maxPositions: ctxLen }),
      /state must be u32|must not lie in the output/,
    ],
    [
      "strided output over the input",
      (t) => ops.ropeNeox(t, r, cache.slice(0, 512), cache, pos, { ...rope, outHeadStride: 2 * hd }),
      /strided output must not overlap the input/,
    ],
  ]);

  const v = f32(kv * hd), copy = { rows: kv, cols: hd, dstStride: ctxLen * hd };
  refuses((t) => ops.stridedCopy(t, r, v, row, copy), 1, [
    ["cols 0", (t) => ops.stridedCopy(t, r, v, row, { ...copy, cols: 0 }), /cols must be an integer >= 1/],
    [
      "dstStride < cols",
      (t) => ops.stridedCopy(t, r, v, row, { ...copy, dstStride: 8 }),
      /dstStride must be an integer >= 64/,
    ],
    ["short src", (t) => ops.stridedCopy(t, r, f32(hd), row, copy), /src holds 256 bytes/],
    ["short dst", (t) => ops.stridedCopy(t, r, v, cache.slice(0, 2048), copy), /dst holds 2048 bytes/],
    [
      "maxPositions without state",
      (t) => ops.stridedCopy(t, r, v, row, { ...copy, maxPositions: 4 }),
      /need a step state/,
    ],
    [
      "state without maxPositions",
      (t) => ops.stridedCopy(t, r, v, cache, { ...copy, state, dstPosStride: hd }),
      /maxPositions must be an integer >= 1/,
    ],
    [
      "state in the destination",
      (t) =>
        ops.stridedCopy(t, r, v, cache, {
          ...copy,
          state: cache.slice(0, 4).slice(0, 4, { dtype: DType.U32 }),
          maxPositions: 2,
        }),
      /must not lie in the destination/,
    ],
  ]);

  const tmp = f32(4 * 32 * (hd + 2)), out = f32(4 * hd);
  const fa = { nHeads: 4, nKvHeads: kv, headDim: 64 as const, kvSeqLen: 4, kvCapacity: ctxLen };
  refuses((t) => ops.flashAttnVec(t, r, qr, cache, cache, tmp, out, fa), 2, [
    ["nKvHeads 3", (t) => ops.flashAttnVec(t, r, qr, cache, cache, tmp, out, { ...fa, nKvHeads: 3 }), /must divide/],
    [
      "headDim 96",
      (t) => ops.flashAttnVec(t, r, qr, cache, cache, tmp, out, { ...fa, headDim: 96 as 64 }),
      /headDim must be 64/,
    ],
    [
      "kvSeqLen 9",
      (t) => ops.flashAttnVec(t, r, qr, cache, cache, tmp, out, { ...fa, kvSeqLen: 9 }),
      /exceeds kvCapacity/,
    ],
    ["nwg 300", (t) => ops.flashAttnVec(t, r, qr, cache, cache, tmp, out, { ...fa, nwg: 300 }), /nwg must be <= 256/],
    [
      "scale NaN",
      (t) => ops.flashAttnVec(t, r, qr, cache, cache, tmp, out, { ...fa, scale: NaN }),
      /scale must be finite/,
    ],
    [
      "softcap −1",
      (t) => ops.flashAttnVec(t, r, qr, cache, cache, tmp, out, { ...fa, softcap: -1 }),
      /softcap must be >= 0/,
    ],
    [
      "mask",
      (t) => ops.flashAttnVec(t, r, qr, cache, cache, tmp, out, { ...fa, mask: "band" as "none" }),
      /mask must be/,
    ],
    [
      "window 0",
      (t) => ops.flashAttnVec(t, r, qr, cache, cache, tmp, out, { ...fa, mask: "sliding" }),
      /slidingWindow/,
    ],
    ["u32 K", (t) => ops.flashAttnVec(t, r, qr, state, cache, tmp, out, fa), /K\/V must be f32 or f16, got u32/],
    ["short V", (t) => ops.flashAttnVec(t, r, qr, cache, cache.slice(0, 1024), tmp, out, fa), /v holds 1024 bytes/],
    ["short tmp", (t) => ops.flashAttnVec(t, r, qr, cache, cache, f32(64), out, fa), /tmp holds 256 bytes/],
    ["short out", (t) => ops.flashAttnVec(t, r, qr, cache, cache, tmp, f32(4), fa), /out holds 16 bytes/],
    [
      "state in tmp",
      (t) =>
        ops.flashAttnVec(t, r, qr, cache, cache, tmp, out, { ...fa, state: tmp.slice(0, 4, { dtype: DType.U32 }) }),
      /must not lie in tmp/,
    ],
  ]);
});
