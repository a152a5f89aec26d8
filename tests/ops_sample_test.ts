/**
 * On-device token selection and input: argmax, seeded sampling and the embedding gather, against
 * the independent references of tests/reference.ts (a full sort with BigInt sums for the sampler).
 * The sampler's choice is exact integer arithmetic, so tokens must match exactly on every backend.
 */
import { deepStrictEqual, equal, ok, throws } from "node:assert/strict";
import { dequantizeGgml, DType, GraphExecutor, type MlxBuffer, MlxError, ops, quantizeGgml } from "../mod.ts";
import { roundThrough } from "../src/dtype.ts";
import { randomValues, rng, testContext } from "./helpers.ts";
import { refArgmax, refPhilox4x32, refSample, refSampleTable, refSampleWeight } from "./reference.ts";

const isCommandBufferError = (name: string) => (e: unknown) =>
  e instanceof MlxError && e.code === "CommandBufferError" && e.message.includes(name);

/** Logits with repeated values (ties), −0/+0 and a few −inf, rounded through `dtype`. */
function trickyLogits(n: number, seed: number, dtype: DType, o: { levels?: number; spread?: number } = {}) {
  const r = rng(seed), levels = o.levels ?? 0, spread = o.spread ?? 8;
  const v = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    const u = r();
    v[i] = levels ? Math.floor(u * levels) * (spread / levels) - spread / 2 : (u - 0.5) * spread;
    if (r() < 0.02) v[i] = -Infinity;
    else if (r() < 0.01) v[i] = r() < 0.5 ? -0 : 0;
  }
  return roundThrough(dtype, v);
}

Deno.test("reference Philox4x32-10 matches the Random123 known-answer vectors", () => {
  deepStrictEqual(refPhilox4x32([0, 0, 0, 0], [0, 0]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
  const ones = 0xffffffff;
  deepStrictEqual(refPhilox4x32([ones, ones, ones, ones], [ones, ones]), [
    0x408f276d,
    0x41c83b0e,
    0xa20bc7c6,
    0x6d5451fd,
  ]);
  deepStrictEqual(
    refPhilox4x32([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0]),
    [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1],
  );
});

Deno.test("every backend's sampler weight table is E[j] = round(2^31 · 2^(−j/256))", () => {
  const want = refSampleTable();
  const root = new URL("../", import.meta.url);
  for (const file of ["kernels/cpu/sample.c", "kernels/cuda/sample.cu", "kernels/metal/sample.metal"]) {
    const src = Deno.readTextFileSync(new URL(file, root));
    const body = src.match(/exp2_neg_q31\[257\] = \{([^}]*)\}/);
    ok(body, `${file}: table not found`);
    deepStrictEqual([...body[1]!.matchAll(/0x([0-9a-f]{8})/g)].map((m) => parseInt(m[1]!, 16)), want, file);
  }
});

Deno.test("the sampler's weights follow 2^31 · e^((x − m)/T) to 1.2e-5, and vanish below 2^−31", () => {
  // d is truncated to 2^−16 (relative 2^−16·ln 2 ≈ 1.06e-5); the table's interpolation adds < 1e-6.
  const table = refSampleTable(), r = rng(5);
  for (let i = 0; i < 2000; i++) {
    const t = 0.1 + 2 * r(), x = Math.fround(-30 * r()), c = Math.fround(Math.LOG2E / t);
    const w = refSampleWeight(x, 0, c, table), d = Math.fround(Math.fround(0 - x) * c);
    if (d >= 31) equal(w, 0);
    else ok(Math.abs(w - 2 ** (31 - d)) <= 1.2e-5 * 2 ** (31 - d) + 1, `x ${x} t ${t}: ${w} vs ${2 ** (31 - d)}`);
  }
  equal(refSampleWeight(1.5, 1.5, 1, table), 2 ** 31);
});

function readIds(b: MlxBuffer): number[] {
  return [...(b.read() as Uint32Array)];
}

Deno.test("argmax matches the reference (ties to the lowest index, −inf, ±0, bf16, vocab up to 256k)", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  for (const dtype of [DType.F32, DType.BF16]) {
    for (
      const [rows, vocab, levels] of [[1, 1, 0], [3, 31, 4], [2, 1000, 0], [4, 5000, 7], [1, 262144, 0]] as [
        number,
        number,
        number,
      ][]
    ) {
      await t.step(`${dtype} rows=${rows} vocab=${vocab} levels=${levels}`, () => {
        const x = trickyLogits(rows * vocab, vocab + rows, dtype, { levels });
        using logits = device.upload(x, dtype), ids = device.alloc(rows * 4, DType.U32);
        using enc = device.commandEncoder();
        ops.argmax(enc, registry, logits, ids, { vocab, rows });
        enc.commitAndWait();
        const want = Array.from({ length: rows }, (_, r) => refArgmax(x.subarray(r * vocab, (r + 1) * vocab)));
        deepStrictEqual(readIds(ids), want);
      });
    }
  }
  await t.step("all equal: index 0; the maximum last: the last index", () => {
    using logits = device.upload(new Float32Array([-0, 0, -0, 0, -Infinity, 3, 3])), ids = device.alloc(8, DType.U32);
    using enc = device.commandEncoder();
    ops.argmax(enc, registry, logits, ids, { vocab: 4, rows: 1 });
    ops.argmax(enc, registry, logits.slice(16, 12), ids.slice(4, 4), { vocab: 3 });
    enc.commitAndWait();
    deepStrictEqual(readIds(ids), [0, 1]);
  });
});

