/**
 * Device time per kernel at the decode step's shapes (run on the GPU machine; skipped on the CPU backend,
 * where GPU-sized work only measures the host):
 *
 *   deno run --allow-ffi --allow-read --allow-env bench/gpu_kernels_bench.ts [--layers-shape llama1b]
 *
 * For each op, one command buffer holds R dispatches of it, either chained (a barrier after each:
 * what a dependent step pays, launch latency included) or independent (one concurrent group:
 * throughput). Device time ÷ R is printed with the bytes the op must move and the bandwidth that
 * implies. Shapes: hidden 2048, GQA 16/4 × 128, ffn 5632, vocab 32000, ctx 512 (torch_decode.py's).
 */
import { DType, type MlxBuffer, type MlxDevice, ops } from "../mod.ts";
import type { CommandEncoder } from "../src/encoder.ts";
import { f32Bits } from "../src/ops/common.ts";
import { openGpuOrSkip } from "./gpu_device.ts";

const R = 64, REPS = 20;
const HIDDEN = 2048, HEADS = 16, KV_HEADS = 4, HEAD_DIM = 128, FFN = 5632, VOCAB = 32000, CTX = 512;

const gpu = openGpuOrSkip("gpu_kernels_bench");
if (gpu) report(gpu);

/** Times every case on `device` and prints the table; closes the device. */
function report(device: MlxDevice): void {
  const reg = device.kernels;
  const f32 = (n: number) => device.alloc(n * 4, DType.F32);
  const bf16 = (n: number) => {
    const bits = new Uint16Array(n);
    for (let i = 0; i < n; i++) bits[i] = 0x3c00 + ((i * 2654435761) >>> 24); // small positive values
    return device.upload(bits, DType.BF16);
  };

  interface Case {
    name: string;
    /** Bytes one dispatch must read + write at minimum. */
    bytes: number;
    encode: (enc: CommandEncoder) => void;
  }

  const x = f32(FFN), y = f32(VOCAB), z = f32(FFN);
  const ones = device.upload(new Float32Array(HIDDEN).fill(1));
  const pos = device.upload(new Uint32Array([CTX - 1]));
  const kCache = f32(KV_HEADS * CTX * HEAD_DIM), vCache = f32(KV_HEADS * CTX * HEAD_DIM);
  const tmp = device.alloc(ops.flashAttnVecScratchBytes({ nHeads: HEADS, headDim: HEAD_DIM }), DType.F32);

  function gemv(n: number, k: number): Case {
    const w = bf16(n * k);
    return {
      name: `matmul bf16 ${n}×${k}`,
      bytes: n * k * 2 + k * 4 + n * 4,
      encode: (enc) => ops.matmul(enc, reg, x, w, y, { m: 1, n, k }),
    };
  }

  const cases: Case[] = [
    gemv(HIDDEN, HIDDEN),
    gemv(KV_HEADS * HEAD_DIM, HIDDEN),
    gemv(FFN, HIDDEN),
    gemv(HIDDEN, FFN),
    gemv(VOCAB, HIDDEN),
    {
      name: "rms_norm 2048",
      bytes: HIDDEN * 12,
      encode: (enc) => ops.rmsNorm(enc, reg, x, ones, z, { rows: 1, dim: HIDDEN, eps: 1e-5 }),
    },
    {
      name: "rms_norm_mul 2048",
      bytes: HIDDEN * 16,
      encode: (enc) => ops.rmsNormMul(enc, reg, x, ones, ones, z, { rows: 1, dim: HIDDEN, eps: 1e-5 }),
    },
    { name: "add 2048", bytes: HIDDEN * 12, encode: (enc) => ops.elementwiseAdd(enc, reg, x, x, z, HIDDEN) },
    { name: "silu 5632", bytes: FFN * 8, encode: (enc) => ops.silu(enc, reg, x, z, FFN) },
    {
      name: "rope_neox 16×128",
      bytes: HEADS * HEAD_DIM * 8,
      encode: (enc) =>
        ops.ropeNeox(enc, reg, x, z, pos, {
          theta: 1e4,
          headDim: HEAD_DIM,
          ropeDim: HEAD_DIM,
          nHeads: HEADS,
          seqLen: 1,
        }),
    },
    {
      name: "strided_copy 4×128 into the cache",
      bytes: KV_HEADS * HEAD_DIM * 8,
      encode: (enc) =>
        ops.stridedCopy(enc, reg, x, kCache.slice(0, ((KV_HEADS - 1) * CTX + 1) * HEAD_DIM * 4), {
          rows: KV_HEADS,
          cols: HEAD_DIM,
          dstStride: CTX * HEAD_DIM,
        }),
    },
    {
      name: "flash_attn_vec f32 ctx 512 (split + reduce)",
      bytes: 2 * KV_HEADS * CTX * HEAD_DIM * 4,
      encode: (enc) =>
        ops.flashAttnVec(enc, reg, x, kCache, vCache, tmp, z, {
          nHeads: HEADS,
          nKvHeads: KV_HEADS,
          headDim: HEAD_DIM,
          kvSeqLen: CTX,
          kvCapacity: CTX,
        }),
    },
    {
      name: "flash_attn_vec split kernel only",
      bytes: 2 * KV_HEADS * CTX * HEAD_DIM * 4,
      encode: (enc) =>
        enc.dispatch({
          pipeline: reg.get("flash_attn_vec_f32"),
          bindings: [x, kCache, vCache, tmp, [HEADS, KV_HEADS, HEAD_DIM, CTX, CTX, f32Bits(0.088), 1, 0, 0, 32]],
          grid: [HEADS, 32, 1],
          threadgroup: 32,
        }),
    },
    {
      name: "flash_attn_vec split kernel only, ctx 64",
      bytes: 2 * KV_HEADS * 64 * HEAD_DIM * 4,
      encode: (enc) =>
        enc.dispatch({
          pipeline: reg.get("flash_attn_vec_f32"),
          bindings: [x, kCache, vCache, tmp, [HEADS, KV_HEADS, HEAD_DIM, 64, CTX, f32Bits(0.088), 1, 0, 0, 32]],
          grid: [HEADS, 32, 1],
          threadgroup: 32,
        }),
    },
    {
      name: "flash_attn_vec reduce kernel only",
      bytes: HEADS * 32 * (HEAD_DIM + 2) * 4,
      encode: (enc) =>
        enc.dispatch({
          pipeline: reg.get("flash_attn_vec_reduce"),
          bindings: [tmp, z, [HEADS, HEAD_DIM, 32]],
          grid: HEADS,
          threadgroup: HEAD_DIM,
        }),
    },
  ];

  function deviceUsPerDispatch(c: Case, chained: boolean): number {
    let best = Infinity;
    for (let rep = 0; rep < REPS; rep++) {
      const enc = device.commandEncoder();
      for (let i = 0; i < R; i++) {
        c.encode(enc);
        if (chained) enc.memoryBarrier();
      }
      enc.commitAndWait();
      best = Math.min(best, enc.gpuNs / 1e3 / R);
      enc.dispose();
    }
    return best;
  }

  const rows = cases.map((c) => {
    const chained = deviceUsPerDispatch(c, true), independent = deviceUsPerDispatch(c, false);
    return {
      op: c.name,
      "chained µs": +chained.toFixed(2),
      "independent µs": +independent.toFixed(2),
      "MB moved": +(c.bytes / 1e6).toFixed(2),
      "GB/s chained": Math.round(c.bytes / chained / 1e3),
    };
  });
  console.log(
    `device: ${device.info.name} (${device.info.backend}); best of ${REPS} command buffers of ${R} dispatches`,
  );
  console.table(rows);
  for (const r of rows) console.log(JSON.stringify(r));
  const bufs: MlxBuffer[] = [x, y, z, ones, pos, kCache, vCache, tmp];
  for (const b of bufs) b.dispose();
  device.close();
}
