/**
 * Matrix products against float64 references on awkward shapes, and the quantizers' round trips.
 *
 * Tolerance: the kernels accumulate K products in f32, so |y − y_ref| ≤ (K + 4)·u·Σ|x·w| with
 * u = 2⁻²⁴ (each product and partial sum rounds once; the dequantized weight itself may round once
 * more, e.g. d·scale·q in Q6_K or scale·q + bias in the affine format). The reference dequantizes
 * with an independent TypeScript implementation of each format (src/quant.ts), exactly in float64.
 */
import { deepStrictEqual, equal, ok, throws } from "node:assert/strict";
import {
  type AffineBits,
  type AffineGroupSize,
  dequantizeAffine,
  dequantizeGgml,
  DType,
  findBrokenConstantPromises,
  type GgmlFormat,
  GraphExecutor,
  MlxError,
  ops,
  quantizeAffine,
  quantizeGgml,
} from "../mod.ts";
import { affineFastApplies } from "../src/ops/matmul.ts";
import { roundThrough } from "../src/dtype.ts";
import { assertClose, randomValues, testContext } from "./helpers.ts";
import { refMatmul } from "./reference.ts";

const U = 2 ** -24;
const close = (got: ArrayLike<number>, ref: { y: Float64Array; mag: Float64Array }, k: number, what: string) =>
  assertClose(got, ref.y, (i) => (k + 4) * U * ref.mag[i]! + 1e-30, what);

Deno.test("dense matmul (f32 and bf16 weights) matches the reference", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  for (const [m, n, k] of [[1, 1, 1], [1, 7, 33], [3, 255, 64], [9, 17, 4097]] as [number, number, number][]) {
    for (const wt of [DType.F32, DType.BF16]) {
      await t.step(`${wt} m=${m} n=${n} k=${k}`, () => {
        const xv = randomValues(m * k, m + k), wv = randomValues(n * k, n + k, wt);
        using x = device.upload(xv), w = device.upload(wv, wt), y = device.alloc(m * n * 4, DType.F32);
        using enc = device.commandEncoder();
        ops.matmul(enc, registry, x, w, y, { m, n, k });
        enc.commitAndWait();
        close(y.read(), refMatmul(xv, wv, m, n, k), k, `matmul ${wt}`);
      });
    }
  }
});

Deno.test("dense matmul: weights written earlier in the same command buffer are read after their writer", () => {
  // Without constantWeights the GPU may not read W before the dispatches it depends on finish; with
  // it, the same product on weights no dispatch writes gives the same bits.
  using ctx = testContext();
  const { device, registry } = ctx;
  const [n, k] = [64, 2048]; // the bf16 fast path
  const xv = randomValues(k, 3), av = randomValues(n * k, 5, DType.BF16), bv = randomValues(n * k, 7, DType.BF16);
  using x = device.upload(xv), a = device.upload(av, DType.BF16), b = device.upload(bv, DType.BF16);
  using w = device.alloc(n * k * 2, DType.BF16), wConst = device.alloc(n * k * 2, DType.BF16);
  using y = device.alloc(n * 4, DType.F32), yConst = device.alloc(n * 4, DType.F32);
  {
    using enc = device.commandEncoder();
    ops.elementwiseAdd(enc, registry, a, b, wConst); // written in an earlier command buffer
    enc.commitAndWait();
  }
  for (let round = 0; round < 3; round++) {
    using enc = device.commandEncoder();
    ops.elementwiseAdd(enc, registry, a, b, w);
    enc.memoryBarrier();
    ops.matmul(enc, registry, x, w, y, { m: 1, n, k });
    ops.matmul(enc, registry, x, wConst, yConst, { m: 1, n, k, constantWeights: true });
    enc.memoryBarrier();
    ops.elementwiseAdd(enc, registry, w, w, w); // leaves W different for the next round's writer
    enc.commitAndWait();
    deepStrictEqual(y.read(), yConst.read(), `round ${round}`);
  }
  const wv = roundThrough(DType.BF16, Float32Array.from(av, (v, i) => v + bv[i]!));
  close(y.read(), refMatmul(xv, wv, 1, n, k), k, "x · (A + B)ᵀ");
});

