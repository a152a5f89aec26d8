/**
 * Real model files end to end: the tests write small llama models themselves — a 2-layer
 * Q4_K_M-style GGUF (Q4_K / Q6_K / F32 tensors), a GGUF of every other runnable type with tied
 * embeddings and rope freq factors, and an MLX checkpoint (affine 4-bit group 64, one layer at 8
 * bits / group 32, one dense bf16, tied embeddings) — load them with loadLlama, run them on the
 * backend under test (directly, through generate, and as examples/generate.ts in a subprocess) and
 * compare the logits of every position with an independent float64 forward (tests/model_reference.ts)
 * of the same exactly-dequantized weights.
 *
 * Tolerance: |logit − reference| ≤ 1e-4 · max(1, max |reference logit|). The forward runs in f32;
 * each product accumulates K ≤ 512 terms (≈ K·2⁻²⁴ relative) through two layers and the norms, which
 * measures ≈ 3e-6 here on logits of magnitude ≈ 3; the bound leaves room for other backends'
 * summation orders, while a wrong rope pairing, scale or weight layout moves logits by > 0.1.
 * Greedy ids must equal the reference's argmax wherever its top-two margin exceeds twice the
 * tolerance.
 */
import { deepStrictEqual, equal, match, ok, throws } from "node:assert/strict";
import { generate, GraphExecutor, loadLlama, MlxError, writeRandomLlamaGguf } from "../mod.ts";
import { GgufFile, GgufValueType } from "../src/io/gguf.ts";
import { openDevice, rng, runDeno } from "./helpers.ts";
import { type TinyLlamaSpec, writeTinyLlamaGguf } from "./helpers/gguf_writer.ts";
import { writeTinyLlamaMlx } from "./helpers/safetensors_writer.ts";
import { ReferenceLlama, type RefWeights, refWeightsFromGguf, refWeightsFromMlx } from "./model_reference.ts";

const TOL = 1e-4;
const BASE = { layers: 2, hidden: 256, heads: 4, kvHeads: 2, ffn: 512, vocab: 300 };

/** Q4_K_M's mix: Q4_K, with Q6_K for output, ffn_down and (layer 0) attn_v; norms F32. */
const Q4_K_M: TinyLlamaSpec = {
  ...BASE,
  seed: 7,
  typeOf: (role, layer) =>
    role === "output" || role === "ffn_down" || (role === "attn_v" && layer === 0) ? "q6_k" : "q4_k",
};

/** Every other type the loader runs, tied embeddings (q8_0, gathered as is) and llama3-style freq factors. */
const MIXED: TinyLlamaSpec = {
  ...BASE,
  seed: 11,
  tied: true,
  ropeTheta: 500000,
  freqFactors: Float32Array.from({ length: 32 }, (_, i) => (i < 8 ? 1 : i < 16 ? 1 + (i - 8) : 8)),
  typeOf: (role, layer) =>
    ({
      token_embd: "q8_0",
      attn_q: layer === 0 ? "f16" : "q5_1",
      attn_k: layer === 0 ? "bf16" : "q5_k",
      attn_v: layer === 0 ? "f32" : "q5_k",
      attn_output: layer === 0 ? "q8_0" : "q4_0",
      ffn_gate: layer === 0 ? "q4_0" : "bf16",
      ffn_up: layer === 0 ? "q4_1" : "bf16",
      ffn_down: layer === 0 ? "q5_0" : "f16",
    })[role]!,
};

const dir = Deno.makeTempDirSync({ prefix: "mlxn_generate_test_" });
globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));

const files = new Map<string, string>();
/** Writes a model once per test module. */
function gguf(name: string, spec: TinyLlamaSpec): string {
  const path = `${dir}/${name}.gguf`;
  if (!files.has(path)) {
    Deno.writeFileSync(path, writeTinyLlamaGguf(spec));
    files.set(path, path);
  }
  return path;
}

