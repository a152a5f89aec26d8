/**
 * MLX affine quantizer: bytes equal MLX's own quantize (both its GPU kernels' and its CPU
 * arithmetic), properties that hold whatever the implementation, the packing, and clear errors.
 *
 * Golden digests: SHA-256 of packed weights ‖ scales ‖ biases that ml-explore/mlx 846d1762 produces
 * for `adversarialRows(56, 512, 2027)` (rows for f16 kept inside f16's range): "cpu" is
 * mlx/backend/cpu/quantized.cpp's `quantize` compiled as is with MLX's own bf16/f16 types; "gpu" is
 * the Metal/CUDA `affine_quantize` kernel's per-group arithmetic transcribed to C++ (no Apple GPU
 * here), clang 14 -O2 -ffp-contract=off, x86-64. Neither harness is part of this repository.
 */
import { deepStrictEqual, equal, ok, throws } from "node:assert/strict";
import {
  type AffineGroupSize,
  type AffineQuantBits,
  type AffineQuantized,
  type AffineScaleDtype,
  dequantizeAffine,
  MlxError,
  quantizeAffine,
} from "../mod.ts";
import { randomValues } from "./helpers.ts";
import { adversarialRows } from "./helpers/quant_inputs.ts";

const UPSTREAM_SHA256: Record<string, string> = {
  "bf16 gpu 2 32": "a8fc08831adf294a59b1db353f001680af2c83274798c26fb4f1125f6aa16c8e",
  "bf16 gpu 3 64": "f4e93fb7a0c06188028a3a448b204ef5b9c7d340c283f88e09701220062b767d",
  "bf16 gpu 4 128": "127df440ffc6b32932a7628d5d5671a41a7c85fc5eb59485cd01e6aecd3af494",
  "bf16 gpu 5 32": "07d32f808387dda9be2f9e57589d27754ba97bcd569a7e5110accb66a3512fc0",
  "bf16 gpu 6 64": "ec7c86cb6c615dc58d2489b66069368d360537d23c43d9a7eee9ef2bd358e25b",
  "bf16 gpu 8 128": "b020bc7dadda5387efc8efb4f8e8e1bf9d92e83e270a3168cb6e3db0c85efcd2",
  "bf16 cpu 2 32": "db718e96c5d802351cf6bb585a8c9b4dccf2dcbdeb53a7118c8f44821f6eadb4",
  "bf16 cpu 3 64": "dc68b77adcee1d68094405ddff2ec01b2a5b051cba777a186e9bb4d7a1da47a4",
  "bf16 cpu 4 128": "2d1f49fd2688bcaa14070f17fb6ce7cdfdff8127ec20f085189252986d450de5",
  "bf16 cpu 5 32": "0ca89fb822a9137369455c67747a9ad2dac818c5492b0b38bb68ee1ca88b3e18",
  "bf16 cpu 6 64": "072643e6b64120b227b345ccf57b932f5fdb62c6cc8497007fe44f6fee9cc1a4",
  "bf16 cpu 8 128": "4649792769969f96b02cd0033fde71dbe4682d6e02bce202010bdc9349f6a0ab",
  "f16 gpu 2 32": "a0e1ee692acb93f9a5f0c959e5958949fdd5c9d0e3bfe145b64baa71a825f00e",
  "f16 gpu 3 64": "aba5c4a90ec7778bdf65a70326d9cba6aa9e51c409bbf971b1d6b538d2534410",
  "f16 gpu 4 128": "bb39d34282f71e54e626a82c62c19b09e6701a5a37524bb99c09817aebdd5248",
  "f16 gpu 5 32": "7842cd62d1f396095c6694240fc8853537891671015132774699ee10b896ec5e",
  "f16 gpu 6 64": "8d10432d9ee9b52d8d66957a46ef6124cfaae65515ebd61b48d0133a9107c831",
  "f16 gpu 8 128": "bd9504e1d1161a3c6c71f9aea10f16c6c87c7dcc8fc43b332d1767f92cb59c1e",
  "f16 cpu 2 32": "63e9de859a9ef917941f246cefd66325583aca69a460f4fcc9834ed7f3951952",
  "f16 cpu 3 64": "0a007a3713d3cba5d373c8c7295b478df45efec0ccac7c227dd6bb46e5fe5094",
  "f16 cpu 4 128": "166e0fabc1cd51ccb409231c80f8bc007697b627ff0336cb19e5bf3b940e84ad",
  "f16 cpu 5 32": "da491234363eafafcd37ced14d04ce34e1203cc97c81a881aa8ef74e118f7438",
  "f16 cpu 6 64": "0e49d1334c394216872d71ddc740b285e0e1d8e95be3855c5928e366a4bcd8c4",
  "f16 cpu 8 128": "93c5ca92495fcb21734e35246c33857b853988190f94cd5b2b039cd68ae3f7ed",
  "f32 gpu 2 32": "e4a47001c4ec0c44ba330c365e00627e49ba4c32e220d6e34497313c9a401704",
  "f32 gpu 3 64": "5ff2b3b7fbfa8ba9d192ee60f4c187c3b2e77f21a50174859a52a66b2afaf3ff",
  "f32 gpu 4 128": "2048ffe85a63cbc43dd0fcc70eca9f9e342585eb75d23cc59dff0caf2457c5ab",
  "f32 gpu 5 32": "237a620a2f83594956ca197667f659fbd72a34c9ab4e7c8e73f0f05f191e41ab",
  "f32 gpu 6 64": "7736db66774d264868eefc1eca791f54a9ed25efb0b35ce9cfb0b2804aa45d96",
  "f32 gpu 8 128": "148ae35372ff04cfd2203c7c6cbdae2f58f7bd5713ffcb49d123a6c5b7810db8",
  "f32 cpu 2 32": "4360927c811f105552f323fa7b00029a94de157cd72c360493679dca093c9e9e",
  "f32 cpu 3 64": "a98e010611aba8d85f17d6bd53969e7bc05503929f19911fca12fe4b7cb5db7b",
  "f32 cpu 4 128": "9d124c789721a95d581086855b569c49b5968edd1d16b37e4c44d3ee0cfcd876",
  "f32 cpu 5 32": "bd869409e6ce682cd1ad92979c1c702cfac5bdddb8a142bbf1f9797c427529f1",
  "f32 cpu 6 64": "d1964bc85406c6dadf960b55365cbd591c59d55c7dc277b8aa8e29ba269ca156",
  "f32 cpu 8 128": "a166088eef0c3d357882b50bbc9b2b244ee345d6063daaef83897d6d2f7b83c4",
};

