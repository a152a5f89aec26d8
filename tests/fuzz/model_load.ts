/**
 * Mutation fuzzing of `loadLlama` on small model files: tiny llama GGUF files (f32, q8_0 and q4_k
 * weights) and MLX checkpoint directories (affine 4-bit, one dense layer) written by the test
 * writers, then broken three ways — structure-aware (metadata keys rewritten with other types and
 * extreme values, tensors dropped, retyped, reshaped or transposed; config.json fields replaced,
 * quantization groups and rope scaling corrupted), byte-wise over the whole file
 * (tests/fuzz/model_files.ts's mutator), or through the safetensors header. Each input is written
 * to disk and loaded with a small ctx; a model that loads runs one forward pass (and, now and then,
 * a two-token generate). A finding is anything thrown that is not an MlxError, a single device
 * allocation over {@link MAX_ALLOC_BYTES} (the seeds are under 1 MiB: a larger request means a
 * header's claim was believed), or, from the command line, an input that takes over 5 s.
 *
 *   deno run --allow-ffi --allow-read --allow-write --allow-env tests/fuzz/model_load.ts [iterations=20000] [seed=1] [max-seconds]
 *
 * Findings are written to build/fuzz-model-load/ and the run exits 1.
 */
import { generate, GgufValueType, GraphExecutor, loadLlama, MlxDevice, MlxError } from "../../mod.ts";
import { rng } from "../helpers.ts";
import {
  type TinyLlamaSpec,
  writeGguf,
  type WriteKv,
  type WriteTensor,
  writeTinyLlamaGguf,
} from "../helpers/gguf_writer.ts";
import { writeTinyLlamaMlx } from "../helpers/safetensors_writer.ts";
import { mutate, mutateSafetensorsHeader } from "./model_files.ts";

/** The largest single device allocation a load of the (sub-MiB) seed models may ask for. */
export const MAX_ALLOC_BYTES = 64 << 20;

const T = GgufValueType;
const SMALL: Omit<TinyLlamaSpec, "seed"> = { layers: 1, hidden: 64, heads: 1, kvHeads: 1, ffn: 64, vocab: 16 };

/** The GGUF llama keys the loader reads, and whether the seed writes them. */
const GGUF_KEYS = [
  "general.architecture",
  "general.alignment",
  "llama.block_count",
  "llama.context_length",
  "llama.embedding_length",
  "llama.feed_forward_length",
  "llama.attention.head_count",
  "llama.attention.head_count_kv",
  "llama.attention.key_length",
  "llama.rope.dimension_count",
  "llama.rope.freq_base",
  "llama.rope.scaling.type",
  "llama.attention.layer_norm_rms_epsilon",
  "llama.vocab_size",
  "tokenizer.ggml.tokens",
];

const NUMBERS = [0, 1, 2, 3, 16, 32, 63, 64, 65, 128, 256, 512, 4096, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1];
const FLOATS = [0, -1, 1e-5, 0.5, 1e30, NaN, Infinity, -Infinity, 1e-45];
const BIGS = [0n, 1n, 16n, 64n, 2n ** 32n, 2n ** 40n, 2n ** 53n, 2n ** 63n, 2n ** 64n - 1n];
const STRINGS = ["llama", "mistral", "", "none", "linear", "yarn", "\u0000", "x".repeat(200)];
const GGML_TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "q2_k", "i8"];

/** A metadata entry with a random type and an extreme value for `key` (or `undefined`: removed). */
function randomKv(key: string, pick: (n: number) => number): WriteKv {
  switch (pick(8)) {
    case 0:
      return { key, type: T.UINT32, value: NUMBERS[pick(NUMBERS.length)] };
    case 1:
      return { key, type: T.INT32, value: -NUMBERS[pick(NUMBERS.length)]! | 0 };
    case 2:
      return { key, type: T.UINT64, value: BIGS[pick(BIGS.length)] };
    case 3:
      return { key, type: T.FLOAT32, value: FLOATS[pick(FLOATS.length)] };
    case 4:
      return { key, type: T.FLOAT64, value: FLOATS[pick(FLOATS.length)] };
    case 5:
      return { key, type: T.STRING, value: STRINGS[pick(STRINGS.length)] };
    case 6:
      return { key, type: T.ARRAY, elementType: T.STRING, value: Array.from({ length: pick(20) }, (_, i) => `t${i}`) };
    default:
      return { key, type: T.UINT32, value: undefined };
  }
}

