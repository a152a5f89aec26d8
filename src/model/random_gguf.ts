/**
 * Writes a llama-architecture GGUF file of random weights at any shape, streamed to disk a chunk at
 * a time (a multi-gigabyte file never sits in memory): for speed runs of real model sizes without
 * a real model. Weights are bf16 (values ~ ±√3/√k), or a Q4_K_M-like mix of random Q4_K and Q6_K
 * blocks whose scales keep weights at the same magnitude; norms are f32 ones.
 *
 * @module
 */

import { MlxError } from "../errors.ts";
import { GgufValueType } from "../io/gguf.ts";
import { ggmlTypeByName } from "../io/ggml_types.ts";
import { f16BitsOf } from "../quant/float32.ts";

/** Shape and weight mix of a random model. */
export interface RandomLlamaShape {
  /** Transformer blocks. */
  readonly layers: number;
  /** Model width. */
  readonly hidden: number;
  /** Attention heads. */
  readonly heads: number;
  /** Key/value heads. */
  readonly kvHeads: number;
  /** Feed-forward width. */
  readonly ffn: number;
  /** Vocabulary size. */
  readonly vocab: number;
  /** Context length written to the metadata (default 4096). */
  readonly contextLength?: number;
  /** `bf16` everywhere, or `q4_k_m`: Q4_K projections with Q6_K attn_v, ffn_down and output. */
  readonly weights: "bf16" | "q4_k_m";
  /** PRNG seed (default 1). */
  readonly seed?: number;
}

interface Planned {
  name: string;
  type: string;
  ne: number[];
  bytes: number;
}

const ALIGN = 32;

function plan(s: RandomLlamaShape): Planned[] {
  const hd = s.hidden / s.heads;
  const out: Planned[] = [];
  const quant = (role: string) =>
    s.weights === "bf16" ? "bf16" : ["attn_v", "ffn_down", "output"].includes(role) ? "q6_k" : "q4_k";
  const add = (name: string, role: string, ne: number[]) => {
    const type = ne.length === 1 ? "f32" : quant(role);
    const t = ggmlTypeByName(type)!;
    const elems = ne.reduce((a, b) => a * b, 1);
    if (ne[0]! % t.blockValues !== 0) {
      throw new MlxError(
        "InvalidArgument",
        `${name}: rows of ${ne[0]} are not whole ${type} blocks of ${t.blockValues}`,
      );
    }
    out.push({ name, type, ne, bytes: (elems / t.blockValues) * t.blockBytes });
  };
  add("token_embd.weight", "token_embd", [s.hidden, s.vocab]);
  for (let i = 0; i < s.layers; i++) {
    add(`blk.${i}.attn_norm.weight`, "", [s.hidden]);
    add(`blk.${i}.attn_q.weight`, "attn_q", [s.hidden, s.heads * hd]);
    add(`blk.${i}.attn_k.weight`, "attn_k", [s.hidden, s.kvHeads * hd]);
    add(`blk.${i}.attn_v.weight`, "attn_v", [s.hidden, s.kvHeads * hd]);
    add(`blk.${i}.attn_output.weight`, "attn_output", [s.heads * hd, s.hidden]);
    add(`blk.${i}.ffn_norm.weight`, "", [s.hidden]);
    add(`blk.${i}.ffn_gate.weight`, "ffn_gate", [s.hidden, s.ffn]);
    add(`blk.${i}.ffn_up.weight`, "ffn_up", [s.hidden, s.ffn]);
    add(`blk.${i}.ffn_down.weight`, "ffn_down", [s.ffn, s.hidden]);
  }
  add("output_norm.weight", "", [s.hidden]);
  add("output.weight", "output", [s.hidden, s.vocab]);
  return out;
}

