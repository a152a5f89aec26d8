/**
 * ggml quantizers: bytes equal the upstream C reference, format properties that hold whatever the
 * implementation, exact dequantizers, and clear errors for bad input.
 *
 * Golden digests: SHA-256 of the bytes that ggml-org/ggml d99724f2 (src/ggml-quants.c,
 * `quantize_row_*_ref`, clang 14 -O2 -ffp-contract=off -DNDEBUG, x86-64) writes for
 * `adversarialRows(56, 512, 2026)`; produced by a throwaway harness that is not part of this
 * repository. Blocks of float32-subnormal weights (C's undefined float→int conversion, see
 * src/quant/float32.ts) are in these rows, so a gcc build gives other digests for q4_0/q4_1/q8_0.
 * The properties below check the same code independently of those digests.
 */
import { deepStrictEqual, equal, ok, throws } from "node:assert/strict";
import fc from "fast-check";
import { dequantizeGgml, GGML_FORMATS, type GgmlQuantFormat, MlxError, quantizeGgml } from "../mod.ts";
import { randomValues } from "./helpers.ts";
import { adversarialRows } from "./helpers/quant_inputs.ts";

const FORMATS = Object.keys(GGML_FORMATS) as GgmlQuantFormat[];

const UPSTREAM_SHA256: Record<GgmlQuantFormat, string> = {
  q4_0: "f32e7005e7332eff3597b2cfae9a87f775f073e207cd01b1175d0f2f8059c85c",
  q4_1: "9d215eec2f55118221919dea7af5de2df6406e49bc68a7b83df0b1c2f410f5bd",
  q5_0: "05026a3c9808c6a9001407274955c856e3657cf09c5ac0cb6a9de602d9dbf75d",
  q5_1: "7e5edca95ee175f5516e28c6c760df8d1269ae9c43edacf0b67b1923a720b307",
  q8_0: "6ac0ab2ca90f609b2fe11d05114ac17e9cde037ffede0dce65367b7981be2381",
  q4_k: "76eb3c8dcfd9e97a3405fdecf53cc6543a0b306d8dd43dd7a473fb4bdc4c983c",
  q5_k: "52d9264b14bb5839e7df74ef9f9f0ce44764c30a22fd0b9882b8d690a0d0f571",
  q6_k: "cab167e8b125234831e6f166277da8518f6d435090d9d8abc28c21852ab60351",
  f16: "1e95c0c850b0b705b4d390897232dbda795db9aa9fd2b6c88004b2ef0f25f509",
};

async function sha256(bytes: Uint8Array): Promise<string> {
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", new Uint8Array(bytes)));
  return Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
}

Deno.test("ggml quantizers write the upstream reference's bytes on random and adversarial rows", async (t) => {
  const x = adversarialRows(56, 512, 2026);
  for (const format of FORMATS) {
    await t.step(format, async () => equal(await sha256(quantizeGgml(x, 56, 512, format)), UPSTREAM_SHA256[format]));
  }
});

/** The f16 scale fields (d, and dmin/m where present) of one block, as byte offsets. */
const SCALE_FIELDS: Record<GgmlQuantFormat, number[]> = {
  f16: [0],
  q4_0: [0],
  q4_1: [0, 2],
  q5_0: [0],
  q5_1: [0, 2],
  q8_0: [0],
  q4_k: [0, 2],
  q5_k: [0, 2],
  q6_k: [208],
};

Deno.test("scaling the weights by 4 scales the f16 scales by 4 and leaves every code alone", () => {
  // Every float step of the references is exact under a power-of-two scaling (no over/underflow, no
  // subnormal f16 values here).
  fc.assert(
    fc.property(fc.constantFrom(...FORMATS), fc.integer({ min: 1, max: 1 << 30 }), (format, seed) => {
      const blk = GGML_FORMATS[format], k = Math.max(256, blk.values);
      // Magnitudes below 2^-10 are moved up: an f16 subnormal loses bits that 4× its value keeps.
      const w = randomValues(2 * k, seed, "f32", -3, 3).map((v) => Math.abs(v) < 2 ** -10 ? 2 ** -10 : v);
      const a = quantizeGgml(w, 2, k, format), b = quantizeGgml(w.map((v) => v * 4), 2, k, format);
      const fields = new Set<number>();
      for (let at = 0; at < a.length; at += blk.bytes) for (const f of SCALE_FIELDS[format]) fields.add(at + f);
      const half = (bytes: Uint8Array, at: number) => new Float16Array(bytes.slice(at, at + 2).buffer)[0];
      for (let i = 0; i < a.length; i++) {
        if (fields.has(i)) {
          equal(half(b, i), 4 * half(a, i)!, `${format}: scale at byte ${i}`);
          i++;
        } else equal(b[i], a[i], `${format}: byte ${i}`);
      }
    }),
    { numRuns: 60 },
  );
});