function mlxDir(): string {
  const path = `${dir}/mlx4`;
  if (!files.has(path)) {
    writeTinyLlamaMlx(
      path,
      { ...BASE, seed: 5, tied: true },
      { bits: 4, groupSize: 64 },
      (name) =>
        name === "model.layers.1.mlp.down_proj"
          ? { bits: 8, groupSize: 32 }
          : name === "model.layers.0.self_attn.q_proj"
          ? null
          : { bits: 4, groupSize: 64 },
    );
    files.set(path, path);
  }
  return path;
}

Deno.test("an MLX checkpoint with llama3 rope scaling applies its frequency divisors", () => {
  const path = `${dir}/mlx_llama3`;
  // theta 500000 over 64 dims spans wavelengths 6 … 3e5: original context 64 puts some below the
  // high-frequency bound (kept), some above the low one (divided by 8) and some in the blended band.
  const scaling = {
    rope_type: "llama3",
    factor: 8,
    low_freq_factor: 1,
    high_freq_factor: 4,
    original_max_position_embeddings: 64,
  };
  writeTinyLlamaMlx(path, { ...BASE, layers: 1, seed: 13, ropeTheta: 500000 }, { bits: 4, groupSize: 64 }, undefined, {
    rope_scaling: scaling,
  });
  const w = refWeightsFromMlx(path);
  const f = w.freqFactors!;
  ok(f.includes(1) && f.includes(8) && f.some((v) => v > 1 && v < 8), `divisors ${f}`);
  checkModel(path, w, [1, 2, 3, 4, 5, 6, 7, 8], 3);
});

function checkLogits(got: ArrayLike<number>, want: Float64Array, what: string): void {
  equal(got.length, want.length, what);
  const bound = TOL * Math.max(1, ...Array.from(want, Math.abs));
  let worst = 0, at = 0;
  for (let i = 0; i < want.length; i++) {
    const d = Math.abs(got[i]! - want[i]!);
    if (!(d <= worst)) [worst, at] = [d, i];
  }
  ok(worst <= bound, `${what}: logit ${at} is ${got[at]}, the reference ${want[at]} (|Δ| ${worst} > ${bound})`);
}

/** The index of the largest value and its margin over the second. */
function top(v: Float64Array): { id: number; margin: number } {
  let id = 0;
  for (let i = 1; i < v.length; i++) if (v[i]! > v[id]!) id = i;
  let second = -Infinity;
  for (let i = 0; i < v.length; i++) if (i !== id && v[i]! > second) second = v[i]!;
  return { id, margin: v[id]! - second };
}

/**
 * Generates from `prompt`, then checks every generated id against the reference's argmax (where
 * its margin is clear), the last logits, and — rerunning the whole sequence one forward at a time
 * — every position's logits.
 */
function checkModel(path: string, weights: RefWeights, prompt: number[], tokens: number): void {
  using device = openDevice();
  const exec = new GraphExecutor(device);
  using model = loadLlama(device, path, { ctx: 16 });
  equal(model.ropeMode, weights.rope);
  const r = generate(model, exec, { promptIds: prompt, tokens });
  equal(r.tokens.length, tokens);

  const ref = new ReferenceLlama(weights);
  let logits: Float64Array<ArrayBufferLike> = new Float64Array();
  for (const id of prompt) logits = ref.step(id);
  let clear = 0;
  r.tokens.forEach((id, i) => {
    const t = top(logits);
    if (t.margin > 2 * TOL * Math.max(1, ...Array.from(logits, Math.abs))) {
      equal(id, t.id, `generated token ${i}: the reference's argmax is ${t.id} (margin ${t.margin})`);
      clear++;
    }
    if (i < tokens - 1) logits = ref.step(id);
  });
  ok(clear >= tokens - 1, `only ${clear} of ${tokens} steps had a clear margin`);
  checkLogits(r.lastLogits, logits, "last logits of generate");

  // Every position, prompt and generated, through the plain forward path.
  const seq = [...prompt, ...r.tokens.slice(0, -1)];
  const again = new ReferenceLlama(weights);
  model.resetCache();
  seq.forEach((id, pos) => checkLogits(model.forward(exec, id, pos), again.step(id), `position ${pos}`));
}

