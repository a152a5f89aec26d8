/**
 * The weight formats and rope mode real model files need beyond the seed's: ggml Q4_1, Q5_0, Q5_1,
 * Q4_K and Q5_K (mat-vec, mat-mat, MoE-id), dense f16 weights with the matmul epilogues, MLX affine
 * with 2/3/5 bits and f16/f32 scales plus its MoE gather product, and ggml's normal-mode rope. Each
 * is checked against a float64 reference: products of the independently dequantized weights
 * (src/quant.ts) on bytes from the upstream quantizers and, for ggml, on random block bytes (every
 * scale, min and high-bit pattern, which quantized smooth data rarely reaches).
 *
 * Product tolerance: K products accumulated in f32 give (K + 4)·u·Σ|x·w| (u = 2⁻²⁴). The kernels
 * form each weight as d·q + m, scale·q + bias or d·sc·q − dmin·m in f32, so a weight may round near
 * the magnitude of its terms rather than its own: the bound adds 4·u·Σ|x|·max|w| of the row for that.
 */
import { deepStrictEqual, equal, throws } from "node:assert/strict";
import {
  type AffineGroupSize,
  type AffineQuantBits,
  type AffineQuantized,
  type AffineScaleDtype,
  dequantizeAffine,
  dequantizeGgml,
  DType,
  GGML_BLOCK,
  type GgmlFormat,
  GraphExecutor,
  MlxError,
  ops,
  quantizeAffine,
  quantizeGgml,
} from "../mod.ts";
import { assertClose, randomValues, rng, testContext } from "./helpers.ts";
import { refMatmul } from "./reference.ts";

const U = 2 ** -24;
const NEW_FORMATS: readonly GgmlFormat[] = ["q4_1", "q5_0", "q5_1", "q4_k", "q5_k"];

/** Offsets of each block's f16 fields (d, and m/dmin where the format has one). */
const HALF_FIELDS: Readonly<Record<string, readonly number[]>> = {
  q4_1: [0, 2],
  q5_0: [0],
  q5_1: [0, 2],
  q4_k: [0, 2],
  q5_k: [0, 2],
};

/**
 * Random block bytes: every quant, scale and high bit uniform, the f16 fields finite with magnitudes
 * in [2⁻⁸, 2⁻⁶) and random signs (a negative d or dmin is legal in the format).
 */
function randomBlocks(format: GgmlFormat, n: number, k: number, seed: number): Uint8Array {
  const blk = GGML_BLOCK[format], r = rng(seed);
  const out = Uint8Array.from({ length: n * (k / blk.values) * blk.bytes }, () => Math.floor(r() * 256));
  for (let at = 0; at < out.length; at += blk.bytes) {
    for (const off of HALF_FIELDS[format]!) {
      const bits = (r() < 0.5 ? 0x8000 : 0) | ((15 - 8 + Math.floor(r() * 2)) << 10) | Math.floor(r() * 1024);
      out[at + off] = bits & 0xff;
      out[at + off + 1] = bits >> 8;
    }
  }
  return out;
}

function checkRows(x: ArrayLike<number>, w: Float64Array, m: number, n: number, k: number) {
  const ref = refMatmul(x, w, m, n, k);
  const slack = new Float64Array(m * n);
  for (let j = 0; j < n; j++) {
    let wmax = 0;
    for (let t = 0; t < k; t++) wmax = Math.max(wmax, Math.abs(w[j * k + t]!));
    for (let i = 0; i < m; i++) {
      let xs = 0;
      for (let t = 0; t < k; t++) xs += Math.abs(x[i * k + t]!);
      slack[i * n + j] = 4 * U * xs * wmax;
    }
  }
  return { ref, slack };
}

function assertProduct(
  got: ArrayLike<number>,
  x: ArrayLike<number>,
  w: Float64Array,
  shape: { m: number; n: number; k: number },
  what: string,
) {
  const { m, n, k } = shape;
  const { ref, slack } = checkRows(x, w, m, n, k);
  assertClose(got, ref.y, (i) => (k + 4) * U * ref.mag[i]! + slack[i]! + 1e-30, what);
}