Deno.test("argmax and sample write the ring slot cursor[0] % ring, read on the device", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const vocab = 100, rows = 2, ring = 3;
  const x = trickyLogits(rows * vocab, 11, DType.F32);
  const want = [0, 1].map((r) => refArgmax(x.subarray(r * vocab, (r + 1) * vocab)));
  using logits = device.upload(x), ids = device.alloc(ring * rows * 4, DType.U32), cursor = device.alloc(4, DType.U32);
  for (const step of [0, 1, 2, 3, 7]) {
    ids.write(new Uint32Array(ring * rows).fill(0xdead));
    cursor.write(new Uint32Array([step]));
    using enc = device.commandEncoder();
    ops.argmax(enc, registry, logits, ids, { vocab, rows, ring, cursor });
    enc.commitAndWait();
    const expect = new Array(ring * rows).fill(0xdead);
    expect.splice((step % ring) * rows, rows, ...want);
    deepStrictEqual(readIds(ids), expect, `step ${step}`);
  }
  // The sampler's counter is counter + cursor[0]: step 5 with counter 2 is counter 7 without a cursor.
  const o = { vocab, rows, temperature: 1, seed: 99n };
  cursor.write(new Uint32Array([5]));
  using plain = device.alloc(rows * 4, DType.U32);
  using enc = device.commandEncoder();
  ops.sample(enc, registry, logits, ids, { ...o, ring, cursor, counter: 2 });
  ops.sample(enc, registry, logits, plain, { ...o, counter: 7 });
  enc.commitAndWait();
  const viaCursor = readIds(ids).slice((5 % ring) * rows, (5 % ring) * rows + rows);
  deepStrictEqual(viaCursor, readIds(plain));
  deepStrictEqual(
    readIds(plain),
    [0, 1].map((row) => refSample(x.subarray(row * vocab, (row + 1) * vocab), { ...o, counter: 7, row })),
  );
});