Deno.test("a 2-layer Q4_K_M-style GGUF matches the float64 reference (prompt and decode steps)", () => {
  const path = gguf("q4_k_m", Q4_K_M);
  checkModel(path, refWeightsFromGguf(path), [5, 17, 200, 42], 6);
});

Deno.test("a GGUF of f32/f16/bf16/q4_0/q4_1/q5_0/q5_1/q8_0/q5_k weights, tied, with rope_freqs matches the reference", () => {
  const path = gguf("mixed", MIXED);
  using device = openDevice();
  using model = loadLlama(device, path, { ctx: 8 });
  equal(model.formats.embedding, "q8_0");
  equal(model.formats.output, "q8_0");
  device.close();
  checkModel(path, refWeightsFromGguf(path), [3, 299, 0], 4);
});

Deno.test("an MLX checkpoint (affine 4-bit/64, an 8-bit/32 layer, a dense layer, tied) matches the reference", () => {
  const path = mlxDir();
  using device = openDevice();
  using model = loadLlama(device, path, { ctx: 8 });
  equal(model.formats.output, "affine4/64");
  equal(model.formats.down, "affine4/64|affine8/32");
  match(model.formats.qkv!, /^bf16\+affine4\/64\+affine4\/64\|/);
  device.close();
  checkModel(path, refWeightsFromMlx(path), [9, 100, 250], 5);
});

Deno.test("examples/generate.ts prints the greedy ids and writes the last logits", async () => {
  const path = gguf("q4_k_m", Q4_K_M);
  const out = `${dir}/logits.f32`;
  using device = openDevice();
  const backend = device.backend;
  device.close();
  const prompt = [5, 17, 200, 42], tokens = 3;
  const r = await runDeno([
    "run",
    "--no-prompt",
    "--allow-ffi",
    "--allow-read",
    "--allow-env",
    `--allow-write=${out}`,
    new URL("../examples/generate.ts", import.meta.url).pathname,
    "--model",
    path,
    "--prompt-ids",
    prompt.join(","),
    "--tokens",
    String(tokens),
    "--backend",
    backend,
    "--logits",
    out,
  ]);
  equal(r.code, 0, r.stderr);
  match(r.stdout, /tokens\/s/);
  const ids = r.stdout.match(/^generated: ([\d,]+)$/m)![1]!.split(",").map(Number);
  ok(ids && ids.length === tokens, r.stdout);
  const ref = new ReferenceLlama(refWeightsFromGguf(path));
  let logits: Float64Array<ArrayBufferLike> = new Float64Array();
  for (const id of [...prompt, ...ids.slice(0, -1)]) logits = ref.step(id);
  const bytes = Deno.readFileSync(out);
  equal(bytes.length, BASE.vocab * 4);
  const dv = new DataView(bytes.buffer);
  checkLogits(Float32Array.from({ length: BASE.vocab }, (_, i) => dv.getFloat32(4 * i, true)), logits, "--logits");
  equal(ids.at(-1), top(logits).id);
});

/** loadLlama on a file written from `spec` (and `edit` of its bytes) must throw an MlxError. */
function loadError(spec: TinyLlamaSpec, edit: (b: Uint8Array) => Uint8Array = (b) => b): MlxError {
  const path = `${dir}/bad.gguf`;
  Deno.writeFileSync(path, edit(writeTinyLlamaGguf(spec)));
  using device = openDevice();
  let err: unknown;
  try {
    loadLlama(device, path).dispose();
  } catch (e) {
    err = e;
  }
  ok(err instanceof MlxError, `expected an MlxError, got ${err}`);
  return err;
}

