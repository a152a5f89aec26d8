/**
 * Runs a llama-architecture model file: a GGUF file or an MLX checkpoint directory, from token ids
 * (no tokenizer), greedy by default, on any backend. Prints the generated ids and tokens/s;
 * `--logits out.f32` writes the last pass's logits (f32 little-endian). `--random-gguf out.gguf`
 * instead writes a random-weight GGUF of the given shape (streamed; for speed runs).
 *
 *   deno run --allow-ffi --allow-read --allow-env examples/generate.ts --model m.gguf --prompt-ids 1,2,3
 *
 * @module
 */
import { parseArgs } from "node:util";
import { type BackendName, GraphExecutor, MlxDevice, MlxError } from "../mod.ts";
import { generate, loadLlama, writeRandomLlamaGguf } from "../mod.ts";

const USAGE = `Usage: deno run --allow-ffi --allow-read --allow-env [--allow-write] examples/generate.ts [flags]

Generate from a model file:
  --model PATH         a llama GGUF file or an MLX checkpoint directory
  --prompt-ids IDS     comma-separated prompt token ids (default 1)
  --tokens N           tokens to generate (default 16)
  --warmup N           leading generated tokens left out of tokens/s (default 0)
  --ctx N              KV-cache positions (default prompt + tokens)
  --backend NAME       cpu, cuda, metal or metal-emu (default: MLXN_BACKEND, else the platform's)
  --temperature T      sample at temperature T (default 0: greedy)
  --top-k N            sample among the N most likely (default 0: all)
  --top-p P            nucleus share in (0, 1] (default 1)
  --seed N             sampling seed (default 0)
  --logits FILE        write the last pass's logits there (f32 little-endian; needs --allow-write)
Write a random-weight model instead (needs --allow-write):
  --random-gguf FILE   write a llama GGUF of random weights there and exit
  --layers N --hidden N --heads N --kv-heads N --ffn N --vocab N
                       its shape (default 32, 2048, 16, 4, 5632, 32000: the demo's PyTorch shapes)
  --weights KIND       bf16 or q4_k_m (default bf16)
  --help               this text`;

function usageError(message: string): never {
  console.error(`generate: ${message}\n\n${USAGE}`);
  Deno.exit(2);
}

let parsed;
try {
  parsed = parseArgs({
    args: Deno.args,
    strict: true,
    allowPositionals: false,
    options: {
      help: { type: "boolean", default: false },
      model: { type: "string" },
      "prompt-ids": { type: "string", default: "1" },
      tokens: { type: "string", default: "16" },
      warmup: { type: "string", default: "0" },
      ctx: { type: "string" },
      backend: { type: "string" },
      temperature: { type: "string", default: "0" },
      "top-k": { type: "string", default: "0" },
      "top-p": { type: "string", default: "1" },
      seed: { type: "string", default: "0" },
      logits: { type: "string" },
      "random-gguf": { type: "string" },
      layers: { type: "string", default: "32" },
      hidden: { type: "string", default: "2048" },
      heads: { type: "string", default: "16" },
      "kv-heads": { type: "string", default: "4" },
      ffn: { type: "string", default: "5632" },
      vocab: { type: "string", default: "32000" },
      weights: { type: "string", default: "bf16" },
    },
  });
} catch (e) {
  usageError(e instanceof Error ? e.message : String(e));
}
const a = parsed.values;
if (a.help) {
  console.log(USAGE);
  Deno.exit(0);
}
const int = (name: string, v: string, min: number) => {
  // Decimal digits only: Number() would also take "", "0x10" and "1e3".
  const n = /^\s*\d+\s*$/.test(v) ? Number(v) : NaN;
  if (!Number.isSafeInteger(n) || n < min) usageError(`--${name} must be an integer ≥ ${min}, got ${v}`);
  return n;
};

function fail(what: string, e: unknown): never {
  if (!(e instanceof MlxError)) throw e;
  console.error(`generate: ${what} (${e.code}): ${e.message}`);
  Deno.exit(1);
}

/** A file the example writes could not be written: say why and which permission it needs. */
function writeFailed(path: string, e: unknown): never {
  if (!(e instanceof Error)) throw e;
  console.error(`generate: cannot write ${path}: ${e.message} (run with --allow-write and an existing directory)`);
  Deno.exit(1);
}

