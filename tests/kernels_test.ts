/**
 * Every kernel, through the FFI, against the float64 references of tests/reference.ts on odd sizes.
 *
 * Tolerances are derived per kernel from the arithmetic the kernels do: they compute in f32
 * (u32 = 2⁻²⁴ unit roundoff) and round the result once into the output dtype (u = 2⁻²⁴, 2⁻¹¹ for
 * f16, 2⁻⁸ for bf16). Each tolerance is stated next to its test.
 */
import { deepStrictEqual as assertEquals, equal, throws } from "node:assert/strict";
import { type DType, DType as D, type MlxBuffer, MlxError, ops } from "../mod.ts";
import { roundThrough } from "../src/dtype.ts";
import { f32Bits } from "../src/ops/common.ts";
import { assertClose, randomValues, testContext, unitRoundoff } from "./helpers.ts";
import {
  neoxAngle,
  refAdd,
  refGelu,
  refMul,
  refRmsNorm,
  refRope,
  refRopeNeox,
  refSilu,
  refSoftcap,
  refSoftmax,
} from "./reference.ts";

const U32 = 2 ** -24;
const FLOATS: DType[] = [D.F32, D.F16, D.BF16];
const SIZES = [1, 7, 255, 4097, 65537];
/** The smallest f16 subnormal: absolute floor for f16 results near zero. */
const subnormalFloor = (dtype: DType) => dtype === D.F16 ? 2 ** -24 : 0;

function run(fn: (enc: import("../mod.ts").CommandEncoder) => void, device: import("../mod.ts").MlxDevice): void {
  using enc = device.commandEncoder();
  fn(enc);
  enc.commitAndWait();
}

Deno.test("elementwise add/mul match the reference for every dtype and odd sizes", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  for (const dtype of FLOATS) {
    for (const n of SIZES) {
      await t.step(`${dtype} n=${n}`, () => {
        const av = randomValues(n, n * 3 + 1, dtype), bv = randomValues(n, n * 5 + 2, dtype);
        using a = device.upload(av, dtype), b = device.upload(bv, dtype);
        using sum = device.alloc(n * (dtype === D.F32 ? 4 : 2), dtype);
        using prod = device.alloc(n * (dtype === D.F32 ? 4 : 2), dtype);
        run((enc) => {
          ops.elementwiseAdd(enc, registry, a, b, sum);
          ops.elementwiseMul(enc, registry, a, b, prod);
        }, device);
        // f32: the kernel's single f32 rounding of an exact sum/product is exactly fround(ref).
        // f16/bf16: f32 then dtype rounding may double-round a tie: at most 1 ulp = 2u·|want|.
        const u = unitRoundoff(dtype);
        for (const [got, ref] of [[sum.read(), refAdd(av, bv)], [prod.read(), refMul(av, bv)]] as const) {
          const want = roundThrough(dtype, ref);
          if (dtype === D.F32) assertEquals(Array.from(got), Array.from(want));
          else assertClose(got, want, (i) => 2 * u * Math.abs(want[i]!) + subnormalFloor(dtype), `${dtype} n=${n}`);
        }
      });
    }
  }
});

