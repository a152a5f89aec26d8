/**
 * MlxDevice: opens a backend (metal, cuda or cpu; best available by default), allocates buffers and
 * creates command encoders.
 *
 * @module
 */

import { checkShape, type HostData, MlxBuffer, toDeviceBytes } from "./buffer.ts";
import { dropAllTemplates, dropTemplatesBinding } from "./command_template.ts";
import { type BackendName, envConfig } from "./config.ts";
import { DType, dtypeSize, isDType } from "./dtype.ts";
import type { CommandBufferSlot } from "./command_buffer.ts";
import { CommandEncoder, type EncoderOptions } from "./encoder.ts";
import { KernelRegistry } from "./kernels.ts";
import { MlxError } from "./errors.ts";
import { Flag, Live } from "./native/abi.ts";
import type { NativeSymbols } from "./native/ffi.ts";
import { defaultLibraryPath, ffiGranted, loadLibrary, type NativeLibrary } from "./native/loader.ts";
import { check, lastErrorText, readText } from "./native/status.ts";
import { StreamWriter } from "./native/stream.ts";
import { prepareTraceFile, Profiler } from "./profile.ts";

/** Options of {@link MlxDevice.open}; each overrides the matching environment switch. */
export interface DeviceOptions {
  /** Backend; default MLXN_BACKEND, else the best available (metal > cuda > cpu). */
  backend?: BackendName | undefined;
  /** Native library path; default MLXN_LIB, else the module's build/ directory. */
  libPath?: string | undefined;
  /** false = serial dispatch (MLXN_CONCURRENCY=0). */
  concurrency?: boolean | undefined;
  /** CPU backend worker threads; 0 = one per core. */
  threads?: number | undefined;
  /** Collect per-dispatch timings (same as profile: "dispatch"). */
  profileDispatches?: boolean | undefined;
  /** MLXN_PROFILE: per-label command-buffer times ("cb"), plus per-dispatch timings ("dispatch"). */
  profile?: "cb" | "dispatch" | undefined;
  /** MLXN_TRACE: write a Chrome trace / Perfetto JSON file here on close (needs --allow-write). */
  trace?: string | undefined;
  /** CUDA: use CUDA graphs (MLXN_CUDA_GRAPHS). */
  cudaGraphs?: boolean | undefined;
  /**
   * CUDA (compute capability 9.0+): let a dependent kernel launch while its producers still run,
   * waiting in-kernel for their results (programmatic dependent launch; MLXN_CUDA_PDL).
   */
  cudaPdl?: boolean | undefined;
  /** Check every command buffer for missing barriers at commit (MLXN_VALIDATE=1). */
  validate?: boolean | undefined;
  /**
   * Microseconds a blocking wait for a command buffer (`waitUntilCompleted`, `commit({ wait })`,
   * a session's `finish`, a DecodeLoop's oldest pass) first polls it before the thread sleeps,
   * 0 … 1,000,000 (default 0: sleep at once). A thread that sleeps through a pass wakes on a core that
   * may have dropped its clock and caches: a sync token loop then encodes its next pass slower and
   * sees its completion later. Polling keeps the core busy for up to this long per wait, so set it
   * near the pass's device time only where a core can be spared.
   */
  waitSpinUs?: number | undefined;
}

/** What the native device reports about itself. */
export interface DeviceInfo {
  /** Backend name. */
  readonly backend: BackendName;
  /** Human-readable device name. */
  readonly name: string;
  /** Most threads in one threadgroup. */
  readonly maxThreadsPerGroup: number;
  /** Most threadgroup memory bytes. */
  readonly maxThreadgroupMemory: number;
  /** Whether host and device share memory. */
  readonly unifiedMemory: boolean;
  /** Whether dispatches run serially. */
  readonly serial: boolean;
  /** Whether per-dispatch timings are available (collected while profiling dispatches). */
  readonly perDispatchTiming: boolean;
  /** Backend-specific extras. */
  readonly [key: string]: unknown;
}

