/**
 * The single error type of the module: every failure carries a machine-readable code and a message
 * that says what to do about it.
 *
 * @module
 */

/** What went wrong, as a stable machine-readable code. */
export type MlxErrorCode =
  | "PermissionDenied"
  | "LibraryNotFound"
  | "LibraryLoadFailed"
  | "AbiMismatch"
  | "KernelNotFound"
  | "InvalidArgument"
  | "OutOfMemory"
  | "CommandBufferError"
  | "HazardError"
  | "StreamError"
  | "InvalidState"
  | "Disposed"
  | "Unsupported"
  | "DeviceError";

/**
 * An error raised by mlx-native. `code` names the kind of failure; the message explains the cause
 * and the fix.
 *
 * @example
 * ```ts
 * import { MlxDevice, MlxError } from "@mlxn/mlx-native";
 * try {
 *   MlxDevice.open({ backend: "cpu" });
 * } catch (e) {
 *   if (e instanceof MlxError && e.code === "PermissionDenied") console.error(e.message);
 * }
 * ```
 */
export class MlxError extends Error {
  /** The kind of failure. */
  readonly code: MlxErrorCode;

  /** Creates an error with a code and an actionable message. */
  constructor(code: MlxErrorCode, message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "MlxError";
    this.code = code;
  }
}

/** Throws an InvalidArgument MlxError unless `cond` holds. */
export function require(cond: unknown, message: string): asserts cond {
  if (!cond) throw new MlxError("InvalidArgument", message);
}