const CHEAP: TinyLlamaSpec = { ...BASE, layers: 1, seed: 3, typeOf: () => "q8_0" };

Deno.test("unsupported architectures, tensor types, head sizes and rope scaling are MlxErrors that say what to do", () => {
  const arch = loadError({
    ...CHEAP,
    extraKvs: [{ key: "general.architecture", type: GgufValueType.STRING, value: "gpt2" }],
  });
  equal(arch.code, "Unsupported");
  match(arch.message, /"gpt2" is not supported \(supported: llama\)/);

  // Q2_K blocks (84 bytes per 256 values) parse but do not run: the error names tensor, type and fix.
  const q2k = loadError({
    ...CHEAP,
    edit: (ts) => {
      const t = ts.find((t) => t.name === "blk.0.attn_k.weight")!;
      Object.assign(t, { type: "q2_k", data: new Uint8Array(t.ne[1]! * (t.ne[0]! / 256) * 84) });
    },
  });
  equal(q2k.code, "Unsupported");
  match(q2k.message, /blk\.0\.attn_k\.weight is q2_k.*llama-quantize/);

  const hd = loadError({ ...CHEAP, heads: 8, kvHeads: 2 });
  equal(hd.code, "Unsupported");
  match(hd.message, /head dimension 32 is not supported/);

  const scaling = loadError({
    ...CHEAP,
    extraKvs: [{ key: "llama.rope.scaling.type", type: GgufValueType.STRING, value: "yarn" }],
  });
  equal(scaling.code, "Unsupported");
  match(scaling.message, /rope scaling "yarn"/);
});

Deno.test("a missing tensor, a shape that contradicts the metadata, and truncated or corrupt files are MlxErrors", () => {
  const gone = loadError({
    ...CHEAP,
    edit: (ts) => ts.splice(ts.findIndex((t) => t.name === "blk.0.ffn_up.weight"), 1),
  });
  equal(gone.code, "InvalidArgument");
  match(gone.message, /tensor blk\.0\.ffn_up\.weight is missing; .*re-convert/);

  const wide = loadError({
    ...CHEAP,
    extraKvs: [{ key: "llama.feed_forward_length", type: GgufValueType.UINT32, value: 1024 }],
  });
  equal(wide.code, "InvalidArgument");
  match(wide.message, /blk\.0\.ffn_gate\.weight has shape \[256,512\], the config needs \[256,1024\]/);

  const freqs = loadError({ ...CHEAP, freqFactors: new Float32Array(16).fill(1) });
  equal(freqs.code, "InvalidArgument");
  match(freqs.message, /rope_freqs\.weight has shape \[16\], the config needs \[32\]/);

  const truncated = loadError(CHEAP, (b) => b.slice(0, b.length - 1000));
  equal(truncated.code, "InvalidArgument");
  match(truncated.message, /truncated.*re-download or re-convert/);

  const header = loadError(CHEAP, (b) => b.slice(0, 200));
  equal(header.code, "InvalidArgument");
  match(header.message, /truncated/);

  const magic = loadError(CHEAP, (b) => b.map((v, i) => (i === 0 ? 0x58 : v)));
  equal(magic.code, "InvalidArgument");
  match(magic.message, /not a valid GGUF file: the magic is/);

  // A tensor type id no ggml version defines, patched into the first tensor info.
  const typed = loadError(CHEAP, (b) => {
    const name = new TextEncoder().encode("token_embd.weight");
    const at = b.findIndex((_, i) => name.every((c, j) => b[i + j] === c));
    const out = b.slice();
    new DataView(out.buffer).setUint32(at + name.length + 4 + 2 * 8, 0xbad, true);
    return out;
  });
  equal(typed.code, "InvalidArgument");
  match(typed.message, /unknown ggml type 2989/);
});

function captured(f: () => unknown): MlxError {
  try {
    f();
  } catch (e) {
    ok(e instanceof MlxError, `expected an MlxError, got ${e}`);
    return e;
  }
  throw new Error("expected an error");
}