/** Live native objects across the process (for leak checks). */
export interface LiveObjects {
  /** Open devices. */
  devices: number;
  /** Buffers, including those whose free is deferred. */
  buffers: number;
  /** Bytes held by those buffers. */
  bufferBytes: number;
  /**
   * Command buffers not yet freed, including the decoded records (templates) that frozen passes
   * keep (one per command buffer they commit), that a plan cache keeps for plans it replays (at most
   * two per plan) and that a running DecodeLoop keeps of direct passes that repeat byte for byte (at
   * most four); those go with the frozen pass, the cached plan, the loop's run, or any buffer they
   * bind.
   */
  commandBuffers: number;
}

const noticeShown = new Set<string>();

/** The longest poll a blocking wait may make (1 s): past it, sleeping costs nothing worth saving. */
const MAX_WAIT_SPIN_US = 1_000_000;

interface ProfileSettings {
  enabled: boolean;
  dispatches: boolean;
  tracePath: string | undefined;
  traceUndo: string;
}

/**
 * The command buffers whose streams may hold unflushed records. It holds their slots, never their
 * encoders, so an encoder dropped without commit or dispose stays collectable (its finalizer then
 * removes the slot). Each slot knows its index: adding and removing are O(1) and allocate nothing.
 */
class OpenCommandBuffers {
  readonly #slots: CommandBufferSlot[] = [];

  add(cb: CommandBufferSlot): void {
    cb.openIndex = this.#slots.length;
    this.#slots.push(cb);
  }