Deno.test("validation mode refuses a constantWeights promise that an earlier dispatch breaks", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const [n, k] = [8, 64];
  using x = device.alloc(k * 4, DType.F32), a = device.alloc(n * k * 2, DType.BF16);
  using w = device.alloc(n * k * 2, DType.BF16), y = device.alloc(n * 4, DType.F32);
  const encode = (promise: boolean) => {
    const enc = device.commandEncoder({ validate: true });
    ops.elementwiseAdd(enc, registry, a, a, w); // writes W …
    enc.memoryBarrier();
    ops.matmul(enc, registry, x, w, y, { m: 1, n, k, constantWeights: promise }); // … then reads it
    return enc;
  };
  {
    using enc = encode(true);
    throws(
      () => enc.commitAndWait(),
      (e: unknown) =>
        e instanceof MlxError && e.code === "HazardError" &&
        /dispatch 1 \(matmul_bf16\) promised its w constant, but dispatch 0 \(elementwise_add_bf16\) writes/.test(
          e.message,
        ),
    );
  }
  {
    using enc = encode(false); // no promise: the barrier orders the write and the read
    enc.commitAndWait();
  }
  using later = device.commandEncoder({ validate: true }); // W was written by an earlier command buffer
  ops.matmul(later, registry, x, w, y, { m: 1, n, k, constantWeights: true });
  later.commitAndWait();
  // The check itself, on a recorded sequence: one broken promise, with both dispatches and the bytes.
  using session = new GraphExecutor(device).beginRecorded();
  session.elementwiseAdd(a, a, w);
  session.barrier();
  session.matmul(x, w, y, { m: 1, n, k, constantWeights: true });
  const broken = findBrokenConstantPromises(session.encoder.takeCapture() ?? []);
  deepStrictEqual(broken.map((b) => [b.promised.index, b.slot, b.writer.index, b.range[2] - b.range[1]]), [
    [1, "w", 0, n * k * 2],
  ]);
});

Deno.test("dense matmul with a residual: the reference, bit-equal to matmul → add, in place too", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  for (const [m, n, k] of [[1, 7, 33], [3, 255, 64], [2, 2048, 2048]] as [number, number, number][]) {
    for (const wt of [DType.F32, DType.BF16]) {
      await t.step(`${wt} m=${m} n=${n} k=${k}`, () => {
        const xv = randomValues(m * k, m + k), wv = randomValues(n * k, n + k, wt), rv = randomValues(m * n, n);
        using x = device.upload(xv), w = device.upload(wv, wt), r = device.upload(rv);
        using fused = device.alloc(m * n * 4, DType.F32), tmp = device.alloc(m * n * 4, DType.F32);
        using pair = device.alloc(m * n * 4, DType.F32), inPlace = device.upload(rv);
        using enc = device.commandEncoder();
        ops.matmul(enc, registry, x, w, fused, { m, n, k, residual: r });
        ops.matmul(enc, registry, x, w, inPlace, { m, n, k, residual: inPlace }); // y += x · Wᵀ
        ops.matmul(enc, registry, x, w, tmp, { m, n, k });
        enc.memoryBarrier();
        ops.elementwiseAdd(enc, registry, r, tmp, pair);
        enc.commitAndWait();
        const got = fused.read(), unfused = pair.read(), self = inPlace.read();
        for (let i = 0; i < m * n; i++) {
          equal(got[i], unfused[i], `fused vs matmul → add, i=${i}`);
          equal(self[i], unfused[i], `in place, i=${i}`);
        }
        // The product as for plain matmul, then one f32 addition (≤ 1 u of the sum).
        const ref = refMatmul(xv, wv, m, n, k);
        assertClose(
          got,
          ref.y.map((v, i) => v + rv[i]!),
          (i) => (k + 4) * U * ref.mag[i]! + U * Math.abs(ref.y[i]! + rv[i]!) + 1e-30,
          "matmul + residual",
        );
      });
    }
  }
  await t.step("a residual that partly overlaps y is refused, in TypeScript and natively", () => {
    using x = device.alloc(64 * 4, DType.F32), w = device.alloc(64 * 8 * 4, DType.F32);
    using buf = device.alloc(16 * 4, DType.F32);
    const y = buf.slice(0, 32), r = buf.slice(16, 32);
    using enc = device.commandEncoder();
    throws(
      () => ops.matmul(enc, registry, x, w, y, { m: 1, n: 8, k: 64, residual: r }),
      (e: unknown) => e instanceof MlxError && /residual must be y itself or not overlap/.test(e.message),
    );
    equal(enc.dispatchCount, 0);
    // Past the op's check, the native validator refuses the same bindings.
    using raw = device.commandEncoder();
    raw.dispatch({
      pipeline: registry.get("matmul_f32"),
      bindings: [x, w, y, [1, 8, 64, 1], r],
      grid: [2, 1, 1],
      threadgroup: 128,
    });
    throws(
      () => raw.commitAndWait(),
      (e: unknown) => e instanceof MlxError && /residual must be y itself or not overlap/.test(e.message),
    );
  });
});

