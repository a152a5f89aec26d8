/**
 * Llama-architecture hyperparameters from a GGUF file's metadata (llama.cpp's `llama.*` keys) or an
 * MLX checkpoint's config.json (Hugging Face names), validated so that a model built from them has
 * consistent shapes. Other architectures get an Unsupported error naming what is supported.
 *
 * @module
 */

import { MlxError } from "../errors.ts";
import type { GgufFile } from "./gguf.ts";

/** The hyperparameters a llama-architecture forward pass needs. */
export interface LlamaConfig {
  /** Vocabulary size (rows of the embedding). */
  readonly vocabSize: number;
  /** Model width. */
  readonly hiddenSize: number;
  /** Feed-forward width. */
  readonly intermediateSize: number;
  /** Transformer blocks. */
  readonly layers: number;
  /** Attention heads. */
  readonly heads: number;
  /** Key/value heads (grouped-query attention). */
  readonly kvHeads: number;
  /** Dimension per head. */
  readonly headDim: number;
  /** Rotary dimensions (≤ headDim). */
  readonly ropeDim: number;
  /** Rotary base frequency. */
  readonly ropeTheta: number;
  /** RMSNorm epsilon. */
  readonly rmsEps: number;
  /** Trained context length. */
  readonly contextLength: number;
}

/** GGUF `general.architecture` values read with llama's key set. */
const GGUF_LLAMA_ARCHS = ["llama"];
/** config.json `model_type` values read as llama. */
const MLX_LLAMA_TYPES = ["llama", "mistral"];

function positiveInt(where: string, key: string, v: unknown): number {
  const n = typeof v === "bigint" ? Number(v) : v;
  if (typeof n !== "number" || !Number.isSafeInteger(n) || n <= 0) {
    throw new MlxError("InvalidArgument", `${where}: ${key} must be a positive integer, got ${String(v)}`);
  }
  return n;
}

function positiveNumber(where: string, key: string, v: unknown): number {
  if (typeof v !== "number" || !Number.isFinite(v) || v <= 0) {
    throw new MlxError("InvalidArgument", `${where}: ${key} must be a positive number, got ${String(v)}`);
  }
  return v;
}

function check(where: string, c: LlamaConfig): LlamaConfig {
  if (c.heads % c.kvHeads !== 0) {
    throw new MlxError("InvalidArgument", `${where}: ${c.heads} heads are not a multiple of ${c.kvHeads} kv heads`);
  }
  if (c.ropeDim > c.headDim || c.ropeDim % 2 !== 0) {
    throw new MlxError(
      "InvalidArgument",
      `${where}: rope dimension ${c.ropeDim} must be even and ≤ head dim ${c.headDim}`,
    );
  }
  return Object.freeze(c);
}

/** Reads a llama-architecture config from GGUF metadata. */
export function llamaConfigFromGguf(file: GgufFile): LlamaConfig {
  const where = "GGUF metadata";
  const arch = file.get("general.architecture");
  if (typeof arch !== "string") {
    throw new MlxError("InvalidArgument", `${where}: general.architecture is missing or not a string`);
  }
  if (!GGUF_LLAMA_ARCHS.includes(arch)) {
    throw new MlxError(
      "Unsupported",
      `GGUF architecture ${JSON.stringify(arch)} is not supported (supported: ${GGUF_LLAMA_ARCHS.join(", ")})`,
    );
  }
  const req = (key: string) => {
    const v = file.get(`${arch}.${key}`);
    if (v === undefined) throw new MlxError("InvalidArgument", `${where}: ${arch}.${key} is missing`);
    return v;
  };
  const opt = (key: string) => file.get(`${arch}.${key}`);
  const hiddenSize = positiveInt(where, `${arch}.embedding_length`, req("embedding_length"));
  const heads = positiveInt(where, `${arch}.attention.head_count`, req("attention.head_count"));
  const kvHeads = positiveInt(where, `${arch}.attention.head_count_kv`, opt("attention.head_count_kv") ?? heads);
  const headDim = positiveInt(where, `${arch}.attention.key_length`, opt("attention.key_length") ?? hiddenSize / heads);
  const tokens = file.get("tokenizer.ggml.tokens");
  const vocab = opt("vocab_size") ?? (Array.isArray(tokens) ? tokens.length : undefined) ??
    file.tensor("token_embd.weight").ne[1];
  return check(where, {
    vocabSize: positiveInt(where, `${arch}.vocab_size`, vocab),
    hiddenSize,
    intermediateSize: positiveInt(where, `${arch}.feed_forward_length`, req("feed_forward_length")),
    layers: positiveInt(where, `${arch}.block_count`, req("block_count")),
    heads,
    kvHeads,
    headDim,
    ropeDim: positiveInt(where, `${arch}.rope.dimension_count`, opt("rope.dimension_count") ?? headDim),
    ropeTheta: positiveNumber(where, `${arch}.rope.freq_base`, opt("rope.freq_base") ?? 10000),
    rmsEps: positiveNumber(where, `${arch}.attention.layer_norm_rms_epsilon`, req("attention.layer_norm_rms_epsilon")),
    contextLength: positiveInt(where, `${arch}.context_length`, req("context_length")),
  });
}

/** Reads a llama-architecture config from an MLX (Hugging Face style) config.json object. */
export function llamaConfigFromMlx(config: Readonly<Record<string, unknown>>): LlamaConfig {
  const where = "config.json";
  const type = config.model_type;
  if (typeof type !== "string" || !MLX_LLAMA_TYPES.includes(type)) {
    throw new MlxError(
      "Unsupported",
      `model_type ${JSON.stringify(type)} is not supported (supported: ${MLX_LLAMA_TYPES.join(", ")})`,
    );
  }
  const req = (key: string) => {
    if (config[key] === undefined) throw new MlxError("InvalidArgument", `${where}: ${key} is missing`);
    return config[key];
  };
  const hiddenSize = positiveInt(where, "hidden_size", req("hidden_size"));
  const heads = positiveInt(where, "num_attention_heads", req("num_attention_heads"));
  const headDim = positiveInt(where, "head_dim", config.head_dim ?? hiddenSize / heads);
  return check(where, {
    vocabSize: positiveInt(where, "vocab_size", req("vocab_size")),
    hiddenSize,
    intermediateSize: positiveInt(where, "intermediate_size", req("intermediate_size")),
    layers: positiveInt(where, "num_hidden_layers", req("num_hidden_layers")),
    heads,
    kvHeads: positiveInt(where, "num_key_value_heads", config.num_key_value_heads ?? heads),
    headDim,
    ropeDim: headDim,
    ropeTheta: positiveNumber(where, "rope_theta", config.rope_theta ?? 10000),
    rmsEps: positiveNumber(where, "rms_norm_eps", req("rms_norm_eps")),
    contextLength: positiveInt(where, "max_position_embeddings", config.max_position_embeddings ?? 4096),
  });
}
