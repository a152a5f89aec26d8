/**
 * GGUF reader: header, metadata, tensor infos and alignment, checked as strictly as ggml's own
 * gguf.cpp (ggml-org/ggml d99724f2) checks them, and the streaming upload of a tensor's bytes into a
 * device buffer. Every malformed, truncated or oversized file gives an MlxError that names the
 * byte offset and what is wrong; nothing is read past what the header describes.
 *
 * Layout (little-endian): "GGUF", u32 version (2 or 3), u64 tensor count, u64 metadata count,
 * metadata (string key, u32 type, value), tensor infos (string name, u32 n_dims, u64 ne[n_dims],
 * u32 ggml type, u64 offset), padding to `general.alignment` (default 32), then the tensor data,
 * each tensor at its offset, packed in info order and padded to the alignment.
 *
 * @module
 */

import type { MlxBuffer } from "../buffer.ts";
import type { MlxDevice } from "../device.ts";
import { MlxError } from "../errors.ts";
import { dequantizeGgml } from "../quant/ggml.ts";
import { type GgmlType, ggmlTypeById, LOADABLE_GGML_TYPES } from "./ggml_types.ts";
import { type ByteSource, bytesSource, fileSource, type UploadOptions, uploadRange } from "./source.ts";

/** GGUF metadata value types (gguf.h `enum gguf_type`). */
export const GgufValueType = {
  UINT8: 0,
  INT8: 1,
  UINT16: 2,
  INT16: 3,
  UINT32: 4,
  INT32: 5,
  FLOAT32: 6,
  BOOL: 7,
  STRING: 8,
  ARRAY: 9,
  UINT64: 10,
  INT64: 11,
  FLOAT64: 12,
} as const;

/** One of the {@link GgufValueType} codes. */
export type GgufValueType = typeof GgufValueType[keyof typeof GgufValueType];

/** A metadata value: numbers (64-bit integers as bigint), booleans, strings, or arrays of them. */
export type GgufValue =
  | number
  | bigint
  | boolean
  | string
  | readonly string[]
  | readonly boolean[]
  | Uint8Array
  | Int8Array
  | Uint16Array
  | Int16Array
  | Uint32Array
  | Int32Array
  | Float32Array
  | BigUint64Array
  | BigInt64Array
  | Float64Array;

/** One metadata entry. */
export interface GgufMetadataEntry {
  /** The stored type. */
  readonly type: GgufValueType;
  /** For arrays, the element type. */
  readonly elementType?: GgufValueType;
  /** The value. */
  readonly value: GgufValue;
}

/** One tensor of a GGUF file. */
export interface GgufTensorInfo {
  /** Tensor name (at most 63 bytes). */
  readonly name: string;
  /** Its ggml type. */
  readonly type: GgmlType;
  /** Dimensions in ggml order: `ne[0]` (the contiguous row length) first. */
  readonly ne: readonly number[];
  /** Elements. */
  readonly elements: number;
  /** Offset of its data within the file. */
  readonly fileOffset: number;
  /** Bytes of its data. */
  readonly byteLength: number;
}

/** A parsed GGUF header. */
export interface GgufHeader {
  /** Format version (2 or 3). */
  readonly version: number;
  /** Data alignment (`general.alignment`, default 32). */
  readonly alignment: number;
  /** Metadata in file order. */
  readonly metadata: ReadonlyMap<string, GgufMetadataEntry>;
  /** Tensor infos in file order. */
  readonly tensors: readonly GgufTensorInfo[];
  /** Offset of the data section. */
  readonly dataOffset: number;
  /** Size of the file. */
  readonly fileSize: number;
}

/** Limits that keep a hostile header from exhausting memory (real files stay far below). */
const MAX_TENSORS = 1 << 20;
const MAX_KV = 1 << 20;
const MAX_STRING_BYTES = 1 << 24;
const MAX_ARRAY_ELEMENTS = 1 << 26;
/** ggml's GGML_MAX_NAME (names are shorter) and GGML_MAX_DIMS. */
const MAX_NAME = 64;
const MAX_DIMS = 4;
const DEFAULT_ALIGNMENT = 32;
const WINDOW = 1 << 20;

const SCALAR_SIZE: Record<number, number> = { 0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8 };
const TYPE_NAME = Object.fromEntries(Object.entries(GgufValueType).map(([k, v]) => [v, k])) as Record<number, string>;

const utf8 = new TextDecoder("utf-8", { fatal: true });