Deno.test("dense matmul with the SwiGLU epilogue: the reference, bit-equal to matmul → siluMul", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  // n = 5632, k = 2048: the decode step's gate/up shape (the GPU's fast bf16 path); the others take
  // the generic paths (k not a multiple of 8, odd n, several rows).
  for (const [m, n, k] of [[1, 1, 1], [1, 7, 33], [3, 255, 64], [1, 5632, 2048]] as [number, number, number][]) {
    for (const wt of [DType.F32, DType.BF16]) {
      await t.step(`${wt} m=${m} n=${n} k=${k}`, () => {
        const xv = randomValues(m * k, m + k), wv = randomValues(2 * n * k, n + k, wt);
        using x = device.upload(xv), w = device.upload(wv, wt);
        using fused = device.alloc(m * n * 4, DType.F32), gu = device.alloc(m * 2 * n * 4, DType.F32);
        using pair = device.alloc(m * n * 4, DType.F32);
        using enc = device.commandEncoder();
        ops.matmul(enc, registry, x, w, fused, { m, n, k, swiglu: true });
        ops.matmul(enc, registry, x, w, gu, { m, n: 2 * n, k }); // the unfused pair, row by row
        enc.memoryBarrier();
        for (let r = 0; r < m; r++) {
          const row = gu.slice(r * 2 * n * 4, 2 * n * 4);
          ops.siluMul(enc, registry, row.slice(0, n * 4), row.slice(n * 4, n * 4), pair.slice(r * n * 4, n * 4), n);
        }
        enc.commitAndWait();
        const got = fused.read(), unfused = pair.read();
        for (let i = 0; i < m * n; i++) equal(got[i], unfused[i], `fused vs matmul → siluMul, i=${i}`);
        // Reference: gate g and up u in float64, then silu(g)·u. The f32 errors of g and u (as for
        // plain matmul) propagate through |silu'| ≤ 1.1 and the product; silu and the final product
        // add a few ulps of the result (expf, one division, one multiplication).
        const ref = refMatmul(xv, wv, m, 2 * n, k);
        const at = (i: number, half: number) => Math.floor(i / n) * 2 * n + half * n + (i % n);
        const silu = (v: number) => v / (1 + Math.exp(-v));
        assertClose(
          got,
          Float64Array.from({ length: m * n }, (_, i) => silu(ref.y[at(i, 0)]!) * ref.y[at(i, 1)]!),
          (i) => {
            const g = ref.y[at(i, 0)]!, u = ref.y[at(i, 1)]!, eg = (k + 4) * U * ref.mag[at(i, 0)]!;
            const eu = (k + 4) * U * ref.mag[at(i, 1)]!;
            return 1.1 * eg * (Math.abs(u) + eu) + Math.abs(silu(g)) * eu + 8 * U * Math.abs(silu(g) * u) + 1e-30;
          },
          "matmul + SwiGLU",
        );
      });
    }
  }
  await t.step("residual and swiglu together, or a bad epilogue code, are refused", () => {
    using x = device.alloc(64 * 4, DType.F32), w = device.alloc(64 * 16 * 4, DType.F32);
    using y = device.alloc(16 * 4, DType.F32), r = device.alloc(8 * 4, DType.F32);
    using enc = device.commandEncoder();
    throws(
      () => ops.matmul(enc, registry, x, w, y, { m: 1, n: 8, k: 64, residual: r, swiglu: true }),
      (e: unknown) => e instanceof MlxError && /cannot be combined/.test(e.message),
    );
    throws( // 2n rows of W are needed
      () => ops.matmul(enc, registry, x, w.slice(0, 64 * 12 * 4), y, { m: 1, n: 8, k: 64, swiglu: true }),
      (e: unknown) => e instanceof MlxError && /w/.test(e.message),
    );
    equal(enc.dispatchCount, 0);
    for (
      const [params, bindR, pattern] of [
        [[1, 8, 64, 3], false, /epilogue must be 0 \(none\), 1 \(residual\) or 2 \(SwiGLU\), got 3/],
        [[1, 8, 64, 0x200], false, /mode 0x200 has unknown bits/],
        [[1, 8, 64, 2], true, /slot 4 \(residual\) bound without the residual epilogue/],
        [[1, 8, 64, 1], false, /residual epilogue but slot 4 is not bound/],
        [[1, 16, 64, 2], false, /slot 1/], // W holds 16 rows, SwiGLU over n = 16 needs 32
      ] as const
    ) {
      using raw = device.commandEncoder();
      raw.dispatch({
        pipeline: registry.get("matmul_f32"),
        bindings: [x, w, y, [...params], bindR ? r : undefined],
        grid: [8, 1, 1],
        threadgroup: 128,
      });
      throws(
        () => raw.commitAndWait(),
        (e: unknown) => e instanceof MlxError && pattern.test(e.message),
        String(params),
      );
    }
  });
});

