/**
 * safetensors reader and MLX checkpoints: files written by the test writer read back exactly and
 * stream into device buffers; quantized layers (weight/scales/biases) are validated against
 * config.json's quantization; malformed, truncated and oversized files get clear MlxErrors.
 */
import { deepStrictEqual, equal, throws } from "node:assert/strict";
import {
  dequantizeAffine,
  llamaConfigFromMlx,
  MlxCheckpoint,
  MlxError,
  quantizeAffine,
  SafetensorsFile,
} from "../mod.ts";
import { randomValues, testContext } from "./helpers.ts";
import { bytesOf, type WriteSafetensor, writeSafetensors } from "./helpers/safetensors_writer.ts";

function sample(): WriteSafetensor[] {
  return [
    { name: "a", dtype: "F32", shape: [2, 3], data: bytesOf(Float32Array.of(1, 2, 3, 4, 5, 6)) },
    { name: "b", dtype: "BF16", shape: [4], data: bytesOf(Uint16Array.of(0x3f80, 0x4000, 0xbf80, 0)) },
    { name: "empty", dtype: "I64", shape: [0, 5], data: new Uint8Array(0) },
    { name: "c", dtype: "U32", shape: [1], data: bytesOf(Uint32Array.of(0xdeadbeef)) },
  ];
}

function expectError(bytes: Uint8Array, code: string, re: RegExp): void {
  throws(
    () => SafetensorsFile.open(bytes),
    (e: unknown) => e instanceof MlxError && e.code === code && re.test(e.message),
    `expected ${code} ${re}`,
  );
}

/** A safetensors file whose header is `json` verbatim, followed by `data` bytes. */
function raw(json: string, dataBytes = 0): Uint8Array {
  const h = new TextEncoder().encode(json);
  const out = new Uint8Array(8 + h.length + dataBytes);
  new DataView(out.buffer).setBigUint64(0, BigInt(h.length), true);
  out.set(h, 8);
  return out;
}

Deno.test("safetensors: tensors and metadata read back exactly and stream into device buffers", () => {
  using ctx = testContext();
  const tensors = sample();
  using f = SafetensorsFile.open(writeSafetensors(tensors, { format: "mlx" }));
  deepStrictEqual(f.header.metadata, { format: "mlx" });
  deepStrictEqual(f.tensors.map((t) => [t.name, t.dtype, [...t.shape], t.byteLength]), [
    ["a", "F32", [2, 3], 24],
    ["b", "BF16", [4], 8],
    ["empty", "I64", [0, 5], 0],
    ["c", "U32", [1], 4],
  ]);
  for (const t of tensors) deepStrictEqual(f.readTensorBytes(t.name), t.data);
  using a = f.upload(ctx.device, "a", { chunkBytes: 5 });
  deepStrictEqual([a.dtype, [...a.shape], Array.from(a.read() as Float32Array)], ["f32", [2, 3], [1, 2, 3, 4, 5, 6]]);
  using b = f.upload(ctx.device, "b");
  deepStrictEqual(Array.from(b.read() as Float32Array), [1, 2, -1, 0]);
  throws(() => f.upload(ctx.device, "empty"), (e: unknown) => e instanceof MlxError && e.code === "Unsupported");
  throws(() => f.tensor("zzz"), (e: unknown) => e instanceof MlxError && /no tensor "zzz"/.test(e.message));
});

Deno.test("safetensors: malformed, truncated and oversized files get clear errors", () => {
  const good = writeSafetensors(sample());
  for (let cut = 0; cut < good.length; cut++) {
    throws(
      () => SafetensorsFile.open(good.subarray(0, cut)),
      (e: unknown) => e instanceof MlxError && e.code === "InvalidArgument" && /truncated|not a valid/.test(e.message),
      `cut at ${cut}`,
    );
  }
  const big = good.slice();
  new DataView(big.buffer).setBigUint64(0, 2n ** 40n, true);
  expectError(big, "InvalidArgument", /header length is 1099511627776 bytes, more than/);
  expectError(raw("[1,2]"), "InvalidArgument", /does not start with '\{'/);
  expectError(raw("{nope"), "InvalidArgument", /not valid JSON/);
  expectError(raw('{"a": 5}'), "InvalidArgument", /tensor "a" is not an object/);
  expectError(raw('{"a": {"shape": [1], "data_offsets": [0, 4]}}', 4), "InvalidArgument", /no dtype string/);
  expectError(raw('{"a": {"dtype": "F4", "shape": [1], "data_offsets": [0, 1]}}', 1), "Unsupported", /dtype "F4"/);
  expectError(
    raw('{"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}', 4),
    "InvalidArgument",
    /invalid shape/,
  );
  expectError(
    raw('{"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}', 4),
    "InvalidArgument",
    /invalid data_offsets/,
  );
  expectError(
    raw('{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}', 4),
    "InvalidArgument",
    /F32\[2\] takes 8 bytes, its data_offsets span 4/,
  );
  expectError(
    raw(
      '{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}, "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}',
      3,
    ),
    "InvalidArgument",
    /tensor "b" starts at data byte 1, expected 2 \(gap or overlap\)/,
  );
  expectError(
    raw('{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}', 3),
    "InvalidArgument",
    /1 bytes after the last tensor/,
  );
  expectError(
    raw('{"a": {"dtype": "U8", "shape": [9007199254740991, 9007199254740991], "data_offsets": [0, 2]}}', 2),
    "InvalidArgument",
    /more than 2\^53 elements/,
  );
  expectError(raw('{"__metadata__": {"k": 1}}'), "InvalidArgument", /__metadata__.k is not a string/);
  const badUtf8 = raw('{"a":1}');
  badUtf8[10] = 0xff;
  expectError(badUtf8, "InvalidArgument", /not valid UTF-8/);
});

