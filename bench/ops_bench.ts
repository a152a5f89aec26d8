/**
 * One op per command buffer (encode + commit + wait) on decode shapes: hidden 2048, 16 heads × 128
 * (GQA 16/4), ffn 5632, context 512; Q4_0 and MLX 4-bit weights.
 *
 *   deno bench --allow-ffi --allow-read --allow-env bench/ops_bench.ts
 */
import { DType, KernelRegistry, MlxDevice, ops, quantizeAffine, quantizeGgml } from "../mod.ts";
import type { DispatchTarget } from "../src/ops/common.ts";

const hidden = 2048, heads = 16, kvHeads = 4, hd = 128, ffn = 5632, ctx = 512;
const device = MlxDevice.open();
const registry = new KernelRegistry(device);
const rand = (n: number, seed: number) => {
  let s = seed >>> 0;
  return Float32Array.from({ length: n }, () => ((s = (s * 1664525 + 1013904223) >>> 0) / 2 ** 32) * 2 - 1);
};
const x = device.upload(rand(ffn, 1)), y = device.alloc(ffn * 4, DType.F32);
const wUp = rand(ffn * hidden, 2);
const q4Up = device.upload(quantizeGgml(wUp, ffn, hidden, "q4_0"));
const q4Down = device.upload(quantizeGgml(rand(hidden * ffn, 3), hidden, ffn, "q4_0"));
const aff = quantizeAffine(wUp, ffn, hidden, 4, 64);
const affW = device.upload(aff.weights),
  affS = device.upload(aff.scales, DType.BF16),
  affB = device.upload(aff.biases, DType.BF16);
const dense = device.upload(rand(hidden * hidden, 4), DType.BF16);
const q = device.upload(rand(heads * hd, 5));
const kCache = device.upload(rand(kvHeads * ctx * hd, 6)), vCache = device.upload(rand(kvHeads * ctx * hd, 7));
const kCache16 = device.upload(rand(kvHeads * ctx * hd, 6), DType.F16),
  vCache16 = device.upload(rand(kvHeads * ctx * hd, 7), DType.F16);
const tmp = device.alloc(ops.flashAttnVecScratchBytes({ nHeads: heads, headDim: hd }), DType.F32);
const attnOut = device.alloc(heads * hd * 4, DType.F32);
const w = device.upload(rand(hidden, 8)),
  h = device.alloc(hidden * 4, DType.F32),
  pos = device.upload(new Uint32Array([ctx - 1]));

function bench(name: string, group: string, op: (t: DispatchTarget) => void) {
  Deno.bench(name, { group }, () => {
    const enc = device.commandEncoder();
    op(enc);
    enc.commitAndWait();
    enc.dispose();
  });
}

bench(
  "Q4_0 up   [1×2048]·[5632×2048]ᵀ (mat-vec)",
  "matmul",
  (t) => ops.quantizedMatmulGgml(t, registry, x, q4Up, y, { m: 1, n: ffn, k: hidden, format: "q4_0" }),
);
bench(
  "Q4_0 down [1×5632]·[2048×5632]ᵀ (mat-vec)",
  "matmul",
  (t) => ops.quantizedMatmulGgml(t, registry, x, q4Down, y, { m: 1, n: hidden, k: ffn, format: "q4_0" }),
);
bench(
  "MLX 4-bit g64 up [1×2048]·[5632×2048]ᵀ (fast kernel)",
  "matmul",
  (t) => ops.quantizedMatmul(t, registry, x, affW, affS, affB, y, { m: 1, n: ffn, k: hidden, bits: 4, groupSize: 64 }),
);
bench(
  "MLX 4-bit g64 up (scalar kernel)",
  "matmul",
  (t) =>
    ops.quantizedMatmul(t, registry, x, affW, affS, affB, y, {
      m: 1,
      n: ffn,
      k: hidden,
      bits: 4,
      groupSize: 64,
      variant: "scalar",
    }),
);
bench(
  "dense bf16 [1×2048]·[2048×2048]ᵀ",
  "matmul",
  (t) => ops.matmul(t, registry, x, dense, y, { m: 1, n: hidden, k: hidden }),
);
bench(
  "sdpa decode 16×128, GQA 16/4, ctx 512",
  "attention",
  (t) =>
    ops.sdpa(t, registry, q, kCache, vCache, attnOut, {
      nHeads: heads,
      nKvHeads: kvHeads,
      headDim: hd,
      seqLen: 1,
      kvSeqLen: ctx,
      kvCapacity: ctx,
    }),
);
bench(
  "flash_attn_vec f32 K/V (split 32 + reduce)",
  "attention",
  (t) =>
    ops.flashAttnVec(t, registry, q, kCache, vCache, tmp, attnOut, {
      nHeads: heads,
      nKvHeads: kvHeads,
      headDim: hd,
      kvSeqLen: ctx,
      kvCapacity: ctx,
    }),
);
bench(
  "flash_attn_vec f16 K/V (split 32 + reduce)",
  "attention",
  (t) =>
    ops.flashAttnVec(t, registry, q, kCache16, vCache16, tmp, attnOut, {
      nHeads: heads,
      nKvHeads: kvHeads,
      headDim: hd,
      kvSeqLen: ctx,
      kvCapacity: ctx,
    }),
);
bench("rms_norm 2048", "small", (t) => ops.rmsNorm(t, registry, x, w, h, { rows: 1, dim: hidden, eps: 1e-5 }));
bench(
  "rope_neox 16 heads × 128",
  "small",
  (t) => ops.ropeNeox(t, registry, q, attnOut, pos, { theta: 1e4, headDim: hd, ropeDim: hd, nHeads: heads, seqLen: 1 }),
);
bench("elementwise add 5632", "small", (t) => ops.elementwiseAdd(t, registry, x, x, y));