Deno.test("MLX affine quantized matmul: 4/6/8 bits × group 32/64/128, scalar and fast kernels", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const shapes: [number, number, number][] = [[1, 7, 256], [2, 16, 512], [5, 9, 384]];
  for (const bits of [4, 6, 8] as AffineBits[]) {
    for (const gs of [32, 64, 128] as AffineGroupSize[]) {
      for (const [m, n, k] of shapes) {
        await t.step(`${bits}-bit g${gs} m=${m} n=${n} k=${k}`, () => {
          const xv = randomValues(m * k, 3 * k + m), wv = randomValues(n * k, n * k + bits);
          const qz = quantizeAffine(wv, n, k, bits, gs);
          using x = device.upload(xv), w = device.upload(qz.weights);
          using sc = device.upload(qz.scales, DType.BF16), bi = device.upload(qz.biases, DType.BF16);
          using y = device.alloc(m * n * 4, DType.F32), yScalar = device.alloc(m * n * 4, DType.F32);
          const o = { m, n, k, bits, groupSize: gs };
          const fast = affineFastApplies(o);
          using enc = device.commandEncoder();
          ops.quantizedMatmul(enc, registry, x, w, sc, bi, y, o); // fast whenever it applies
          ops.quantizedMatmul(enc, registry, x, w, sc, bi, yScalar, { ...o, variant: "scalar" });
          enc.commitAndWait();
          const ref = refMatmul(xv, dequantizeAffine(qz), m, n, k);
          close(y.read(), ref, k, fast ? "fast" : "scalar");
          close(yScalar.read(), ref, k, "scalar");
          equal(fast, n % 8 === 0 && k % 256 === 0 && bits !== 6);
        });
      }
    }
  }
});

Deno.test("ggml Q4_0 / Q8_0 / Q6_K matmul: mat-vec and mat-mat agree with the reference", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const cases: [GgmlFormat, number, number, number][] = [
    ["q4_0", 1, 7, 96], // K not a multiple of 256: allowed for 32-value blocks
    ["q4_0", 8, 33, 4096],
    ["q4_0", 9, 5, 160],
    ["q8_0", 1, 1, 32],
    ["q8_0", 3, 31, 224],
    ["q8_0", 12, 8, 1024],
    ["q6_k", 1, 7, 256],
    ["q6_k", 5, 9, 512],
    ["q6_k", 10, 3, 768],
  ];
  for (const [format, m, n, k] of cases) {
    await t.step(`${format} m=${m} n=${n} k=${k}`, () => {
      const xv = randomValues(m * k, m * 7 + k), wv = randomValues(n * k, n * 11 + k);
      const blocks = quantizeGgml(wv, n, k, format);
      using x = device.upload(xv), w = device.upload(blocks);
      using yAuto = device.alloc(m * n * 4, DType.F32), yMm = device.alloc(m * n * 4, DType.F32);
      using enc = device.commandEncoder();
      ops.quantizedMatmulGgml(enc, registry, x, w, yAuto, { m, n, k, format });
      ops.quantizedMatmulGgml(enc, registry, x, w, yMm, { m, n, k, format, variant: "mm" });
      enc.commitAndWait();
      close(yAuto.read(), refMatmul(xv, dequantizeGgml(blocks, n, k, format), m, n, k), k, format);
      // Same arithmetic, different work split: the two paths agree bit for bit.
      deepStrictEqual(yMm.readBytes(), yAuto.readBytes());
    });
  }
});