/** Sequential little-endian reads over a source, through a window so a header costs few reads. */
class Cursor {
  pos = 0;
  #win: Uint8Array = new Uint8Array(0);
  #winAt = 0;
  constructor(readonly src: ByteSource) {}

  fail(what: string, at = this.pos): never {
    throw new MlxError("InvalidArgument", `${this.src.label}: not a valid GGUF file: ${what} (at byte ${at})`);
  }

  need(n: number, what: string): void {
    if (n > this.src.size - this.pos) {
      throw new MlxError(
        "InvalidArgument",
        `${this.src.label}: GGUF file is truncated: ${what} needs ${n} bytes at byte ${this.pos}, ` +
          `the file has ${this.src.size} bytes (re-download or re-convert the model)`,
      );
    }
  }

  bytes(n: number, what: string): Uint8Array {
    this.need(n, what);
    const rel = this.pos - this.#winAt;
    if (rel < 0 || rel + n > this.#win.length) {
      if (n > WINDOW) {
        const out = this.src.read(this.pos, n);
        this.pos += n;
        return out;
      }
      this.#winAt = this.pos;
      this.#win = this.src.read(this.pos, Math.min(WINDOW, this.src.size - this.pos));
    }
    const at = this.pos - this.#winAt;
    this.pos += n;
    return this.#win.subarray(at, at + n);
  }

  view(n: number, what: string): DataView {
    const b = this.bytes(n, what);
    return new DataView(b.buffer, b.byteOffset, n);
  }

  u32(what: string): number {
    return this.view(4, what).getUint32(0, true);
  }

  /** A u64 that must fit a safe integer and stay within `max`. */
  count(what: string, max: number): number {
    const at = this.pos;
    const v = this.view(8, what).getBigUint64(0, true);
    if (v > BigInt(max)) this.fail(`${what} is ${v}, more than the ${max} allowed`, at);
    return Number(v);
  }

  string(what: string): string {
    const at = this.pos;
    const n = this.count(`${what} length`, MAX_STRING_BYTES);
    const b = this.bytes(n, what);
    try {
      return utf8.decode(b);
    } catch {
      this.fail(`${what} is not valid UTF-8`, at);
    }
  }
}

function readScalar(c: Cursor, type: number, what: string): number | bigint | boolean {
  const at = c.pos;
  const v = c.view(SCALAR_SIZE[type]!, what);
  switch (type) {
    case GgufValueType.UINT8:
      return v.getUint8(0);
    case GgufValueType.INT8:
      return v.getInt8(0);
    case GgufValueType.UINT16:
      return v.getUint16(0, true);
    case GgufValueType.INT16:
      return v.getInt16(0, true);
    case GgufValueType.UINT32:
      return v.getUint32(0, true);
    case GgufValueType.INT32:
      return v.getInt32(0, true);
    case GgufValueType.FLOAT32:
      return v.getFloat32(0, true);
    case GgufValueType.BOOL: {
      const b = v.getUint8(0);
      if (b > 1) c.fail(`${what} is a bool stored as ${b} (must be 0 or 1)`, at);
      return b === 1;
    }
    case GgufValueType.UINT64:
      return v.getBigUint64(0, true);
    case GgufValueType.INT64:
      return v.getBigInt64(0, true);
    default:
      return v.getFloat64(0, true);
  }
}

