/**
 * A small GGUF writer for tests (little-endian, version 3 unless told): metadata of every value
 * type and tensors packed in order at the alignment, as llama.cpp's writers lay them out.
 */
import { ggmlTypeByName } from "../../src/io/ggml_types.ts";
import { GgufValueType } from "../../src/io/gguf.ts";
import { type GgmlQuantFormat, quantizeGgml } from "../../src/quant/ggml.ts";

/** A metadata entry to write. */
export interface WriteKv {
  key: string;
  type: GgufValueType;
  /** For arrays: element type. */
  elementType?: GgufValueType;
  value: unknown;
}

/** A tensor to write: `ne` in ggml order (row length first), `data` its bytes. */
export interface WriteTensor {
  name: string;
  type: string;
  ne: number[];
  data: Uint8Array;
}

class Bytes {
  parts: Uint8Array[] = [];
  length = 0;
  push(b: Uint8Array) {
    this.parts.push(b);
    this.length += b.length;
  }
  num(size: number, set: (v: DataView) => void) {
    const b = new Uint8Array(size);
    set(new DataView(b.buffer));
    this.push(b);
  }
  u32(v: number) {
    this.num(4, (d) => d.setUint32(0, v, true));
  }
  u64(v: number | bigint) {
    this.num(8, (d) => d.setBigUint64(0, BigInt(v), true));
  }
  str(s: string) {
    const b = new TextEncoder().encode(s);
    this.u64(b.length);
    this.push(b);
  }
  concat(): Uint8Array {
    const out = new Uint8Array(this.length);
    let at = 0;
    for (const p of this.parts) {
      out.set(p, at);
      at += p.length;
    }
    return out;
  }
}

function scalar(w: Bytes, type: GgufValueType, v: unknown) {
  switch (type) {
    case GgufValueType.UINT8:
      return w.num(1, (d) => d.setUint8(0, Number(v)));
    case GgufValueType.INT8:
      return w.num(1, (d) => d.setInt8(0, Number(v)));
    case GgufValueType.UINT16:
      return w.num(2, (d) => d.setUint16(0, Number(v), true));
    case GgufValueType.INT16:
      return w.num(2, (d) => d.setInt16(0, Number(v), true));
    case GgufValueType.UINT32:
      return w.num(4, (d) => d.setUint32(0, Number(v), true));
    case GgufValueType.INT32:
      return w.num(4, (d) => d.setInt32(0, Number(v), true));
    case GgufValueType.FLOAT32:
      return w.num(4, (d) => d.setFloat32(0, Number(v), true));
    case GgufValueType.BOOL:
      return w.num(1, (d) => d.setUint8(0, v ? 1 : 0));
    case GgufValueType.STRING:
      return w.str(String(v));
    case GgufValueType.UINT64:
      return w.num(8, (d) => d.setBigUint64(0, BigInt(v as number), true));
    case GgufValueType.INT64:
      return w.num(8, (d) => d.setBigInt64(0, BigInt(v as number), true));
    case GgufValueType.FLOAT64:
      return w.num(8, (d) => d.setFloat64(0, Number(v), true));
  }
  throw new Error(`cannot write type ${type}`);
}

/** Writes a GGUF file to bytes. */
export function writeGguf(
  kvs: WriteKv[],
  tensors: WriteTensor[],
  options: { alignment?: number; version?: number } = {},
): Uint8Array {
  const alignment = options.alignment ?? 32;
  const w = new Bytes();
  w.push(new TextEncoder().encode("GGUF"));
  w.u32(options.version ?? 3);
  w.u64(tensors.length);
  w.u64(kvs.length);
  for (const kv of kvs) {
    w.str(kv.key);
    w.u32(kv.type);
    if (kv.type === GgufValueType.ARRAY) {
      const items = Array.from(kv.value as ArrayLike<unknown>);
      w.u32(kv.elementType!);
      w.u64(items.length);
      for (const item of items) scalar(w, kv.elementType!, item);
    } else scalar(w, kv.type, kv.value);
  }
  let offset = 0;
  const offsets: number[] = [];
  for (const t of tensors) {
    const type = ggmlTypeByName(t.type);
    if (!type) throw new Error(`unknown type ${t.type}`);
    w.str(t.name);
    w.u32(t.ne.length);
    for (const d of t.ne) w.u64(d);
    w.u32(type.id);
    w.u64(offset);
    offsets.push(offset);
    offset += Math.ceil(t.data.length / alignment) * alignment;
  }
  const header = w.concat();
  const dataOffset = tensors.length > 0 ? Math.ceil(header.length / alignment) * alignment : header.length;
  const out = new Uint8Array(dataOffset + (tensors.length ? offsets.at(-1)! + tensors.at(-1)!.data.length : 0));
  out.set(header);
  tensors.forEach((t, i) => out.set(t.data, dataOffset + offsets[i]!));
  return out;
}

// ---- small llama models ---------------------------------------------------------------------------

/** Shape, weight types and seed of a small random llama model for the model tests. */
export interface TinyLlamaSpec {
  layers: number;
  hidden: number;
  heads: number;
  kvHeads: number;
  ffn: number;
  vocab: number;
  seed: number;
  /**
   * ggml type of a weight by GGUF role (`attn_q`, `ffn_down`, `token_embd`, `output`, …) and layer
   * (−1: global); default f32.
   */
  typeOf?: (role: string, layer: number) => string;
  /** Leave out output.weight (the lm-head is the embedding). */
  tied?: boolean;
  /** Write rope_freqs.weight with these divisors. */
  freqFactors?: Float32Array;
  /** Default 10000. */
  ropeTheta?: number;
  /** Default 1e-5. */
  rmsEps?: number;
  /** Metadata overrides or additions (value `undefined` removes a key). */
  extraKvs?: WriteKv[];
  /** Edits the tensor list before writing (drop, retype or reshape a tensor). */
  edit?: (tensors: WriteTensor[]) => void;
}