Deno.test("MLX checkpoints: a missing layer, an unsupported model type and bad rope scaling are MlxErrors", () => {
  const path = `${dir}/mlx_bad`;
  writeTinyLlamaMlx(path, { ...BASE, layers: 1, seed: 2 }, { bits: 4, groupSize: 64 });
  using device = openDevice();
  const config = JSON.parse(Deno.readTextFileSync(`${path}/config.json`));
  const withConfig = (c: Record<string, unknown>) => {
    Deno.writeTextFileSync(`${path}/config.json`, JSON.stringify(c));
    return captured(() => loadLlama(device, path));
  };
  const type = withConfig({ ...config, model_type: "gemma" });
  equal(type.code, "Unsupported");
  match(type.message, /model_type "gemma" is not supported/);
  const rope = withConfig({ ...config, rope_scaling: { type: "linear", factor: 2 } });
  equal(rope.code, "Unsupported");
  match(rope.message, /rope_scaling type "linear"/);
  const layers = withConfig({ ...config, num_hidden_layers: 2 });
  equal(layers.code, "InvalidArgument");
  match(layers.message, /model\.layers\.1\..* is missing; .*mlx_lm\.convert/);
  const wide = withConfig({ ...config, intermediate_size: 1024 });
  equal(wide.code, "InvalidArgument");
  match(wide.message, /mlp\.gate_proj\.weight has shape \[512,256\], the config needs \[1024,256\]/);
  throws(
    () => loadLlama(device, `${dir}/no_such_model`),
    (e) => e instanceof MlxError && /no model at/.test(e.message),
  );
});

Deno.test("random byte flips and truncations of a model file give a loaded model or an MlxError, nothing else", () => {
  const good = writeTinyLlamaGguf(CHEAP);
  const headerEnd = GgufFile.open(good).header.dataOffset; // flips land in metadata and tensor infos
  const r = rng(2026);
  using device = openDevice();
  const path = `${dir}/fuzz.gguf`;
  const outcomes = { loaded: 0, errors: 0, dataFlipsLoaded: 0 };
  for (let i = 0; i < 60; i++) {
    let bytes = good.slice();
    const kind = i % 3; // 0: truncated, 1: header bits flipped, 2: tensor data bits flipped
    if (kind === 0) bytes = bytes.slice(0, Math.floor(r() * bytes.length));
    const [from, to] = kind === 1 ? [0, headerEnd] : [headerEnd, bytes.length];
    for (let f = 0; kind > 0 && f < 1 + (i % 4); f++) {
      bytes[from + Math.floor(r() * (to - from))]! ^= 1 << Math.floor(r() * 8);
    }
    Deno.writeFileSync(path, bytes);
    try {
      loadLlama(device, path, { ctx: 4 }).dispose();
      outcomes.loaded++;
      if (i % 3 === 2) outcomes.dataFlipsLoaded++;
    } catch (e) {
      ok(e instanceof MlxError, `case ${i}: ${e}`);
      ok(e.message.length > 20, e.message);
      outcomes.errors++;
    }
  }
  // Weight bytes are not validated at load (any bits are some weights); the header always is.
  ok(outcomes.errors >= 30 && outcomes.dataFlipsLoaded === 20, JSON.stringify(outcomes));
});