Deno.test("dequantize(quantize(w)) stays within each format's step", () => {
  // Uniform values in [-2, 2): the worst error is about half a step, the step being range/levels;
  // Q4_0 and Q5_0 clip the end opposite the anchor (code 15 of −8..7), up to one step there.
  const n = 8, k = 512, w = randomValues(n * k, 77);
  const steps: Record<GgmlQuantFormat, number> = {
    f16: 2 ** -10,
    q8_0: 2 / 127,
    q6_k: 2 / 31,
    q5_0: 2 / 16,
    q5_1: 4 / 31,
    q5_k: 4 / 31,
    q4_0: 2 / 8,
    q4_1: 4 / 15,
    q4_k: 4 / 15,
  };
  for (const format of FORMATS) {
    const back = dequantizeGgml(quantizeGgml(w, n, k, format), n, k, format);
    let worst = 0;
    for (let i = 0; i < w.length; i++) worst = Math.max(worst, Math.abs(back[i]! - w[i]!));
    const bound = (format === "q4_0" || format === "q5_0" ? 1.01 : 0.75) * steps[format];
    ok(worst > 0 && worst <= bound, `${format}: worst error ${worst} > ${bound}`);
  }
});

Deno.test("ggml reference details: halves round away in Q8_0, −0 scale of an all-zero Q4_0 block, zero Q6_K", () => {
  // Q8_0: amax 127 gives d = 1 and id = 1, so codes are roundf(x): halves away from zero.
  const w = new Float32Array(32);
  w.set([127, 2.5, -2.5, 0.5, -0.5, 1.5, -1.5, -127]);
  const q8 = quantizeGgml(w, 1, 32, "q8_0");
  deepStrictEqual(Array.from(q8.subarray(0, 2)), [0x00, 0x3c]);
  deepStrictEqual(Array.from(new Int8Array(q8.buffer, 2, 8)), [127, 3, -3, 1, -1, 2, -2, -127]);
  // Q4_0 divides the signed max by −8: an all-zero block (with −0s) stores d = −0.
  const q4 = quantizeGgml(Float32Array.from({ length: 32 }, (_, i) => i % 2 ? -0 : 0), 1, 32, "q4_0");
  deepStrictEqual(Array.from(q4.subarray(0, 2)), [0x00, 0x80]);
  ok(q4.subarray(2).every((b) => b === 0x88));
  // Q6_K: a block below GROUP_MAX_EPS is all zero bytes.
  ok(quantizeGgml(new Float32Array(256).fill(1e-16), 1, 256, "q6_k").every((b) => b === 0));
});

Deno.test("Q4_K and Q5_K dequantizers read the packed 6-bit scales and mins of every sub-block", () => {
  // A hand-built block: d = 1, dmin = 0.5, sub-block j has scale j + 40 and min 63 − j (both use the
  // high 2 bits, so sub-blocks 4..7 exercise the split encoding), every code = its index mod 16.
  const scales = Array.from({ length: 8 }, (_, j) => j + 40), mins = Array.from({ length: 8 }, (_, j) => 63 - j);
  const packed = new Uint8Array(12);
  for (let j = 0; j < 4; j++) {
    packed[j] = (scales[j]! & 63) | ((scales[j + 4]! >> 4) << 6);
    packed[j + 4] = (mins[j]! & 63) | ((mins[j + 4]! >> 4) << 6);
    packed[j + 8] = (scales[j + 4]! & 15) | ((mins[j + 4]! & 15) << 4);
  }
  for (const format of ["q4_k", "q5_k"] as const) {
    const block = new Uint8Array(GGML_FORMATS[format].bytes);
    block.set([0x00, 0x3c, 0x00, 0x38], 0); // f16 1.0, 0.5
    block.set(packed, 4);
    const qs = format === "q4_k" ? 16 : 48;
    const code = (v: number) => (v * 7) % (format === "q4_k" ? 16 : 32);
    for (let v = 0; v < 256; v++) {
      // value v: chunk v/64, low nibble for the first 32 of a chunk, high for the second.
      const byte = qs + (v >> 6) * 32 + (v & 31), shift = (v >> 5) & 1 ? 4 : 0;
      block[byte]! |= (code(v) & 15) << shift;
      if (format === "q5_k" && code(v) & 16) block[16 + (v & 31)]! |= 1 << (v >> 5);
    }
    const out = dequantizeGgml(block, 1, 256, format);
    for (let v = 0; v < 256; v++) {
      equal(out[v], scales[v >> 5]! * code(v) - 0.5 * mins[v >> 5]!, `${format} value ${v}`);
    }
  }
});