Deno.test("quantizers reproduce weights within each format's resolution", () => {
  const n = 16, k = 512;
  const wv = randomValues(n * k, 5);
  const rms = (deq: ArrayLike<number>) =>
    Math.sqrt(Array.from(wv, (v, i) => (v - deq[i]!) ** 2).reduce((a, b) => a + b) / wv.length);
  // Uniform values in [-2, 2): the step is 4/levels for affine, amax/… for blocks; RMS error of a
  // uniform rounding is step/√12. Bounds below leave room for the bf16/f16 scale rounding.
  const bounds: [string, number, number][] = [
    ["affine8", rms(dequantizeAffine(quantizeAffine(wv, n, k, 8, 64))), (4 / 255) / Math.sqrt(12) * 1.5],
    ["affine6", rms(dequantizeAffine(quantizeAffine(wv, n, k, 6, 64))), (4 / 63) / Math.sqrt(12) * 1.5],
    ["affine4", rms(dequantizeAffine(quantizeAffine(wv, n, k, 4, 64))), (4 / 15) / Math.sqrt(12) * 1.5],
    ["q8_0", rms(dequantizeGgml(quantizeGgml(wv, n, k, "q8_0"), n, k, "q8_0")), (2 / 127) / Math.sqrt(12) * 1.5],
    ["q6_k", rms(dequantizeGgml(quantizeGgml(wv, n, k, "q6_k"), n, k, "q6_k")), (2 / 31) / Math.sqrt(12) * 1.5],
    ["q4_0", rms(dequantizeGgml(quantizeGgml(wv, n, k, "q4_0"), n, k, "q4_0")), (2 / 8) / Math.sqrt(12) * 1.5],
  ];
  for (const [name, err, bound] of bounds) ok(err > 0 && err < bound, `${name}: rms error ${err} >= ${bound}`);
  // Exactly representable grids come back exactly.
  const grid = Float32Array.from({ length: 64 }, (_, i) => (i % 16) - 8);
  deepStrictEqual(Array.from(dequantizeGgml(quantizeGgml(grid, 2, 32, "q4_0"), 2, 32, "q4_0")), Array.from(grid));
  deepStrictEqual(
    Array.from(dequantizeAffine(quantizeAffine(roundThrough("f32", grid), 1, 64, 4, 32))),
    Array.from(grid),
  );
});

Deno.test("MoE: each output row uses its token and its expert's weights", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  for (const [format, k] of [["q4_0", 64], ["q8_0", 96], ["q6_k", 256]] as [GgmlFormat, number][]) {
    await t.step(format, () => {
      const tokens = 3, topK = 2, experts = 4, n = 9;
      const xv = randomValues(tokens * k, k), wv = randomValues(experts * n * k, k + 1);
      const ids = new Uint32Array([3, 0, 1, 1, 2, 3]); // repeats and every expert
      const blocks = quantizeGgml(wv, experts * n, k, format); // experts stacked along N
      using x = device.upload(xv), w = device.upload(blocks), idb = device.upload(ids);
      using y = device.alloc(tokens * topK * n * 4, DType.F32);
      using enc = device.commandEncoder();
      ops.quantizedMatmulIdGgml(enc, registry, x, w, idb, y, { tokens, topK, n, k, experts, format });
      enc.commitAndWait();
      const deq = dequantizeGgml(blocks, experts * n, k, format);
      const got = y.read();
      for (let r = 0; r < tokens * topK; r++) {
        const xr = xv.subarray(Math.floor(r / topK) * k, (Math.floor(r / topK) + 1) * k);
        const ref = refMatmul(xr, deq.subarray(ids[r]! * n * k, (ids[r]! + 1) * n * k), 1, n, k);
        close(got.subarray(r * n, (r + 1) * n), ref, k, `row ${r}`);
      }
    });
  }
});