function readArray(c: Cursor, what: string): { elementType: GgufValueType; value: GgufValue } {
  const at = c.pos;
  const elementType = c.u32(`${what} element type`) as GgufValueType;
  if (elementType === GgufValueType.ARRAY) {
    c.fail(`${what} is an array of arrays, which GGUF readers do not support`, at);
  }
  if (!(elementType in TYPE_NAME)) c.fail(`${what} has unknown element type ${elementType}`, at);
  const n = c.count(`${what} element count`, MAX_ARRAY_ELEMENTS);
  if (elementType === GgufValueType.STRING) {
    // Each string takes at least its 8-byte length: a count the file cannot hold is rejected first.
    c.need(n * 8, `${what} (${n} strings)`);
    const out: string[] = new Array(n);
    for (let i = 0; i < n; i++) out[i] = c.string(`${what}[${i}]`);
    return { elementType, value: out };
  }
  const size = SCALAR_SIZE[elementType]!;
  const raw = c.bytes(n * size, `${what} (${n} × ${TYPE_NAME[elementType]})`);
  const copy = raw.slice().buffer;
  switch (elementType) {
    case GgufValueType.UINT8:
      return { elementType, value: new Uint8Array(copy) };
    case GgufValueType.INT8:
      return { elementType, value: new Int8Array(copy) };
    case GgufValueType.BOOL: {
      const bytes = new Uint8Array(copy);
      const bad = bytes.findIndex((b) => b > 1);
      if (bad >= 0) c.fail(`${what}[${bad}] is a bool stored as ${bytes[bad]}`, at);
      return { elementType, value: Array.from(bytes, (b) => b === 1) };
    }
  }
  // Wider elements: decode explicitly (little-endian regardless of the host).
  const dv = new DataView(copy);
  const decode = <T extends { [i: number]: number | bigint }>(arr: T, get: (i: number) => number | bigint): T => {
    for (let i = 0; i < n; i++) arr[i] = get(i);
    return arr;
  };
  switch (elementType) {
    case GgufValueType.UINT16:
      return { elementType, value: decode(new Uint16Array(n), (i) => dv.getUint16(2 * i, true)) };
    case GgufValueType.INT16:
      return { elementType, value: decode(new Int16Array(n), (i) => dv.getInt16(2 * i, true)) };
    case GgufValueType.UINT32:
      return { elementType, value: decode(new Uint32Array(n), (i) => dv.getUint32(4 * i, true)) };
    case GgufValueType.INT32:
      return { elementType, value: decode(new Int32Array(n), (i) => dv.getInt32(4 * i, true)) };
    case GgufValueType.FLOAT32:
      return { elementType, value: decode(new Float32Array(n), (i) => dv.getFloat32(4 * i, true)) };
    case GgufValueType.UINT64:
      return { elementType, value: decode(new BigUint64Array(n), (i) => dv.getBigUint64(8 * i, true)) };
    case GgufValueType.INT64:
      return { elementType, value: decode(new BigInt64Array(n), (i) => dv.getBigInt64(8 * i, true)) };
    default:
      return { elementType, value: decode(new Float64Array(n), (i) => dv.getFloat64(8 * i, true)) };
  }
}