Deno.test("rms_norm, rms_norm_mul and rms_norm_no_scale match the reference", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const shapes: [number, number][] = [[1, 1], [1, 7], [3, 255], [2, 4097], [7, 64]];
  for (const dtype of FLOATS) {
    for (const [rows, dim] of shapes) {
      await t.step(`${dtype} rows=${rows} dim=${dim}`, () => {
        const es = dtype === D.F32 ? 4 : 2;
        const xv = randomValues(rows * dim, rows * 31 + dim, dtype);
        const wv = randomValues(dim, dim + 7, dtype, 0.5, 1.5);
        const sv = randomValues(rows * dim, dim + 11, dtype);
        using x = device.upload(xv, dtype), w = device.upload(wv, dtype), s = device.upload(sv, dtype);
        using y = device.alloc(rows * dim * es, dtype), ym = device.alloc(rows * dim * es, dtype);
        const eps = 1e-5;
        run((enc) => {
          ops.rmsNorm(enc, registry, x, w, y, { rows, dim, eps });
          ops.rmsNormMul(enc, registry, x, w, s, ym, { rows, dim, eps });
        }, device);
        // The f32 sum of dim squares has relative error ≤ dim·u32; the rsqrt, two products and the
        // final store add a few roundings: |err| ≤ |want|·((dim + 8)·u32 + 2u).
        const u = unitRoundoff(dtype);
        const want = refRmsNorm(xv, wv, rows, dim, eps);
        assertClose(
          y.read(),
          want,
          (i) => Math.abs(want[i]!) * ((dim + 8) * U32 + 2 * u) + subnormalFloor(dtype),
          "rms_norm",
        );
        // Fused: one more product and one more rounding through the dtype.
        const wantMul = refMul(want, sv);
        assertClose(
          ym.read(),
          wantMul,
          (i) => Math.abs(wantMul[i]!) * ((dim + 10) * U32 + 4 * u) + 2 * subnormalFloor(dtype),
          "rms_norm_mul",
        );
        if (dtype === D.F32) {
          using z = device.alloc(rows * dim * 4, D.F32);
          run((enc) => ops.rmsNormNoScale(enc, registry, x, z, { rows, dim, eps }), device);
          const wantNs = refRmsNorm(xv, null, rows, dim, eps);
          assertClose(z.read(), wantNs, (i) => Math.abs(wantNs[i]!) * (dim + 8) * U32, "rms_norm_no_scale");
        }
      });
    }
  }
});

Deno.test("fused rms_norm_mul is bit-identical to rms_norm → barrier → mul", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  for (const dtype of FLOATS) {
    await t.step(dtype, () => {
      const rows = 5, dim = 300, es = dtype === D.F32 ? 4 : 2;
      using x = device.upload(randomValues(rows * dim, 1, dtype), dtype);
      using w = device.upload(randomValues(dim, 2, dtype), dtype);
      using s = device.upload(randomValues(rows * dim, 3, dtype), dtype);
      using tmp = device.alloc(rows * dim * es, dtype);
      using a = device.alloc(rows * dim * es, dtype), b = device.alloc(rows * dim * es, dtype);
      run((enc) => {
        ops.rmsNorm(enc, registry, x, w, tmp, { rows, dim, eps: 1e-6 });
        enc.memoryBarrier();
        ops.elementwiseMul(enc, registry, tmp, s, a);
        ops.rmsNormMul(enc, registry, x, w, s, b, { rows, dim, eps: 1e-6 });
      }, device);
      assertEquals(b.readBytes(), a.readBytes());
    });
  }
});

Deno.test("softmax matches the reference", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  for (const [rows, cols] of [[1, 1], [1, 7], [4, 255], [2, 4097], [3, 32000]] as const) {
    await t.step(`rows=${rows} cols=${cols}`, () => {
      const xv = randomValues(rows * cols, cols, D.F32, -8, 8);
      using x = device.upload(xv);
      using y = device.alloc(rows * cols * 4, D.F32);
      run((enc) => ops.softmax(enc, registry, x, y, { rows, cols }), device);
      // exp of an argument with ≤ 1 rounding, an f32 sum of cols terms (≤ cols·u32 relative), one
      // reciprocal and one product: |err| ≤ |want|·(cols + 12)·u32.
      const want = refSoftmax(xv, rows, cols);
      assertClose(y.read(), want, (i) => Math.abs(want[i]!) * (cols + 12) * U32 + 1e-30, "softmax");
    });
  }
});

Deno.test("gelu (tanh form, clamped) and softcap match the reference", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  for (const dtype of FLOATS) {
    for (const n of [1, 7, 255, 4097]) {
      await t.step(`gelu ${dtype} n=${n}`, () => {
        // Include arguments far beyond the clamp (|inner| > 15 from |x| ≳ 5.4).
        const xv = randomValues(n, n + 99, dtype, -40, 40);
        using x = device.upload(xv, dtype);
        using y = device.alloc(n * (dtype === D.F32 ? 4 : 2), dtype);
        run((enc) => ops.gelu(enc, registry, x, y), device);
        // A dozen f32 operations on values whose magnitude is at most ~|x|: a 32-ulp budget in
        // absolute terms of (1 + |x|), then one rounding into the dtype.
        const want = refGelu(xv);
        const u = unitRoundoff(dtype);
        assertClose(
          y.read(),
          want,
          (i) => 32 * U32 * (1 + Math.abs(xv[i]!)) + 2 * u * Math.abs(want[i]!) + subnormalFloor(dtype),
          "gelu",
        );
      });
    }
  }
  for (const n of [1, 7, 4097]) {
    await t.step(`softcap n=${n}`, () => {
      const cap = 30;
      const xv = randomValues(n, n, D.F32, -100, 100);
      using x = device.upload(xv);
      using y = device.alloc(n * 4, D.F32);
      run((enc) => ops.softcap(enc, registry, x, y, { cap }), device);
      // a division, tanhf (≤ 2 ulp) and a product: 8 u32 relative to the output scale cap.
      const want = refSoftcap(xv, cap);
      assertClose(y.read(), want, () => 8 * U32 * cap, "softcap");
    });
  }
});

