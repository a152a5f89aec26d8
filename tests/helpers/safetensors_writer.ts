/**
 * A small safetensors writer for tests: tensors in the given order, contiguous, with optional
 * `__metadata__`, as huggingface/safetensors serializes them (header padded with spaces to 8 bytes).
 */

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