class HeaderBytes {
  parts: Uint8Array[] = [];
  length = 0;
  #push(b: Uint8Array) {
    this.parts.push(b);
    this.length += b.length;
  }
  num(size: number, set: (d: DataView) => void) {
    const b = new Uint8Array(size);
    set(new DataView(b.buffer));
    this.#push(b);
  }
  u32(v: number) {
    this.num(4, (d) => d.setUint32(0, v, true));
  }
  u64(v: number) {
    this.num(8, (d) => d.setBigUint64(0, BigInt(v), true));
  }
  f32(v: number) {
    this.num(4, (d) => d.setFloat32(0, v, true));
  }
  str(s: string) {
    const b = new TextEncoder().encode(s);
    this.u64(b.length);
    this.#push(b);
  }
  bytes(): Uint8Array {
    const out = new Uint8Array(this.length);
    let at = 0;
    for (const p of this.parts) {
      out.set(p, at);
      at += p.length;
    }
    return out;
  }
}

/** A table of 4096 random bf16 values of magnitude ~√(3/k), as bits. */
function bf16Table(next: () => number, k: number): Uint16Array {
  const scale = Math.sqrt(3 / k);
  const f = Float32Array.from({ length: 4096 }, () => (2 * (next() / 2 ** 32) - 1) * scale);
  return new Uint16Array(f.buffer).filter((_, i) => i % 2 === 1);
}

/** Fills `out` (whole blocks of `type`, rows of `k` values) with random blocks of sane scales. */
function fillBlocks(out: Uint8Array, type: string, k: number, next: () => number): void {
  const u32 = new Uint32Array(out.buffer, out.byteOffset, out.byteLength >> 2);
  for (let i = 0; i < u32.length; i++) u32[i] = next();
  for (let i = u32.length * 4; i < out.length; i++) out[i] = next() & 0xff;
  const dv = new DataView(out.buffer, out.byteOffset, out.byteLength);
  const target = Math.sqrt(3 / k);
  if (type === "q4_k") {
    // w = d·sc·q − dmin·m with sc, m < 64 and q < 16: d and dmin scaled so |w| stays ~ target.
    const d = f16BitsOf(target / (63 * 15 / 2)), dmin = f16BitsOf(target / 63);
    for (let b = 0; b + 144 <= out.length; b += 144) {
      dv.setUint16(b, d, true);
      dv.setUint16(b + 2, dmin, true);
    }
  } else if (type === "q6_k") {
    // w = d·sc·(q − 32) with int8 sc and q < 64.
    const d = f16BitsOf(target / (128 * 32));
    for (let b = 0; b + 210 <= out.length; b += 210) dv.setUint16(b + 208, d, true);
  } else if (type === "f32") {
    for (let i = 0; i + 4 <= out.length; i += 4) dv.setFloat32(i, 1, true);
  }
}

/**
 * Writes the random model to `path` (needs --allow-write) and returns its size in bytes. Memory
 * use stays at one 8 MiB chunk whatever the model size.
 */