/** A tiny deterministic PRNG (mulberry32) in [0, 1). */
function uniform(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * Random float weights of a small llama model in float32, by GGUF tensor name (row-major [n, k],
 * `ne = [k, n]`): projections uniform with unit output variance, embeddings in [−1, 1), norms
 * 1 ± 0.2.
 */
export function tinyLlamaValues(spec: TinyLlamaSpec): Map<string, { ne: number[]; values: Float32Array }> {
  const r = uniform(spec.seed);
  const hd = spec.hidden / spec.heads;
  const out = new Map<string, { ne: number[]; values: Float32Array }>();
  const mat = (name: string, n: number, k: number, scale = Math.sqrt(3 / k)) =>
    out.set(name, { ne: [k, n], values: Float32Array.from({ length: n * k }, () => (2 * r() - 1) * scale) });
  const vec = (name: string, n: number) =>
    out.set(name, { ne: [n], values: Float32Array.from({ length: n }, () => 1 + 0.4 * (r() - 0.5)) });
  mat("token_embd.weight", spec.vocab, spec.hidden, 1);
  for (let i = 0; i < spec.layers; i++) {
    vec(`blk.${i}.attn_norm.weight`, spec.hidden);
    mat(`blk.${i}.attn_q.weight`, spec.heads * hd, spec.hidden);
    mat(`blk.${i}.attn_k.weight`, spec.kvHeads * hd, spec.hidden);
    mat(`blk.${i}.attn_v.weight`, spec.kvHeads * hd, spec.hidden);
    mat(`blk.${i}.attn_output.weight`, spec.hidden, spec.heads * hd);
    vec(`blk.${i}.ffn_norm.weight`, spec.hidden);
    mat(`blk.${i}.ffn_gate.weight`, spec.ffn, spec.hidden);
    mat(`blk.${i}.ffn_up.weight`, spec.ffn, spec.hidden);
    mat(`blk.${i}.ffn_down.weight`, spec.hidden, spec.ffn);
  }
  vec("output_norm.weight", spec.hidden);
  if (!spec.tied) mat("output.weight", spec.vocab, spec.hidden);
  return out;
}

/** The bytes of `values` ([n, k]) as ggml type `type`. */
export function ggmlBytesOf(values: Float32Array, n: number, k: number, type: string): Uint8Array {
  if (type === "f32") return new Uint8Array(values.slice().buffer);
  if (type === "bf16") {
    const u = new Uint32Array(values.slice().buffer);
    // Round to nearest even on the upper 16 bits (the weights are finite).
    return new Uint8Array(Uint16Array.from(u, (b) => (b + 0x7fff + ((b >>> 16) & 1)) >>> 16).buffer);
  }
  return quantizeGgml(values, n, k, type as GgmlQuantFormat);
}

/** A small llama-architecture GGUF file (random weights, types from `spec.typeOf`). */
export function writeTinyLlamaGguf(spec: TinyLlamaSpec): Uint8Array {
  const T = GgufValueType;
  const kvs: WriteKv[] = [
    { key: "general.architecture", type: T.STRING, value: "llama" },
    { key: "llama.block_count", type: T.UINT32, value: spec.layers },
    { key: "llama.context_length", type: T.UINT32, value: 64 },
    { key: "llama.embedding_length", type: T.UINT32, value: spec.hidden },
    { key: "llama.feed_forward_length", type: T.UINT32, value: spec.ffn },
    { key: "llama.attention.head_count", type: T.UINT32, value: spec.heads },
    { key: "llama.attention.head_count_kv", type: T.UINT32, value: spec.kvHeads },
    { key: "llama.rope.freq_base", type: T.FLOAT32, value: spec.ropeTheta ?? 10000 },
    { key: "llama.attention.layer_norm_rms_epsilon", type: T.FLOAT32, value: spec.rmsEps ?? 1e-5 },
    { key: "llama.vocab_size", type: T.UINT32, value: spec.vocab },
  ];
  for (const extra of spec.extraKvs ?? []) {
    const at = kvs.findIndex((kv) => kv.key === extra.key);
    if (at >= 0) kvs.splice(at, 1);
    if (extra.value !== undefined) kvs.push(extra);
  }
  const tensors: WriteTensor[] = [];
  for (const [name, { ne, values }] of tinyLlamaValues(spec)) {
    const parts = name.split(".");
    const layer = parts[0] === "blk" ? Number(parts[1]) : -1;
    const role = parts[0] === "blk" ? parts[2] : parts[0];
    const type = ne.length === 1 ? "f32" : spec.typeOf?.(role!, layer) ?? "f32";
    tensors.push({ name, type, ne, data: ggmlBytesOf(values, ne.length === 2 ? ne[1]! : 1, ne[0]!, type) });
  }
  if (spec.freqFactors) {
    tensors.push({
      name: "rope_freqs.weight",
      type: "f32",
      ne: [spec.freqFactors.length],
      data: new Uint8Array(spec.freqFactors.slice().buffer),
    });
  }
  spec.edit?.(tensors);
  return writeGguf(kvs, tensors);
}