/** An expert-routed product: output row r is x[r / topK] times expert ids[r]'s rows of `w`. */
function assertExpertRows(
  got: { subarray(start: number, end: number): ArrayLike<number> },
  x: Float32Array,
  w: Float64Array,
  ids: Uint32Array,
  o: { tokens: number; topK: number; n: number; k: number },
  what: string,
) {
  const { topK, n, k } = o;
  for (let r = 0; r < o.tokens * topK; r++) {
    const t = Math.floor(r / topK);
    assertProduct(
      got.subarray(r * n, (r + 1) * n),
      x.subarray(t * k, (t + 1) * k),
      w.subarray(ids[r]! * n * k, (ids[r]! + 1) * n * k),
      { m: 1, n, k },
      `${what}, row ${r}`,
    );
  }
}

Deno.test("ggml Q4_1/Q5_0/Q5_1/Q4_K/Q5_K matmul: mat-vec and mat-mat match the float64 reference", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  for (const format of NEW_FORMATS) {
    const bv = GGML_BLOCK[format].values;
    const shapes: [number, number, number][] = [[1, 7, bv], [5, 9, 2 * bv], [10, 3, 3 * bv]];
    for (const [m, n, k] of shapes) {
      for (const source of ["quantized", "random bytes"]) {
        await t.step(`${format} ${source} m=${m} n=${n} k=${k}`, () => {
          const xv = randomValues(m * k, m * 13 + k);
          const blocks = source === "quantized"
            ? quantizeGgml(randomValues(n * k, n * 17 + k), n, k, format)
            : randomBlocks(format, n, k, n * 19 + k + m);
          using x = device.upload(xv), w = device.upload(blocks);
          using yAuto = device.alloc(m * n * 4, DType.F32), yMm = device.alloc(m * n * 4, DType.F32);
          using enc = device.commandEncoder();
          ops.quantizedMatmulGgml(enc, registry, x, w, yAuto, { m, n, k, format });
          ops.quantizedMatmulGgml(enc, registry, x, w, yMm, { m, n, k, format, variant: "mm" });
          enc.commitAndWait();
          assertProduct(yAuto.read(), xv, dequantizeGgml(blocks, n, k, format), { m, n, k }, format);
          // Same per-lane arithmetic, different work split: bit-equal.
          deepStrictEqual(yMm.readBytes(), yAuto.readBytes());
        });
      }
    }
  }
});

Deno.test("ggml Q4_1/Q5_0/Q5_1/Q4_K/Q5_K MoE: each output row uses its token and its expert", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  for (const format of NEW_FORMATS) {
    await t.step(format, () => {
      const k = 2 * GGML_BLOCK[format].values, tokens = 3, topK = 2, experts = 4, n = 6;
      const xv = randomValues(tokens * k, k + 3);
      const blocks = randomBlocks(format, experts * n, k, k + 5); // experts stacked along N
      const ids = new Uint32Array([3, 0, 1, 1, 2, 3]);
      using x = device.upload(xv), w = device.upload(blocks), idb = device.upload(ids);
      using y = device.alloc(tokens * topK * n * 4, DType.F32);
      using enc = device.commandEncoder();
      ops.quantizedMatmulIdGgml(enc, registry, x, w, idb, y, { tokens, topK, n, k, experts, format });
      enc.commitAndWait();
      const deq = dequantizeGgml(blocks, experts * n, k, format);
      assertExpertRows(y.read(), xv, deq, ids, { tokens, topK, n, k }, format);
    });
  }
});

Deno.test("ggml K-quant matmul rejects K that is not a whole number of 256-value blocks", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  using x = device.alloc(4 * 128, DType.F32), w = device.alloc(144, DType.U8), y = device.alloc(4, DType.F32);
  for (const format of ["q4_k", "q5_k"] as GgmlFormat[]) {
    using enc = device.commandEncoder();
    throws(
      () => ops.quantizedMatmulGgml(enc, registry, x, w, y, { m: 1, n: 1, k: 128, format }),
      (e: unknown) => e instanceof MlxError && e.code === "InvalidArgument" && /multiple of 256/.test(e.message),
    );
  }
});