/** Writes an MLX checkpoint directory; returns its path. */
function writeCheckpoint(config: Record<string, unknown>, shards: WriteSafetensor[][]): string {
  const dir = Deno.makeTempDirSync({ prefix: "mlxn_ckpt_" });
  Deno.writeTextFileSync(`${dir}/config.json`, JSON.stringify(config));
  if (shards.length === 1) Deno.writeFileSync(`${dir}/model.safetensors`, writeSafetensors(shards[0]!));
  else {
    const weightMap: Record<string, string> = {};
    shards.forEach((tensors, i) => {
      const file = `model-0000${i + 1}-of-0000${shards.length}.safetensors`;
      Deno.writeFileSync(`${dir}/${file}`, writeSafetensors(tensors));
      for (const t of tensors) weightMap[t.name] = file;
    });
    Deno.writeTextFileSync(
      `${dir}/model.safetensors.index.json`,
      JSON.stringify({ metadata: {}, weight_map: weightMap }),
    );
  }
  return dir;
}

/** MLX's on-disk form of a quantized layer: weight U32 [n, k·bits/32], scales/biases [n, k/gs]. */
function mlxLayer(prefix: string, n: number, k: number, bits: 2 | 3 | 4 | 5 | 6 | 8, gs: 32 | 64 | 128, seed: number) {
  const q = quantizeAffine(randomValues(n * k, seed), n, k, bits, gs);
  const tensors: WriteSafetensor[] = [
    { name: `${prefix}.weight`, dtype: "U32", shape: [n, (k * bits) / 32], data: q.weights.slice() },
    { name: `${prefix}.scales`, dtype: "BF16", shape: [n, k / gs], data: bytesOf(q.scales) },
    { name: `${prefix}.biases`, dtype: "BF16", shape: [n, k / gs], data: bytesOf(q.biases) },
  ];
  return { q, tensors };
}

const LLAMA = {
  model_type: "llama",
  hidden_size: 64,
  intermediate_size: 128,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  vocab_size: 100,
  rms_norm_eps: 1e-5,
  rope_theta: 500000,
};

