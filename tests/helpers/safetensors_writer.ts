/**
 * A small safetensors writer for tests: tensors in the given order, contiguous, with optional
 * `__metadata__`, as huggingface/safetensors serializes them (header padded with spaces to 8 bytes).
 */
import { type AffineGroupSize, type AffineQuantBits, quantizeAffine } from "../../src/quant/affine.ts";
import { type TinyLlamaSpec, tinyLlamaValues } from "./gguf_writer.ts";

/** A tensor to write. */
export interface WriteSafetensor {
  name: string;
  dtype: string;
  shape: number[];
  data: Uint8Array;
}

/** Writes a safetensors file to bytes. */
export function writeSafetensors(tensors: WriteSafetensor[], metadata?: Record<string, string>): Uint8Array {
  const header: Record<string, unknown> = {};
  if (metadata) header.__metadata__ = metadata;
  let offset = 0;
  for (const t of tensors) {
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + t.data.length] };
    offset += t.data.length;
  }
  let json = new TextEncoder().encode(JSON.stringify(header));
  const padded = Math.ceil(json.length / 8) * 8;
  if (padded !== json.length) {
    const p = new Uint8Array(padded).fill(0x20);
    p.set(json);
    json = p;
  }
  const out = new Uint8Array(8 + json.length + offset);
  new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true);
  out.set(json, 8);
  let at = 8 + json.length;
  for (const t of tensors) {
    out.set(t.data, at);
    at += t.data.length;
  }
  return out;
}

/** The bytes of a typed array. */
export function bytesOf(a: ArrayBufferView): Uint8Array {
  return new Uint8Array(a.buffer, a.byteOffset, a.byteLength).slice();
}

/** How one MLX layer is stored: affine with these parameters, or dense bf16 (`null`). */
export type MlxLayerQuant = { bits: AffineQuantBits; groupSize: AffineGroupSize } | null;

const HF_ROLE: Record<string, string> = {
  attn_q: "self_attn.q_proj",
  attn_k: "self_attn.k_proj",
  attn_v: "self_attn.v_proj",
  attn_output: "self_attn.o_proj",
  ffn_gate: "mlp.gate_proj",
  ffn_up: "mlp.up_proj",
  ffn_down: "mlp.down_proj",
  attn_norm: "input_layernorm",
  ffn_norm: "post_attention_layernorm",
};

/** The Hugging Face / MLX name of a GGUF tensor name of a llama model (without `.weight`). */
export function mlxLayerName(ggufName: string): string {
  const p = ggufName.split(".");
  if (p[0] === "blk") return `model.layers.${p[1]}.${HF_ROLE[p[2]!]}`;
  return { token_embd: "model.embed_tokens", output: "lm_head", output_norm: "model.norm" }[p[0]!]!;
}

function bf16Bytes(values: Float32Array): Uint8Array {
  const u = new Uint32Array(values.slice().buffer);
  return new Uint8Array(Uint16Array.from(u, (b) => (b + 0x7fff + ((b >>> 16) & 1)) >>> 16).buffer);
}

/**
 * Writes a small MLX llama checkpoint into `dir` (config.json + model.safetensors) holding the same
 * random float weights as {@link writeTinyLlamaGguf} for `spec` (norms as BF16), each layer quantized
 * as `quantOf(mlxName)` says with the checkpoint default `base` (per-layer overrides in config.json
 * for the others).
 */
export function writeTinyLlamaMlx(
  dir: string,
  spec: TinyLlamaSpec,
  base: { bits: AffineQuantBits; groupSize: AffineGroupSize },
  quantOf: (name: string) => MlxLayerQuant = () => base,
  extraConfig: Record<string, unknown> = {},
): void {
  const tensors: WriteSafetensor[] = [];
  const quantization: Record<string, unknown> = { group_size: base.groupSize, bits: base.bits };
  for (const [name, { ne, values }] of tinyLlamaValues(spec)) {
    const prefix = mlxLayerName(name);
    if (ne.length === 1) {
      tensors.push({ name: `${prefix}.weight`, dtype: "BF16", shape: ne, data: bf16Bytes(values) });
      continue;
    }
    const [k, n] = ne;
    const q = quantOf(prefix);
    if (q === null) {
      quantization[prefix] = false;
      tensors.push({ name: `${prefix}.weight`, dtype: "BF16", shape: [n!, k!], data: bf16Bytes(values) });
      continue;
    }
    if (q.bits !== base.bits || q.groupSize !== base.groupSize) {
      quantization[prefix] = { group_size: q.groupSize, bits: q.bits };
    }
    const a = quantizeAffine(values, n!, k!, q.bits, q.groupSize);
    const groups = k! / q.groupSize;
    tensors.push({ name: `${prefix}.weight`, dtype: "U32", shape: [n!, (k! * q.bits) / 32], data: a.weights });
    tensors.push({ name: `${prefix}.scales`, dtype: "BF16", shape: [n!, groups], data: bytesOf(a.scales) });
    tensors.push({ name: `${prefix}.biases`, dtype: "BF16", shape: [n!, groups], data: bytesOf(a.biases) });
  }
  const config = {
    model_type: "llama",
    hidden_size: spec.hidden,
    intermediate_size: spec.ffn,
    num_hidden_layers: spec.layers,
    num_attention_heads: spec.heads,
    num_key_value_heads: spec.kvHeads,
    vocab_size: spec.vocab,
    rms_norm_eps: spec.rmsEps ?? 1e-5,
    rope_theta: spec.ropeTheta ?? 10000,
    max_position_embeddings: 64,
    tie_word_embeddings: spec.tied ?? false,
    quantization,
    ...extraConfig,
  };
  Deno.mkdirSync(dir, { recursive: true });
  Deno.writeTextFileSync(`${dir}/config.json`, JSON.stringify(config, null, 2));
  Deno.writeFileSync(`${dir}/model.safetensors`, writeSafetensors(tensors));
}