Deno.test("sample matches the reference token for token (f32, bf16, ties, −inf, top-k, top-p)", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const configs = [
    { temperature: 1 },
    { temperature: 0.7, topK: 40 },
    { temperature: 1.3, topP: 0.9 },
    { temperature: 0.8, topK: 50, topP: 0.95 },
    { temperature: 2, topK: 3, topP: 0.5 },
    { temperature: 1, topP: 1e-9 },
    { temperature: 5, topK: 1_000_000 },
    { temperature: 1e-5 },
  ];
  const rows = 6;
  for (const dtype of [DType.F32, DType.BF16]) {
    for (
      const [vocab, levels, spread] of [[1, 0, 8], [7, 3, 2], [300, 0, 30], [2048, 16, 4], [5000, 0, 12]] as [
        number,
        number,
        number,
      ][]
    ) {
      await t.step(`${dtype} vocab=${vocab} levels=${levels} spread=${spread}`, () => {
        const x = trickyLogits(rows * vocab, 3 * vocab + levels, dtype, { levels, spread });
        for (let r = 0; r < rows; r++) x[r * vocab] = 0; // never a row of only −inf
        using logits = device.upload(x, dtype), ids = device.alloc(rows * configs.length * 4, DType.U32);
        using enc = device.commandEncoder();
        configs.forEach((cfg, i) => {
          const o = { ...cfg, vocab, rows, seed: 1234567n + BigInt(i) * (1n << 40n), counter: 17 + i };
          ops.sample(enc, registry, logits, ids.slice(i * rows * 4, rows * 4), o);
        });
        enc.commitAndWait();
        const got = readIds(ids);
        configs.forEach((cfg, i) => {
          for (let row = 0; row < rows; row++) {
            const want = refSample(x.subarray(row * vocab, (row + 1) * vocab), {
              ...cfg,
              seed: 1234567n + BigInt(i) * (1n << 40n),
              counter: 17 + i,
              row,
            });
            equal(got[i * rows + row], want, `config ${JSON.stringify(cfg)} row ${row}`);
          }
        });
      });
    }
  }
});

Deno.test("sample over a 256k vocabulary matches the reference (f32 and bf16)", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const vocab = 262144;
  for (const dtype of [DType.F32, DType.BF16]) {
    const x = trickyLogits(vocab, 77, dtype, { spread: 16 });
    using logits = device.upload(x, dtype), ids = device.alloc(8, DType.U32);
    const a = { temperature: 1, seed: 3n, counter: 0 },
      b = { temperature: 0.9, topK: 100, topP: 0.8, seed: 4n, counter: 1 };
    using enc = device.commandEncoder();
    ops.sample(enc, registry, logits, ids, { ...a, vocab });
    ops.sample(enc, registry, logits, ids.slice(4, 4), { ...b, vocab });
    enc.commitAndWait();
    deepStrictEqual(readIds(ids), [refSample(x, { ...a, row: 0 }), refSample(x, { ...b, row: 0 })], dtype);
  }
});

Deno.test("sample: temperature 0 and top-k 1 give the argmax; +inf logits share all the mass", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const vocab = 777, rows = 4;
  const x = trickyLogits(rows * vocab, 8, DType.F32, { levels: 5 });
  using logits = device.upload(x), greedy = device.alloc(rows * 4, DType.U32), top1 = device.alloc(rows * 4, DType.U32);
  using am = device.alloc(rows * 4, DType.U32);
  using enc = device.commandEncoder();
  ops.sample(enc, registry, logits, greedy, { vocab, rows, temperature: 0, seed: 1 });
  ops.sample(enc, registry, logits, top1, { vocab, rows, temperature: 1.5, topK: 1, seed: 2 });
  ops.argmax(enc, registry, logits, am, { vocab, rows });
  enc.commitAndWait();
  deepStrictEqual(readIds(greedy), readIds(am));
  deepStrictEqual(readIds(top1), readIds(am));

  const inf = new Float32Array(64).fill(1);
  inf[5] = inf[40] = Infinity;
  const picksRows = 64;
  using li = device.upload(Float32Array.from({ length: picksRows * 64 }, (_, i) => inf[i % 64]!));
  using picks = device.alloc(picksRows * 4, DType.U32);
  using enc2 = device.commandEncoder();
  ops.sample(enc2, registry, li, picks, { vocab: 64, rows: picksRows, temperature: 1, seed: 0 });
  enc2.commitAndWait();
  const got = readIds(picks);
  deepStrictEqual(got, got.map((_, row) => refSample(inf, { temperature: 1, seed: 0n, counter: 0, row })));
  deepStrictEqual([...new Set(got)].sort((a, b) => a - b), [5, 40]);
});