Deno.test("MLX checkpoint: sharded files, per-layer quantization overrides, quantized layers upload exactly", () => {
  using ctx = testContext();
  const q = mlxLayer("model.layers.0.self_attn.q_proj", 8, 64, 4, 64, 1);
  const o = mlxLayer("model.layers.0.self_attn.o_proj", 4, 96, 3, 32, 2);
  const norm = { name: "model.norm.weight", dtype: "F32", shape: [64], data: bytesOf(randomValues(64, 3)) };
  const dir = writeCheckpoint(
    {
      ...LLAMA,
      quantization: { group_size: 64, bits: 4, "model.layers.0.self_attn.o_proj": { group_size: 32, bits: 3 } },
    },
    [[...q.tensors, norm], o.tensors],
  );
  try {
    using ck = MlxCheckpoint.open(dir);
    deepStrictEqual(ck.quantization, { groupSize: 64, bits: 4 });
    equal(ck.tensorNames.length, 7);
    equal(llamaConfigFromMlx(ck.config).kvHeads, 2);
    const lq = ck.quantizedLayer("model.layers.0.self_attn.q_proj");
    deepStrictEqual([lq.n, lq.k, lq.bits, lq.groupSize, lq.scaleDtype], [8, 64, 4, 64, "bf16"]);
    const lo = ck.quantizedLayer("model.layers.0.self_attn.o_proj");
    deepStrictEqual([lo.n, lo.k, lo.bits, lo.groupSize], [4, 96, 3, 32]);
    equal(ck.quantizationOf("model.norm"), undefined);
    const up = ck.uploadQuantizedLayer(ctx.device, "model.layers.0.self_attn.o_proj");
    try {
      equal(up.weights.dtype, "u8");
      const back = dequantizeAffine({
        bits: 3,
        groupSize: 32,
        n: 4,
        k: 96,
        weights: up.weights.readBytes(),
        scales: new Uint16Array(up.scales.readBytes().buffer),
        biases: new Uint16Array(up.biases.readBytes().buffer),
      });
      deepStrictEqual(back, dequantizeAffine(o.q));
      deepStrictEqual(ck.dequantizeLayer("model.layers.0.self_attn.o_proj"), dequantizeAffine(o.q));
    } finally {
      up.weights.dispose();
      up.scales.dispose();
      up.biases.dispose();
    }
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("MLX checkpoint: inconsistent or unsupported quantization gets clear errors", () => {
  const bad = (
    config: Record<string, unknown>,
    tensors: WriteSafetensor[],
    code: string,
    re: RegExp,
    prefix?: string,
  ) => {
    const dir = writeCheckpoint(config, [tensors]);
    try {
      throws(
        () => {
          using ck = MlxCheckpoint.open(dir);
          if (prefix) ck.quantizedLayer(prefix);
        },
        (e: unknown) => e instanceof MlxError && e.code === code && re.test(e.message),
        String(re),
      );
    } finally {
      Deno.removeSync(dir, { recursive: true });
    }
  };
  const l = mlxLayer("p", 4, 64, 4, 64, 5).tensors;
  bad(
    { ...LLAMA, quantization: { group_size: 64, bits: 4, mode: "mxfp4" } },
    l,
    "Unsupported",
    /mode "mxfp4" is not supported/,
  );
  bad({ ...LLAMA, quantization: { group_size: 64, bits: 7 } }, l, "Unsupported", /7 bits are not supported/);
  bad({ ...LLAMA, quantization: { group_size: 16, bits: 4 } }, l, "Unsupported", /group size 16 is not supported/);
  bad(
    { ...LLAMA, quantization: { group_size: 64, bits: 8 } },
    l,
    "InvalidArgument",
    /p.scales must be \[4, 0\.5\]|not a whole number/,
    "p",
  );
  bad({ ...LLAMA }, l, "InvalidArgument", /has scales but config.json has no quantization group/, "p");
  bad(
    { ...LLAMA, quantization: { group_size: 64, bits: 4, p: false } },
    l,
    "InvalidArgument",
    /marks it unquantized/,
    "p",
  );
  const f16Biases = l.map((t) => t.name === "p.biases" ? { ...t, dtype: "F16" } : t);
  bad(
    { ...LLAMA, quantization: { group_size: 64, bits: 4 } },
    f16Biases,
    "InvalidArgument",
    /biases are F16 but scales are BF16/,
    "p",
  );
  const i8 = l.map((t) => t.name === "p.weight" ? { ...t, dtype: "U8", shape: [4, 32] } : t);
  bad({ ...LLAMA, quantization: { group_size: 64, bits: 4 } }, i8, "InvalidArgument", /weight must be U32/, "p");
  throws(
    () => MlxCheckpoint.open("/nonexistent/ckpt"),
    (e: unknown) => e instanceof MlxError && /no \/nonexistent\/ckpt\/config.json/.test(e.message),
  );
  throws(
    () => llamaConfigFromMlx({ ...LLAMA, model_type: "gpt2" }),
    (e: unknown) => e instanceof MlxError && e.code === "Unsupported" && /model_type "gpt2"/.test(e.message),
  );
  throws(
    () => llamaConfigFromMlx({ ...LLAMA, num_key_value_heads: 3 }),
    (e: unknown) => e instanceof MlxError && /4 heads are not a multiple of 3 kv heads/.test(e.message),
  );
});

Deno.test("MLX checkpoint: f16 and f32 scales (MLX stores them in the weights' dtype) dequantize exactly", () => {
  for (const [dtype, st] of [["f16", "F16"], ["f32", "F32"]] as const) {
    const q = quantizeAffine(randomValues(4 * 128, 11), 4, 128, 5, 32, { dtype });
    const dir = writeCheckpoint({ ...LLAMA, quantization: { group_size: 32, bits: 5 } }, [[
      { name: "e.weight", dtype: "U32", shape: [4, 20], data: q.weights.slice() },
      { name: "e.scales", dtype: st, shape: [4, 4], data: bytesOf(q.scales) },
      { name: "e.biases", dtype: st, shape: [4, 4], data: bytesOf(q.biases) },
    ]]);
    try {
      using ck = MlxCheckpoint.open(dir);
      equal(ck.quantizedLayer("e").scaleDtype, dtype);
      deepStrictEqual(ck.dequantizeLayer("e"), dequantizeAffine(q));
    } finally {
      Deno.removeSync(dir, { recursive: true });
    }
  }
});