Deno.test("MoE: an expert id out of range fails that command buffer; the next one works", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const k = 32, n = 4;
  using x = device.upload(randomValues(k, 1)),
    w = device.upload(quantizeGgml(randomValues(2 * n * k, 2), 2 * n, k, "q8_0"));
  using bad = device.upload(new Uint32Array([7])), good = device.upload(new Uint32Array([1]));
  using y = device.alloc(n * 4, DType.F32);
  const o = { tokens: 1, topK: 1, n, k, experts: 2, format: "q8_0" as const };
  const enc = device.commandEncoder();
  ops.quantizedMatmulIdGgml(enc, registry, x, w, bad, y, o);
  throws(
    () => enc.commitAndWait(),
    (e: unknown) => e instanceof MlxError && e.code === "CommandBufferError" && /qmatmul_id_q8_0/.test(e.message),
  );
  throws(() => enc.waitUntilCompleted(), (e: unknown) => e instanceof MlxError && e.code === "CommandBufferError");
  enc.dispose();
  using enc2 = device.commandEncoder();
  ops.quantizedMatmulIdGgml(enc2, registry, x, w, good, y, o);
  enc2.commitAndWait();
  ok(y.read().some((v) => v !== 0));
});

Deno.test("matmul ops reject bad shapes, formats and buffers clearly", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  using x = device.alloc(4 * 64, DType.F32), w = device.alloc(4 * 64, DType.U8), y = device.alloc(64, DType.F32);
  using enc = device.commandEncoder();
  const bad = (fn: () => void, re: RegExp) =>
    throws(fn, (e: unknown) => e instanceof MlxError && e.code === "InvalidArgument" && re.test(e.message));
  bad(() => ops.quantizedMatmulGgml(enc, registry, x, w, y, { m: 1, n: 1, k: 48, format: "q4_0" }), /multiple of 32/);
  bad(
    () => ops.quantizedMatmulGgml(enc, registry, x, w, y, { m: 1, n: 1, k: 32, format: "q2_k" as GgmlFormat }),
    /unknown format/,
  );
  bad(
    () => ops.quantizedMatmulGgml(enc, registry, x, w, y, { m: 9, n: 1, k: 32, format: "q4_0", variant: "mv" }),
    /m <= 8/,
  );
  bad(() => ops.quantizedMatmulGgml(enc, registry, x, w, y, { m: 1, n: 100, k: 32, format: "q8_0" }), /w holds/);
  bad(() => ops.matmul(enc, registry, x, w, y, { m: 1, n: 1, k: 1 }), /f32, bf16 or f16/);
  bad(
    () =>
      ops.quantizedMatmul(enc, registry, x, w, y, y, y, {
        m: 1,
        n: 8,
        k: 256,
        bits: 6,
        groupSize: 64,
        variant: "fast",
      }),
    /fast kernel/,
  );
  equal(enc.dispatchCount, 0);
});

Deno.test("a session validates a matmul pipeline: ops declare their accesses", () => {
  using ctx = testContext({ validate: true });
  const { device } = ctx;
  const exec = new GraphExecutor(device, { autoBarriers: true });
  const k = 64, n = 32;
  using x = device.upload(randomValues(k, 1)), w = device.upload(randomValues(n * k, 2));
  using h = device.alloc(n * 4, DType.F32), w2 = device.upload(randomValues(n * n, 3));
  using out = device.alloc(n * 4, DType.F32);
  using s = exec.beginRecorded();
  s.matmul(x, w, h, { m: 1, n, k });
  s.matmul(h, w2, out, { m: 1, n, k: n }); // reads h: the auto barrier goes in
  const r = s.finish({ reorder: true });
  deepStrictEqual(r.barriers, [1]);
});
