/**
 * GGUF reader: files written by the test writer read back exactly (metadata of every type, mixed
 * Q4_K/Q6_K/F32 tensors, alignment), stream into device buffers, and every malformed, truncated or
 * oversized file gives a clear MlxError.
 */
import { deepStrictEqual, equal, ok, throws } from "node:assert/strict";
import { dequantizeGgml, GgufFile, GgufValueType, llamaConfigFromGguf, MlxError, quantizeGgml } from "../mod.ts";
import { randomValues, testContext } from "./helpers.ts";
import { writeGguf, type WriteKv, type WriteTensor } from "./helpers/gguf_writer.ts";

const T = GgufValueType;

function sampleKvs(): WriteKv[] {
  return [
    { key: "general.architecture", type: T.STRING, value: "llama" },
    { key: "llama.block_count", type: T.UINT32, value: 2 },
    { key: "llama.attention.layer_norm_rms_epsilon", type: T.FLOAT32, value: 1e-5 },
    { key: "u8", type: T.UINT8, value: 255 },
    { key: "i8", type: T.INT8, value: -128 },
    { key: "u16", type: T.UINT16, value: 65535 },
    { key: "i16", type: T.INT16, value: -32768 },
    { key: "i32", type: T.INT32, value: -5 },
    { key: "b", type: T.BOOL, value: true },
    { key: "u64", type: T.UINT64, value: 2n ** 64n - 1n },
    { key: "i64", type: T.INT64, value: -(2n ** 63n) },
    { key: "f64", type: T.FLOAT64, value: Math.PI },
    { key: "tokenizer.ggml.tokens", type: T.ARRAY, elementType: T.STRING, value: ["<s>", "héllo", "", "▁the"] },
    { key: "scores", type: T.ARRAY, elementType: T.FLOAT32, value: [0.5, -1, 2] },
    { key: "types", type: T.ARRAY, elementType: T.INT32, value: [1, -2, 3] },
    { key: "flags", type: T.ARRAY, elementType: T.BOOL, value: [true, false] },
    { key: "big", type: T.ARRAY, elementType: T.UINT64, value: [0n, 2n ** 63n] },
  ];
}

function sampleTensors(): WriteTensor[] {
  const wq = randomValues(4 * 256, 1), wo = randomValues(3 * 512, 2), norm = randomValues(256, 3);
  return [
    { name: "blk.0.attn_q.weight", type: "q4_k", ne: [256, 4], data: quantizeGgml(wq, 4, 256, "q4_k") },
    { name: "blk.0.attn_output.weight", type: "q6_k", ne: [512, 3], data: quantizeGgml(wo, 3, 512, "q6_k") },
    { name: "blk.0.attn_norm.weight", type: "f32", ne: [256], data: new Uint8Array(norm.buffer) },
    { name: "odd", type: "q8_0", ne: [32, 1, 1, 3], data: quantizeGgml(randomValues(96, 4), 3, 32, "q8_0") },
  ];
}

Deno.test("GGUF: metadata of every type and mixed Q4_K/Q6_K/F32/Q8_0 tensors read back exactly", () => {
  for (const alignment of [32, 64, 1]) {
    const tensors = sampleTensors();
    const kvs = sampleKvs();
    if (alignment !== 32) kvs.push({ key: "general.alignment", type: T.UINT32, value: alignment });
    const bytes = writeGguf(kvs, tensors, { alignment });
    using f = GgufFile.open(bytes);
    equal(f.header.version, 3);
    equal(f.header.alignment, alignment);
    equal(f.header.dataOffset % alignment, 0);
    equal(f.get("general.architecture"), "llama");
    equal(f.get("llama.block_count"), 2);
    equal(f.get("llama.attention.layer_norm_rms_epsilon"), Math.fround(1e-5));
    deepStrictEqual(
      ["u8", "i8", "u16", "i16", "i32", "b", "u64", "i64", "f64"].map((k) => f.get(k)),
      [255, -128, 65535, -32768, -5, true, 2n ** 64n - 1n, -(2n ** 63n), Math.PI],
    );
    deepStrictEqual(f.get("tokenizer.ggml.tokens"), ["<s>", "héllo", "", "▁the"]);
    deepStrictEqual(f.get("scores"), Float32Array.of(0.5, -1, 2));
    deepStrictEqual(f.get("types"), Int32Array.of(1, -2, 3));
    deepStrictEqual(f.get("flags"), [true, false]);
    deepStrictEqual(f.get("big"), BigUint64Array.of(0n, 2n ** 63n));
    equal(f.header.metadata.get("tokenizer.ggml.tokens")?.elementType, T.STRING);
    deepStrictEqual(f.tensors.map((t) => [t.name, t.type.name, [...t.ne], t.elements]), [
      ["blk.0.attn_q.weight", "q4_k", [256, 4], 1024],
      ["blk.0.attn_output.weight", "q6_k", [512, 3], 1536],
      ["blk.0.attn_norm.weight", "f32", [256], 256],
      ["odd", "q8_0", [32, 1, 1, 3], 96],
    ]);
    for (const t of tensors) {
      const info = f.tensor(t.name);
      equal(info.fileOffset % alignment, 0);
      deepStrictEqual(f.readTensorBytes(t.name), t.data);
    }
  }
});