Deno.test("dense matmul with f16 weights: plain, residual and SwiGLU epilogues", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  for (const [m, n, k] of [[1, 1, 1], [1, 7, 33], [3, 255, 64], [9, 17, 1025]] as [number, number, number][]) {
    await t.step(`m=${m} n=${n} k=${k}`, () => {
      const xv = randomValues(m * k, m + 3 * k), wv = randomValues(2 * n * k, n + k, DType.F16);
      const rv = randomValues(m * n, n + 1);
      using x = device.upload(xv), w = device.upload(wv, DType.F16), r = device.upload(rv);
      const f32 = (count: number) => device.alloc(count * 4, DType.F32);
      using y = f32(m * n), withRes = f32(m * n), glu = f32(m * n), gu = f32(m * 2 * n), pair = f32(m * n);
      using sum = f32(m * n);
      using enc = device.commandEncoder();
      ops.matmul(enc, registry, x, w, y, { m, n, k }); // W's first n rows
      ops.matmul(enc, registry, x, w, withRes, { m, n, k, residual: r });
      ops.matmul(enc, registry, x, w, glu, { m, n, k, swiglu: true });
      ops.matmul(enc, registry, x, w, gu, { m, n: 2 * n, k });
      enc.memoryBarrier();
      ops.elementwiseAdd(enc, registry, r, y, sum);
      for (let i = 0; i < m; i++) {
        const row = gu.slice(i * 2 * n * 4, 2 * n * 4);
        ops.siluMul(enc, registry, row.slice(0, n * 4), row.slice(n * 4, n * 4), pair.slice(i * n * 4, n * 4), n);
      }
      enc.commitAndWait();
      const ref = refMatmul(xv, wv.subarray(0, n * k), m, n, k);
      assertClose(y.read(), ref.y, (i) => (k + 4) * U * ref.mag[i]! + 1e-30, "f16 matmul");
      // The epilogues equal the unfused sequences bit for bit, as for f32 and bf16 weights.
      deepStrictEqual(withRes.readBytes(), sum.readBytes());
      deepStrictEqual(glu.readBytes(), pair.readBytes());
    });
  }
});

function uploadScales(device: ReturnType<typeof testContext>["device"], qz: AffineQuantized) {
  const dt = (qz.scaleDtype ?? "bf16") as DType;
  return { sc: device.upload(qz.scales, dt), bi: device.upload(qz.biases, dt) };
}

Deno.test("MLX affine matmul: 2/3/5 bits and f16/f32 scales match the float64 reference", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const cases: [AffineQuantBits, AffineGroupSize, AffineScaleDtype][] = [];
  for (const bits of [2, 3, 5] as AffineQuantBits[]) {
    for (const gs of [32, 64, 128] as AffineGroupSize[]) cases.push([bits, gs, "bf16"]);
  }
  for (const bits of [2, 3, 4, 5, 6, 8] as AffineQuantBits[]) {
    cases.push([bits, 64, "f16"], [bits, 32, "f32"]);
  }
  for (const [bits, gs, dtype] of cases) {
    for (const [m, n, k] of [[1, 7, 256], [3, 16, 384]] as [number, number, number][]) {
      await t.step(`${bits}-bit g${gs} ${dtype} m=${m} n=${n} k=${k}`, () => {
        const xv = randomValues(m * k, 5 * k + m + bits), wv = randomValues(n * k, n * k + bits + gs);
        const qz = quantizeAffine(wv, n, k, bits, gs, { dtype });
        using x = device.upload(xv), w = device.upload(qz.weights), y = device.alloc(m * n * 4, DType.F32);
        const { sc, bi } = uploadScales(device, qz);
        using _s = sc, _b = bi;
        using enc = device.commandEncoder();
        ops.quantizedMatmul(enc, registry, x, w, sc, bi, y, { m, n, k, bits, groupSize: gs });
        enc.commitAndWait();
        assertProduct(y.read(), xv, dequantizeAffine(qz), { m, n, k }, `${bits}-bit ${dtype}`);
      });
    }
  }
});

