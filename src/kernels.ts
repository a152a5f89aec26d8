/**
 * Kernel contracts (one TypeScript description per kernel: slots, their kind and access mode) and
 * the KernelRegistry that resolves kernel names to native pipelines of a device.
 *
 * @module
 */

import { MlxError } from "./errors.ts";
import { CapturedOpKind } from "./graph/op_kind.ts";
import { Limits, RecordWords } from "./native/abi.ts";
import type { NativeSymbols } from "./native/ffi.ts";
import { lastErrorText, readText } from "./native/status.ts";

/** How a dispatch touches a buffer slot. */
export type Access = "read" | "write" | "readwrite";

/** One argument slot of a kernel. */
export interface SlotSpec {
  /** Name, for messages. */
  readonly name: string;
  /** A buffer, or inline constant bytes. */
  readonly kind: "buffer" | "bytes";
  /** For buffers: how the kernel accesses it. */
  readonly access?: Access;
  /** For buffers: the element type it holds (`blocks`: quantized blocks; `any`: set by a parameter field). */
  readonly dtype?: "f32" | "f16" | "bf16" | "u32" | "blocks" | "any";
  /** For buffers: may be left unbound. */
  readonly optional?: boolean;
  /** For bytes: exact size in bytes. */
  readonly size?: number;
  /**
   * For read buffers: the dispatch promises that no earlier dispatch of its command buffer writes
   * this buffer when bit(s) `mask` of u32 word `word` of bytes slot `slot` are set (a product's
   * constant weights, which a GPU backend may then read before the dispatch's producers finish).
   * Validation mode checks the promise.
   */
  readonly constantIf?: { readonly slot: number; readonly word: number; readonly mask: number };
}

/** The one description of a kernel that every backend implements. */
export interface KernelContract {
  /** Kernel name, identical in every backend. */
  readonly name: string;
  /** Argument slots in order. */
  readonly slots: readonly SlotSpec[];
  /** Op kind its dispatches carry. */
  readonly opKind: CapturedOpKind;
  /** Threadgroup memory the kernel reduces through: at least this many f32 per thread (0: none). */
  readonly tgFloatsPerThread?: number;
  /**
   * How threads map to work: one thread per element, one threadgroup per row (see
   * {@link rowThreadgroup}), or a mapping the op documents.
   */
  readonly geometry?: "elements" | "rows" | "custom";
}

/**
 * Threads per threadgroup of a row kernel (geometry "rows"): one threadgroup reduces one row of `cols`
 * by a tree over min(256, next_pow2(cols)) threads.
 */
export function rowThreadgroup(cols: number): number {
  // A u32 (what the row ops pass, checked) by its bit length: the doubling loop below took up to
  // eight turns per op.
  if ((cols >>> 0) === cols) return cols >= 256 ? 256 : cols <= 1 ? 1 : 1 << (32 - Math.clz32(cols - 1));
  let p = 1;
  while (p < cols && p < 256) p *= 2;
  return p;
}

/** The native signature string of a contract ('b' buffer, 'o' optional buffer, 'c' bytes). */
export function contractSignature(c: KernelContract): string {
  return c.slots.map((s) => s.kind === "bytes" ? "c" : s.optional ? "o" : "b").join("");
}

/** A kernel resolved on a device: its native handle and contract. */
export class Pipeline {
  /** Kernel name. */
  readonly name: string;
  /** Native pipeline handle. */
  readonly handle: number;
  /** The kernel's contract. */
  readonly contract: KernelContract;
  /**
   * @ignore The contract as one small integer per slot, for the encoder's single-pass writer:
   * {@link SLOT_BUFFER}, {@link SLOT_OPTIONAL_BUFFER}, or for inline bytes their exact size in
   * bytes (0 when any size up to the limit is accepted).
   */
  readonly slotPlan: readonly number[];
  /** @ignore Most stream words one dispatch of this pipeline can take. */
  readonly maxDispatchWords: number;

  /** @ignore Created by KernelRegistry. */
  constructor(name: string, handle: number, contract: KernelContract) {
    this.name = name;
    this.handle = handle;
    this.contract = contract;
    this.slotPlan = contract.slots.map((s) =>
      s.kind === "buffer" ? (s.optional ? SLOT_OPTIONAL_BUFFER : SLOT_BUFFER) : s.size ?? 0
    );
    // SET_PIPELINE + SET_TG_MEMORY + DISPATCH, and per slot the largest record it can take.
    const bytesWords = (n: number) => RecordWords.SET_BYTES_HEADER + ((n + 3) >>> 2);
    this.maxDispatchWords = this.slotPlan.reduce(
      (sum, code) =>
        sum + (code < 0 ? RecordWords.SET_BUFFER64 : bytesWords(code > 0 ? code : Limits.MAX_INLINE_BYTES)),
      RecordWords.SET_PIPELINE + RecordWords.SET_TG_MEMORY + RecordWords.DISPATCH,
    );
  }
}

