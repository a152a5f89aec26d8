/**
 * A small GGUF writer for tests (little-endian, version 3 unless told): metadata of every value
 * type and tensors packed in order at the alignment, as llama.cpp's writers lay them out.
 */
import { ggmlTypeByName } from "../../src/io/ggml_types.ts";
import { GgufValueType } from "../../src/io/gguf.ts";

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
