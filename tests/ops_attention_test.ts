/**
 * Attention against float64 references: sdpa (causal, GQA, KV capacity stride, batch; f32 and bf16)
 * and flash_attn_vec (every head dim, K/V f32 and f16, masks, softcap, kv_len 1 … capacity).
 *
 * Tolerance: a score is an f32 dot of hd products (error ≤ hd·u·Σ|q·k|, scaled), the softmax sums
 * kvLen terms and the output is an f32 weighted sum; with |q|,|k| ≤ 2 the score error stays
 * ≤ (hd + 4)·u·scale·Σ|q·k| ≈ (hd + 4)·u·4·√hd, which moves each weight by that relative amount.
 * So |o − o_ref| ≤ (kvLen + 4·(hd + 4)·√hd + 32)·u·max|v|. bf16 outputs add one rounding (2⁻⁸·|o|).
 */
import { deepStrictEqual, equal, ok } from "node:assert/strict";
import { type CapturedNode, DType, findHazards, GraphExecutor, ops } from "../mod.ts";
import { assertClose, randomValues, testContext } from "./helpers.ts";
import { refAttentionDecode, refSdpa } from "./reference.ts";

const U = 2 ** -24;
const maxAbs = (v: ArrayLike<number>) => Array.from(v).reduce((m, x) => Math.max(m, Math.abs(x)), 0);
const tolFor = (hd: number, kvLen: number, vmax: number) => (kvLen + 4 * (hd + 4) * Math.sqrt(hd) + 32) * U * vmax;

Deno.test("sdpa: causal, GQA, capacity stride, batch, query blocks of 32 — f32 and bf16", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const cases = [
    { batch: 1, nHeads: 1, nKvHeads: 1, headDim: 64, seqLen: 1, kvSeqLen: 1, kvCapacity: 1 },
    { batch: 1, nHeads: 4, nKvHeads: 1, headDim: 128, seqLen: 5, kvSeqLen: 37, kvCapacity: 64 }, // GQA 4:1
    { batch: 1, nHeads: 2, nKvHeads: 2, headDim: 72, seqLen: 40, kvSeqLen: 40, kvCapacity: 40 }, // prefill, 2 blocks
    { batch: 2, nHeads: 6, nKvHeads: 3, headDim: 32, seqLen: 3, kvSeqLen: 63, kvCapacity: 64 }, // near capacity
    { batch: 1, nHeads: 2, nKvHeads: 1, headDim: 512, seqLen: 2, kvSeqLen: 9, kvCapacity: 16 },
  ];
  for (const c of cases) {
    for (const dtype of [DType.F32, DType.BF16]) {
      await t.step(`${dtype} ${JSON.stringify(c)}`, () => {
        const scale = 1 / Math.sqrt(c.headDim);
        const qn = c.batch * c.nHeads * c.seqLen * c.headDim, kn = c.batch * c.nKvHeads * c.kvCapacity * c.headDim;
        const qv = randomValues(qn, 1 + c.headDim, dtype), kv = randomValues(kn, 2 + c.headDim, dtype);
        const vv = randomValues(kn, 3 + c.headDim, dtype);
        using q = device.upload(qv, dtype), k = device.upload(kv, dtype), v = device.upload(vv, dtype);
        using out = device.alloc(qn * (dtype === DType.F32 ? 4 : 2), dtype);
        using enc = device.commandEncoder();
        ops.sdpa(enc, registry, q, k, v, out, c);
        enc.commitAndWait();
        const want = refSdpa(qv, kv, vv, { ...c, scale });
        const tol = tolFor(c.headDim, c.kvSeqLen, maxAbs(vv));
        const rounding = dtype === DType.BF16 ? 2 ** -8 : 0;
        assertClose(out.read(), want, (i) => tol + rounding * Math.abs(want[i]!), "sdpa");
      });
    }
  }
});