/** @ignore {@link Pipeline.slotPlan} code of a required buffer slot. */
export const SLOT_BUFFER = -1;
/** @ignore {@link Pipeline.slotPlan} code of an optional buffer slot. */
export const SLOT_OPTIONAL_BUFFER = -2;

const contracts = new Map<string, KernelContract>();

/** Adds kernel contracts to the global table (each op module registers its own). */
export function registerContracts(list: readonly KernelContract[]): void {
  for (const c of list) contracts.set(c.name, c);
}

/** The contract of a kernel, if one is registered. */
export function contractOf(name: string): KernelContract | undefined {
  return contracts.get(name);
}

/** Every registered contract. */
export function allContracts(): KernelContract[] {
  return [...contracts.values()];
}

/** A kernel name with a process-wide small id, made once by {@link kernelRef}. */
export interface KernelRef {
  /** Kernel name. */
  readonly name: string;
  /** Index into every registry's resolved-pipeline table. */
  readonly id: number;
}

const refs = new Map<string, KernelRef>();

/**
 * The reference of kernel `name` (the same object for every call): op dispatchers make theirs once at
 * module load, and {@link KernelRegistry.resolve} then finds the pipeline by array index.
 */
export function kernelRef(name: string): KernelRef {
  let ref = refs.get(name);
  if (ref === undefined) refs.set(name, ref = Object.freeze({ name, id: refs.size }));
  return ref;
}

/** The pieces of a device a registry needs. */
export interface RegistryHost {
  /** Native symbols. */
  readonly sym: NativeSymbols;
  /** Native device pointer. */
  devicePtr(): Deno.PointerObject;
  /** Backend name, for messages. */
  readonly backend: string;
}

const encoder = new TextEncoder();

/**
 * Resolves kernel names to pipelines of one device, once each.
 *
 * @example
 * ```ts
 * import { KernelRegistry, MlxDevice } from "@mlxn/mlx-native";
 * using device = MlxDevice.open({ backend: "cpu" });
 * const registry = new KernelRegistry(device);
 * const add = registry.get("elementwise_add_f32");
 * console.log(add.contract.slots.length); // 4
 * ```
 */
export class KernelRegistry {
  readonly #host: RegistryHost;
  readonly #cache = new Map<string, Pipeline>();
  readonly #byRef: (Pipeline | undefined)[] = [];

  /** A registry for `device`. */
  constructor(device: RegistryHost) {
    this.#host = device;
  }

  /** The pipeline of a kernel reference: {@link KernelRegistry.get} once, an array index afterwards. */
  resolve(ref: KernelRef): Pipeline {
    // Small enough for V8 to inline into every op; the first lookup is out of line.
    const p = this.#byRef[ref.id];
    return p !== undefined ? p : this.#resolveFirst(ref);
  }

  #resolveFirst(ref: KernelRef): Pipeline {
    return this.#byRef[ref.id] = this.get(ref.name);
  }

  /** The pipeline of kernel `name`; throws KernelNotFound when no backend kernel has that name. */
  get(name: string): Pipeline {
    const hit = this.#cache.get(name);
    if (hit) return hit;
    const sym = this.#host.sym;
    const dev = this.#host.devicePtr();
    const handle = sym.mlxn_pipeline_get(dev, encoder.encode(name + "\0"));
    if (handle === 0) {
      const known = allContracts().map((c) => c.name).sort().join(", ");
      throw new MlxError(
        "KernelNotFound",
        `kernel '${name}' is not available on the ${this.#host.backend} backend (${lastErrorText(sym)}). ` +
          `Known kernels: ${known}`,
      );
    }
    const signature = readText((b, cap) => sym.mlxn_pipeline_signature(dev, handle, b, cap));
    const contract = contractOf(name) ?? contractFromSignature(name, signature);
    const expected = contractSignature(contract);
    if (signature !== expected) {
      throw new MlxError(
        "AbiMismatch",
        `kernel '${name}': the native library's signature '${signature}' differs from the contract ` +
          `'${expected}': rebuild the native library from this release (\`make native\`)`,
      );
    }
    const p = new Pipeline(name, handle, contract);
    this.#cache.set(name, p);
    return p;
  }

  /** Whether the device has a kernel called `name`. */
  has(name: string): boolean {
    try {
      this.get(name);
      return true;
    } catch (e) {
      if (e instanceof MlxError && e.code === "KernelNotFound") return false;
      throw e;
    }
  }
}

/** A conservative contract for a native kernel without a TS description: buffers read+written. */
function contractFromSignature(name: string, signature: string): KernelContract {
  return {
    name,
    opKind: CapturedOpKind.Other,
    slots: [...signature].map((ch, i) =>
      ch === "c"
        ? { name: `arg${i}`, kind: "bytes" as const }
        : { name: `arg${i}`, kind: "buffer" as const, access: "readwrite" as const, optional: ch === "o" }
    ),
  };
}