Deno.test("sample frequencies follow softmax(x / T) restricted by top-k and top-p", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const vocab = 6, rows = 4000, temperature = 0.9;
  const row = [2, 1.5, 1.5, 0.2, -1, -Infinity];
  using logits = device.upload(Float32Array.from({ length: rows * vocab }, (_, i) => row[i % vocab]!));
  using ids = device.alloc(rows * 4, DType.U32), cut = device.alloc(rows * 4, DType.U32);
  using enc = device.commandEncoder();
  ops.sample(enc, registry, logits, ids, { vocab, rows, temperature, seed: 2024 });
  ops.sample(enc, registry, logits, cut, { vocab, rows, temperature, topK: 4, topP: 0.75, seed: 2024 });
  enc.commitAndWait();
  const expectFreq = (keep: number) => {
    const e = row.map((v, i) => (i < keep ? Math.exp(v / temperature) : 0));
    const s = e.reduce((a, b) => a + b, 0);
    return e.map((v) => v / s);
  };
  // top-k 4 keeps 0..3; top-p 0.75 of that mass: p0 ≈ 0.47, p0 + p1 ≈ 0.73 < 0.75, so 0, 1, 2 remain.
  for (const [buf, keep] of [[ids, 5], [cut, 3]] as const) {
    const counts = new Array(vocab).fill(0);
    for (const id of readIds(buf)) counts[id]++;
    const p = expectFreq(keep);
    for (let i = 0; i < vocab; i++) {
      const sd = Math.sqrt((p[i]! * (1 - p[i]!)) / rows);
      ok(
        Math.abs(counts[i] / rows - p[i]!) <= 5 * sd + 1e-12,
        `keep ${keep} token ${i}: ${counts[i] / rows} vs ${p[i]}`,
      );
    }
  }
});

Deno.test("argmax and sample fail the command buffer on NaN; sample also on a row of only −inf", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const cases: [string, number[], (l: MlxBuffer, ids: MlxBuffer) => (enc: ops.DispatchTarget) => void, string][] = [
    ["argmax NaN", [1, NaN, 3, 2], (l, ids) => (enc) => ops.argmax(enc, registry, l, ids, { vocab: 4 }), "argmax_f32"],
    [
      "sample NaN",
      [1, NaN, 3, 2],
      (l, ids) => (enc) => ops.sample(enc, registry, l, ids, { vocab: 4, temperature: 1, seed: 1 }),
      "sample_f32",
    ],
    [
      "sample −inf",
      [-Infinity, -Infinity, -Infinity, -Infinity],
      (l, ids) => (enc) => ops.sample(enc, registry, l, ids, { vocab: 4, temperature: 1, seed: 1 }),
      "sample_f32",
    ],
  ];
  for (const [name, values, op, kernel] of cases) {
    await t.step(name, () => {
      using l = device.upload(new Float32Array(values)), ids = device.alloc(4, DType.U32);
      ids.write(new Uint32Array([0xdead]));
      const enc = device.commandEncoder();
      op(l, ids)(enc);
      throws(() => enc.commitAndWait(), isCommandBufferError(kernel));
      enc.dispose();
      equal(readIds(ids)[0], refArgmax(values), "the argmax (NaN lowest) is still written");
      using enc2 = device.commandEncoder(); // the device keeps working
      ops.argmax(enc2, registry, device.upload(new Float32Array([1, 5, 2])), ids, { vocab: 3 });
      enc2.commitAndWait();
      equal(readIds(ids)[0], 1);
    });
  }
});

