/**
 * safetensors reader: the 8-byte header length, the JSON header (dtype, shape and data offsets of
 * each tensor, optional string metadata) and streaming uploads of tensor data, validated as the
 * reference implementation (huggingface/safetensors) validates them: header at most 100 MB, data
 * offsets contiguous from 0 with no gaps or overlaps, each tensor's byte size equal to its element
 * count times its dtype size, and the data section ending exactly at the end of the file.
 *
 * @module
 */

import type { MlxBuffer } from "../buffer.ts";
import type { MlxDevice } from "../device.ts";
import type { DType } from "../dtype.ts";
import { MlxError } from "../errors.ts";
import { type ByteSource, bytesSource, fileSource, type UploadOptions, uploadRange } from "./source.ts";

/** Bytes per element of the safetensors dtypes this reader knows. */
export const SAFETENSORS_DTYPE_BYTES: Readonly<Record<string, number>> = Object.freeze({
  BOOL: 1,
  U8: 1,
  I8: 1,
  F8_E4M3: 1,
  F8_E5M2: 1,
  F8_E8M0: 1,
  U16: 2,
  I16: 2,
  F16: 2,
  BF16: 2,
  U32: 4,
  I32: 4,
  F32: 4,
  U64: 8,
  I64: 8,
  F64: 8,
});

/** The device dtype each uploadable safetensors dtype becomes. */
const DEVICE_DTYPE: Readonly<Record<string, DType>> = {
  F32: "f32",
  F16: "f16",
  BF16: "bf16",
  U32: "u32",
  I32: "i32",
  U16: "u16",
  U8: "u8",
};

/** Options of {@link SafetensorsFile.upload}. */
export interface SafetensorsUploadOptions extends UploadOptions {
  /** Upload the raw bytes as a u8 buffer (e.g. packed quantized codes stored as U32). */
  readonly asBytes?: boolean | undefined;
}

/** One tensor of a safetensors file. */
export interface SafetensorsTensorInfo {
  /** Tensor name. */
  readonly name: string;
  /** safetensors dtype (`F32`, `BF16`, `U32`, …). */
  readonly dtype: string;
  /** Shape, outermost first. */
  readonly shape: readonly number[];
  /** Offset of its data within the file. */
  readonly fileOffset: number;
  /** Bytes of its data. */
  readonly byteLength: number;
}

/** A parsed safetensors header. */
export interface SafetensorsHeader {
  /** The `__metadata__` strings (empty when absent). */
  readonly metadata: Readonly<Record<string, string>>;
  /** Tensors in data order. */
  readonly tensors: readonly SafetensorsTensorInfo[];
  /** Offset of the data section (8 + header length). */
  readonly dataOffset: number;
}

/** The reference implementation's limit on the JSON header. */
const MAX_HEADER_BYTES = 100_000_000;

const utf8 = new TextDecoder("utf-8", { fatal: true });

/** Parses and validates a safetensors header; tensor data is not read. */
export function parseSafetensorsHeader(source: ByteSource): SafetensorsHeader {
  const label = source.label;
  const bad = (what: string): never => {
    throw new MlxError("InvalidArgument", `${label}: not a valid safetensors file: ${what}`);
  };
  if (source.size < 8) {
    throw new MlxError(
      "InvalidArgument",
      `${label}: safetensors file is truncated: ${source.size} bytes, the header length alone takes 8`,
    );
  }
  const n = new DataView(source.read(0, 8).buffer).getBigUint64(0, true);
  if (n > BigInt(MAX_HEADER_BYTES)) bad(`the header length is ${n} bytes, more than the ${MAX_HEADER_BYTES} allowed`);
  const headerBytes = Number(n);
  if (8 + headerBytes > source.size) {
    throw new MlxError(
      "InvalidArgument",
      `${label}: safetensors file is truncated: the header needs ${headerBytes} bytes after byte 8, the file has ${source.size}`,
    );
  }
  let text: string;
  try {
    text = utf8.decode(source.read(8, headerBytes));
  } catch {
    return bad("the header is not valid UTF-8");
  }
  if (!text.startsWith("{")) bad("the header does not start with '{'");
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    return bad(`the header is not valid JSON (${(e as Error).message})`);
  }
  if (json === null || typeof json !== "object" || Array.isArray(json)) bad("the header is not a JSON object");
  const dataOffset = 8 + headerBytes;
  const metadata: Record<string, string> = {};
  const raw: { name: string; dtype: string; shape: number[]; begin: number; end: number }[] = [];
  for (const [name, value] of Object.entries(json as Record<string, unknown>)) {
    if (name === "__metadata__") {
      if (value === null || typeof value !== "object" || Array.isArray(value)) bad("__metadata__ is not an object");
      for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
        if (typeof v !== "string") bad(`__metadata__.${k} is not a string`);
        metadata[k] = v as string;
      }
      continue;
    }
    const t = value as Record<string, unknown>;
    if (t === null || typeof t !== "object" || Array.isArray(t)) bad(`tensor ${JSON.stringify(name)} is not an object`);
    const { dtype, shape, data_offsets: offsets } = t;
    if (typeof dtype !== "string") bad(`tensor ${JSON.stringify(name)} has no dtype string`);
    const size = Object.hasOwn(SAFETENSORS_DTYPE_BYTES, dtype as string)
      ? SAFETENSORS_DTYPE_BYTES[dtype as string]
      : undefined;
    if (size === undefined) {
      throw new MlxError(
        "Unsupported",
        `${label}: tensor ${JSON.stringify(name)} has dtype ${
          JSON.stringify(dtype)
        }, which this reader does not know ` +
          `(it knows ${Object.keys(SAFETENSORS_DTYPE_BYTES).join(", ")})`,
      );
    }
    if (!Array.isArray(shape) || shape.length > 16 || !shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
      bad(`tensor ${JSON.stringify(name)} has an invalid shape ${JSON.stringify(shape)?.slice(0, 100)}`);
    }
    if (
      !Array.isArray(offsets) || offsets.length !== 2 || !offsets.every((o) => Number.isSafeInteger(o) && o >= 0) ||
      offsets[1] < offsets[0]
    ) {
      bad(`tensor ${JSON.stringify(name)} has invalid data_offsets ${JSON.stringify(offsets)?.slice(0, 100)}`);
    }
    let elements = 1;
    for (const d of shape as number[]) {
      elements *= d;
      if (!Number.isSafeInteger(elements)) bad(`tensor ${JSON.stringify(name)} has more than 2^53 elements`);
    }
    const [begin, end] = offsets as [number, number];
    if (!Number.isSafeInteger(elements * size) || elements * size !== end - begin) {
      bad(
        `tensor ${JSON.stringify(name)}: ${dtype}${JSON.stringify(shape)} takes ${elements * size} bytes, ` +
          `its data_offsets span ${end - begin}`,
      );
    }
    raw.push({ name, dtype: dtype as string, shape: shape as number[], begin, end });
  }
  raw.sort((a, b) => a.begin - b.begin || a.end - b.end);
  let expected = 0;
  for (const t of raw) {
    if (t.begin !== expected) {
      bad(`tensor ${JSON.stringify(t.name)} starts at data byte ${t.begin}, expected ${expected} (gap or overlap)`);
    }
    expected = t.end;
  }
  if (dataOffset + expected !== source.size) {
    throw new MlxError(
      "InvalidArgument",
      dataOffset + expected > source.size
        ? `${label}: safetensors file is truncated: its tensors end at byte ${
          dataOffset + expected
        }, the file has ${source.size} bytes`
        : `${label}: not a valid safetensors file: ${source.size - dataOffset - expected} bytes after the last tensor`,
    );
  }
  const tensors = raw.map((t) =>
    Object.freeze({
      name: t.name,
      dtype: t.dtype,
      shape: Object.freeze(t.shape),
      fileOffset: dataOffset + t.begin,
      byteLength: t.end - t.begin,
    })
  );
  return Object.freeze({ metadata: Object.freeze(metadata), tensors: Object.freeze(tensors), dataOffset });
}