Deno.test("GGUF: tensors stream into device buffers in small chunks, from memory and from a file", () => {
  using ctx = testContext();
  const tensors = sampleTensors();
  const bytes = writeGguf(sampleKvs(), tensors);
  const path = Deno.makeTempFileSync({ suffix: ".gguf" });
  try {
    Deno.writeFileSync(path, bytes);
    for (const source of [bytes, path]) {
      using f = GgufFile.open(source);
      for (const t of tensors) {
        using buf = f.upload(ctx.device, t.name, { chunkBytes: 100 });
        deepStrictEqual(buf.readBytes(), t.data);
        if (t.type === "f32") {
          equal(buf.dtype, "f32");
          deepStrictEqual(buf.shape, [256]);
        } else equal(buf.dtype, "u8");
      }
    }
  } finally {
    Deno.removeSync(path);
  }
});

function expectError(bytes: Uint8Array, code: string, re: RegExp): void {
  throws(
    () => GgufFile.open(bytes),
    (e: unknown) => e instanceof MlxError && e.code === code && re.test(e.message),
    `expected ${code} ${re}`,
  );
}

/** The writer's output with a patch: `at` bytes replaced. */
function patched(bytes: Uint8Array, at: number, patch: number[]): Uint8Array {
  const out = bytes.slice();
  out.set(patch, at);
  return out;
}

const u64le = (v: bigint) => Array.from(new Uint8Array(BigUint64Array.of(v).buffer));

Deno.test("GGUF: every truncation of a valid file is reported as truncated, never a crash", () => {
  const bytes = writeGguf(sampleKvs(), sampleTensors());
  for (let cut = 0; cut < bytes.length; cut += cut < 600 ? 1 : 97) {
    throws(
      () => GgufFile.open(bytes.subarray(0, cut)),
      (e: unknown) => e instanceof MlxError && /truncated/.test(e.message),
      `cut at ${cut}`,
    );
  }
});

Deno.test("GGUF: malformed headers get clear errors", () => {
  const kv = (k: WriteKv[]) => writeGguf(k, []);
  const base = writeGguf([{ key: "a", type: T.UINT32, value: 1 }], sampleTensors().slice(2, 3));
  expectError(patched(base, 0, [0x47, 0x47, 0x4d, 0x4c]), "InvalidArgument", /magic is "GGML", not "GGUF"/);
  expectError(patched(base, 4, [1, 0, 0, 0]), "Unsupported", /version 1 is not supported/);
  expectError(patched(base, 4, [0, 0, 0, 3]), "Unsupported", /big-endian/);
  expectError(patched(base, 8, u64le(2n ** 40n)), "InvalidArgument", /tensor count is 1099511627776, more than/);
  expectError(patched(base, 16, u64le(1000n)), "InvalidArgument", /truncated: 1000 metadata entries/);
  // Key length beyond the file; key "a" then type patched to 13 (unknown).
  expectError(patched(base, 24, u64le(2n ** 23n)), "InvalidArgument", /truncated: metadata key 0 needs 8388608 bytes/);
  expectError(patched(base, 24, u64le(2n ** 30n)), "InvalidArgument", /metadata key 0 length is 1073741824, more than/);
  expectError(patched(base, 33, [13]), "InvalidArgument", /metadata "a" has unknown type 13/);
  expectError(patched(base, 32, [0xff]), "InvalidArgument", /metadata key 0 is not valid UTF-8/);
  expectError(
    kv([{ key: "a", type: T.BOOL, value: 1 }, { key: "a", type: T.BOOL, value: 0 }]),
    "InvalidArgument",
    /"a" appears twice/,
  );
  const boolAt = kv([{ key: "a", type: T.BOOL, value: 1 }]);
  expectError(patched(boolAt, boolAt.length - 1, [2]), "InvalidArgument", /bool stored as 2/);
  expectError(
    kv([{ key: "general.alignment", type: T.UINT64, value: 32 }]),
    "InvalidArgument",
    /general.alignment must be a UINT32, not UINT64/,
  );
  expectError(
    kv([{ key: "general.alignment", type: T.UINT32, value: 48 }]),
    "InvalidArgument",
    /48 is not a power of two/,
  );
  expectError(
    kv([{ key: "general.alignment", type: T.UINT32, value: 0 }]),
    "InvalidArgument",
    /0 is not a power of two/,
  );
  expectError(
    kv([{ key: "n", type: T.ARRAY, elementType: T.ARRAY, value: [] }]),
    "InvalidArgument",
    /array of arrays/,
  );
  expectError(
    kv([{ key: "n", type: T.ARRAY, elementType: 77 as GgufValueType, value: [] }]),
    "InvalidArgument",
    /unknown element type 77/,
  );
  const strArr = kv([{ key: "s", type: T.ARRAY, elementType: T.STRING, value: ["x"] }]);
  expectError(
    patched(strArr, strArr.length - 17, u64le(2n ** 25n)),
    "InvalidArgument",
    /truncated: metadata "s" \(33554432 strings\)/,
  );
  expectError(
    patched(strArr, strArr.length - 17, u64le(2n ** 27n)),
    "InvalidArgument",
    /element count is 134217728, more than/,
  );
  const f32Arr = kv([{ key: "f", type: T.ARRAY, elementType: T.FLOAT32, value: [1, 2] }]);
  expectError(
    patched(f32Arr, f32Arr.length - 16, u64le(3n)),
    "InvalidArgument",
    /truncated: metadata "f" \(3 × FLOAT32\)/,
  );
});