Deno.test("embedGather matches the reference for f32, bf16, q8_0 and q4_0 tables, ids from the ring", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const vocab = 50, dim = 96, rows = 3, ring = 4;
  const values = randomValues(vocab * dim, 21);
  const ringIds = Uint32Array.from({ length: ring * rows }, (_, i) => (i * 17 + 3) % vocab);
  const tables: [ops.EmbeddingFormat, Uint8Array | Float32Array, DType, ArrayLike<number>][] = [
    ["f32", values, DType.F32, values],
    ["bf16", roundThrough(DType.BF16, values), DType.BF16, roundThrough(DType.BF16, values)],
    ...(["q8_0", "q4_0"] as const).map((f): [ops.EmbeddingFormat, Uint8Array, DType, ArrayLike<number>] => {
      const q = quantizeGgml(values, vocab, dim, f);
      return [f, q, DType.U8, dequantizeGgml(q, vocab, dim, f)];
    }),
  ];
  for (const [format, data, dtype, deq] of tables) {
    await t.step(format, () => {
      using table = data instanceof Uint8Array ? device.upload(data) : device.upload(data, dtype);
      using ids = device.upload(ringIds), cursor = device.upload(new Uint32Array([6]));
      using out = device.alloc(rows * dim * 4, DType.F32), first = device.alloc(rows * dim * 4, DType.F32);
      using enc = device.commandEncoder();
      ops.embedGather(enc, registry, table, ids, out, { dim, vocab, rows, ring, cursor, format });
      ops.embedGather(enc, registry, table, ids, first, { dim, vocab, rows, format });
      enc.commitAndWait();
      for (const [buf, slot] of [[out, 6 % ring], [first, 0]] as const) {
        const want = new Float32Array(rows * dim);
        for (let r = 0; r < rows; r++) {
          const id = ringIds[slot * rows + r]!;
          for (let j = 0; j < dim; j++) want[r * dim + j] = deq[id * dim + j]!;
        }
        deepStrictEqual(buf.read(), want, `${format} slot ${slot}`);
      }
    });
  }
});

Deno.test("embedGather: an id out of range fails the command buffer and writes zeros, reading nothing outside", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const vocab = 4, dim = 32;
  using table = device.upload(randomValues(vocab * dim, 2));
  using ids = device.upload(new Uint32Array([1, vocab, 0xffffffff])), out = device.alloc(3 * dim * 4, DType.F32);
  out.write(new Float32Array(3 * dim).fill(7));
  const enc = device.commandEncoder();
  ops.embedGather(enc, registry, table, ids, out, { dim, vocab, rows: 3 });
  throws(() => enc.commitAndWait(), isCommandBufferError("embed_gather_f32"));
  enc.dispose();
  const got = out.read() as Float32Array;
  deepStrictEqual(got.subarray(0, dim), (table.read() as Float32Array).subarray(dim, 2 * dim));
  deepStrictEqual(got.subarray(dim), new Float32Array(2 * dim));
});

Deno.test("argmax/sample/embedGather reject bad arguments with actionable errors", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  using enc = device.commandEncoder();
  using l = device.alloc(64, DType.F32), ids = device.alloc(8, DType.U32), f16 = device.alloc(64, DType.F16);
  using u8 = device.alloc(340, DType.U8), out = device.alloc(32 * 4, DType.F32), ringIds = device.alloc(4, DType.U32);
  const bad = (f: () => void, re: RegExp) =>
    throws(f, (e: unknown) => e instanceof MlxError && e.code === "InvalidArgument" && re.test(e.message));
  bad(() => ops.argmax(enc, registry, l, ids, { vocab: 17 }), /logits holds 64 bytes, needs 68/);
  bad(() => ops.argmax(enc, registry, f16, ids, { vocab: 4 }), /f32 or bf16/);
  bad(() => ops.argmax(enc, registry, l, ids, { vocab: 4, ring: 3 }), /ids holds 8 bytes, needs 12/);
  bad(() => ops.argmax(enc, registry, l, ids, { vocab: 0 }), /vocab must be an integer >= 1/);
  const s = { vocab: 16, temperature: 1, seed: 1 };
  bad(() => ops.sample(enc, registry, l, ids, { ...s, temperature: -1 }), /temperature must be 0/);
  bad(() => ops.sample(enc, registry, l, ids, { ...s, temperature: 1e-7 }), /temperature must be 0/);
  bad(() => ops.sample(enc, registry, l, ids, { ...s, topP: 0 }), /topP must be in \(0, 1\]/);
  bad(() => ops.sample(enc, registry, l, ids, { ...s, topK: -1 }), /topK must be an integer >= 0/);
  bad(() => ops.sample(enc, registry, l, ids, { ...s, seed: 1.5 }), /seed must be an integer/);
  bad(() => ops.sample(enc, registry, l, ids, { ...s, seed: 1n << 64n }), /seed must be an integer/);
  const g = { dim: 32, vocab: 10 };
  bad(() => ops.embedGather(enc, registry, u8, ringIds, out, g), /format u8 is not one of/);
  bad(
    () => ops.embedGather(enc, registry, u8, ringIds, out, { ...g, vocab: 11, format: "q8_0" }),
    /holds 340 bytes, needs 374/,
  );
  bad(() => ops.embedGather(enc, registry, u8, ringIds, out, { ...g, format: "q8_0", dim: 48 }), /multiple of 32/);
  bad(() => ops.embedGather(enc, registry, l, ringIds, out, { ...g, format: "bf16" }), /must be a bf16 buffer/);
});