/** Parses and validates the header of a GGUF file; tensor data is not read. */
export function parseGgufHeader(source: ByteSource): GgufHeader {
  const c: Cursor = new Cursor(source);
  const magic = c.bytes(4, "magic");
  if (magic[0] !== 0x47 || magic[1] !== 0x47 || magic[2] !== 0x55 || magic[3] !== 0x46) {
    c.fail(`the magic is ${JSON.stringify(String.fromCharCode(...magic))}, not "GGUF"`, 0);
  }
  const version = c.u32("version");
  if (version !== 2 && version !== 3) {
    const swapped = ((version & 0xff) << 24 | (version & 0xff00) << 8 | (version >>> 8) & 0xff00 | version >>> 24) >>>
      0;
    throw new MlxError(
      "Unsupported",
      swapped === 2 || swapped === 3
        ? `${source.label}: a big-endian GGUF file; convert it to little-endian (gguf-py's gguf_convert_endian.py)`
        : `${source.label}: GGUF version ${version} is not supported (versions 2 and 3 are); re-convert the model`,
    );
  }
  const nTensors = c.count("tensor count", MAX_TENSORS);
  const nKv = c.count("metadata count", MAX_KV);
  // Every entry takes at least 12 bytes (key length + type) and every tensor info 24: reject
  // counts the file cannot hold before allocating anything for them.
  c.need(nKv * 12 + nTensors * 24, `${nKv} metadata entries and ${nTensors} tensor infos`);

  const metadata = new Map<string, GgufMetadataEntry>();
  for (let i = 0; i < nKv; i++) {
    const at = c.pos;
    const key = c.string(`metadata key ${i}`);
    if (metadata.has(key)) c.fail(`metadata key ${JSON.stringify(key)} appears twice`, at);
    const typeAt = c.pos;
    const type = c.u32(`type of ${key}`);
    const what = `metadata ${JSON.stringify(key)}`;
    if (type === GgufValueType.STRING) metadata.set(key, { type, value: c.string(what) });
    else if (type === GgufValueType.ARRAY) {
      const { elementType, value } = readArray(c, what);
      metadata.set(key, { type, elementType, value });
    } else if (type in SCALAR_SIZE) {
      metadata.set(key, { type: type as GgufValueType, value: readScalar(c, type, what) });
    } else c.fail(`${what} has unknown type ${type}`, typeAt);
  }

  let alignment = DEFAULT_ALIGNMENT;
  const align = metadata.get("general.alignment");
  if (align) {
    if (align.type !== GgufValueType.UINT32) {
      c.fail(`general.alignment must be a UINT32, not ${TYPE_NAME[align.type]}`, 0);
    }
    alignment = align.value as number;
    if (alignment === 0 || (alignment & (alignment - 1)) !== 0) {
      c.fail(`general.alignment ${alignment} is not a power of two`, 0);
    }
  }

  const infos: { name: string; type: GgmlType; ne: number[]; elements: number; offset: number; bytes: number }[] = [];
  const names = new Set<string>();
  for (let i = 0; i < nTensors; i++) {
    const at = c.pos;
    const name = c.string(`tensor name ${i}`);
    if (new TextEncoder().encode(name).length >= MAX_NAME) {
      c.fail(`tensor name ${JSON.stringify(name.slice(0, 80))} is longer than ${MAX_NAME - 1} bytes`, at);
    }
    if (names.has(name)) c.fail(`tensor ${JSON.stringify(name)} appears twice`, at);
    names.add(name);
    const dimsAt = c.pos;
    const nDims = c.u32(`dimension count of ${name}`);
    if (nDims > MAX_DIMS) c.fail(`tensor ${name} has ${nDims} dimensions (at most ${MAX_DIMS})`, dimsAt);
    const ne: number[] = [];
    let elements = 1;
    for (let d = 0; d < nDims; d++) {
      const dimAt = c.pos;
      const v = c.view(8, `dimension ${d} of ${name}`).getBigInt64(0, true);
      if (v < 0n) c.fail(`tensor ${name} dimension ${d} is negative (${v})`, dimAt);
      if (v > BigInt(Number.MAX_SAFE_INTEGER)) c.fail(`tensor ${name} dimension ${d} (${v}) is too large`, dimAt);
      ne.push(Number(v));
      elements *= Number(v);
      if (!Number.isSafeInteger(elements)) c.fail(`tensor ${name} has more than 2^53 elements`, dimAt);
    }
    const typeAt = c.pos;
    const typeId = c.u32(`type of ${name}`);
    const type = ggmlTypeById(typeId);
    if (!type) c.fail(`tensor ${name} has unknown ggml type ${typeId}`, typeAt);
    const rowLength = ne[0] ?? 1;
    if (rowLength % type.blockValues !== 0) {
      c.fail(
        `tensor ${name} (${type.name}) has rows of ${rowLength} values, not a multiple of ${type.blockValues}`,
        typeAt,
      );
    }
    const bytes = (elements / type.blockValues) * type.blockBytes;
    if (!Number.isSafeInteger(bytes)) c.fail(`tensor ${name} is larger than 2^53 bytes`, typeAt);
    const offAt = c.pos;
    const off = c.view(8, `offset of ${name}`).getBigUint64(0, true);
    if (off > BigInt(Number.MAX_SAFE_INTEGER)) c.fail(`tensor ${name} offset ${off} is too large`, offAt);
    infos.push({ name, type, ne, elements, offset: Number(off), bytes });
  }

  const dataOffset = nTensors > 0 ? Math.ceil(c.pos / alignment) * alignment : c.pos;
  // As gguf.cpp: tensors are packed in info order, each padded to the alignment.
  let expected = 0;
  const tensors: GgufTensorInfo[] = [];
  for (const t of infos) {
    if (t.offset !== expected) {
      c.fail(`tensor ${t.name} has data offset ${t.offset}, expected ${expected} (tensors are packed in order)`, c.pos);
    }
    const end = dataOffset + t.offset + t.bytes;
    if (end > source.size) {
      throw new MlxError(
        "InvalidArgument",
        `${source.label}: GGUF file is truncated: tensor ${t.name} (${t.type.name}, ${t.bytes} bytes) ends at byte ${end}, ` +
          `the file has ${source.size} bytes (re-download or re-convert the model)`,
      );
    }
    expected = t.offset + Math.ceil(t.bytes / alignment) * alignment;
    tensors.push(Object.freeze({
      name: t.name,
      type: t.type,
      ne: Object.freeze(t.ne),
      elements: t.elements,
      fileOffset: dataOffset + t.offset,
      byteLength: t.bytes,
    }));
  }
  return Object.freeze({
    version,
    alignment,
    metadata,
    tensors: Object.freeze(tensors),
    dataOffset,
    fileSize: source.size,
  });
}