Deno.test("GGUF: malformed tensor infos and data get clear errors", () => {
  const one = (t: Partial<WriteTensor>, extra: WriteTensor[] = []) =>
    writeGguf([], [{ name: "w", type: "f32", ne: [8], data: new Uint8Array(32), ...t }, ...extra]);
  // Layout of one tensor info: 24-byte file header, name (8 + len), n_dims u32, ne u64s, type u32, offset u64.
  const base = one({});
  const dims = 24 + 8 + 1;
  expectError(patched(base, dims, [5]), "InvalidArgument", /tensor w has 5 dimensions \(at most 4\)/);
  expectError(patched(base, dims + 4, u64le(2n ** 64n - 1n)), "InvalidArgument", /dimension 0 is negative/);
  expectError(patched(base, dims + 12, [31]), "InvalidArgument", /unknown ggml type 31/);
  expectError(patched(base, dims + 12, [4]), "InvalidArgument", /unknown ggml type 4/);
  expectError(
    one({ type: "q4_0", ne: [48], data: new Uint8Array(36) }),
    "InvalidArgument",
    /rows of 48 values, not a multiple of 32/,
  );
  expectError(patched(base, dims + 16, [32]), "InvalidArgument", /data offset 32, expected 0/);
  expectError(one({ name: "x".repeat(64) }), "InvalidArgument", /longer than 63 bytes/);
  expectError(
    one({}, [{ name: "w", type: "f32", ne: [8], data: new Uint8Array(32) }]),
    "InvalidArgument",
    /tensor "w" appears twice/,
  );
  expectError(one({ ne: [2 ** 26, 2 ** 26, 2 ** 2] }), "InvalidArgument", /tensor w has more than 2\^53 elements/);
  expectError(one({ ne: [2 ** 52] }), "InvalidArgument", /tensor w is larger than 2\^53 bytes/);
  expectError(one({ ne: [2 ** 50] }), "InvalidArgument", /truncated: tensor w \(f32, 4503599627370496 bytes\) ends at/);
  expectError(
    base.subarray(0, base.length - 1),
    "InvalidArgument",
    /truncated: tensor w \(f32, 32 bytes\) ends at byte/,
  );
});

Deno.test("GGUF: types this library cannot run, missing tensors and missing files are reported", () => {
  using ctx = testContext();
  using f = GgufFile.open(writeGguf([], [{ name: "q", type: "iq2_xxs", ne: [256], data: new Uint8Array(66) }]));
  equal(f.tensor("q").type.name, "iq2_xxs");
  throws(
    () => f.upload(ctx.device, "q"),
    (e: unknown) => e instanceof MlxError && e.code === "Unsupported" && /q is iq2_xxs.*re-quantize/.test(e.message),
  );
  throws(() => f.tensor("nope"), (e: unknown) => e instanceof MlxError && /no tensor "nope".*it has q/.test(e.message));
  ok(!f.has("nope"));
  throws(
    () => GgufFile.open("/nonexistent/model.gguf"),
    (e: unknown) => e instanceof MlxError && e.code === "InvalidArgument" && /no file at/.test(e.message),
  );
});