Deno.test("axpby matches the reference", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  for (const n of SIZES) {
    await t.step(`n=${n}`, () => {
      const av = randomValues(n, n + 1), bv = randomValues(n, n + 2);
      const alpha = 0.75, beta = -1.3;
      using a = device.upload(av), b = device.upload(bv);
      using y = device.alloc(n * 4, D.F32);
      run((enc) => ops.axpby(enc, registry, a, b, y, { alpha, beta }), device);
      // Two products and a sum in f32 (3 roundings, no FMA contraction): ≤ 3 u32 of the magnitudes.
      const want = Float64Array.from(av, (x, i) => alpha * x + Math.fround(beta) * bv[i]!);
      assertClose(y.read(), want, (i) => 3 * U32 * (Math.abs(alpha * av[i]!) + Math.abs(beta * bv[i]!)), "axpby");
    });
  }
});

Deno.test("silu and silu_mul match the reference; strided_copy moves exactly its rows", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  for (const dtype of FLOATS) {
    for (const n of [1, 7, 4097]) {
      await t.step(`silu ${dtype} n=${n}`, () => {
        const xv = randomValues(n, n + 5, dtype, -20, 20);
        using x = device.upload(xv, dtype), y = device.alloc(n * (dtype === D.F32 ? 4 : 2), dtype);
        run((enc) => ops.silu(enc, registry, x, y), device);
        // expf, one addition, one division in f32 (≤ 4 u32 relative), then the dtype rounding.
        const want = refSilu(xv), u = unitRoundoff(dtype);
        assertClose(
          y.read(),
          want,
          (i) => Math.abs(want[i]!) * (8 * U32 + 2 * u) + 1e-30 + subnormalFloor(dtype),
          "silu",
        );
      });
    }
  }
  for (const dtype of FLOATS) {
    for (const n of [1, 7, 4097]) {
      await t.step(`silu_mul (SwiGLU) ${dtype} n=${n}: the reference, and bit-equal to silu → mul`, () => {
        const gv = randomValues(n, n + 11, dtype, -20, 20), uv = randomValues(n, n + 12, dtype, -4, 4);
        const bytes = n * (dtype === D.F32 ? 4 : 2);
        using g = device.upload(gv, dtype), up = device.upload(uv, dtype);
        using fused = device.alloc(bytes, dtype), s = device.alloc(bytes, dtype), pair = device.alloc(bytes, dtype);
        run((enc) => ops.siluMul(enc, registry, g, up, fused), device);
        run((enc) => {
          ops.silu(enc, registry, g, s);
          enc.memoryBarrier();
          ops.elementwiseMul(enc, registry, s, up, pair);
        }, device);
        const got = fused.read(), unfused = pair.read();
        for (let i = 0; i < n; i++) assertEquals(got[i], unfused[i], `i=${i}`);
        // silu as above (≤ 8 u32 + a dtype rounding), then one product rounded to the dtype.
        const sw = refSilu(gv), want = Float64Array.from(sw, (v, i) => v * uv[i]!), u = unitRoundoff(dtype);
        assertClose(
          got,
          want,
          (i) => Math.abs(want[i]!) * (8 * U32 + 4 * u) + 1e-30 + subnormalFloor(dtype) * (1 + Math.abs(uv[i]!)),
          "silu_mul",
        );
      });
    }
  }
  await t.step("strided_copy into a [heads, capacity, hd] cache row", () => {
    const heads = 3, cap = 5, hd = 4, pos = 2;
    const src = Float32Array.from({ length: heads * hd }, (_, i) => i + 1);
    using s = device.upload(src), cache = device.alloc(heads * cap * hd * 4, D.F32);
    run(
      (enc) =>
        ops.stridedCopy(enc, registry, s, cache.slice(pos * hd * 4, ((heads - 1) * cap + 1) * hd * 4), {
          rows: heads,
          cols: hd,
          dstStride: cap * hd,
        }),
      device,
    );
    const got = cache.read();
    for (let h = 0; h < heads; h++) {
      for (let r = 0; r < cap; r++) {
        for (let d = 0; d < hd; d++) {
          assertEquals(got[(h * cap + r) * hd + d], r === pos ? src[h * hd + d] : 0, `head ${h} row ${r} dim ${d}`);
        }
      }
    }
  });
});