const BASES: TinyLlamaSpec[] = [
  { ...SMALL, seed: 1 },
  { ...SMALL, seed: 2, typeOf: () => "q8_0", tied: true },
  { ...SMALL, hidden: 256, heads: 2, kvHeads: 1, ffn: 256, seed: 3, typeOf: () => "q4_k" },
];

/** The metadata and tensors of each base model, made once (quantizing on every input is slow). */
const baseParts = BASES.map((spec) => {
  let tensors: WriteTensor[] = [];
  writeTinyLlamaGguf({ ...spec, edit: (t) => void (tensors = t.map((x) => ({ ...x }))) });
  const kvs: WriteKv[] = [
    { key: "general.architecture", type: T.STRING, value: "llama" },
    { key: "llama.block_count", type: T.UINT32, value: spec.layers },
    { key: "llama.context_length", type: T.UINT32, value: 64 },
    { key: "llama.embedding_length", type: T.UINT32, value: spec.hidden },
    { key: "llama.feed_forward_length", type: T.UINT32, value: spec.ffn },
    { key: "llama.attention.head_count", type: T.UINT32, value: spec.heads },
    { key: "llama.attention.head_count_kv", type: T.UINT32, value: spec.kvHeads },
    { key: "llama.rope.freq_base", type: T.FLOAT32, value: 10000 },
    { key: "llama.attention.layer_norm_rms_epsilon", type: T.FLOAT32, value: 1e-5 },
    { key: "llama.vocab_size", type: T.UINT32, value: spec.vocab },
  ];
  return { kvs, tensors };
});

/** A structure-aware GGUF: a small llama model with metadata and tensor edits. */
function structuredGguf(next: () => number): Uint8Array {
  const pick = (n: number) => Math.floor(next() * n);
  const base = baseParts[pick(baseParts.length)]!;
  const kvs = base.kvs.slice();
  for (let i = pick(3); i >= 0; i--) {
    const kv = randomKv(GGUF_KEYS[pick(GGUF_KEYS.length)]!, pick);
    const at = kvs.findIndex((x) => x.key === kv.key);
    if (at >= 0) kvs.splice(at, 1);
    if (kv.value !== undefined) kvs.push(kv);
  }
  const tensors = base.tensors.map((t) => ({ ...t }));
  const edits = pick(3);
  const edit = (tensors: WriteTensor[]) => {
    for (let e = 0; e < edits && tensors.length > 0; e++) {
      const at = pick(tensors.length), t = tensors[at]!;
      switch (pick(5)) {
        case 0: // drop
          tensors.splice(at, 1);
          break;
        case 1: // retype, keeping the bytes
          t.type = GGML_TYPES[pick(GGML_TYPES.length)]!;
          break;
        case 2: // one dimension replaced (the bytes stay: the header's size no longer matches)
          t.ne = t.ne.slice();
          t.ne[pick(t.ne.length + 1)] = [0, 1, 2 ** 20, 2 ** 31, 2 ** 40, 2 ** 52][pick(6)]!;
          break;
        case 3: // transposed
          t.ne = t.ne.slice().reverse();
          break;
        default: // a rope_freqs tensor of a random length
          tensors.push({ name: "rope_freqs.weight", type: "f32", ne: [pick(64)], data: new Uint8Array(4 * 64) });
      }
    }
  };
  edit(tensors);
  return writeGguf(kvs, tensors);
}

const CONFIG_KEYS = [
  "model_type",
  "hidden_size",
  "intermediate_size",
  "num_hidden_layers",
  "num_attention_heads",
  "num_key_value_heads",
  "head_dim",
  "vocab_size",
  "rms_norm_eps",
  "rope_theta",
  "max_position_embeddings",
  "quantization",
  "rope_scaling",
];
const JSON_VALUES: unknown[] = [
  0,
  1,
  -1,
  2.5,
  16,
  64,
  2 ** 31,
  2 ** 53,
  1e308,
  "llama",
  "64",
  "",
  null,
  true,
  false,
  [],
  [64],
  {},
  { group_size: 64, bits: 4 },
  { group_size: 32, bits: 8 },
  { group_size: 64, bits: 7 },
  { group_size: 64, bits: 4, mode: "mxfp4" },
  { rope_type: "llama3", factor: 8 },
  { rope_type: "llama3", factor: 8, low_freq_factor: 4, high_freq_factor: 1 },
  { type: "linear", factor: 2 },
];