export function writeRandomLlamaGguf(path: string, s: RandomLlamaShape): number {
  for (const [k, v] of Object.entries({ ...s, weights: 1, seed: 1, contextLength: s.contextLength ?? 1 })) {
    if (!Number.isSafeInteger(v) || (v as number) < 1) {
      throw new MlxError("InvalidArgument", `writeRandomLlamaGguf: ${k} must be a positive integer, got ${v}`);
    }
  }
  if (s.hidden % s.heads !== 0 || s.heads % s.kvHeads !== 0) {
    throw new MlxError("InvalidArgument", "writeRandomLlamaGguf: heads must divide hidden and kvHeads divide heads");
  }
  if (s.weights !== "bf16" && s.weights !== "q4_k_m") {
    throw new MlxError("InvalidArgument", `writeRandomLlamaGguf: weights must be bf16 or q4_k_m, got ${s.weights}`);
  }
  const tensors = plan(s);
  const h = new HeaderBytes();
  h.num(4, (d) => d.setUint32(0, 0x46554747, true)); // "GGUF"
  h.u32(3);
  h.u64(tensors.length);
  const kvs: [string, number, (h: HeaderBytes) => void][] = [
    ["general.architecture", GgufValueType.STRING, (h) => h.str("llama")],
    ["general.name", GgufValueType.STRING, (h) => h.str(`random ${s.weights}`)],
    ["llama.block_count", GgufValueType.UINT32, (h) => h.u32(s.layers)],
    ["llama.context_length", GgufValueType.UINT32, (h) => h.u32(s.contextLength ?? 4096)],
    ["llama.embedding_length", GgufValueType.UINT32, (h) => h.u32(s.hidden)],
    ["llama.feed_forward_length", GgufValueType.UINT32, (h) => h.u32(s.ffn)],
    ["llama.attention.head_count", GgufValueType.UINT32, (h) => h.u32(s.heads)],
    ["llama.attention.head_count_kv", GgufValueType.UINT32, (h) => h.u32(s.kvHeads)],
    ["llama.rope.freq_base", GgufValueType.FLOAT32, (h) => h.f32(10000)],
    ["llama.attention.layer_norm_rms_epsilon", GgufValueType.FLOAT32, (h) => h.f32(1e-5)],
    ["llama.vocab_size", GgufValueType.UINT32, (h) => h.u32(s.vocab)],
  ];
  h.u64(kvs.length);
  for (const [key, type, write] of kvs) {
    h.str(key);
    h.u32(type);
    write(h);
  }
  let offset = 0;
  for (const t of tensors) {
    h.str(t.name);
    h.u32(t.ne.length);
    for (const d of t.ne) h.u64(d);
    h.u32(ggmlTypeByName(t.type)!.id);
    h.u64(offset);
    offset += Math.ceil(t.bytes / ALIGN) * ALIGN;
  }
  const header = h.bytes();
  const dataOffset = Math.ceil(header.length / ALIGN) * ALIGN;
  let seed = (s.seed ?? 1) >>> 0;
  const next = () => (seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0);
  let file: Deno.FsFile;
  try {
    file = Deno.openSync(path, { write: true, create: true, truncate: true });
  } catch (e) {
    const denied = e instanceof Deno.errors.NotCapable || e instanceof Deno.errors.PermissionDenied;
    throw new MlxError(
      denied ? "PermissionDenied" : "InvalidArgument",
      `cannot write the random model to ${path}: ${(e as Error).message}; ` +
        (denied ? "grant --allow-write for that path" : "pick a path in a writable folder that exists"),
    );
  }
  const writeAll = (b: Uint8Array) => {
    for (let done = 0; done < b.length;) done += file.writeSync(b.subarray(done));
  };
  let written = 0;
  try {
    writeAll(header);
    writeAll(new Uint8Array(dataOffset - header.length));
    written = dataOffset;
    // A whole number of Q4_K (144 B) and Q6_K (210 B) blocks, so every chunk starts a block.
    const chunk = new Uint8Array(5040 * 1664);
    for (const t of tensors) {
      const table = t.type === "bf16" ? bf16Table(next, t.name === "token_embd.weight" ? 3 : t.ne[0]!) : undefined;
      for (let done = 0; done < t.bytes;) {
        const part = chunk.subarray(0, Math.min(chunk.length, t.bytes - done));
        if (table) {
          const u16 = new Uint16Array(part.buffer, part.byteOffset, part.length >> 1);
          const base = done >> 1;
          for (let i = 0; i < u16.length; i++) u16[i] = table[(Math.imul(base + i, 2654435761) >>> 21) & 2047]!;
        } else fillBlocks(part, t.type, t.ne[0]!, next);
        writeAll(part);
        done += part.length;
      }
      const pad = Math.ceil(t.bytes / ALIGN) * ALIGN - t.bytes;
      if (pad && t !== tensors[tensors.length - 1]) writeAll(new Uint8Array(pad));
      written += t.bytes + (t !== tensors[tensors.length - 1] ? pad : 0);
    }
  } finally {
    file.close();
  }
  return written;
}
