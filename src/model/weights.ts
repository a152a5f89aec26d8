/**
 * Where a llama model's weights come from: a GGUF file (llama.cpp's tensor names, normal-mode rope)
 * or an MLX checkpoint directory (Hugging Face names, NeoX rope). Both answer the same questions —
 * the config, each projection as device {@link Linear}s chosen by tensor type, the f32 vectors
 * (norms, rope freq factors) and an embedding table `embedGather` can read — and check every
 * tensor's presence, type and shape with an MlxError that says what to do.
 *
 * @module
 */

import type { MlxBuffer } from "../buffer.ts";
import type { MlxDevice } from "../device.ts";
import type { DType } from "../dtype.ts";
import { MlxError } from "../errors.ts";
import { LOADABLE_GGML_TYPES } from "../io/ggml_types.ts";
import { GgufFile, type GgufTensorInfo } from "../io/gguf.ts";
import { MlxCheckpoint, type MlxQuantizedBuffers, type MlxQuantizedLayer } from "../io/mlx_checkpoint.ts";
import { type LlamaConfig, llamaConfigFromGguf, llamaConfigFromMlx } from "../io/model_config.ts";
import { type ByteSource, fileSource } from "../io/source.ts";
import type { GgmlFormat } from "../quant.ts";
import { dequantizeAffine } from "../quant/affine.ts";
import { dequantizeGgml } from "../quant/ggml.ts";
import { bf16Value, f16Value } from "../quant/float32.ts";
import { affineLinear, denseLinear, ggmlLinear, type Linear } from "./linear.ts";

/** The projections of one block, by role. */
export type Projection = "q" | "k" | "v" | "o" | "gate" | "up" | "down";

/** The per-layer vectors, by role. */
export type LayerVector = "attn_norm" | "ffn_norm";

/** Rope pairing: ggml's normal mode (adjacent pairs) or NeoX (halves). */
export type RopeMode = "norm" | "neox";

/** One part of a (possibly stacked) projection: a linear and the first output row it writes. */
export interface LinearPart {
  /** The projection. */
  readonly linear: Linear;
  /** Its first row within the stacked output. */
  readonly row: number;
}

/** An embedding table `ops.embedGather` reads. */
export interface EmbeddingTable {
  /** The table [vocab, hidden]. */
  readonly table: MlxBuffer;
  /** Its format (f32, bf16, q8_0 or q4_0). */
  readonly format: "f32" | "bf16" | "q8_0" | "q4_0";
}

/** A model file's weights, read on demand. */
export interface WeightSource {
  /** Where they come from (for messages). */
  readonly label: string;
  /** The validated hyperparameters. */
  readonly config: LlamaConfig;
  /** How rope pairs dimensions for this file's layout. */
  readonly ropeMode: RopeMode;
  /**
   * The projections `roles` of layer `layer` stacked row-wise in role order: consecutive roles of one
   * format share one linear (one product), a format change starts a new part.
   */
  projections(device: MlxDevice, layer: number, roles: readonly Projection[]): LinearPart[];
  /** A per-layer norm weight as f32 (`device` may stage the read). */
  layerVector(device: MlxDevice, layer: number, role: LayerVector): Float32Array;
  /** The final norm weight as f32. */
  outputNorm(device: MlxDevice): Float32Array;
  /** Rope frequency divisors [ropeDim/2], when the file carries them. */
  freqFactors(): Float32Array | undefined;
  /** The token embedding as a gather table. */
  embedding(device: MlxDevice): EmbeddingTable;
  /** The lm-head (or the tied embedding) as a projection [vocab, hidden]. */
  lmHead(device: MlxDevice): Linear;
  /** Closes the files. */
  close(): void;
}

