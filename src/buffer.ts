/**
 * MlxBuffer: a device allocation or an exact slice of one, with typed host reads and writes.
 *
 * @module
 */

import {
  bf16BitsToF32,
  DType,
  dtypeSize,
  f16BitsToF32,
  f32ToBf16Bits,
  f32ToF16Bits,
  type HostArray,
  isDType,
} from "./dtype.ts";
import { MlxError } from "./errors.ts";
import type { NativeSymbols } from "./native/ffi.ts";
import { check } from "./native/status.ts";

import type { MemRange } from "./graph/ranges.ts";
export type { MemRange };

/** What a buffer needs from its device (implemented by MlxDevice). */
export interface BufferHost {
  /** Native symbols of the device's library. */
  readonly sym: NativeSymbols;
  /** Native device pointer; throws Disposed when the device is closed. */
  devicePtr(): Deno.PointerObject;
  /** Frees a native buffer once nothing pending still needs its handle. */
  releaseBuffer(handle: number): void;
  /** Queues a free from a finalizer (runs at a safe point later). */
  deferFree(handle: number): void;
}

/** Shared by an allocation and all of its slices. */
interface AllocationState {
  handle: number; // 0 once disposed
  readonly allocId: number;
  readonly byteLength: number;
}

let nextAllocId = 1;

/** An allocation and its device, as the finalizer and {@link liveAllocation} hold it. */
interface HeldAllocation {
  readonly host: BufferHost;
  readonly state: AllocationState;
  /** The allocation's dtype as allocated (the dtype of a whole view made from its handle). */
  readonly dtype: DType;
  /** The view whose collection frees the allocation (weak, so that it can be collected). */
  owner: WeakRef<MlxBuffer>;
}

// Live allocations by id: a range given as [allocation id, start, end) names its buffer only by id,
// and the native tracker needs the handle (barrierBetween / trackDispatch on a direct encoder).
const liveAllocations = new Map<number, HeldAllocation>();
// Live allocations by native handle, per device: a recorded pass names its buffers only by handle.
const liveHandles = new WeakMap<object, Map<number, HeldAllocation>>();

// Recorded passes not yet committed or dropped. Their stream words name buffers by handle only, and
// the handles are not in any native command buffer yet: while one is open, the frees of collected
// buffers wait (a command buffer keeps every buffer it binds alive, a recording one too).
let openCaptures = 0;
let heldBack: HeldAllocation[] = [];

/** Takes a live allocation out of the by-id and by-handle maps (before its handle is freed). */
function forgetLive(host: BufferHost, state: AllocationState): void {
  liveAllocations.delete(state.allocId);
  liveHandles.get(host)?.delete(state.handle);
}

/** Frees a collected allocation (a no-op once disposed or freed). */
function freeCollected(held: HeldAllocation): void {
  const { host, state } = held;
  if (state.handle === 0) return;
  forgetLive(host, state);
  host.deferFree(state.handle);
  state.handle = 0;
}

const finalizer = new FinalizationRegistry<HeldAllocation>((held) => {
  if (held.owner.deref() !== undefined) return; // a view made from its handle took the allocation over
  if (openCaptures > 0) heldBack.push(held);
  else freeCollected(held);
});

function captureEnded(): void {
  if (--openCaptures > 0 || heldBack.length === 0) return;
  const list = heldBack;
  heldBack = [];
  for (const held of list) if (held.owner.deref() === undefined) freeCollected(held);
}

/** @ignore Internal: whether the recording that uses an object (see {@link watchCaptures}) is open. */
export interface CaptureLife {
  /** Between {@link beginCapture} and {@link endCapture}. */
  open: boolean;
}

// A recording dropped without being ended (its session was never finished or disposed) ends when
// the object it recorded into is collected.
const captureCleanup = new FinalizationRegistry<CaptureLife>((life) => {
  if (!life.open) return;
  life.open = false;
  captureEnded();
});

/**
 * @ignore Internal: `life` tells whether a recording into `owner` is open; `owner` is reused by one
 * recording after another and registered once, so that a recording costs no registration.
 */
export function watchCaptures(owner: object, life: CaptureLife): void {
  captureCleanup.register(owner, life);
}

/**
 * @ignore Internal: a recording begins: until {@link endCapture} (or until the object its `life`
 * belongs to is collected), no collected buffer's allocation is freed.
 */
export function beginCapture(life: CaptureLife): void {
  if (life.open) return;
  life.open = true;
  openCaptures++;
}

/** @ignore Internal: the recording ended. */
export function endCapture(life: CaptureLife): void {
  if (!life.open) return;
  life.open = false;
  captureEnded();
}