Deno.test("MLX affine MoE (gather): each output row uses its token and its expert", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  for (const [bits, gs, dtype] of [[3, 32, "bf16"], [4, 64, "f16"], [5, 128, "f32"], [8, 32, "bf16"]] as const) {
    await t.step(`${bits}-bit g${gs} ${dtype}`, () => {
      const k = 256, tokens = 3, topK = 2, experts = 4, n = 5;
      const xv = randomValues(tokens * k, k + bits), wv = randomValues(experts * n * k, k + gs);
      const qz = quantizeAffine(wv, experts * n, k, bits, gs, { dtype }); // experts stacked along N
      const ids = new Uint32Array([2, 0, 3, 3, 1, 2]);
      using x = device.upload(xv), w = device.upload(qz.weights), idb = device.upload(ids);
      const { sc, bi } = uploadScales(device, qz);
      using _s = sc, _b = bi;
      using y = device.alloc(tokens * topK * n * 4, DType.F32);
      const o = { tokens, topK, n, k, experts, bits, groupSize: gs };
      const deq = dequantizeAffine(qz), exec = new GraphExecutor(device);
      // The op on an encoder, then as a method of a direct and of a recorded session.
      const ways: [string, () => void][] = [
        ["ops on an encoder", () => {
          using enc = device.commandEncoder();
          ops.quantizedMatmulAffineGather(enc, registry, x, w, sc, bi, idb, y, o);
          enc.commitAndWait();
        }],
        ["direct session method", () => {
          const s = exec.begin();
          s.quantizedMatmulAffineGather(x, w, sc, bi, idb, y, o);
          s.finish();
        }],
        ["recorded session method", () => {
          const s = exec.beginRecorded();
          s.quantizedMatmulAffineGather(x, w, sc, bi, idb, y, o);
          s.finish({ fuse: true, reorder: true });
        }],
      ];
      for (const [way, run] of ways) {
        y.write(new Float32Array(tokens * topK * n).fill(Number.NaN));
        run();
        assertExpertRows(y.read(), xv, deq, ids, { tokens, topK, n, k }, way);
      }
    });
  }
  await t.step("an expert id out of range fails the command buffer", () => {
    const k = 64, n = 4;
    const qz = quantizeAffine(randomValues(2 * n * k, 9), 2 * n, k, 4, 32);
    using x = device.upload(randomValues(k, 1)), w = device.upload(qz.weights);
    const { sc, bi } = uploadScales(device, qz);
    using _s = sc, _b = bi;
    using bad = device.upload(new Uint32Array([2])), y = device.alloc(n * 4, DType.F32);
    using enc = device.commandEncoder();
    const o = { tokens: 1, topK: 1, n, k, experts: 2, bits: 4 as const, groupSize: 32 as const };
    ops.quantizedMatmulAffineGather(enc, registry, x, w, sc, bi, bad, y, o);
    throws(
      () => enc.commitAndWait(),
      (e: unknown) =>
        e instanceof MlxError && e.code === "CommandBufferError" && /qmatmul_affine_gather/.test(e.message),
    );
  });
});

Deno.test("MLX affine ops reject bad widths, mixed scale dtypes and the fast kernel off its rules", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  using x = device.alloc(4 * 256, DType.F32), w = device.alloc(256, DType.U8), y = device.alloc(64, DType.F32);
  using s16 = device.alloc(64, DType.F16), sb16 = device.alloc(64, DType.BF16);
  using enc = device.commandEncoder();
  const bad = (fn: () => void, re: RegExp) =>
    throws(fn, (e: unknown) => e instanceof MlxError && e.code === "InvalidArgument" && re.test(e.message));
  const o = { m: 1, n: 1, k: 256, groupSize: 64 as const };
  bad(() => ops.quantizedMatmul(enc, registry, x, w, s16, s16, y, { ...o, bits: 7 as 8 }), /bits must be 2, 3, 4, 5/);
  bad(() => ops.quantizedMatmul(enc, registry, x, w, s16, sb16, y, { ...o, bits: 4 }), /share one dtype/);
  bad(() => ops.quantizedMatmul(enc, registry, x, w, w, w, y, { ...o, bits: 4 }), /one dtype of f32, f16 or bf16/);
  bad(
    () => ops.quantizedMatmul(enc, registry, x, w, s16, s16, y, { ...o, n: 8, bits: 4, variant: "fast" }),
    /bf16 scales/,
  );
  equal(enc.dispatchCount, 0);
});