/** Opens `path`: a GGUF file, or an MLX checkpoint directory (config.json + *.safetensors). */
export function openWeights(path: string): WeightSource {
  let dir = false;
  try {
    dir = Deno.statSync(path).isDirectory;
  } catch (e) {
    if (e instanceof Deno.errors.NotCapable || e instanceof Deno.errors.PermissionDenied) {
      throw new MlxError("PermissionDenied", `reading ${path} needs --allow-read`, { cause: e });
    }
    if (e instanceof Deno.errors.NotFound) {
      throw new MlxError("InvalidArgument", `no model at ${path}; pass a .gguf file or an MLX checkpoint directory`, {
        cause: e,
      });
    }
    throw new MlxError("InvalidArgument", `cannot read ${path}: ${(e as Error)?.message ?? e}`, { cause: e });
  }
  return dir ? new MlxWeights(path) : new GgufWeights(path);
}

function missing(label: string, name: string, fix: string): MlxError {
  return new MlxError("InvalidArgument", `${label}: tensor ${name} is missing; ${fix}`);
}

function shapeError(label: string, name: string, got: readonly number[], want: readonly number[], order: string) {
  return new MlxError(
    "InvalidArgument",
    `${label}: tensor ${name} has shape ${JSON.stringify(got)}, the config needs ${JSON.stringify(want)} ` +
      `(${order}); the weights do not match the metadata — re-convert the model`,
  );
}

/** Rows and inputs of each projection role. */
function projectionShape(c: LlamaConfig, role: Projection): { n: number; k: number } {
  const q = c.heads * c.headDim, kv = c.kvHeads * c.headDim;
  switch (role) {
    case "q":
      return { n: q, k: c.hiddenSize };
    case "k":
    case "v":
      return { n: kv, k: c.hiddenSize };
    case "o":
      return { n: c.hiddenSize, k: q };
    case "gate":
    case "up":
      return { n: c.intermediateSize, k: c.hiddenSize };
    case "down":
      return { n: c.hiddenSize, k: c.intermediateSize };
  }
}

/** Streams byte ranges of `source`, back to back, into one new device buffer. */
function uploadRanges(
  device: MlxDevice,
  source: ByteSource,
  ranges: readonly { offset: number; length: number }[],
  dtype: DType,
  shape: readonly number[],
): MlxBuffer {
  const total = ranges.reduce((t, r) => t + r.length, 0);
  const buffer = device.alloc(total, dtype, shape);
  try {
    const staging = new Uint8Array(Math.min(8 << 20, total));
    let at = 0;
    for (const r of ranges) {
      for (let done = 0; done < r.length; done += staging.length) {
        const part = staging.subarray(0, Math.min(staging.length, r.length - done));
        source.readInto(r.offset + done, part);
        buffer.writeBytes(part, at + done);
      }
      at += r.length;
    }
  } catch (e) {
    buffer.dispose();
    throw e;
  }
  return buffer;
}

/** A quantized layer's buffers, disposed together. */
function disposable(q: MlxQuantizedBuffers): MlxQuantizedBuffers & Disposable {
  return {
    ...q,
    [Symbol.dispose]() {
      q.weights.dispose();
      q.scales.dispose();
      q.biases.dispose();
    },
  };
}

/** f32 values of f32 / f16 / bf16 little-endian bytes. */
function floatsOf(bytes: Uint8Array, dtype: string, where: string): Float32Array {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (dtype === "f32") return new Float32Array(bytes.slice().buffer);
  if (dtype !== "f16" && dtype !== "bf16") {
    throw new MlxError("Unsupported", `${where} is ${dtype}; a norm or vector must be f32, f16 or bf16`);
  }
  const out = new Float32Array(bytes.byteLength / 2);
  const conv = dtype === "f16" ? f16Value : bf16Value;
  for (let i = 0; i < out.length; i++) out[i] = conv(dv.getUint16(2 * i, true));
  return out;
}

const GGUF_ROLE: Record<Projection, string> = {
  q: "attn_q",
  k: "attn_k",
  v: "attn_v",
  o: "attn_output",
  gate: "ffn_gate",
  up: "ffn_up",
  down: "ffn_down",
};

/** Weights of a llama-architecture GGUF file (llama.cpp's names; normal-mode rope, as llama.cpp runs it). */
class GgufWeights implements WeightSource {
  readonly label: string;
  readonly config: LlamaConfig;
  readonly ropeMode: RopeMode = "norm";
  readonly #file: GgufFile;
  readonly #source: ByteSource;