Deno.test("rope rotates adjacent pairs like the reference", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  for (const [hd, seq] of [[2, 1], [6, 7], [64, 33], [128, 5]] as const) {
    await t.step(`hd=${hd} seq=${seq}`, () => {
      const theta = 10000;
      const xv = randomValues(seq * hd, hd + seq);
      const pos = Uint32Array.from({ length: seq }, (_, i) => i * 37 + (i % 3));
      using x = device.upload(xv), p = device.upload(pos);
      using y = device.alloc(seq * hd * 4, D.F32);
      run((enc) => ops.rope(enc, registry, x, y, p, { theta, headDim: hd, seqLen: seq }), device);
      // The f32 angle pos·theta^(−2i/hd) carries a relative error of ~12 u32 (powf of an exponent
      // that is itself rounded, scaled by ln θ ≈ 9.2); sin/cos and the rotation add ~8 u32.
      const want = refRope(xv, pos, theta, hd, seq);
      assertClose(y.read(), want, (k) => {
        const t = Math.floor(k / hd), i = Math.floor((k % hd) / 2);
        const ang = pos[t]! * theta ** (-2 * i / hd);
        return (Math.abs(xv[t * hd + 2 * i]!) + Math.abs(xv[t * hd + 2 * i + 1]!)) * (12 * ang + 8) * U32;
      }, "rope");
    });
  }
});

Deno.test("rope_neox: partial rotation, pass-through tail, freq factors, GQA-style rows", async (t) => {
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
      const theta = 1e6;
      const rows = c.seqLen * c.nHeads;
      const xv = randomValues(rows * c.headDim, rows + c.headDim);
      const pos = Uint32Array.from({ length: c.seqLen }, (_, i) => 3 + i * 11);
      const ffv = c.ff ? randomValues(c.ropeDim / 2, 5, D.F32, 1, 8) : undefined;
      using x = device.upload(xv), p = device.upload(pos);
      using ff = ffv ? device.upload(ffv) : undefined;
      using y = device.alloc(rows * c.headDim * 4, D.F32);
      run((enc) => ops.ropeNeox(enc, registry, x, y, p, { ...c, theta, freqFactors: ff }), device);
      const want = refRopeNeox(xv, pos, { ...c, theta }, ffv);
      const half = c.ropeDim / 2;
      assertClose(y.read(), want, (k) => {
        const r = Math.floor(k / c.headDim), d = k % c.headDim;
        if (d >= c.ropeDim) return 0; // pass-through: copied exactly
        const i = d % half;
        const ang = neoxAngle(pos[Math.floor(r / c.nHeads)]!, i, theta, c.ropeDim, ffv);
        const mag = Math.abs(xv[r * c.headDim + i]!) + Math.abs(xv[r * c.headDim + i + half]!);
        return mag * (16 * ang + 8) * U32; // as for rope, plus the freq-factor division
      }, "rope_neox");
    });
  }
});