/** Writes a structure-aware MLX checkpoint into `dir` (config.json fields replaced, then maybe bytes). */
function structuredMlx(dir: string, next: () => number): void {
  const pick = (n: number) => Math.floor(next() * n);
  const extra: Record<string, unknown> = {};
  for (let i = pick(3); i >= 0; i--) {
    extra[CONFIG_KEYS[pick(CONFIG_KEYS.length)]!] = JSON_VALUES[pick(JSON_VALUES.length)];
  }
  const dense = pick(2) === 0;
  writeTinyLlamaMlx(
    dir,
    { ...SMALL, seed: 4, tied: pick(2) === 0 },
    { bits: 4, groupSize: 64 },
    (name) => (dense || name.endsWith("o_proj") ? null : { bits: 4, groupSize: 64 }),
    extra,
  );
  const file = `${dir}/model.safetensors`;
  const bytes = Deno.readFileSync(file);
  switch (pick(4)) {
    case 0:
      Deno.writeFileSync(file, mutate(bytes, bytes, next));
      break;
    case 1:
      try {
        Deno.writeFileSync(file, mutateSafetensorsHeader(bytes, next));
      } catch { /* a header the JSON mutator cannot rewrite: left as is */ }
      break;
    case 2: {
      const text = Deno.readTextFileSync(`${dir}/config.json`);
      const m = mutate(new TextEncoder().encode(text), bytes, next);
      Deno.writeFileSync(`${dir}/config.json`, m);
      break;
    }
    default: // config.json edits only
  }
  if (pick(16) === 0) {
    Deno.writeTextFileSync(
      `${dir}/model.safetensors.index.json`,
      JSON.stringify(
        [{ weight_map: { "model.norm.weight": "../x.safetensors" } }, { weight_map: [] }, null, { weight_map: {} }][
          pick(4)
        ],
      ),
    );
  }
}

/** What one load did. */
export type LoadOutcome = "loaded" | "refused";

/** Loads the model at `path` (and runs it when it loads); throws a finding, returns the outcome. */
export function loadOne(device: MlxDevice, exec: GraphExecutor, path: string, generateToo: boolean): LoadOutcome {
  try {
    using model = loadLlama(device, path, { ctx: 4 });
    const logits = model.forward(exec, 0, 0);
    if (logits.length !== model.config.vocabSize) {
      throw new Error(`forward returned ${logits.length} logits for vocab ${model.config.vocabSize}`);
    }
    if (generateToo) generate(model, exec, { promptIds: [1], tokens: 2 });
    return "loaded";
  } catch (e) {
    if (e instanceof MlxError) return "refused";
    throw e;
  }
}

/** Counts of a run. */
export interface LoadFuzzResult {
  /** Inputs tried. */
  inputs: number;
  /** Inputs that loaded (and ran). */
  loaded: number;
  /** Inputs refused with an MlxError. */
  refused: number;
  /** Findings (non-MlxError throws, oversized allocations). */
  findings: number;
  /** The largest single allocation seen, bytes. */
  maxAlloc: number;
}

/**
 * Runs `iterations` inputs (or as many as fit in `maxSeconds`) in `dir` (a scratch directory).
 * `onFinding` gets each finding with the bytes of the input that caused it (for an MLX input, the
 * safetensors file; config.json beside it).
 */