  constructor(path: string) {
    this.label = path;
    this.#file = GgufFile.open(path);
    try {
      this.#source = fileSource(path);
    } catch (e) {
      this.#file.close();
      throw e;
    }
    try {
      this.config = llamaConfigFromGguf(this.#file);
      const scaling = this.#file.get("llama.rope.scaling.type");
      if (scaling !== undefined && scaling !== "none") {
        throw new MlxError(
          "Unsupported",
          `${path}: rope scaling ${
            JSON.stringify(scaling, (_, v) => typeof v === "bigint" ? String(v) : v)
          } is not supported (plain rope and llama3 rope_freqs are)`,
        );
      }
    } catch (e) {
      this.close();
      throw e;
    }
  }

  #tensor(name: string, want: readonly number[]): GgufTensorInfo {
    if (!this.#file.has(name)) {
      throw missing(this.label, name, "the file is not a complete llama model (re-convert it with llama.cpp)");
    }
    const t = this.#file.tensor(name);
    if (t.ne.length !== want.length || t.ne.some((d, i) => d !== want[i])) {
      throw shapeError(this.label, name, t.ne, want, "ggml order, row length first");
    }
    if (!LOADABLE_GGML_TYPES[t.type.name]) {
      throw new MlxError(
        "Unsupported",
        `${this.label}: tensor ${name} is ${t.type.name}, which mlx-native cannot run (it runs ${
          Object.keys(LOADABLE_GGML_TYPES).join(", ")
        }); re-quantize the model, e.g. llama-quantize --allow-requantize in.gguf out.gguf Q4_K_M`,
      );
    }
    return t;
  }