async function sha256(parts: ArrayBufferView[]): Promise<string> {
  const total = parts.reduce((s, p) => s + p.byteLength, 0), all = new Uint8Array(total);
  let at = 0;
  for (const p of parts) {
    all.set(new Uint8Array(p.buffer, p.byteOffset, p.byteLength), at);
    at += p.byteLength;
  }
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", all));
  return Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
}

Deno.test("MLX affine: bytes equal MLX's quantize for every dtype, both implementations and all bit widths", async (t) => {
  for (const key of Object.keys(UPSTREAM_SHA256)) {
    const [dtype, variant, bits, gs] = key.split(" ");
    await t.step(key, async () => {
      const x = adversarialRows(56, 512, 2027, dtype === "f16" ? "f16" : "f32");
      const q = quantizeAffine(x, 56, 512, Number(bits) as AffineQuantBits, Number(gs) as AffineGroupSize, {
        dtype: dtype as AffineScaleDtype,
        variant: variant as "gpu" | "cpu",
      });
      equal(await sha256([q.weights, q.scales, q.biases]), UPSTREAM_SHA256[key]);
    });
  }
});

const ALL_BITS: AffineQuantBits[] = [2, 3, 4, 5, 6, 8];

Deno.test("every group's larger-magnitude end comes back exactly and the error stays within a step", () => {
  const n = 6, k = 256, w = randomValues(n * k, 31, "bf16", -3, 2);
  for (const bits of ALL_BITS) {
    for (const gs of [32, 64, 128] as AffineGroupSize[]) {
      for (const dtype of ["bf16", "f16", "f32"] as AffineScaleDtype[]) {
        const q = quantizeAffine(w, n, k, bits, gs, { dtype });
        const back = dequantizeAffine(q);
        const groups = (n * k) / gs;
        const value = (arr: Uint16Array | Float32Array, g: number) =>
          dtype === "f32"
            ? arr[g]
            : dtype === "f16"
            ? new Float16Array(Uint16Array.of(arr[g]!).buffer)[0]
            : new Float32Array(Uint32Array.of(arr[g]! << 16).buffer)[0];
        for (let g = 0; g < groups; g++) {
          const group = w.subarray(g * gs, (g + 1) * gs);
          let edge = 0, worst = 0;
          for (const v of group) if (Math.abs(v) > Math.abs(edge)) edge = v;
          for (let j = 0; j < gs; j++) {
            const i = g * gs + j;
            if (w[i] === edge) equal(back[i], edge, `${bits}b g${gs} ${dtype}: anchor of group ${g}`);
            worst = Math.max(worst, Math.abs(back[i]! - w[i]!));
          }
          // Half the stored step, or what the far end loses when q0's rounding shrank the step, plus
          // the step's rounding to the dtype over up to 2^bits − 1 codes.
          const levels = (1 << bits) - 1, s = Math.abs(value(q.scales, g)!);
          const range = Math.max(...group) - Math.min(...group);
          const rel = dtype === "bf16" ? 2 ** -8 : dtype === "f16" ? 2 ** -11 : 2 ** -24;
          const bound = Math.max(0.5 * s, range - levels * s) * (1 + rel) + 2 * levels * s * rel + 1e-7;
          ok(worst <= bound, `${bits}b g${gs} ${dtype}: group ${g} error ${worst} > ${bound}`);
        }
      }
    }
  }
});