  delete(cb: CommandBufferSlot): void {
    const i = cb.openIndex;
    if (i < 0 || this.#slots[i] !== cb) return;
    cb.openIndex = -1;
    const last = this.#slots.pop()!;
    if (last !== cb) {
      this.#slots[i] = last;
      last.openIndex = i;
    }
  }

  /**
   * Hands every open stream's records to the native library. Never throws: a stream the library
   * rejects leaves the list with its error kept in its slot, and its own encoder reports it.
   */
  flushAll(): void {
    const slots = this.#slots;
    // Backwards: a slot that fails leaves the list by swapping in the last one, already flushed.
    for (let i = slots.length - 1; i >= 0; i--) {
      try {
        slots[i]?.flush();
      } catch (e) {
        if (!(e instanceof MlxError)) throw e;
      }
    }
  }

  /** Drops every open command buffer without running it. */
  abandonAll(): void {
    for (const cb of [...this.#slots]) cb.abandon();
  }
}

const CANDIDATES: readonly BackendName[] = Deno.build.os === "darwin" ? ["metal", "cpu"] : ["cuda", "cpu"];

const deviceCleanup = new FinalizationRegistry<{ sym: NativeSymbols; ptr: Deno.PointerObject }>(
  ({ sym, ptr }) => sym.mlxn_device_close(ptr),
);

/**
 * A compute device on one backend.
 *
 * @example
 * ```ts
 * import { DType, MlxDevice } from "@mlxn/mlx-native";
 * using device = MlxDevice.open(); // best available backend
 * console.log(device.backend, device.info.name);
 * using x = device.alloc(4 * 1024, DType.F32, [1024]); // zero-filled
 * ```
 */
export class MlxDevice {
  /** @ignore Internal: Native symbols. */
  readonly sym: NativeSymbols;
  /** Path of the native library in use. */
  readonly libraryPath: string;
  /** Whether per-dispatch timings are collected. */
  readonly profileDispatches: boolean;
  /** What the device reports about itself. */
  readonly info: DeviceInfo;
  /** Whether command encoders validate hazards at commit by default. */
  readonly validate: boolean;
  /** Microseconds a blocking wait polls before it sleeps (see {@link DeviceOptions.waitSpinUs}). */
  readonly waitSpinUs: number;
  /** Profiler fed by this device's command buffers (null when profiling is off). */
  readonly profiler: Profiler | null;
  #ptr: Deno.PointerObject | null;
  #kernels: KernelRegistry | undefined;
  readonly #writers: StreamWriter[] = [];
  readonly #open = new OpenCommandBuffers();
  #deferred: number[] = [];
  #closingTraced = false;

  private constructor(
    lib: NativeLibrary,
    ptr: Deno.PointerObject,
    prof: ProfileSettings,
    validate: boolean,
    waitSpinUs: number,
  ) {
    this.sym = lib.symbols;
    this.validate = validate;
    this.waitSpinUs = waitSpinUs;
    this.libraryPath = lib.path;
    this.#ptr = ptr;
    this.info = JSON.parse(readText((b, cap) => lib.symbols.mlxn_device_info(ptr, b, cap))) as DeviceInfo;
    this.profiler = prof.enabled
      ? new Profiler({
        dispatches: prof.dispatches,
        tracePath: prof.tracePath,
        traceUndo: prof.traceUndo,
        backend: this.info.backend,
      })
      : null;
    this.profileDispatches = this.profiler?.dispatches ?? false;
    if (this.profileDispatches && !this.info.perDispatchTiming && !noticeShown.has(this.info.backend)) {
      noticeShown.add(this.info.backend);
      console.warn(
        `mlx-native: the ${this.info.backend} backend has no per-dispatch timings; ` +
          `command-buffer times are still collected`,
      );
    }
    deviceCleanup.register(this, { sym: lib.symbols, ptr }, this);
  }

  /**
   * Opens a device. Needs `--allow-ffi` (scoped to the library path is enough). Environment
   * switches apply only when `--allow-env` already grants them.
   */
  static open(options: DeviceOptions = {}): MlxDevice {
    const env = envConfig();
    const explicit = options.backend ?? env.backend;
    if (explicit !== undefined && !CANDIDATES.includes(explicit) && explicit !== "cpu" && explicit !== "metal-emu") {
      throw new MlxError("Unsupported", `backend '${explicit}' is not available on ${Deno.build.os}`);
    }
    const libPath = options.libPath ?? env.lib;
    const concurrency = options.concurrency ?? env.concurrency;
    const threads = options.threads ?? 0;
    if ((threads >>> 0) !== threads) throw new MlxError("InvalidArgument", `threads must be a non-negative integer`);
    const level = options.profile ?? (options.profileDispatches ? "dispatch" : undefined) ?? env.profile;
    const tracePath = options.trace ?? env.trace;
    const flags = (concurrency ? 0 : Flag.SERIAL) | ((options.cudaGraphs ?? env.cudaGraphs) ? 0 : Flag.NO_GRAPHS) |
      ((options.cudaPdl ?? env.cudaPdl) ? 0 : Flag.NO_PDL) |
      (level === "dispatch" || tracePath !== undefined ? Flag.DISPATCH_TIMING : 0);
    const traceUndo = options.trace !== undefined ? "drop the trace option" : "unset MLXN_TRACE";
    if (tracePath !== undefined) prepareTraceFile(tracePath, traceUndo); // fail now, not after the run
    const profile: ProfileSettings = {
      enabled: level !== undefined || tracePath !== undefined,
      dispatches: level === "dispatch",
      tracePath,
      traceUndo,
    };
    const validate = options.validate ?? env.validate;
    const spin = options.waitSpinUs ?? 0;
    if (typeof spin !== "number" || !(spin >= 0 && spin <= MAX_WAIT_SPIN_US)) {
      throw new MlxError(
        "InvalidArgument",
        `waitSpinUs must be a number of microseconds in 0..${MAX_WAIT_SPIN_US}, got ${String(spin)}: ` +
          `0 sleeps at once, a pass's device time polls through it`,
      );
    }

    if (libPath !== undefined || explicit !== undefined) {
      const path = libPath ?? defaultLibraryPath(explicit!);
      return MlxDevice.#openLibrary(loadLibrary(path), flags, threads, profile, validate, spin);
    }
    // Best available: the first candidate whose library is permitted, present and opens a device.
    let firstError: MlxError | undefined;
    for (const backend of CANDIDATES) {
      const path = defaultLibraryPath(backend);
      const last = backend === CANDIDATES[CANDIDATES.length - 1];
      if (!last && !ffiGranted(path)) continue;
      try {
        return MlxDevice.#openLibrary(loadLibrary(path), flags, threads, profile, validate, spin);
      } catch (e) {
        if (!(e instanceof MlxError) || last) throw e;
        firstError ??= e;
      }
    }
    throw firstError!;
  }

  static #openLibrary(
    lib: NativeLibrary,
    flags: number,
    threads: number,
    profile: ProfileSettings,
    validate: boolean,
    waitSpinUs: number,
  ): MlxDevice {
    const ptr = lib.symbols.mlxn_device_open(flags, threads);
    if (ptr === null) {
      throw new MlxError("DeviceError", `could not open a device with ${lib.path}: ${lastErrorText(lib.symbols)}`);
    }
    return new MlxDevice(lib, ptr, profile, validate, waitSpinUs);
  }

  /** Live native objects of every device in the process (a library must be loaded). */
  static liveObjects(device: MlxDevice): LiveObjects {
    const out = new BigUint64Array(Live.COUNT);
    device.sym.mlxn_live_objects(out, out.length);
    return {
      devices: Number(out[Live.DEVICES]),
      buffers: Number(out[Live.BUFFERS]),
      bufferBytes: Number(out[Live.BUFFER_BYTES]),
      commandBuffers: Number(out[Live.CMDBUFS]),
    };
  }

  /** Reads the device's self-description again (backends report live counters in it). */
  queryInfo(): DeviceInfo {
    const ptr = this.devicePtr();
    return JSON.parse(readText((b, cap) => this.sym.mlxn_device_info(ptr, b, cap))) as DeviceInfo;
  }

  /** Backend of this device. */
  get backend(): BackendName {
    return this.info.backend;
  }

  /** Whether {@link MlxDevice.close} was called. */
  get closed(): boolean {
    return this.#ptr === null;
  }

  /** @ignore Internal: The native device pointer; throws Disposed after close. */
  devicePtr(): Deno.PointerObject {
    if (this.#ptr === null) {
      throw new MlxError("Disposed", "the device was closed: open a new one with MlxDevice.open()");
    }
    return this.#ptr;
  }

  /**
   * A zero-filled buffer of `byteLength` **bytes** (not elements: 1024 f32 values take 4096 bytes)
   * holding `dtype` elements (default f32, like {@link MlxDevice.upload} of float data), with an
   * optional logical shape in elements. `byteLength` must be a whole number of elements.
   */
  alloc(byteLength: number, dtype: DType = DType.F32, shape?: readonly number[]): MlxBuffer {
    if (!isDType(dtype)) throw new MlxError("InvalidArgument", `alloc: unknown dtype ${String(dtype)}`);
    if (!Number.isSafeInteger(byteLength) || byteLength <= 0) {
      throw new MlxError("InvalidArgument", `alloc: byteLength must be a positive integer, got ${byteLength}`);
    }
    if (byteLength % dtypeSize(dtype) !== 0) {
      throw new MlxError("InvalidArgument", `alloc: ${byteLength} bytes is not a whole number of ${dtype} elements`);
    }
    if (shape !== undefined) checkShape("alloc", shape, dtype, byteLength);
    this.#drainDeferred();
    const handle = this.sym.mlxn_buffer_alloc(this.devicePtr(), BigInt(byteLength));
    if (handle === 0) {
      throw new MlxError("OutOfMemory", `alloc of ${byteLength} bytes failed: ${lastErrorText(this.sym)}`);
    }
    return new MlxBuffer(this, handle, 0, byteLength, dtype, shape);
  }

  /**
   * A new buffer holding `data` (its length counts **elements**), converted to `dtype` (default: f32
   * for float data and plain numbers, the integer type of an integer typed array).
   */
  upload(data: HostData, dtype?: DType, shape?: readonly number[]): MlxBuffer {
    const dt = dtype ?? inferDType(data);
    const bytes = toDeviceBytes(dt, data);
    if (bytes.byteLength === 0) throw new MlxError("InvalidArgument", "upload: data is empty");
    const buf = this.alloc(bytes.byteLength, dt, shape);
    buf.writeBytes(bytes);
    return buf;
  }

  /** The device's kernel registry (pipelines resolved once per name). */
  get kernels(): KernelRegistry {
    return this.#kernels ??= new KernelRegistry(this);
  }

  /** A new command encoder (one command buffer); validation defaults to the device's setting. */
  commandEncoder(options?: EncoderOptions): CommandEncoder {
    return new CommandEncoder(this, options); // throws Disposed after close
  }

  /**
   * Waits for all committed work, then frees the device and everything allocated on it; then writes
   * the trace file, if one was asked for (a write failure is an MlxError, after the device is freed).
   */
  close(): void {
    // The native device is freed first; a trace that cannot be written is reported afterwards.
    if (this.#ptr !== null && this.profiler?.tracePath !== undefined && !this.#closingTraced) {
      this.#closingTraced = true;
      this.close();
      this.profiler.writeTrace();
      return;
    }
    const ptr = this.#ptr;
    if (ptr === null) return;
    this.#open.abandonAll();
    dropAllTemplates(this);
    this.#ptr = null;
    deviceCleanup.unregister(this);
    this.sym.mlxn_device_close(ptr);
  }

  /** Same as {@link MlxDevice.close}. */
  [Symbol.dispose](): void {
    this.close();
  }

  /** @ignore Internal. */
  releaseBuffer(handle: number): void {
    if (this.#ptr === null) return;
    // Records still in an encoder's stream name this handle: hand them over first so the native
    // side holds its reference and defers the free until the command buffer completes.
    this.#open.flushAll(); // never throws: a rejected stream keeps its error for its own encoder
    check(this.sym, this.sym.mlxn_buffer_free(this.#ptr, handle), "buffer free");
    dropTemplatesBinding(this, handle); // their references would keep its memory
  }

  /** @ignore Internal. */
  deferFree(handle: number): void {
    if (this.#ptr !== null) this.#deferred.push(handle);
  }

  #drainDeferred(): void {
    if (this.#deferred.length === 0 || this.#ptr === null) return;
    const list = this.#deferred;
    this.#deferred = [];
    this.#open.flushAll();
    for (const h of list) {
      this.sym.mlxn_buffer_free(this.#ptr, h);
      dropTemplatesBinding(this, h);
    }
  }

  /** @ignore Internal. */
  takeWriter(): StreamWriter {
    return this.#writers.pop() ?? new StreamWriter();
  }

  /** @ignore Internal. */
  returnWriter(w: StreamWriter): void {
    if (this.#writers.length < 4) this.#writers.push(w);
  }

  /** @ignore Internal. */
  commandBufferOpened(cb: CommandBufferSlot): void {
    this.#open.add(cb);
  }

  /** @ignore Internal. */
  commandBufferClosed(cb: CommandBufferSlot, drain: boolean): void {
    this.#open.delete(cb);
    if (drain) this.#drainDeferred();
  }
}

function inferDType(data: HostData): DType {
  if (data instanceof Uint32Array) return DType.U32;
  if (data instanceof Int32Array) return DType.I32;
  if (data instanceof Uint16Array) return DType.U16;
  if (data instanceof Uint8Array) return DType.U8;
  return DType.F32;
}