/** ggml normal-mode rope in float64: pairs (2i, 2i+1), i < ropeDim/2; dims ≥ ropeDim copied. */
function refRopeNorm(
  x: ArrayLike<number>,
  pos: ArrayLike<number>,
  o: { theta: number; headDim: number; ropeDim: number; nHeads: number; seqLen: number },
  ff?: ArrayLike<number>,
): Float64Array {
  const { headDim: hd, ropeDim: rd, nHeads } = o, out = Float64Array.from(x);
  for (let r = 0; r < o.seqLen * nHeads; r++) {
    for (let i = 0; i < rd / 2; i++) {
      const ang = pos[Math.floor(r / nHeads)]! * o.theta ** (-2 * i / rd) / (ff ? ff[i] : 1)!;
      const x0 = x[r * hd + 2 * i]!, x1 = x[r * hd + 2 * i + 1]!;
      out[r * hd + 2 * i] = x0 * Math.cos(ang) - x1 * Math.sin(ang);
      out[r * hd + 2 * i + 1] = x0 * Math.sin(ang) + x1 * Math.cos(ang);
    }
  }
  return out;
}

Deno.test("rope_norm (ggml normal mode): adjacent pairs, partial rotation, freq factors, strided output", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const cases = [
    { headDim: 64, ropeDim: 64, nHeads: 1, seqLen: 1, ff: false },
    { headDim: 80, ropeDim: 32, nHeads: 3, seqLen: 7, ff: false },
    { headDim: 128, ropeDim: 128, nHeads: 4, seqLen: 5, ff: true },
    { headDim: 6, ropeDim: 4, nHeads: 2, seqLen: 3, ff: true },
  ];
  for (const c of cases) {
    await t.step(JSON.stringify(c), () => {
      const theta = 500000, rows = c.seqLen * c.nHeads;
      const xv = randomValues(rows * c.headDim, rows + 2 * c.headDim);
      const pos = Uint32Array.from({ length: c.seqLen }, (_, i) => 5 + i * 13);
      const ffv = c.ff ? randomValues(c.ropeDim / 2, 7, DType.F32, 1, 8) : undefined;
      using x = device.upload(xv), p = device.upload(pos);
      using ff = ffv ? device.upload(ffv) : undefined;
      using y = device.alloc(rows * c.headDim * 4, DType.F32);
      // Head-major strided output (a [heads, seqLen, headDim] cache), as a KV cache write.
      using cache = device.alloc(rows * c.headDim * 4, DType.F32);
      using enc = device.commandEncoder();
      ops.ropeNorm(enc, registry, x, y, p, { ...c, theta, freqFactors: ff });
      ops.ropeNorm(enc, registry, x, cache, p, {
        ...c,
        theta,
        freqFactors: ff,
        outHeadStride: c.seqLen * c.headDim,
        outTokenStride: c.headDim,
      });
      enc.commitAndWait();
      const want = refRopeNorm(xv, pos, { ...c, theta }, ffv);
      // f32 angle (pow, product, division: a few ulps of it) and f32 sin/cos, as for rope_neox.
      const tol = (k: number) => {
        const r = Math.floor(k / c.headDim), d = k % c.headDim;
        if (d >= c.ropeDim) return 0; // pass-through: copied exactly
        const i = Math.floor(d / 2);
        const ang = pos[Math.floor(r / c.nHeads)]! * theta ** (-2 * i / c.ropeDim) / (ffv ? ffv[i] : 1)!;
        const mag = Math.abs(xv[r * c.headDim + 2 * i]!) + Math.abs(xv[r * c.headDim + 2 * i + 1]!);
        return mag * (16 * ang + 8) * U;
      };
      const got = y.read();
      assertClose(got, want, tol, "rope_norm");
      const headMajor = cache.read(), back = new Float32Array(rows * c.headDim);
      for (let tok = 0; tok < c.seqLen; tok++) {
        for (let h = 0; h < c.nHeads; h++) {
          const src = (h * c.seqLen + tok) * c.headDim, dst = (tok * c.nHeads + h) * c.headDim;
          back.set(headMajor.subarray(src, src + c.headDim), dst);
        }
      }
      deepStrictEqual(back, got);
    });
  }
});