function unsupportedType(t: GgufTensorInfo): MlxError {
  return new MlxError(
    "Unsupported",
    `tensor ${t.name} is ${t.type.name}, which mlx-native cannot load (it loads ${
      Object.keys(LOADABLE_GGML_TYPES).join(", ")
    }); re-quantize the model, e.g. llama-quantize … Q4_K_M`,
  );
}

/**
 * An open GGUF file: its header, and tensor data read or uploaded on demand (never mapped, never
 * read whole). Dispose it (`using`) to close the file.
 */
export class GgufFile {
  /** The parsed header. */
  readonly header: GgufHeader;
  readonly #source: ByteSource;
  readonly #byName: Map<string, GgufTensorInfo>;

  private constructor(source: ByteSource) {
    this.#source = source;
    try {
      this.header = parseGgufHeader(source);
    } catch (e) {
      source.close();
      throw e;
    }
    this.#byName = new Map(this.header.tensors.map((t) => [t.name, t]));
  }

  /** Opens a GGUF file from a path (needs --allow-read) or from bytes in memory. */
  static open(file: string | URL | Uint8Array): GgufFile {
    return new GgufFile(file instanceof Uint8Array ? bytesSource(file) : fileSource(file));
  }

  /** Tensor infos in file order. */
  get tensors(): readonly GgufTensorInfo[] {
    return this.header.tensors;
  }

  /** A metadata value, or undefined. */
  get(key: string): GgufValue | undefined {
    return this.header.metadata.get(key)?.value;
  }

  /** The info of tensor `name`; throws InvalidArgument naming a few present tensors if absent. */
  tensor(name: string): GgufTensorInfo {
    const t = this.#byName.get(name);
    if (!t) {
      const some = this.header.tensors.slice(0, 5).map((x) => x.name).join(", ");
      throw new MlxError(
        "InvalidArgument",
        `no tensor ${JSON.stringify(name)} in ${this.#source.label} (it has ${some}, …)`,
      );
    }
    return t;
  }

  /** Whether tensor `name` exists. */
  has(name: string): boolean {
    return this.#byName.has(name);
  }

  /** Reads a tensor's bytes into host memory. */
  readTensorBytes(name: string): Uint8Array {
    const t = this.tensor(name);
    return this.#source.read(t.fileOffset, t.byteLength);
  }

  /**
   * A tensor's values in float64, exactly as its format defines them (for references and checks;
   * a model's weights belong on the device, see {@link GgufFile.upload}). Row-major with ne[0]
   * contiguous.
   */
  dequantize(name: string): Float64Array {
    const t = this.tensor(name);
    const loadable = LOADABLE_GGML_TYPES[t.type.name];
    if (!loadable) throw unsupportedType(t);
    const bytes = this.readTensorBytes(name);
    if (t.type.name === "f32") return Float64Array.from(new Float32Array(bytes.buffer, 0, t.elements));
    if (t.type.name === "bf16") {
      const u = new Uint32Array(t.elements);
      for (let i = 0; i < t.elements; i++) u[i] = (bytes[2 * i]! | (bytes[2 * i + 1]! << 8)) << 16;
      return Float64Array.from(new Float32Array(u.buffer));
    }
    const k = t.ne[0] ?? 1;
    return dequantizeGgml(bytes, t.elements / k, k, loadable.format!);
  }

  /**
   * Streams a tensor into a new device buffer: f32/f16/bf16 as that dtype with shape [..., ne1,
   * ne0], quantized blocks as u8. Throws Unsupported for a type this library cannot run.
   */
  upload(device: MlxDevice, name: string, options?: UploadOptions): MlxBuffer {
    const t = this.tensor(name);
    const loadable = LOADABLE_GGML_TYPES[t.type.name];
    if (!loadable) {
      throw new MlxError(
        "Unsupported",
        `tensor ${name} is ${t.type.name}, which mlx-native cannot load (it loads ${
          Object.keys(LOADABLE_GGML_TYPES).join(", ")
        }); ` +
          `re-quantize the model, e.g. llama-quantize … Q4_K_M`,
      );
    }
    if (t.byteLength === 0) throw new MlxError("InvalidArgument", `tensor ${name} has no elements; nothing to upload`);
    const shape = loadable.dtype === "u8" ? [t.byteLength] : [...t.ne].reverse();
    return uploadRange(device, this.#source, t.fileOffset, t.byteLength, loadable.dtype, shape, options);
  }

  /** Closes the file. */
  close(): void {
    this.#source.close();
  }

  /** Same as {@link GgufFile.close}. */
  [Symbol.dispose](): void {
    this.close();
  }
}