/**
 * An open safetensors file: its header, and tensor data read or uploaded on demand (never mapped,
 * never read whole). Dispose it (`using`) to close the file.
 */
export class SafetensorsFile {
  /** The parsed header. */
  readonly header: SafetensorsHeader;
  readonly #source: ByteSource;
  readonly #byName: Map<string, SafetensorsTensorInfo>;

  private constructor(source: ByteSource) {
    this.#source = source;
    try {
      this.header = parseSafetensorsHeader(source);
    } catch (e) {
      source.close();
      throw e;
    }
    this.#byName = new Map(this.header.tensors.map((t) => [t.name, t]));
  }

  /** Opens a safetensors file from a path (needs --allow-read) or from bytes in memory. */
  static open(file: string | URL | Uint8Array): SafetensorsFile {
    return new SafetensorsFile(file instanceof Uint8Array ? bytesSource(file) : fileSource(file));
  }

  /** Where the file came from. */
  get label(): string {
    return this.#source.label;
  }

  /** Tensor infos in data order. */
  get tensors(): readonly SafetensorsTensorInfo[] {
    return this.header.tensors;
  }

  /** Whether tensor `name` exists. */
  has(name: string): boolean {
    return this.#byName.has(name);
  }

  /** The info of tensor `name`; throws InvalidArgument if absent. */
  tensor(name: string): SafetensorsTensorInfo {
    const t = this.#byName.get(name);
    if (!t) throw new MlxError("InvalidArgument", `no tensor ${JSON.stringify(name)} in ${this.#source.label}`);
    return t;
  }

  /** Reads a tensor's bytes into host memory. */
  readTensorBytes(name: string): Uint8Array {
    const t = this.tensor(name);
    return this.#source.read(t.fileOffset, t.byteLength);
  }

  /**
   * Streams a tensor into a new device buffer of the matching dtype and shape (F32, F16, BF16, U32,
   * I32, U16, U8), or as raw bytes with `asBytes`. Throws Unsupported for other dtypes.
   */
  upload(device: MlxDevice, name: string, options: SafetensorsUploadOptions = {}): MlxBuffer {
    const t = this.tensor(name);
    const dtype = options.asBytes ? "u8" : DEVICE_DTYPE[t.dtype];
    if (!dtype) {
      throw new MlxError(
        "Unsupported",
        `tensor ${name} is ${t.dtype}; mlx-native loads ${Object.keys(DEVICE_DTYPE).join(", ")} (convert it first)`,
      );
    }
    if (t.byteLength === 0) throw new MlxError("InvalidArgument", `tensor ${name} has no elements; nothing to upload`);
    const shape = options.asBytes ? [t.byteLength] : t.shape;
    return uploadRange(device, this.#source, t.fileOffset, t.byteLength, dtype, shape, options);
  }

  /** Closes the file. */
  close(): void {
    this.#source.close();
  }

  /** Same as {@link SafetensorsFile.close}. */
  [Symbol.dispose](): void {
    this.close();
  }
}