// The device of a buffer (set in MlxBuffer's static block: the field is private).
let hostOf: (b: MlxBuffer) => BufferHost;

/**
 * @ignore Internal: views of the live allocations of one device by native handle (a recorded pass
 * names its buffers only by handle).
 */
export class HandleViews {
  readonly #host: BufferHost;
  readonly #handles: Map<number, HeldAllocation> | undefined;
  // The allocation last looked up: a pass binds many ranges of few allocations.
  #lastHandle = 0;
  #lastHeld: HeldAllocation | undefined;
  #lastOwner: MlxBuffer | undefined;

  /** The views of the device `probe` lives on. */
  constructor(probe: MlxBuffer) {
    this.#host = hostOf(probe);
    this.#handles = liveHandles.get(this.#host);
  }

  /**
   * A view of bytes `[byteOffset, byteOffset + byteLength)` of the live allocation with native
   * handle `handle` (`byteLength` -1: the whole allocation), or undefined when no live allocation of
   * the device has that handle. A whole allocation is its owning view itself; a slice is a view (the
   * allocation's dtype where the range is aligned to it, else u8) that keeps the allocation alive as
   * slices do, shared with earlier calls for the same range. An allocation whose last view was
   * collected while a recording held its free back gets a new owning view.
   */
  view(handle: number, byteOffset: number, byteLength: number): MlxBuffer | undefined {
    let held = this.#lastHeld, owner = this.#lastOwner;
    if (handle !== this.#lastHandle || held === undefined || held.state.handle !== handle) {
      held = handle === 0 ? undefined : this.#handles?.get(handle);
      if (held === undefined || held.state.handle !== handle) return undefined;
      owner = held.owner.deref();
      if (owner === undefined) {
        owner = new MlxBuffer(this.#host, held.state, 0, held.state.byteLength, held.dtype, undefined);
        held.owner = new WeakRef(owner);
        finalizer.register(owner, held, owner);
      }
      this.#lastHandle = handle;
      this.#lastHeld = held;
      this.#lastOwner = owner;
    }
    if (byteLength < 0 || (byteOffset === 0 && byteLength === held.state.byteLength)) return owner;
    return owner!.ownedSlice(byteOffset, byteLength, held.dtype);
  }
}
// Most slices an owning view keeps for reuse (then it starts over).
const MAX_OWNED_SLICES = 1024;

/**
 * @ignore Internal: the native handle and size of allocation `allocId` if it is live on `host`
 * (undefined when it was disposed, collected, never existed or belongs to another device).
 */
export function liveAllocation(
  allocId: number,
  host: object,
): { readonly handle: number; readonly byteLength: number } | undefined {
  const held = liveAllocations.get(allocId);
  return held !== undefined && held.host === host && held.state.handle !== 0 ? held.state : undefined;
}

// The shapes of views without an explicit shape are `[elements]`, frozen: views of one length
// share one array (a direct-mapped table, so a view costs no array and no freeze once its length
// was seen; a collision just replaces the entry).
const FLAT_SHAPE_SLOTS = 512;
const flatShapes: (readonly number[] | undefined)[] = new Array(FLAT_SHAPE_SLOTS).fill(undefined);

function flatShape(elements: number): readonly number[] {
  const slot = (elements ^ (elements >>> 9) ^ (elements >>> 18)) & (FLAT_SHAPE_SLOTS - 1);
  const shape = flatShapes[slot];
  if (shape !== undefined && shape[0] === elements) return shape;
  return flatShapes[slot] = Object.freeze([elements]);
}

/** A frozen copy of a caller's shape (already checked by {@link checkShape}: an array of integers). */
function frozenCopy(shape: readonly number[]): readonly number[] {
  const copy: number[] = [];
  for (let i = 0; i < shape.length; i++) copy.push(shape[i]!);
  return Object.freeze(copy);
}

/** Typed data accepted by {@link MlxBuffer.write}. */
export type HostData = ArrayLike<number> | ArrayBufferView;

/**
 * @ignore Internal: throws InvalidArgument unless `shape` is a list of safe non-negative integers (no
 * holes) whose elements of `dtype` fit in `byteLength` bytes.
 */
export function checkShape(op: string, shape: readonly number[], dtype: DType, byteLength: number): void {
  let n = 1, ok = Array.isArray(shape);
  for (let i = 0; ok && i < shape.length; i++) {
    const d = shape[i];
    ok = Number.isSafeInteger(d) && d! >= 0;
    n *= ok ? d! : 1;
  }
  const text = Array.isArray(shape) ? Array.from(shape, String).join(",") : String(shape);
  if (!ok) {
    throw new MlxError("InvalidArgument", `${op}: shape [${text}] must be an array of non-negative integers`);
  }
  if (n * dtypeSize(dtype) > byteLength) {
    throw new MlxError(
      "InvalidArgument",
      `${op}: shape [${text}] of ${dtype} needs ${n * dtypeSize(dtype)} bytes, more than ${byteLength}`,
    );
  }
}

let disposals = 0;

/**
 * @ignore Internal: how many allocations were disposed so far in this process. Whoever keeps
 * native handles across calls (a frozen pass) checks its buffers again only when this moved: a
 * handle's generation tag alone can wrap after thousands of reuses of one table slot.
 */
export function disposalCount(): number {
  return disposals;
}

/**
 * A zero-filled device allocation, or a slice view `[byteOffset, byteOffset + byteLength)` of one.
 * Slices share their parent's allocation; binding a slice binds exactly its bytes.
 *
 * Units: sizes and offsets of memory (`device.alloc`, {@link MlxBuffer.slice}, `byteOffset`,
 * `byteLength`, {@link MlxBuffer.writeBytes}) count **bytes**; data operations ({@link MlxBuffer.write}'s
 * offset, {@link MlxBuffer.length}, `shape`) count **elements** of the buffer's dtype.
 *
 * @example
 * ```ts
 * import { DType, MlxDevice } from "@mlxn/mlx-native";
 * using device = MlxDevice.open({ backend: "cpu" });
 * using buf = device.upload(new Float32Array([1, 2, 3, 4]));
 * const tail = buf.slice(8, 8); // elements 2..3
 * console.log(tail.read()); // Float32Array [3, 4]
 * ```
 */
export class MlxBuffer {
  /** Element type. */
  readonly dtype: DType;
  /** Logical shape (elements). */
  readonly shape: readonly number[];
  /** Byte offset of this view within its allocation. */
  readonly byteOffset: number;
  /** Bytes this view covers. */
  readonly byteLength: number;
  readonly #host: BufferHost;
  readonly #state: AllocationState;
  readonly #root: MlxBuffer | undefined; // keeps the allocation alive while a slice lives
  readonly #whole: boolean;