if (a["random-gguf"] !== undefined) {
  if (a.weights !== "bf16" && a.weights !== "q4_k_m") usageError("--weights must be bf16 or q4_k_m");
  const shape = {
    layers: int("layers", a.layers, 1),
    hidden: int("hidden", a.hidden, 1),
    heads: int("heads", a.heads, 1),
    kvHeads: int("kv-heads", a["kv-heads"], 1),
    ffn: int("ffn", a.ffn, 1),
    vocab: int("vocab", a.vocab, 1),
    weights: a.weights,
  } as const;
  const t0 = performance.now();
  let bytes: number;
  try {
    bytes = writeRandomLlamaGguf(a["random-gguf"], shape);
  } catch (e) {
    writeFailed(a["random-gguf"], e);
  }
  console.log(
    `wrote ${a["random-gguf"]}: ${(bytes / 2 ** 30).toFixed(2)} GiB, ${shape.weights} weights, ` +
      `${shape.layers} layers, hidden ${shape.hidden}, ${shape.heads}/${shape.kvHeads} heads, ffn ${shape.ffn}, ` +
      `vocab ${shape.vocab} (${((performance.now() - t0) / 1e3).toFixed(1)} s)`,
  );
  Deno.exit(0);
}

if (a.model === undefined) usageError("pass --model (a .gguf file or an MLX checkpoint directory)");
const promptIds = a["prompt-ids"].split(",").map((s) => s.trim()).filter((s) => s !== "").map((s) =>
  int("prompt-ids", s, 0)
);
if (promptIds.length === 0) usageError("--prompt-ids must name at least one id");
const tokens = int("tokens", a.tokens, 1);
const warmup = int("warmup", a.warmup, 0);
if (warmup >= tokens) usageError("--warmup must be less than --tokens");
const ctx = a.ctx === undefined ? promptIds.length + tokens : int("ctx", a.ctx, 1);
const temperature = Number(a.temperature), topP = Number(a["top-p"]);
if (!(temperature >= 0 && Number.isFinite(temperature))) usageError("--temperature must be ≥ 0");
if (!(topP > 0 && topP <= 1)) usageError("--top-p must be in (0, 1]");
const select = { temperature, topK: int("top-k", a["top-k"], 0), topP, seed: int("seed", a.seed, 0) };
if (a.backend !== undefined && !["cpu", "cuda", "metal", "metal-emu"].includes(a.backend)) {
  usageError("--backend must be cpu, cuda, metal or metal-emu");
}

let device: MlxDevice;
try {
  device = MlxDevice.open({ backend: a.backend as BackendName | undefined });
} catch (e) {
  fail("cannot open a device", e);
}
const t0 = performance.now();
let model;
try {
  model = loadLlama(device, a.model, { ctx });
} catch (e) {
  fail(`cannot load ${a.model}`, e);
}
const c = model.config;
console.log(`device: ${device.info.name} — ${device.backend} backend`);
console.log(
  `model: ${a.model} (${model.ropeMode} rope), ${c.layers} layers, hidden ${c.hiddenSize}, ` +
    `${c.heads}/${c.kvHeads} heads × ${c.headDim}, ffn ${c.intermediateSize}, vocab ${c.vocabSize}; ` +
    `${(model.weightBytes / 2 ** 20).toFixed(1)} MiB of weights loaded in ${
      ((performance.now() - t0) / 1e3).toFixed(2)
    } s`,
);
console.log(`formats: ${Object.entries(model.formats).map(([k, v]) => `${k} ${v}`).join(", ")}`);
const exec = new GraphExecutor(device);
let result;
try {
  result = generate(model, exec, { promptIds, tokens, warmup, select });
} catch (e) {
  fail("generation failed", e);
}
console.log(`prompt: ${promptIds.join(",")} (${result.promptMs.toFixed(1)} ms)`);
console.log(`generated: ${result.tokens.join(",")}`);
console.log(
  `decode: ${result.timedTokens} tokens in ${result.decodeMs.toFixed(1)} ms: ${
    result.tokensPerSecond.toFixed(1)
  } tokens/s (${(result.decodeMs / result.timedTokens).toFixed(3)} ms/token)`,
);
if (a.logits !== undefined) {
  const l = result.lastLogits;
  const bytes = new Uint8Array(l.length * 4), dv = new DataView(bytes.buffer);
  l.forEach((v, i) => dv.setFloat32(4 * i, v, true));
  try {
    Deno.writeFileSync(a.logits, bytes);
  } catch (e) {
    writeFailed(a.logits, e);
  }
  console.log(`logits: ${a.logits} (${l.length} f32)`);
}
model.dispose();
device.close();
