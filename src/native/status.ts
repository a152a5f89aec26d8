/**
 * Turns native status codes and error text into MlxError.
 *
 * @module
 */

import { MlxError, type MlxErrorCode } from "../errors.ts";
import { Status } from "./abi.ts";
import type { NativeSymbols } from "./ffi.ts";

const textBuf = new Uint8Array(2048);
const decoder = new TextDecoder();

/** The calling thread's last native error message. */
export function lastErrorText(sym: NativeSymbols): string {
  const n = sym.mlxn_last_error(textBuf, textBuf.length);
  return decoder.decode(textBuf.subarray(0, Math.min(n, textBuf.length - 1)));
}

/** Reads a length-returning text getter (`fn(buf, cap) → full length`) into a string. */
export function readText(fill: (buf: Uint8Array, cap: number) => number): string {
  const n = fill(textBuf, textBuf.length);
  return decoder.decode(textBuf.subarray(0, Math.min(n, textBuf.length - 1)));
}

/** The MlxError code of a native status. */
export function codeOf(status: number): MlxErrorCode {
  switch (status) {
    case Status.E_OUT_OF_MEMORY:
      return "OutOfMemory";
    case Status.E_STREAM:
      return "StreamError";
    case Status.E_STATE:
      return "InvalidState";
    case Status.E_EXECUTION:
      return "CommandBufferError";
    case Status.E_UNSUPPORTED:
      return "Unsupported";
    case Status.E_DEVICE:
      return "DeviceError";
    default:
      return "InvalidArgument";
  }
}

/** Throws the native error as an MlxError unless `status` is OK. */
export function check(sym: NativeSymbols, status: number, what: string): void {
  if (status === Status.OK) return;
  throw new MlxError(codeOf(status), `${what}: ${lastErrorText(sym)}`);
}
