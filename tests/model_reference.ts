/**
 * An independent float64 forward pass of a llama model, for checking src/model against: weights
 * are dequantized exactly with the TS dequantizers (tested against upstream), every product,
 * norm, rope angle, softmax and residual is float64, and attention runs over the whole float64 KV
 * cache. Rope follows ggml's definitions: normal mode rotates (x[2i], x[2i+1]), NeoX rotates
 * (x[i], x[i + d/2]), both at angle pos · θ^(−2i/d) / freqFactor[i] for i < d/2, dims ≥ d kept.
 */
import { GgufFile } from "../src/io/gguf.ts";
import { type LlamaConfig, llamaConfigFromGguf, llamaConfigFromMlx } from "../src/io/model_config.ts";
import { SafetensorsFile } from "../src/io/safetensors.ts";
import { type AffineGroupSize, type AffineQuantBits, dequantizeAffine } from "../src/quant/affine.ts";
import { bf16Value, f16Value } from "../src/quant/float32.ts";

/** A model's weights in float64 (matrices row-major [n, k]). */
export interface RefWeights {
  config: LlamaConfig;
  rope: "norm" | "neox";
  freqFactors?: Float64Array | undefined;
  embed: Float64Array;
  layers: {
    attnNorm: Float64Array;
    ffnNorm: Float64Array;
    q: Float64Array;
    k: Float64Array;
    v: Float64Array;
    o: Float64Array;
    gate: Float64Array;
    up: Float64Array;
    down: Float64Array;
  }[];
  outNorm: Float64Array;
  lmHead: Float64Array;
}

/** The weights of a GGUF llama file. */
export function refWeightsFromGguf(path: string): RefWeights {
  using f = GgufFile.open(path);
  const config = llamaConfigFromGguf(f);
  const d = (name: string) => f.dequantize(name);
  return {
    config,
    rope: "norm",
    freqFactors: f.has("rope_freqs.weight") ? d("rope_freqs.weight") : undefined,
    embed: d("token_embd.weight"),
    layers: Array.from({ length: config.layers }, (_, i) => ({
      attnNorm: d(`blk.${i}.attn_norm.weight`),
      ffnNorm: d(`blk.${i}.ffn_norm.weight`),
      q: d(`blk.${i}.attn_q.weight`),
      k: d(`blk.${i}.attn_k.weight`),
      v: d(`blk.${i}.attn_v.weight`),
      o: d(`blk.${i}.attn_output.weight`),
      gate: d(`blk.${i}.ffn_gate.weight`),
      up: d(`blk.${i}.ffn_up.weight`),
      down: d(`blk.${i}.ffn_down.weight`),
    })),
    outNorm: d("output_norm.weight"),
    lmHead: f.has("output.weight") ? d("output.weight") : d("token_embd.weight"),
  };
}

/** The weights of an MLX checkpoint directory holding one model.safetensors. */
export function refWeightsFromMlx(dir: string): RefWeights {
  const config = JSON.parse(Deno.readTextFileSync(`${dir}/config.json`));
  const cfg = llamaConfigFromMlx(config);
  using f = SafetensorsFile.open(`${dir}/model.safetensors`);
  const q = config.quantization ?? {};
  const floats = (name: string): Float64Array => {
    const t = f.tensor(name), b = f.readTensorBytes(name), dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
    const size = t.dtype === "F32" ? 4 : 2;
    return Float64Array.from(
      { length: b.byteLength / size },
      (_, i) =>
        t.dtype === "F32"
          ? dv.getFloat32(4 * i, true)
          : t.dtype === "F16"
          ? f16Value(dv.getUint16(2 * i, true))
          : bf16Value(dv.getUint16(2 * i, true)),
    );
  };
  const layer = (prefix: string): Float64Array => {
    if (!f.has(`${prefix}.scales`)) return floats(`${prefix}.weight`);
    const o = q[prefix] ?? q;
    const w = f.tensor(`${prefix}.weight`);
    const n = w.shape[0]!, k = (w.shape[1]! * 32) / o.bits;
    const half = (name: string) => {
      const b = f.readTensorBytes(name);
      return new Uint16Array(b.buffer, b.byteOffset, b.byteLength / 2);
    };
    return dequantizeAffine({
      bits: o.bits as AffineQuantBits,
      groupSize: o.group_size as AffineGroupSize,
      n,
      k,
      weights: f.readTensorBytes(`${prefix}.weight`),
      scales: half(`${prefix}.scales`),
      biases: half(`${prefix}.biases`),
    });
  };
  const L = (i: number, s: string) => `model.layers.${i}.${s}`;
  return {
    config: cfg,
    rope: "neox",
    freqFactors: config.rope_scaling ? llama3Divisors(cfg, config.rope_scaling) : undefined,
    embed: layer("model.embed_tokens"),
    layers: Array.from({ length: cfg.layers }, (_, i) => ({
      attnNorm: floats(`${L(i, "input_layernorm")}.weight`),
      ffnNorm: floats(`${L(i, "post_attention_layernorm")}.weight`),
      q: layer(L(i, "self_attn.q_proj")),
      k: layer(L(i, "self_attn.k_proj")),
      v: layer(L(i, "self_attn.v_proj")),
      o: layer(L(i, "self_attn.o_proj")),
      gate: layer(L(i, "mlp.gate_proj")),
      up: layer(L(i, "mlp.up_proj")),
      down: layer(L(i, "mlp.down_proj")),
    })),
    outNorm: floats("model.norm.weight"),
    lmHead: f.has("lm_head.weight") || f.has("lm_head.scales") ? layer("lm_head") : layer("model.embed_tokens"),
  };
}