Deno.test("flash_attn_vec: head dims 64–512, K/V f32 and f16, masks, softcap, kv_len 1 … capacity", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  type Case = Parameters<typeof ops.flashAttnVec>[7] & { kvType: "f32" | "f16" };
  const cases: Case[] = [
    { nHeads: 1, nKvHeads: 1, headDim: 64, kvSeqLen: 1, kvCapacity: 4, kvType: "f32" },
    { nHeads: 4, nKvHeads: 1, headDim: 128, kvSeqLen: 300, kvCapacity: 300, kvType: "f16" }, // GQA 4:1, full
    { nHeads: 8, nKvHeads: 2, headDim: 256, kvSeqLen: 33, kvCapacity: 64, kvType: "f32", mask: "none" },
    {
      nHeads: 2,
      nKvHeads: 2,
      headDim: 512,
      kvSeqLen: 70,
      kvCapacity: 80,
      kvType: "f16",
      mask: "sliding",
      slidingWindow: 5,
    },
    { nHeads: 2, nKvHeads: 1, headDim: 128, kvSeqLen: 41, kvCapacity: 41, kvType: "f32", softcap: 30, nwg: 7 },
    {
      nHeads: 3,
      nKvHeads: 3,
      headDim: 64,
      kvSeqLen: 3,
      kvCapacity: 8,
      kvType: "f32",
      mask: "sliding",
      slidingWindow: 100,
    },
  ];
  for (const c of cases) {
    await t.step(JSON.stringify(c), () => {
      const { kvType, ...o } = c;
      const scale = 1 / Math.sqrt(o.headDim);
      const kn = o.nKvHeads * o.kvCapacity * o.headDim;
      const qv = randomValues(o.nHeads * o.headDim, o.headDim + 1);
      const kv = randomValues(kn, o.headDim + 2, kvType), vv = randomValues(kn, o.headDim + 3, kvType);
      using q = device.upload(qv), k = device.upload(kv, kvType), v = device.upload(vv, kvType);
      using tmp = device.alloc(ops.flashAttnVecScratchBytes(o), DType.F32);
      using out = device.alloc(o.nHeads * o.headDim * 4, DType.F32);
      using enc = device.commandEncoder();
      ops.flashAttnVec(enc, registry, q, k, v, tmp, out, o);
      equal(enc.barrierCount, 1, "the op places the barrier between its two passes");
      enc.commitAndWait();
      const want = refAttentionDecode(qv, kv, vv, { ...o, scale, mask: o.mask ?? "causal" });
      const tol = tolFor(o.headDim, o.kvSeqLen, maxAbs(vv)) * (o.softcap ? 2 : 1);
      assertClose(out.read(), want, () => tol, "flash_attn_vec");
    });
  }
});

Deno.test("flash_attn_vec agrees with sdpa on the last query row (decode)", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const nHeads = 4, nKvHeads = 2, headDim = 128, kvSeqLen = 50, kvCapacity = 64;
  const kn = nKvHeads * kvCapacity * headDim;
  const qv = randomValues(nHeads * headDim, 9), kv = randomValues(kn, 10), vv = randomValues(kn, 11);
  using q = device.upload(qv), k = device.upload(kv), v = device.upload(vv);
  using tmp = device.alloc(ops.flashAttnVecScratchBytes({ nHeads, headDim }), DType.F32);
  using a = device.alloc(nHeads * headDim * 4, DType.F32), b = device.alloc(nHeads * headDim * 4, DType.F32);
  using enc = device.commandEncoder();
  ops.flashAttnVec(enc, registry, q, k, v, tmp, a, { nHeads, nKvHeads, headDim, kvSeqLen, kvCapacity });
  ops.sdpa(enc, registry, q, k, v, b, { nHeads, nKvHeads, headDim, seqLen: 1, kvSeqLen, kvCapacity });
  enc.commitAndWait();
  const tol = 2 * tolFor(headDim, kvSeqLen, maxAbs(vv));
  assertClose(a.read(), Array.from(b.read()), () => tol, "flash vs sdpa");
});

Deno.test("attention ops declare their accesses: auto barriers and the validator see the split", () => {
  using ctx = testContext({ validate: true });
  const { device } = ctx;
  const nHeads = 2, headDim = 64, kvCapacity = 16;
  using q = device.upload(randomValues(nHeads * headDim, 1));
  using k = device.upload(randomValues(nHeads * kvCapacity * headDim, 2)),
    v = device.upload(randomValues(nHeads * kvCapacity * headDim, 3));
  using tmp = device.alloc(ops.flashAttnVecScratchBytes({ nHeads, headDim }), DType.F32);
  using out = device.alloc(nHeads * headDim * 4, DType.F32), out2 = device.alloc(nHeads * headDim * 4, DType.F32);
  const exec = new GraphExecutor(device, { autoBarriers: true });
  using s = exec.beginRecorded();
  const o = { nHeads, nKvHeads: nHeads, headDim: 64 as const, kvSeqLen: 10, kvCapacity };
  s.flashAttnVec(q, k, v, tmp, out, o);
  s.flashAttnVec(out, k, v, tmp, out2, o); // reads out and rewrites tmp: both need barriers
  const nodes: CapturedNode[] = [...s.encoder.takeCapture()!];
  deepStrictEqual(nodes.map((n) => n.kind === "barrier" ? "|" : n.pipeline.name), [
    "flash_attn_vec_f32",
    "|",
    "flash_attn_vec_reduce",
    "|",
    "flash_attn_vec_f32",
    "|",
    "flash_attn_vec_reduce",
  ]);
  deepStrictEqual(findHazards(nodes), []);
  // Without the op's own barrier the reduce would race with the partial pass:
  const withoutInner = nodes.filter((_, i) => i !== 1);
  ok(findHazards(withoutInner).some((h) => h.kind === "RAW" && h.second.kernel === "flash_attn_vec_reduce"));
});