Deno.test("rope_neox writes strided rows straight into a [heads, capacity, headDim] KV cache", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const theta = 1e4, headDim = 64, ropeDim = 32, nHeads = 3, capacity = 9;
  for (const [first, seqLen] of [[0, 1], [5, 2], [8, 1]] as [number, number][]) {
    await t.step(`tokens ${first}..${first + seqLen - 1}`, () => {
      const rows = seqLen * nHeads, sentinel = -7.25;
      const xv = randomValues(rows * headDim, first + 3);
      const pos = Uint32Array.from({ length: seqLen }, (_, i) => first + i);
      using x = device.upload(xv), p = device.upload(pos);
      using cache = device.upload(new Float32Array(nHeads * capacity * headDim).fill(sentinel));
      // Bound at the first token's row of head 0, through its last token's row of the last head.
      const at = cache.slice(first * headDim * 4, ((nHeads - 1) * capacity + seqLen) * headDim * 4);
      run((enc) =>
        ops.ropeNeox(enc, registry, x, at, p, {
          theta,
          headDim,
          ropeDim,
          nHeads,
          seqLen,
          outHeadStride: capacity * headDim,
          outTokenStride: headDim,
        }), device);
      const dense = refRopeNeox(xv, pos, { theta, headDim, ropeDim, nHeads, seqLen });
      const want = new Float64Array(nHeads * capacity * headDim).fill(sentinel);
      for (let r = 0; r < rows; r++) {
        const tok = Math.floor(r / nHeads), h = r % nHeads;
        want.set(dense.subarray(r * headDim, (r + 1) * headDim), (h * capacity + first + tok) * headDim);
      }
      const got = cache.read();
      assertClose(
        got,
        want,
        (k) => (want[k] === sentinel ? 0 : 64 * U32 * (1 + Math.abs(want[k]!))),
        "rope into cache",
      );
    });
  }
  await t.step("overlapping rows, or a strided output over the input, are refused", () => {
    using x = device.alloc(2 * 64 * 4, D.F32), p = device.alloc(8, D.U32), y = device.alloc(4096 * 4, D.F32);
    const o = { theta, headDim: 64, ropeDim: 64, nHeads: 2, seqLen: 1 };
    using enc = device.commandEncoder();
    throws(
      () => ops.ropeNeox(enc, registry, x, y, p, { ...o, outHeadStride: 32 }),
      (e: unknown) => e instanceof MlxError && /output rows overlap/.test(e.message),
    );
    throws(
      () => ops.ropeNeox(enc, registry, x, y, p, { ...o, seqLen: 2, nHeads: 1, outTokenStride: 0 }),
      (e: unknown) => e instanceof MlxError && /output rows overlap/.test(e.message),
    );
    throws(
      () => ops.ropeNeox(enc, registry, x, x, p, { ...o, nHeads: 1, seqLen: 2, outTokenStride: 64 * 2 }),
      (e: unknown) => e instanceof MlxError && /(must not overlap the input|needs)/.test(e.message),
    );
    throws(
      () => ops.ropeNeox(enc, registry, y.slice(0, 512), y.slice(256, 2048), p, { ...o, outHeadStride: 128 }),
      (e: unknown) => e instanceof MlxError && /must not overlap the input/.test(e.message),
    );
    equal(enc.dispatchCount, 0);
    // Past the op's checks, the native validator bounds the furthest strided row.
    using raw = device.commandEncoder();
    raw.dispatch({
      pipeline: registry.get("rope_neox_f32"),
      bindings: [x, y, [f32Bits(theta), 64, 64], p, [2, 0, 4096, 64, 0, 0, 0]],
      grid: [32, 2, 1],
      threadgroup: [32, 1, 1],
      dispatchKind: "threads",
    });
    throws(() => raw.commitAndWait(), (e: unknown) => e instanceof MlxError && /slot 1: bound slice/.test(e.message));
  });
});

Deno.test("kernels honour slice offsets exactly (inputs and outputs)", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const n = 37;
  const base = randomValues(3 * n + 5, 9);
  using big = device.upload(base);
  using out = device.alloc((3 * n + 5) * 4, D.F32);
  // a = elements [1, 1+n), b = [n+3, 2n+3); write into out at [2n+4, 3n+4).
  const a: MlxBuffer = big.slice(4, n * 4), b = big.slice((n + 3) * 4, n * 4);
  const o = out.slice((2 * n + 4) * 4, n * 4);
  run((enc) => ops.elementwiseAdd(enc, registry, a, b, o), device);
  const got = out.read();
  for (let i = 0; i < 3 * n + 5; i++) {
    const inside = i >= 2 * n + 4 && i < 3 * n + 4;
    const want = inside ? Math.fround(base[1 + i - (2 * n + 4)]! + base[n + 3 + i - (2 * n + 4)]!) : 0;
    assertEquals(got[i], want, `element ${i}`);
  }
});