  #linear(device: MlxDevice, parts: readonly GgufTensorInfo[], k: number): Linear {
    const type = parts[0]!.type.name;
    const n = parts.reduce((t, p) => t + p.ne[1]!, 0);
    const ranges = parts.map((p) => ({ offset: p.fileOffset, length: p.byteLength }));
    const loadable = LOADABLE_GGML_TYPES[type]!;
    if (loadable.dtype !== "u8") {
      return denseLinear(uploadRanges(device, this.#source, ranges, loadable.dtype, [n, k]), n, k);
    }
    const bytes = ranges.reduce((t, r) => t + r.length, 0);
    return ggmlLinear(uploadRanges(device, this.#source, ranges, "u8", [bytes]), n, k, type as GgmlFormat);
  }

  projections(device: MlxDevice, layer: number, roles: readonly Projection[]): LinearPart[] {
    const infos = roles.map((role) => {
      const { n, k } = projectionShape(this.config, role);
      return this.#tensor(`blk.${layer}.${GGUF_ROLE[role]}.weight`, [k, n]);
    });
    const out: LinearPart[] = [];
    let row = 0;
    try {
      for (let i = 0; i < infos.length;) {
        let j = i + 1;
        while (j < infos.length && infos[j]!.type === infos[i]!.type && infos[j]!.ne[0] === infos[i]!.ne[0]) j++;
        const linear = this.#linear(device, infos.slice(i, j), infos[i]!.ne[0]!);
        out.push({ linear, row });
        row += linear.n;
        i = j;
      }
    } catch (e) {
      for (const p of out) p.linear.dispose();
      throw e;
    }
    return out;
  }

  #vector(name: string, length: number): Float32Array {
    const t = this.#tensor(name, [length]);
    return floatsOf(this.#file.readTensorBytes(name), t.type.name, `${this.label}: tensor ${name}`);
  }

  layerVector(_device: MlxDevice, layer: number, role: LayerVector): Float32Array {
    return this.#vector(`blk.${layer}.${role}.weight`, this.config.hiddenSize);
  }

  outputNorm(_device: MlxDevice): Float32Array {
    return this.#vector("output_norm.weight", this.config.hiddenSize);
  }

  freqFactors(): Float32Array | undefined {
    return this.#file.has("rope_freqs.weight") ? this.#vector("rope_freqs.weight", this.config.ropeDim / 2) : undefined;
  }

  embedding(device: MlxDevice): EmbeddingTable {
    const { vocabSize: vocab, hiddenSize: hidden } = this.config;
    const t = this.#tensor("token_embd.weight", [hidden, vocab]);
    const name = t.type.name;
    const range = [{ offset: t.fileOffset, length: t.byteLength }];
    if (name === "f32" || name === "bf16") {
      return { table: uploadRanges(device, this.#source, range, name, [vocab, hidden]), format: name };
    }
    if (name === "q8_0" || name === "q4_0") {
      return { table: uploadRanges(device, this.#source, range, "u8", [t.byteLength]), format: name };
    }
    // Other formats: dequantized on the host into an exact f32 table, a slice of rows at a time.
    const format = LOADABLE_GGML_TYPES[name]!.format!;
    const rowBytes = t.byteLength / vocab;
    const rowsPerChunk = Math.max(1, Math.floor((4 << 20) / (hidden * 4)));
    const table = device.alloc(vocab * hidden * 4, "f32", [vocab, hidden]);
    try {
      for (let r = 0; r < vocab; r += rowsPerChunk) {
        const rows = Math.min(rowsPerChunk, vocab - r);
        const bytes = this.#source.read(t.fileOffset + r * rowBytes, rows * rowBytes);
        table.write(Float32Array.from(dequantizeGgml(bytes, rows, hidden, format)), r * hidden);
      }
    } catch (e) {
      table.dispose();
      throw e;
    }
    return { table, format: "f32" };
  }

  lmHead(device: MlxDevice): Linear {
    const { vocabSize: vocab, hiddenSize: hidden } = this.config;
    const name = this.#file.has("output.weight") ? "output.weight" : "token_embd.weight";
    return this.#linear(device, [this.#tensor(name, [hidden, vocab])], hidden);
  }

  close(): void {
    this.#file.close();
    this.#source?.close();
  }
}

const MLX_ROLE: Record<Projection, string> = {
  q: "self_attn.q_proj",
  k: "self_attn.k_proj",
  v: "self_attn.v_proj",
  o: "self_attn.o_proj",
  gate: "mlp.gate_proj",
  up: "mlp.up_proj",
  down: "mlp.down_proj",
};

const MLX_DENSE: Record<string, DType> = { F32: "f32", BF16: "bf16", F16: "f16" };

/**
 * Llama 3's rope frequency divisors from a config.json `rope_scaling` of type "llama3" (the factors
 * llama.cpp's converter stores as rope_freqs): wavelengths beyond the original context's low-frequency
 * bound are divided by `factor`, those below the high-frequency bound kept, the band between blended.
 */
function llama3FreqFactors(c: LlamaConfig, s: Record<string, unknown>, where: string): Float32Array {
  const num = (key: string, dflt?: number) => {
    const v = s[key] ?? dflt;
    if (typeof v !== "number" || !Number.isFinite(v) || v <= 0) {
      throw new MlxError("InvalidArgument", `${where}: rope_scaling.${key} must be a positive number, got ${v}`);
    }
    return v;
  };
  const factor = num("factor"), low = num("low_freq_factor", 1), high = num("high_freq_factor", 4);
  const original = num("original_max_position_embeddings", 8192);
  if (high <= low) {
    throw new MlxError("InvalidArgument", `${where}: rope_scaling needs high_freq_factor > low_freq_factor`);
  }
  const lowWavelen = original / low, highWavelen = original / high;
  return Float32Array.from({ length: c.ropeDim / 2 }, (_, i) => {
    const wavelen = 2 * Math.PI * c.ropeTheta ** ((2 * i) / c.ropeDim);
    if (wavelen < highWavelen) return 1;
    if (wavelen > lowWavelen) return factor;
    const smooth = (original / wavelen - low) / (high - low);
    return 1 / ((1 - smooth) / factor + smooth);
  });
}

/** Weights of an MLX checkpoint directory (Hugging Face names; NeoX rope, as MLX runs llama). */
class MlxWeights implements WeightSource {
  readonly label: string;
  readonly config: LlamaConfig;
  readonly ropeMode: RopeMode = "neox";
  readonly #ckpt: MlxCheckpoint;
  readonly #freqFactors: Float32Array | undefined;

  constructor(dir: string) {
    this.label = dir;
    this.#ckpt = MlxCheckpoint.open(dir);
    try {
      this.config = llamaConfigFromMlx(this.#ckpt.config);
      const scaling = this.#ckpt.config.rope_scaling;
      if (scaling !== undefined && scaling !== null) {
        const s = scaling as Record<string, unknown>;
        const type = s.rope_type ?? s.type;
        if (type !== "llama3") {
          throw new MlxError(
            "Unsupported",
            `${dir}/config.json: rope_scaling type ${JSON.stringify(type)} is not supported (only "llama3")`,
          );
        }
        this.#freqFactors = llama3FreqFactors(this.config, s, `${dir}/config.json`);
      }
    } catch (e) {
      this.#ckpt.close();
      throw e;
    }
  }

  #require(name: string): void {
    if (!this.#ckpt.has(name)) {
      throw missing(
        this.label,
        name,
        "the checkpoint is not a complete llama model (re-convert it with mlx_lm.convert)",
      );
    }
  }

  /** Layer `prefix` ([n, k]) as a projection: affine when it has scales, else dense. */
  #linear(device: MlxDevice, prefix: string, n: number, k: number): Linear {
    this.#require(`${prefix}.weight`);
    const q = this.#ckpt.quantizationOf(prefix);
    if (q) {
      const layer = this.#ckpt.quantizedLayer(prefix);
      if (layer.n !== n || layer.k !== k) {
        throw shapeError(this.label, `${prefix}.weight`, [layer.n, layer.k], [n, k], "rows, unpacked inputs");
      }
      const b = this.#ckpt.uploadQuantizedLayer(device, prefix);
      return affineLinear(b.weights, b.scales, b.biases, n, k, q.bits, q.groupSize);
    }
    const t = this.#ckpt.tensor(`${prefix}.weight`);
    if (t.shape.length !== 2 || t.shape[0] !== n || t.shape[1] !== k) {
      throw shapeError(this.label, t.name, t.shape, [n, k], "rows, inputs");
    }
    if (!MLX_DENSE[t.dtype]) {
      throw new MlxError(
        "Unsupported",
        `${this.label}: tensor ${t.name} is ${t.dtype}; dense weights must be F32, BF16 or F16 ` +
          `(or quantize the model: mlx_lm.convert -q)`,
      );
    }
    return denseLinear(this.#ckpt.upload(device, t.name), n, k);
  }

  projections(device: MlxDevice, layer: number, roles: readonly Projection[]): LinearPart[] {
    const out: LinearPart[] = [];
    let row = 0;
    try {
      for (const role of roles) {
        const { n, k } = projectionShape(this.config, role);
        out.push({ linear: this.#linear(device, `model.layers.${layer}.${MLX_ROLE[role]}`, n, k), row });
        row += n;
      }
    } catch (e) {
      for (const p of out) p.linear.dispose();
      throw e;
    }
    return out;
  }

  #vector(device: MlxDevice, name: string, length: number): Float32Array {
    this.#require(name);
    const t = this.#ckpt.tensor(name);
    if (t.shape.length !== 1 || t.shape[0] !== length) throw shapeError(this.label, name, t.shape, [length], "1-D");
    const dtype = MLX_DENSE[t.dtype];
    if (!dtype) throw new MlxError("Unsupported", `${this.label}: tensor ${name} is ${t.dtype}, not F32, F16 or BF16`);
    // The checkpoint streams tensors to a device; a vector is small enough to read back from one.
    using buf = this.#ckpt.upload(device, name, { asBytes: true });
    return floatsOf(buf.readBytes(), dtype, `${this.label}: tensor ${name}`);
  }

  layerVector(device: MlxDevice, layer: number, role: LayerVector): Float32Array {
    const name = role === "attn_norm" ? "input_layernorm" : "post_attention_layernorm";
    return this.#vector(device, `model.layers.${layer}.${name}.weight`, this.config.hiddenSize);
  }

  outputNorm(device: MlxDevice): Float32Array {
    return this.#vector(device, "model.norm.weight", this.config.hiddenSize);
  }

  freqFactors(): Float32Array | undefined {
    return this.#freqFactors;
  }

  embedding(device: MlxDevice): EmbeddingTable {
    const { vocabSize: vocab, hiddenSize: hidden } = this.config;
    const prefix = "model.embed_tokens";
    this.#require(`${prefix}.weight`);
    if (this.#ckpt.quantizationOf(prefix)) {
      const layer = this.#ckpt.quantizedLayer(prefix);
      if (layer.n !== vocab || layer.k !== hidden) {
        throw shapeError(this.label, `${prefix}.weight`, [layer.n, layer.k], [vocab, hidden], "rows, unpacked inputs");
      }
      return { table: this.#dequantizedTable(device, prefix, layer), format: "f32" };
    }
    const t = this.#ckpt.tensor(`${prefix}.weight`);
    if (t.shape.length !== 2 || t.shape[0] !== vocab || t.shape[1] !== hidden) {
      throw shapeError(this.label, t.name, t.shape, [vocab, hidden], "rows, inputs");
    }
    if (t.dtype === "F32" || t.dtype === "BF16") {
      return { table: this.#ckpt.upload(device, t.name), format: t.dtype === "F32" ? "f32" : "bf16" };
    }
    if (t.dtype !== "F16") {
      throw new MlxError("Unsupported", `${this.label}: ${t.name} is ${t.dtype}, not F32/F16/BF16`);
    }
    using raw = this.#ckpt.upload(device, t.name, { asBytes: true });
    return { table: device.upload(floatsOf(raw.readBytes(), "f16", t.name), "f32", [vocab, hidden]), format: "f32" };
  }

  /**
   * An exact f32 table of a quantized embedding: the layer goes to the device as stored, and rows
   * come back a slice at a time to be dequantized on the host (host memory stays at one slice).
   */
  #dequantizedTable(device: MlxDevice, prefix: string, layer: MlxQuantizedLayer): MlxBuffer {
    const { n: vocab, k: hidden, bits, groupSize, scaleDtype } = layer;
    using q = disposable(this.#ckpt.uploadQuantizedLayer(device, prefix));
    const table = device.alloc(vocab * hidden * 4, "f32", [vocab, hidden]);
    try {
      const rowBytes = (hidden * bits) / 8, groups = hidden / groupSize, scaleBytes = scaleDtype === "f32" ? 4 : 2;
      const rowsPerSlice = Math.max(1, Math.floor((4 << 20) / (hidden * 4)));
      const part = (b: MlxBuffer, r: number, rows: number, per: number) => b.slice(r * per, rows * per).readBytes();
      const typed = (bytes: Uint8Array) =>
        scaleDtype === "f32" ? new Float32Array(bytes.buffer) : new Uint16Array(bytes.buffer);
      for (let r = 0; r < vocab; r += rowsPerSlice) {
        const rows = Math.min(rowsPerSlice, vocab - r);
        const values = dequantizeAffine({
          bits,
          groupSize,
          n: rows,
          k: hidden,
          weights: part(q.weights, r, rows, rowBytes),
          scaleDtype,
          scales: typed(part(q.scales, r, rows, groups * scaleBytes)),
          biases: typed(part(q.biases, r, rows, groups * scaleBytes)),
        });
        table.write(Float32Array.from(values), r * hidden);
      }
    } catch (e) {
      table.dispose();
      throw e;
    }
    return table;
  }

  lmHead(device: MlxDevice): Linear {
    const { vocabSize: vocab, hiddenSize: hidden } = this.config;
    const prefix = this.#ckpt.has("lm_head.weight") ? "lm_head" : "model.embed_tokens";
    return this.#linear(device, prefix, vocab, hidden);
  }

  close(): void {
    this.#ckpt.close();
  }
}
