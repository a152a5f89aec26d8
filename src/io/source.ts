/**
 * Random-access byte sources for the model-file readers (an in-memory array or a file read with
 * positioned reads: no mmap, nothing read that is not asked for) and the streaming upload of a byte
 * range into a device buffer.
 *
 * @module
 */

import type { MlxBuffer } from "../buffer.ts";
import type { MlxDevice } from "../device.ts";
import type { DType } from "../dtype.ts";
import { MlxError } from "../errors.ts";

/** Bytes that can be read at any offset. */
export interface ByteSource {
  /** Total bytes. */
  readonly size: number;
  /** A short description for error messages (a path, or "memory"). */
  readonly label: string;
  /** Reads exactly `length` bytes at `offset` into a new array (the caller checked the range). */
  read(offset: number, length: number): Uint8Array;
  /** Reads `into.length` bytes at `offset` into `into`. */
  readInto(offset: number, into: Uint8Array): void;
  /** Releases the file, if any. */
  close(): void;
}

/** A source over bytes already in memory (no copy). */
export function bytesSource(bytes: Uint8Array, label = "memory"): ByteSource {
  if (!(bytes instanceof Uint8Array)) {
    throw new MlxError("InvalidArgument", `a model file in memory must be a Uint8Array (got ${typeof bytes})`);
  }
  return {
    size: bytes.length,
    label,
    read: (offset, length) => bytes.slice(offset, offset + length),
    readInto: (offset, into) => into.set(bytes.subarray(offset, offset + into.length)),
    close: () => {},
  };
}

/**
 * Opens a file for positioned reads. Needs `--allow-read` for the path: without it, or when the
 * file is missing or a directory, throws an MlxError saying so.
 */
export function fileSource(path: string | URL): ByteSource {
  let file: Deno.FsFile;
  let size: number;
  try {
    file = Deno.openSync(path, { read: true });
  } catch (e) {
    throw fileError(path, e);
  }
  try {
    const info = file.statSync();
    if (!info.isFile) {
      throw new MlxError("InvalidArgument", `${path} is not a regular file; pass the model file's path`);
    }
    size = info.size;
  } catch (e) {
    file.close();
    throw e instanceof MlxError ? e : fileError(path, e);
  }
  let open = true;
  const readInto = (offset: number, into: Uint8Array) => {
    if (!open) throw new MlxError("Disposed", `${path} was closed; open the model file again`);
    file.seekSync(offset, Deno.SeekMode.Start);
    let done = 0;
    while (done < into.length) {
      const n = file.readSync(into.subarray(done));
      if (n === null || n === 0) {
        throw new MlxError(
          "InvalidArgument",
          `${path} ended at byte ${offset + done} while ${
            into.length - done
          } more bytes were expected (the file shrank while open?)`,
        );
      }
      done += n;
    }
  };
  return {
    size,
    label: String(path),
    read: (offset, length) => {
      const out = new Uint8Array(length);
      readInto(offset, out);
      return out;
    },
    readInto,
    close: () => {
      if (open) file.close();
      open = false;
    },
  };
}

function fileError(path: string | URL, e: unknown): MlxError {
  if (e instanceof Deno.errors.NotCapable || e instanceof Deno.errors.PermissionDenied) {
    return new MlxError("PermissionDenied", `reading ${path} needs --allow-read (e.g. --allow-read=${path})`, {
      cause: e,
    });
  }
  if (e instanceof Deno.errors.NotFound) {
    return new MlxError("InvalidArgument", `no file at ${path}; check the model path`, { cause: e });
  }
  return new MlxError("InvalidArgument", `cannot read ${path}: ${(e as Error)?.message ?? e}`, { cause: e });
}

/** Options of {@link uploadRange}. */
export interface UploadOptions {
  /** Bytes read and written per step (default 8 MiB): host memory used stays at one chunk. */
  readonly chunkBytes?: number | undefined;
}

/**
 * Copies `byteLength` bytes at `offset` of `source` into a new device buffer of `dtype` and
 * `shape`, one chunk at a time.
 */
export function uploadRange(
  device: MlxDevice,
  source: ByteSource,
  offset: number,
  byteLength: number,
  dtype: DType,
  shape: readonly number[],
  options: UploadOptions = {},
): MlxBuffer {
  const chunk = options.chunkBytes ?? 8 << 20;
  if (!Number.isSafeInteger(chunk) || chunk <= 0) {
    throw new MlxError("InvalidArgument", `chunkBytes must be a positive integer (got ${chunk})`);
  }
  if (!(Number.isSafeInteger(offset) && Number.isSafeInteger(byteLength) && offset >= 0 && byteLength > 0)) {
    throw new MlxError("InvalidArgument", `cannot upload ${byteLength} bytes at ${offset}`);
  }
  if (offset + byteLength > source.size) {
    throw new MlxError(
      "InvalidArgument",
      `${source.label} is truncated: bytes ${offset}..${offset + byteLength} are past its end (${source.size} bytes)`,
    );
  }
  const buffer = device.alloc(byteLength, dtype, shape);
  try {
    const staging = new Uint8Array(Math.min(chunk, byteLength));
    for (let done = 0; done < byteLength; done += staging.length) {
      const part = staging.subarray(0, Math.min(staging.length, byteLength - done));
      source.readInto(offset + done, part);
      buffer.writeBytes(part, done);
    }
  } catch (e) {
    buffer.dispose();
    throw e;
  }
  return buffer;
}