Deno.test("GGUF llama config: hyperparameters with llama.cpp's defaults, unsupported architectures rejected", () => {
  const kvs = (arch: string, extra: WriteKv[] = []): WriteKv[] => [
    { key: "general.architecture", type: T.STRING, value: arch },
    { key: `${arch}.embedding_length`, type: T.UINT32, value: 64 },
    { key: `${arch}.feed_forward_length`, type: T.UINT32, value: 160 },
    { key: `${arch}.block_count`, type: T.UINT32, value: 2 },
    { key: `${arch}.attention.head_count`, type: T.UINT32, value: 8 },
    { key: `${arch}.attention.layer_norm_rms_epsilon`, type: T.FLOAT32, value: 1e-6 },
    { key: `${arch}.context_length`, type: T.UINT32, value: 2048 },
    { key: "tokenizer.ggml.tokens", type: T.ARRAY, elementType: T.STRING, value: ["a", "b", "c"] },
    ...extra,
  ];
  {
    using f = GgufFile.open(writeGguf(kvs("llama"), []));
    deepStrictEqual(llamaConfigFromGguf(f), {
      vocabSize: 3,
      hiddenSize: 64,
      intermediateSize: 160,
      layers: 2,
      heads: 8,
      kvHeads: 8,
      headDim: 8,
      ropeDim: 8,
      ropeTheta: 10000,
      rmsEps: Math.fround(1e-6),
      contextLength: 2048,
    });
  }
  {
    using f = GgufFile.open(writeGguf(
      kvs("llama", [
        { key: "llama.attention.head_count_kv", type: T.UINT32, value: 2 },
        { key: "llama.rope.freq_base", type: T.FLOAT32, value: 500000 },
        { key: "llama.rope.dimension_count", type: T.UINT32, value: 4 },
      ]),
      [],
    ));
    const c = llamaConfigFromGguf(f);
    deepStrictEqual([c.kvHeads, c.ropeTheta, c.ropeDim], [2, 500000, 4]);
  }
  const fails = (k: WriteKv[], code: string, re: RegExp) => {
    using f = GgufFile.open(writeGguf(k, []));
    throws(
      () => llamaConfigFromGguf(f),
      (e: unknown) => e instanceof MlxError && e.code === code && re.test(e.message),
    );
  };
  fails(kvs("gpt2"), "Unsupported", /architecture "gpt2" is not supported \(supported: llama\)/);
  fails(kvs("llama").filter((k) => k.key !== "llama.block_count"), "InvalidArgument", /llama.block_count is missing/);
  fails(
    kvs("llama", [{ key: "llama.attention.head_count_kv", type: T.UINT32, value: 3 }]),
    "InvalidArgument",
    /8 heads are not a multiple of 3/,
  );
  fails(
    kvs("llama").map((k) => k.key === "llama.block_count" ? { ...k, value: 0 } : k),
    "InvalidArgument",
    /block_count must be a positive integer, got 0/,
  );
});

Deno.test("GGUF: dequantize gives each tensor's exact values (f32, f16, bf16 and block formats)", () => {
  const w = randomValues(2 * 256, 9);
  const bf16 = new Uint16Array(4);
  const bfValues = [1.5, -2, 0.0078125, -3.0625]; // exact in bf16
  bfValues.forEach((v, i) => bf16[i] = new Uint32Array(Float32Array.of(v).buffer)[0]! >>> 16);
  using f = GgufFile.open(writeGguf([], [
    { name: "f32", type: "f32", ne: [4], data: new Uint8Array(Float32Array.of(1, -2, 0.5, 3).buffer) },
    { name: "f16", type: "f16", ne: [3], data: new Uint8Array(Uint16Array.of(0x3c00, 0xc000, 0x0001).buffer) },
    { name: "bf16", type: "bf16", ne: [4], data: new Uint8Array(bf16.buffer) },
    { name: "q5_k", type: "q5_k", ne: [256, 2], data: quantizeGgml(w, 2, 256, "q5_k") },
    { name: "q4_1", type: "q4_1", ne: [32, 16], data: quantizeGgml(w, 16, 32, "q4_1") },
  ]));
  deepStrictEqual(Array.from(f.dequantize("f32")), [1, -2, 0.5, 3]);
  deepStrictEqual(Array.from(f.dequantize("f16")), [1, -2, 2 ** -24]);
  deepStrictEqual(Array.from(f.dequantize("bf16")), bfValues);
  deepStrictEqual(f.dequantize("q5_k"), dequantizeGgml(quantizeGgml(w, 2, 256, "q5_k"), 2, 256, "q5_k"));
  deepStrictEqual(f.dequantize("q4_1"), dequantizeGgml(quantizeGgml(w, 16, 32, "q4_1"), 16, 32, "q4_1"));
});