Deno.test("the native side validates token kernels on its own (raw dispatches past the TS checks)", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  using l = device.alloc(64, DType.F32), ids = device.alloc(8, DType.U32), out = device.alloc(128, DType.F32);
  const raw = (
    name: string,
    bindings: (MlxBuffer | number[] | undefined)[],
    grid: number[],
    kind = "threadgroups",
    threads = 32,
  ) => {
    using enc = device.commandEncoder();
    enc.dispatch({
      pipeline: registry.get(name),
      bindings,
      grid: grid as [number, number, number],
      threadgroup: [threads, 1, 1],
      dispatchKind: kind as "threads" | "threadgroups",
    });
    enc.commitAndWait();
  };
  const fails = (f: () => void, re: RegExp) => throws(f, (e: unknown) => e instanceof MlxError && re.test(e.message));
  fails(() => raw("argmax_f32", [l, ids, [16, 1, 0, 0], undefined], [1, 1, 1]), /ring must be > 0/);
  fails(
    () => raw("argmax_f32", [l, ids, [2 ** 30 + 1, 1, 1, 0], undefined], [1, 1, 1]),
    /vocab must be in \[1, 2\^30\]/,
  );
  fails(
    () => raw("sample_f32", [l, ids, [16, 1, 1, 0, 0, 0, 2 ** 31, 0, 0, 0], undefined], [1, 1, 1], "threadgroups", 48),
    /threadgroup must be/,
  );
  fails(() => raw("argmax_f32", [l, ids, [16, 1, 1, 1], undefined], [1, 1, 1]), /cursor slot 3 is not bound/);
  fails(() => raw("argmax_f32", [l, ids, [17, 1, 1, 0], undefined], [1, 1, 1]), /kernel needs 68/);
  fails(() => raw("argmax_f32", [l, ids, [4, 2, 1, 0], undefined], [1, 1, 1]), /1 threadgroups do not cover 2 rows/);
  fails(() => raw("argmax_f32", [l, ids, [4, 0xffffffff, 0xffffffff, 0], undefined], [1, 1, 1]), /overflows/);
  const sp = (c: number, topP: number) => [16, 1, 1, 0, c, 0, topP, 0, 0, 0];
  fails(() => raw("sample_f32", [l, ids, sp(0x7f800000, 1 << 30), undefined], [1, 1, 1]), /must be finite/);
  fails(() => raw("sample_f32", [l, ids, sp(0x3f800000, 0), undefined], [1, 1, 1]), /top_p/);
  const gp = (dim: number, vocab: number) => [1, dim, vocab, 1, 0];
  fails(() => raw("embed_gather_q8_0", [l, ids, out, gp(48, 1), undefined], [48, 1, 1], "threads"), /multiple of 32/);
  fails(() => raw("embed_gather_f32", [l, ids, out, gp(16, 2), undefined], [16, 1, 1], "threads"), /kernel needs 128/);
  fails(() => raw("embed_gather_f32", [l, ids, out, gp(16, 1), undefined], [8, 1, 1], "threads"), /does not cover/);
  fails(
    () => raw("embed_gather_f32", [l, ids, out, [1, 0xffffffe0, 0xffffffff, 1, 0], undefined], [16, 1, 1], "threads"),
    /overflows/,
  );
});