Deno.test("packing: code j of a row sits at bit j·bits of a little-endian stream (MLX's u32 words and 3/5-byte packs)", () => {
  for (const bits of ALL_BITS) {
    // 0, 1, 2, … as codes: the group spans exactly 0..levels with scale 1 and bias 0 at 8 bits,
    // so pick values whose codes are known: w = code − levels with the min as anchor.
    const levels = (1 << bits) - 1, k = 128;
    const codes = Array.from({ length: k }, (_, j) => j % (levels + 1));
    const w = codes.map((c) => c - levels); // min −levels anchors: scale 1, bias −levels
    const q = quantizeAffine(w, 1, k, bits, 128, { dtype: "f32" });
    deepStrictEqual([q.scales[0], q.biases[0]], [1, -levels]);
    let stream = 0n;
    codes.forEach((c, j) => stream |= BigInt(c) << BigInt(j * bits));
    const expected = Array.from({ length: (k * bits) / 8 }, (_, b) => Number((stream >> BigInt(8 * b)) & 0xffn));
    deepStrictEqual(Array.from(q.weights), expected, `${bits} bits`);
    if (bits === 4 || bits === 8 || bits === 2) {
      const words = new Uint32Array(q.weights.buffer, 0, q.weights.length / 4), per = 32 / bits;
      for (let j = 0; j < k; j++) equal((words[Math.floor(j / per)]! >>> ((j % per) * bits)) & levels, codes[j]);
    }
  }
});

Deno.test("the GPU and CPU implementations differ where MLX's do: all-negative groups and ties", () => {
  // All negative: the GPU kernels start the max at 0, the CPU loop at −∞.
  const neg = Array.from({ length: 32 }, (_, j) => -1 - j / 31); // -1 … -2
  const gpu = quantizeAffine(neg, 1, 32, 4, 32, { dtype: "f32" });
  const cpu = quantizeAffine(neg, 1, 32, 4, 32, { dtype: "f32", variant: "cpu" });
  equal(gpu.scales[0], Math.fround(2 / 15)); // range 0 − (−2), anchored at −2 (q0 = −15)
  equal(cpu.scales[0], Math.fround(-2 / -30)); // range 1: scale 1/15, q0 = rint(−30) = −30, scale = −2/−30
  equal(cpu.biases[0], -2);
  // Ties: values −8 … 7 at scale 1 except one half-way value: rint (CPU) to even, round (GPU) away.
  const tie = Array.from({ length: 32 }, (_, j) => (j % 16) - 8);
  tie[5] = -8 + 2.5; // code 2.5
  const codeOf = (q: AffineQuantized) => (q.weights[2]! >> 4) & 15;
  equal(codeOf(quantizeAffine(tie, 1, 32, 4, 32, { dtype: "f32" })), 3);
  equal(codeOf(quantizeAffine(tie, 1, 32, 4, 32, { dtype: "f32", variant: "cpu" })), 2);
});

Deno.test("affine quantizer and dequantizer reject bad input with InvalidArgument", () => {
  const bad = (fn: () => unknown, re: RegExp) =>
    throws(fn, (e: unknown) => e instanceof MlxError && e.code === "InvalidArgument" && re.test(e.message));
  const w = new Float32Array(64);
  bad(() => quantizeAffine(w, 1, 64, 7 as AffineQuantBits, 32), /bits must be one of 2, 3, 4, 5, 6, 8 \(got 7\)/);
  bad(() => quantizeAffine(w, 1, 64, 4, 16 as AffineGroupSize), /group size must be 32, 64 or 128/);
  bad(() => quantizeAffine(w.subarray(0, 63), 1, 64, 4, 32), /63 values given for 64 weights/);
  bad(() => quantizeAffine(w.map((_, i) => i === 9 ? NaN : 1), 1, 64, 4, 32), /weight 9 is NaN/);
  bad(() => quantizeAffine(w.map((_, i) => i === 2 ? 1e5 : 1), 1, 64, 4, 32, { dtype: "f16" }), /overflows f16/);
  bad(() => quantizeAffine(w, 1, 48, 4, 32), /multiple of 32/);
  bad(() => quantizeAffine(w, 1, 64, 4, 32, { dtype: "f64" as AffineScaleDtype }), /dtype must be/);
  bad(() => quantizeAffine(w, 1, 64, 4, 32, { variant: "metal" as "gpu" }), /variant must be/);
  const q = quantizeAffine(randomValues(64, 1), 1, 64, 4, 32);
  bad(() => dequantizeAffine({ ...q, weights: q.weights.subarray(1) }), /weights hold 31 bytes/);
  bad(() => dequantizeAffine({ ...q, scales: q.scales.subarray(1) }), /scales must be a Uint16Array of 2 bf16 values/);
  bad(() => dequantizeAffine({ ...q, scaleDtype: "f32" }), /scales must be a Float32Array/);
});