  #ownedSlices: Map<number, MlxBuffer> | undefined; // by offset, when this view owns its allocation

  static {
    hostOf = (b) => b.#host;
  }

  /** @ignore Internal: Use MlxDevice.alloc / upload / MlxBuffer.slice. */
  constructor(
    host: BufferHost,
    state: AllocationState | number,
    byteOffset: number,
    byteLength: number,
    dtype: DType,
    shape: readonly number[] | undefined,
    root?: MlxBuffer,
  ) {
    this.#host = host;
    if (typeof state === "number") {
      this.#state = { handle: state, allocId: nextAllocId++, byteLength };
      const held: HeldAllocation = { host, state: this.#state, dtype, owner: new WeakRef(this) };
      finalizer.register(this, held, this);
      liveAllocations.set(this.#state.allocId, held);
      let handles = liveHandles.get(host);
      if (handles === undefined) liveHandles.set(host, handles = new Map());
      handles.set(state, held);
    } else {
      this.#state = state;
    }
    this.byteOffset = byteOffset;
    this.byteLength = byteLength;
    this.#whole = byteOffset === 0 && byteLength === this.#state.byteLength;
    this.dtype = dtype;
    this.shape = shape ? frozenCopy(shape) : flatShape(Math.floor(byteLength / dtypeSize(dtype)));
    this.#root = root;
  }

  /**
   * @ignore Internal: on the view that owns its allocation, a view of bytes `[byteOffset,
   * byteOffset + byteLength)` of it (`allocDType` where aligned to it, else u8), shared with earlier
   * calls for the same bytes (see HandleViews).
   */
  ownedSlice(byteOffset: number, byteLength: number, allocDType: DType): MlxBuffer {
    const cache = this.#ownedSlices ??= new Map();
    const hit = cache.get(byteOffset);
    if (hit !== undefined && hit.byteLength === byteLength) return hit;
    const es = dtypeSize(allocDType);
    const dtype = byteOffset % es === 0 && byteLength % es === 0 ? allocDType : DType.U8;
    const view = new MlxBuffer(this.#host, this.#state, byteOffset, byteLength, dtype, undefined, this);
    if (cache.size >= MAX_OWNED_SLICES) cache.clear();
    cache.set(byteOffset, view);
    return view;
  }

  /** Native handle; throws Disposed when the allocation was freed. */
  get handle(): number {
    const h = this.#state.handle;
    if (h === 0) throw this.#disposedError();
    return h;
  }

  /** @ignore Internal: Native handle or 0 when disposed (no throw: for the encoder's hot path). */
  get rawHandle(): number {
    return this.#state.handle;
  }

  /** @ignore Internal: Whether this view covers its whole allocation (the stream's compact binding record). */
  get isWholeAllocation(): boolean {
    return this.#whole;
  }

  /** Identity of the allocation, shared by every slice of it (for memory ranges). */
  get allocId(): number {
    return this.#state.allocId;
  }

  /** Number of elements this view covers. */
  get length(): number {
    return Math.floor(this.byteLength / dtypeSize(this.dtype));
  }

  /** Whether the allocation has been disposed. */
  get disposed(): boolean {
    return this.#state.handle === 0;
  }

  /** The bytes this view covers, as a memory range. */
  range(): MemRange {
    return [this.#state.allocId, this.byteOffset, this.byteOffset + this.byteLength];
  }

  /**
   * A view of `byteLength` **bytes** starting `byteOffset` **bytes** into this view (both in bytes,
   * unlike {@link MlxBuffer.write}). The offset must be a multiple of the element size of the view's
   * dtype.
   */
  slice(byteOffset: number, byteLength: number, options?: { dtype?: DType; shape?: readonly number[] }): MlxBuffer {
    let dtype = this.dtype;
    let shape: readonly number[] | undefined;
    if (options !== undefined) {
      dtype = options.dtype ?? dtype;
      if (dtype !== this.dtype && !isDType(dtype)) {
        throw new MlxError("InvalidArgument", `slice: unknown dtype ${String(dtype)}`);
      }
      shape = options.shape;
    }
    if (
      !Number.isSafeInteger(byteOffset) || !Number.isSafeInteger(byteLength) || byteOffset < 0 ||
      byteLength < 0 || byteOffset + byteLength > this.byteLength
    ) {
      throw new MlxError(
        "InvalidArgument",
        `slice [${byteOffset}, ${byteOffset + byteLength}) is outside this ${this.byteLength}-byte view: ` +
          `pass an offset and length within it`,
      );
    }
    const es = dtypeSize(dtype);
    if ((this.byteOffset + byteOffset) % es !== 0 || byteLength % es !== 0) {
      throw new MlxError(
        "InvalidArgument",
        `slice offset ${this.byteOffset + byteOffset} and length ${byteLength} must be multiples of ` +
          `${es} bytes for ${dtype}`,
      );
    }
    if (shape !== undefined) checkShape("slice", shape, dtype, byteLength);
    if (this.#state.handle === 0) throw this.#disposedError();
    return new MlxBuffer(
      this.#host,
      this.#state,
      this.byteOffset + byteOffset,
      byteLength,
      dtype,
      shape,
      this.#root ?? this,
    );
  }

  /**
   * Writes host data at `elementOffset` **elements** (not bytes) into this view. Float32Array or plain numbers are
   * converted to the buffer's dtype (f16/bf16 round to nearest even); a Uint16Array written to an
   * f16/bf16 buffer is taken as raw bits.
   */
  write(data: HostData, elementOffset = 0): void {
    const bytes = toDeviceBytes(this.dtype, data);
    this.writeBytes(bytes, elementOffset * dtypeSize(this.dtype));
  }

  /** Writes raw bytes at `byteOffset` within this view. */
  writeBytes(bytes: Uint8Array, byteOffset = 0): void {
    if (!Number.isSafeInteger(byteOffset) || byteOffset < 0 || byteOffset + bytes.byteLength > this.byteLength) {
      throw new MlxError(
        "InvalidArgument",
        `write of ${bytes.byteLength} bytes at ${byteOffset} does not fit this ${this.byteLength}-byte view`,
      );
    }
    if (bytes.byteLength === 0) return;
    const sym = this.#host.sym;
    const rc = sym.mlxn_buffer_write(
      this.#host.devicePtr(),
      this.handle,
      BigInt(this.byteOffset + byteOffset),
      bytes,
      BigInt(bytes.byteLength),
    );
    check(sym, rc, "buffer write");
  }

  /** Copies this view's bytes to the host. */
  readBytes(): Uint8Array {
    const out = new Uint8Array(this.byteLength);
    this.readBytesInto(out);
    return out;
  }

  /**
   * Copies this view's bytes, as stored on the device (f16/bf16 not widened), into `target`, which
   * must be exactly as long in bytes. A token loop reads its logits into one reused array this way
   * instead of allocating a new one per token (garbage that would be collected inside a later encode).
   * Throws InvalidArgument for a target of another length.
   */
  readBytesInto(target: ArrayBufferView): void {
    if (!ArrayBuffer.isView(target) || target.byteLength !== this.byteLength) {
      throw new MlxError(
        "InvalidArgument",
        `readBytesInto: the target must be an ArrayBufferView of exactly ${this.byteLength} bytes (this view's length); ` +
          `got ${ArrayBuffer.isView(target) ? `${target.byteLength} bytes` : typeof target}`,
      );
    }
    const out = target instanceof Uint8Array
      ? target
      : new Uint8Array(target.buffer, target.byteOffset, target.byteLength);
    if (this.byteLength === 0) return;
    const sym = this.#host.sym;
    const rc = sym.mlxn_buffer_read(
      this.#host.devicePtr(),
      this.handle,
      BigInt(this.byteOffset),
      out,
      BigInt(this.byteLength),
    );
    check(sym, rc, "buffer read");
  }

  /** Copies this view to the host as a typed array of its dtype (f16/bf16 widen to f32). */
  read(): HostArray {
    return fromDeviceBytes(this.dtype, this.readBytes());
  }

  /**
   * Frees the allocation (from any view of it). If a committed command buffer still binds it, the
   * memory is released when that command buffer completes. Disposing twice is harmless.
   */
  dispose(): void {
    const h = this.#state.handle;
    if (h === 0) return;
    disposals++;
    const held = liveAllocations.get(this.#state.allocId);
    forgetLive(this.#host, this.#state);
    this.#state.handle = 0;
    finalizer.unregister(held?.owner.deref() ?? this.#root ?? this);
    this.#host.releaseBuffer(h);
  }

  /** Same as {@link MlxBuffer.dispose}. */
  [Symbol.dispose](): void {
    this.dispose();
  }

  #disposedError(): MlxError {
    return new MlxError(
      "Disposed",
      `buffer (allocation ${this.#state.allocId}, ${this.#state.byteLength} bytes) was disposed: allocate a new one`,
    );
  }
}

/** Host data → the bytes of a dtype. */
export function toDeviceBytes(dtype: DType, data: HostData): Uint8Array {
  let typed: ArrayBufferView;
  if (ArrayBuffer.isView(data)) {
    const isRaw16 = data instanceof Uint16Array && (dtype === DType.F16 || dtype === DType.BF16);
    if (isRaw16 || matchesDType(dtype, data)) typed = data;
    else typed = convert(dtype, data as unknown as ArrayLike<number>);
  } else {
    typed = convert(dtype, data);
  }
  return new Uint8Array(typed.buffer, typed.byteOffset, typed.byteLength);
}

function matchesDType(dtype: DType, v: ArrayBufferView): boolean {
  switch (dtype) {
    case DType.F32:
      return v instanceof Float32Array;
    case DType.U32:
      return v instanceof Uint32Array;
    case DType.I32:
      return v instanceof Int32Array;
    case DType.U16:
      return v instanceof Uint16Array;
    case DType.U8:
      return v instanceof Uint8Array;
    default:
      return false;
  }
}

function convert(dtype: DType, values: ArrayLike<number>): ArrayBufferView {
  switch (dtype) {
    case DType.F32:
      return Float32Array.from(values);
    case DType.F16:
      return f32ToF16Bits(values);
    case DType.BF16:
      return f32ToBf16Bits(values);
    case DType.U32:
      return Uint32Array.from(values);
    case DType.I32:
      return Int32Array.from(values);
    case DType.U16:
      return Uint16Array.from(values);
    case DType.U8:
      return Uint8Array.from(values);
  }
}

/** Device bytes of a dtype → a host typed array (f16/bf16 widen to f32). */
export function fromDeviceBytes(dtype: DType, bytes: Uint8Array): HostArray {
  const buf = bytes.buffer as ArrayBuffer;
  const n = Math.floor(bytes.byteLength / dtypeSize(dtype));
  switch (dtype) {
    case DType.F32:
      return new Float32Array(buf, bytes.byteOffset, n);
    case DType.F16:
      return f16BitsToF32(new Uint16Array(buf, bytes.byteOffset, n));
    case DType.BF16:
      return bf16BitsToF32(new Uint16Array(buf, bytes.byteOffset, n));
    case DType.U32:
      return new Uint32Array(buf, bytes.byteOffset, n);
    case DType.I32:
      return new Int32Array(buf, bytes.byteOffset, n);
    case DType.U16:
      return new Uint16Array(buf, bytes.byteOffset, n);
    case DType.U8:
      return bytes;
  }
}