Deno.test("the random-weight GGUF writer's bf16 and Q4_K_M files load and decode finite logits", () => {
  using device = openDevice();
  const exec = new GraphExecutor(device);
  for (const weights of ["bf16", "q4_k_m"] as const) {
    const path = `${dir}/random_${weights}.gguf`;
    const shape = { layers: 2, hidden: 256, heads: 2, kvHeads: 1, ffn: 512, vocab: 512, weights };
    const bytes = writeRandomLlamaGguf(path, shape);
    equal(bytes, Deno.statSync(path).size);
    using model = loadLlama(device, path, { ctx: 8 });
    equal(model.config.hiddenSize, 256);
    equal(model.config.headDim, 128);
    equal(model.formats.qkv, weights === "bf16" ? "bf16" : "q4_k+q6_k");
    equal(model.formats.down, weights === "bf16" ? "bf16" : "q6_k");
    const r = generate(model, exec, { promptIds: [1, 2], tokens: 4 });
    ok(r.lastLogits.every(Number.isFinite), `${weights}: non-finite logits`);
    const spread = Math.max(...r.lastLogits) - Math.min(...r.lastLogits);
    ok(spread > 0.1 && spread < 1e3, `${weights}: logits spread ${spread}`);
    ok(r.tokens.every((t) => t >= 0 && t < 512));
  }
  throws(
    () =>
      writeRandomLlamaGguf(`${dir}/no/such/folder/x.gguf`, {
        layers: 1,
        hidden: 256,
        heads: 2,
        kvHeads: 1,
        ffn: 512,
        vocab: 64,
        weights: "bf16",
      }),
    (e: unknown) => e instanceof MlxError && e.code === "InvalidArgument" && /writable folder/.test(e.message),
  );
});

Deno.test("seeded sampling in generate repeats for a seed and differs across seeds", () => {
  const path = gguf("q4_k_m", Q4_K_M);
  using device = openDevice();
  const exec = new GraphExecutor(device);
  using model = loadLlama(device, path, { ctx: 16 });
  const run = (seed: number) =>
    generate(model, exec, { promptIds: [5], tokens: 10, select: { temperature: 1.5, seed } }).tokens;
  const a = run(1);
  deepStrictEqual(run(1), a);
  ok([2, 3, 4].some((s) => run(s).join() !== a.join()), "three other seeds gave the same ids");
  const greedy = generate(model, exec, { promptIds: [5], tokens: 10 }).tokens;
  ok(a.join() !== greedy.join(), "sampling at temperature 1.5 gave the greedy ids");
});

Deno.test("examples/generate.ts: --help, bad flags exit 2 with the usage; a bad model path exits 1 with the reason", async () => {
  const script = new URL("../examples/generate.ts", import.meta.url).pathname;
  const flags = ["run", "--no-prompt", "--allow-ffi", "--allow-read", "--allow-env", script];
  const help = await runDeno([...flags, "--help"]);
  equal(help.code, 0);
  match(help.stdout, /--model PATH/);
  for (const args of [[], ["--model", "m.gguf", "--tokens", "0"], ["--bogus"], ["--model", "m", "--prompt-ids", "a"]]) {
    const r = await runDeno([...flags, ...args]);
    equal(r.code, 2, `${args}: ${r.stderr}`);
    match(r.stderr, /^generate: .+\n\nUsage: /);
  }
  const missing = await runDeno([...flags, "--model", `${dir}/none.gguf`]);
  equal(missing.code, 1);
  match(missing.stderr, /^generate: cannot load .*none\.gguf \(InvalidArgument\): no model at/);
  ok(!/^\s+at /m.test(missing.stderr), missing.stderr);
});

Deno.test("the README's Run a model file section names every flag of examples/generate.ts", async () => {
  const script = new URL("../examples/generate.ts", import.meta.url).pathname;
  const help = (await runDeno(["run", "--no-prompt", "--allow-read", "--allow-env", script, "--help"])).stdout;
  const readme = await Deno.readTextFile(new URL("../README.md", import.meta.url));
  const at = readme.indexOf("### Run a model file");
  ok(at >= 0, "README has no Run a model file section");
  const section = readme.slice(at, readme.indexOf("\n## ", at));
  const names = (text: string) => [...new Set(text.match(/--[a-z][a-z-]*/g) ?? [])].sort();
  const permissions = ["--allow-ffi", "--allow-read", "--allow-env", "--allow-write", "--help"];
  deepStrictEqual(
    names(section).filter((f) => !permissions.includes(f)),
    names(help).filter((f) => !permissions.includes(f)),
  );
});