Deno.test("a token step on the device: sample writes the ring, embedGather reads it back (auto barrier on the ids)", () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device, { autoBarriers: true });
  const vocab = 300, dim = 64, ring = 4;
  const values = randomValues(vocab * dim, 31);
  using table = device.upload(values), ids = device.alloc(ring * 4, DType.U32), cursor = device.alloc(4, DType.U32);
  using x = device.alloc(dim * 4, DType.F32);
  const history: number[] = [];
  for (let step = 0; step < 6; step++) {
    const logits = trickyLogits(vocab, 100 + step, DType.F32);
    using l = device.upload(logits);
    cursor.write(new Uint32Array([step]));
    using s = exec.begin();
    const o = { vocab, temperature: 0.7, topK: 20, seed: 5n, ring, cursor };
    ops.sample(s, exec.registry, l, ids, o);
    ops.embedGather(s, exec.registry, table, ids, x, { dim, vocab, ring, cursor });
    deepStrictEqual(s.finish().barriers, [1]);
    const id = refSample(logits, { ...o, counter: step, row: 0 });
    ok(id !== null);
    history.push(id);
    deepStrictEqual(x.read(), values.subarray(id * dim, (id + 1) * dim), `step ${step}`);
  }
  deepStrictEqual(readIds(ids), [4, 5, 2, 3].map((s) => history[s]), "the ring holds the last `ring` tokens");
});

Deno.test("sample: top-k cut inside a run of equal logits keeps the lowest indices", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const row = [1, 3, 3, 3, 2, 3], rows = 300;
  using logits = device.upload(Float32Array.from({ length: rows * row.length }, (_, i) => row[i % row.length]!));
  using ids = device.alloc(rows * 4, DType.U32);
  using enc = device.commandEncoder();
  ops.sample(enc, registry, logits, ids, { vocab: row.length, rows, temperature: 1, topK: 2, seed: 77 });
  enc.commitAndWait();
  deepStrictEqual([...new Set(readIds(ids))].sort(), [1, 2]);
});

Deno.test("sample matches the reference on many small random rows and settings (one dispatch each)", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const r = rng(4242), cases = 150;
  const inputs: { x: Float32Array; o: Parameters<typeof refSample>[1] }[] = [];
  using ids = device.alloc(cases * 4, DType.U32);
  const enc = device.commandEncoder();
  const bufs: MlxBuffer[] = [];
  for (let i = 0; i < cases; i++) {
    const vocab = 1 + Math.floor(r() * 64), dtype = r() < 0.5 ? DType.F32 : DType.BF16;
    const raw = trickyLogits(vocab, 1000 + i, dtype, { levels: 1 + Math.floor(r() * 6), spread: 1 + r() * 40 });
    raw[Math.floor(r() * vocab)] = r() * 4; // at least one finite logit
    const x = roundThrough(dtype, raw);
    const o = {
      temperature: [0, 1e-5, 0.3, 1, 3][Math.floor(r() * 5)]!,
      topK: Math.floor(r() * 8),
      topP: r() < 0.5 ? 1 : r(),
      seed: BigInt(Math.floor(r() * 2 ** 32)) << 20n,
      counter: Math.floor(r() * 2 ** 32),
      row: 0,
    };
    const l = device.upload(x, dtype);
    bufs.push(l);
    ops.sample(enc, registry, l, ids.slice(i * 4, 4), { ...o, vocab });
    inputs.push({ x, o });
  }
  enc.commitAndWait();
  enc.dispose();
  const got = readIds(ids);
  inputs.forEach(({ x, o }, i) =>
    equal(got[i], refSample(x, o), `case ${i}: ${JSON.stringify({ ...o, seed: `${o.seed}` })}`)
  );
  for (const b of bufs) b.dispose();
});