/**
 * Llama 3 rope scaling as Hugging Face's `_compute_llama3_parameters` adjusts the inverse
 * frequencies, returned as divisors of the plain frequencies (plain / adjusted).
 */
function llama3Divisors(c: LlamaConfig, s: Record<string, number>): Float64Array {
  const d = c.ropeDim, factor = s.factor, low = s.low_freq_factor, high = s.high_freq_factor;
  const old = s.original_max_position_embeddings;
  return Float64Array.from({ length: d / 2 }, (_, i) => {
    const inv = 1 / Math.pow(c.ropeTheta, (2 * i) / d);
    const wavelen = (2 * Math.PI) / inv;
    let adjusted = wavelen > old! / low! ? inv / factor! : inv;
    if (!(wavelen < old! / high!) && !(wavelen > old! / low!)) {
      const smooth = (old! / wavelen - low!) / (high! - low!);
      adjusted = ((1 - smooth) * adjusted) / factor! + smooth * adjusted;
    }
    return inv / adjusted;
  });
}

function matvec(w: Float64Array, x: Float64Array, n: number, k: number): Float64Array {
  const y = new Float64Array(n);
  for (let r = 0; r < n; r++) {
    let s = 0;
    for (let j = 0; j < k; j++) s += w[r * k + j]! * x[j]!;
    y[r] = s;
  }
  return y;
}

function rmsNorm(x: Float64Array, w: Float64Array, eps: number): Float64Array {
  let ss = 0;
  for (const v of x) ss += v * v;
  const inv = 1 / Math.sqrt(ss / x.length + eps);
  return x.map((v, i) => v * inv * w[i]!);
}

/** Rotates each head of `x` ([heads, headDim]) in place for position `pos`. */
function rope(x: Float64Array, heads: number, c: LlamaConfig, mode: "norm" | "neox", pos: number, ff?: Float64Array) {
  const d = c.ropeDim, half = d / 2;
  for (let h = 0; h < heads; h++) {
    const base = h * c.headDim;
    for (let i = 0; i < half; i++) {
      const angle = (pos * Math.pow(c.ropeTheta, (-2 * i) / d)) / (ff ? ff[i] : 1)!;
      const cos = Math.cos(angle), sin = Math.sin(angle);
      const a = mode === "norm" ? base + 2 * i : base + i, b = mode === "norm" ? a + 1 : a + half;
      const x0 = x[a]!, x1 = x[b]!;
      x[a] = x0 * cos - x1 * sin;
      x[b] = x0 * sin + x1 * cos;
    }
  }
}

/** A float64 model with its own KV cache: `step(id)` runs the next position and returns the logits. */
export class ReferenceLlama {
  readonly #w: RefWeights;
  readonly #k: Float64Array[][] = [];
  readonly #v: Float64Array[][] = [];
  #pos = 0;

  constructor(w: RefWeights) {
    this.#w = w;
    for (let i = 0; i < w.config.layers; i++) {
      this.#k.push([]);
      this.#v.push([]);
    }
  }

  /** The next position's logits after token `id`. */
  step(id: number): Float64Array {
    const w = this.#w, c = w.config, pos = this.#pos++;
    const { hiddenSize: hidden, heads, kvHeads, headDim, intermediateSize: ffn } = c;
    let x = w.embed.slice(id * hidden, (id + 1) * hidden);
    const group = heads / kvHeads;
    w.layers.forEach((L, li) => {
      const h = rmsNorm(x, L.attnNorm, c.rmsEps);
      const q = matvec(L.q, h, heads * headDim, hidden);
      const k = matvec(L.k, h, kvHeads * headDim, hidden);
      const v = matvec(L.v, h, kvHeads * headDim, hidden);
      rope(q, heads, c, w.rope, pos, w.freqFactors);
      rope(k, kvHeads, c, w.rope, pos, w.freqFactors);
      this.#k[li]!.push(k);
      this.#v[li]!.push(v);
      const attn = new Float64Array(heads * headDim);
      for (let hh = 0; hh < heads; hh++) {
        const kvh = Math.floor(hh / group);
        const scores = this.#k[li]!.map((kk) => {
          let s = 0;
          for (let j = 0; j < headDim; j++) s += q[hh * headDim + j]! * kk[kvh * headDim + j]!;
          return s / Math.sqrt(headDim);
        });
        const max = Math.max(...scores);
        const e = scores.map((s) => Math.exp(s - max));
        const sum = e.reduce((a, b) => a + b, 0);
        this.#v[li]!.forEach((vv, t) => {
          for (let j = 0; j < headDim; j++) attn[hh * headDim + j]! += (e[t]! / sum) * vv[kvh * headDim + j]!;
        });
      }
      const o = matvec(L.o, attn, hidden, heads * headDim);
      x = x.map((v, i) => v + o[i]!);
      const h2 = rmsNorm(x, L.ffnNorm, c.rmsEps);
      const g = matvec(L.gate, h2, ffn, hidden), u = matvec(L.up, h2, ffn, hidden);
      const act = g.map((gv, i) => (gv / (1 + Math.exp(-gv))) * u[i]!);
      const dn = matvec(L.down, act, hidden, ffn);
      x = x.map((v, i) => v + dn[i]!);
    });
    return matvec(w.lmHead, rmsNorm(x, w.outNorm, c.rmsEps), c.vocabSize, hidden);
  }
}