Deno.test("Q4_1, Q5_0 and Q5_1 dequantizers: hand-built blocks", () => {
  const q41 = new Uint8Array(20);
  q41.set([0x00, 0x40, 0x00, 0xbc], 0); // d = 2, m = -1
  for (let j = 0; j < 16; j++) q41[4 + j] = j | ((15 - j) << 4);
  deepStrictEqual(
    Array.from(dequantizeGgml(q41, 1, 32, "q4_1")),
    Array.from({ length: 32 }, (_, i) => 2 * (i < 16 ? i : 31 - i) - 1),
  );
  const q50 = new Uint8Array(22), q51 = new Uint8Array(24);
  q50.set([0x00, 0x3c], 0); // d = 1
  q51.set([0x00, 0x38, 0x00, 0x40], 0); // d = 0.5, m = 2
  const codes = Array.from({ length: 32 }, (_, i) => (i * 11) % 32);
  let qh = 0;
  for (let j = 0; j < 16; j++) {
    const lo = codes[j]!, hi = codes[j + 16]!;
    q50[6 + j] = q51[8 + j] = (lo & 15) | ((hi & 15) << 4);
    qh |= ((lo >> 4) << j) | ((hi >> 4) << (j + 16));
  }
  new DataView(q50.buffer).setUint32(2, qh >>> 0, true);
  new DataView(q51.buffer).setUint32(4, qh >>> 0, true);
  deepStrictEqual(Array.from(dequantizeGgml(q50, 1, 32, "q5_0")), codes.map((c) => c - 16));
  deepStrictEqual(Array.from(dequantizeGgml(q51, 1, 32, "q5_1")), codes.map((c) => 0.5 * c + 2));
});

Deno.test("ggml quantizers and dequantizers reject bad input with InvalidArgument", () => {
  const bad = (fn: () => unknown, re: RegExp) =>
    throws(fn, (e: unknown) => e instanceof MlxError && e.code === "InvalidArgument" && re.test(e.message));
  const w = new Float32Array(256);
  bad(() => quantizeGgml(w.subarray(0, 255), 1, 256, "q4_k"), /255 values given for 256 weights/);
  bad(() => quantizeGgml(w.map((_, i) => i === 7 ? NaN : 0), 1, 256, "q6_k"), /weight 7 is NaN/);
  bad(() => quantizeGgml(w.map((_, i) => i === 3 ? -Infinity : 0), 1, 256, "q8_0"), /weight 3 is -Infinity/);
  bad(() => quantizeGgml([1e39, ...w.subarray(1)], 1, 256, "q4_0"), /not a finite float32/);
  bad(() => quantizeGgml(w, 1, 256, "q3_k" as GgmlQuantFormat), /unknown ggml format "q3_k"; use one of/);
  bad(() => quantizeGgml(w, 1, 128, "q5_k"), /multiple of 256/);
  bad(() => quantizeGgml(w, 0, 256, "q5_0"), /positive integers/);
  bad(() => dequantizeGgml(new Uint8Array(143), 1, 256, "q4_k"), /143 bytes given, a 1×256 matrix needs 144/);
  bad(() => dequantizeGgml(new Uint8Array(64), 1, 32, "toString" as GgmlQuantFormat), /unknown ggml format/);
  bad(() => dequantizeGgml([1, 2] as unknown as Uint8Array, 1, 1, "f16"), /must be a Uint8Array/);
});