export function fuzzLoad(
  dir: string,
  iterations: number,
  seed: number,
  onFinding?: (kind: string, input: Uint8Array, e: unknown, ms: number) => void,
  slowMs = Infinity,
  maxSeconds = Infinity,
): LoadFuzzResult {
  const next = rng(seed);
  const pick = (n: number) => Math.floor(next() * n);
  using device = MlxDevice.open();
  const exec = new GraphExecutor(device);
  // Every device allocation is measured: a header's size claim must never reach one unchecked.
  let maxAlloc = 0, tooLarge = 0;
  const alloc = device.alloc.bind(device), upload = device.upload.bind(device);
  const measure = (bytes: number) => {
    maxAlloc = Math.max(maxAlloc, bytes);
    if (bytes > MAX_ALLOC_BYTES) tooLarge = bytes;
  };
  device.alloc = (byteLength, dtype, shape) => {
    measure(byteLength);
    return alloc(byteLength, dtype, shape);
  };
  device.upload = (data, dtype, shape) => {
    measure((data as ArrayBufferView).byteLength ?? 0);
    return upload(data, dtype, shape);
  };
  const seedFiles = [
    writeTinyLlamaGguf({ ...SMALL, seed: 1 }),
    writeTinyLlamaGguf({ ...SMALL, seed: 2, typeOf: () => "q8_0", tied: true }),
  ];
  const r: LoadFuzzResult = { inputs: 0, loaded: 0, refused: 0, findings: 0, maxAlloc: 0 };
  const ggufPath = `${dir}/model.gguf`, mlxDir = `${dir}/mlx`;
  const stopAt = performance.now() + maxSeconds * 1000;
  for (let i = 0; i < iterations && performance.now() < stopAt; i++) {
    const kind = ["gguf-structured", "gguf-bytes", "mlx"][pick(3)]!;
    let path = ggufPath, input: Uint8Array;
    if (kind === "mlx") {
      Deno.removeSync(mlxDir, { recursive: true });
      structuredMlx(mlxDir, next);
      path = mlxDir;
      input = Deno.readFileSync(`${mlxDir}/model.safetensors`);
    } else {
      const a = seedFiles[pick(seedFiles.length)]!, b = seedFiles[pick(seedFiles.length)]!;
      input = kind === "gguf-structured" ? structuredGguf(next) : mutate(a, b, next);
      Deno.writeFileSync(ggufPath, input);
    }
    tooLarge = 0;
    const t0 = performance.now();
    let finding: unknown;
    try {
      const outcome = loadOne(device, exec, path, pick(16) === 0);
      r[outcome]++;
      if (tooLarge) finding = new Error(`a single device allocation of ${tooLarge} bytes`);
    } catch (e) {
      finding = e;
    }
    const ms = performance.now() - t0;
    if (finding === undefined && ms > slowMs) finding = new Error(`took ${ms.toFixed(0)} ms`);
    r.inputs++;
    if (finding !== undefined) {
      r.findings++;
      onFinding?.(kind, input, finding, ms);
    }
  }
  r.maxAlloc = maxAlloc;
  return r;
}

if (import.meta.main) {
  const iterations = Number(Deno.args[0] ?? 20000), seed = Number(Deno.args[1] ?? 1);
  const maxSeconds = Number(Deno.args[2] ?? Infinity);
  const out = "build/fuzz-model-load";
  const scratch = Deno.makeTempDirSync({ prefix: "mlxn_fuzz_load_" });
  Deno.mkdirSync(`${scratch}/mlx`, { recursive: true });
  const start = performance.now();
  try {
    const r = fuzzLoad(
      scratch,
      iterations,
      seed,
      (kind, input, e, ms) => {
        Deno.mkdirSync(out, { recursive: true });
        const name = `${out}/${kind}-${crypto.randomUUID()}`;
        Deno.writeFileSync(`${name}.bin`, input);
        if (kind === "mlx") Deno.copyFileSync(`${scratch}/mlx/config.json`, `${name}.config.json`);
        console.error(`finding (${kind}, ${ms.toFixed(0)} ms): ${(e as Error)?.stack ?? e} → ${name}.bin`);
      },
      5000,
      maxSeconds,
    );
    const s = (performance.now() - start) / 1000;
    console.log(
      `${r.inputs} inputs, seed ${seed}: ${r.loaded} loaded and ran, ${r.refused} refused with MlxError, ` +
        `${r.findings} findings, largest allocation ${r.maxAlloc} bytes, ${s.toFixed(1)} s`,
    );
    if (r.findings > 0) Deno.exit(1);
  } finally {
    Deno.removeSync(scratch, { recursive: true });
  }
}
