/**
 * MLX checkpoints (the directories `mlx_lm.convert` writes): config.json, one or more safetensors
 * files (with model.safetensors.index.json's weight map when sharded), and quantized layers stored
 * as `<layer>.weight` (u32 words of packed codes), `<layer>.scales` and `<layer>.biases` in the
 * weights' dtype. The quantization parameters come from config.json's `quantization` group:
 * `group_size`, `bits`, `mode` (only "affine" is supported), and per-layer overrides keyed by the
 * layer path (an object of the same fields, or `false` for a layer left unquantized).
 *
 * @module
 */

import type { MlxBuffer } from "../buffer.ts";
import type { MlxDevice } from "../device.ts";
import { MlxError } from "../errors.ts";
import {
  type AffineGroupSize,
  type AffineQuantBits,
  type AffineScaleDtype,
  dequantizeAffine,
} from "../quant/affine.ts";
import { SafetensorsFile, type SafetensorsTensorInfo, type SafetensorsUploadOptions } from "./safetensors.ts";
import type { UploadOptions } from "./source.ts";

/** Affine quantization parameters of one layer. */
export interface MlxQuantization {
  /** Values per scale/bias. */
  readonly groupSize: AffineGroupSize;
  /** Bits per weight. */
  readonly bits: AffineQuantBits;
}

/** The validated shapes of one quantized linear (or embedding) layer. */
export interface MlxQuantizedLayer extends MlxQuantization {
  /** Output rows. */
  readonly n: number;
  /** Input columns (unpacked). */
  readonly k: number;
  /** Dtype of scales and biases. */
  readonly scaleDtype: AffineScaleDtype;
  /** `<layer>.weight`, `<layer>.scales`, `<layer>.biases`. */
  readonly weight: SafetensorsTensorInfo;
  /** Scales tensor. */
  readonly scales: SafetensorsTensorInfo;
  /** Biases tensor. */
  readonly biases: SafetensorsTensorInfo;
}

/** Device buffers of one quantized layer, ready for the affine matmul. */
export interface MlxQuantizedBuffers {
  /** Layer shape and parameters. */
  readonly layer: MlxQuantizedLayer;
  /** Packed codes as bytes. */
  readonly weights: MlxBuffer;
  /** Scales [n, k/groupSize]. */
  readonly scales: MlxBuffer;
  /** Biases [n, k/groupSize]. */
  readonly biases: MlxBuffer;
}

const BITS = [2, 3, 4, 5, 6, 8];
const GROUPS = [32, 64, 128];
const SCALE_DTYPES: Record<string, AffineScaleDtype> = { BF16: "bf16", F16: "f16", F32: "f32" };

function parseQuantization(where: string, q: unknown): MlxQuantization {
  const bad = (what: string): never => {
    throw new MlxError("InvalidArgument", `${where}: ${what}`);
  };
  if (q === null || typeof q !== "object" || Array.isArray(q)) bad("the quantization entry is not an object");
  const { group_size: gs, bits, mode } = q as Record<string, unknown>;
  if (mode !== undefined && mode !== "affine") {
    throw new MlxError(
      "Unsupported",
      `${where}: quantization mode ${
        JSON.stringify(mode)
      } is not supported (only "affine"); convert with mlx_lm.convert -q --q-mode affine`,
    );
  }
  if (!BITS.includes(bits as number)) {
    throw new MlxError("Unsupported", `${where}: ${JSON.stringify(bits)} bits are not supported (2, 3, 4, 5, 6 or 8)`);
  }
  if (!GROUPS.includes(gs as number)) {
    throw new MlxError("Unsupported", `${where}: group size ${JSON.stringify(gs)} is not supported (32, 64 or 128)`);
  }
  return Object.freeze({ groupSize: gs as AffineGroupSize, bits: bits as AffineQuantBits });
}

/**
 * An open MLX checkpoint directory. Opening reads config.json, the index and every safetensors
 * header (not the tensor data); dispose it (`using`) to close the files.
 */
export class MlxCheckpoint {
  /** The parsed config.json. */
  readonly config: Readonly<Record<string, unknown>>;
  /** The checkpoint-wide quantization, or undefined for an unquantized checkpoint. */
  readonly quantization: MlxQuantization | undefined;
  readonly #dir: string;
  readonly #files: SafetensorsFile[] = [];
  readonly #where = new Map<string, SafetensorsFile>();
  readonly #overrides = new Map<string, MlxQuantization | false>();

  private constructor(dir: string) {
    this.#dir = dir;
    const config = readJson(`${dir}/config.json`);
    if (config === null || typeof config !== "object" || Array.isArray(config)) {
      throw new MlxError("InvalidArgument", `${dir}/config.json is not a JSON object`);
    }
    this.config = Object.freeze(config as Record<string, unknown>);
    const q = this.config.quantization;
    if (q !== undefined) {
      this.quantization = parseQuantization(`${dir}/config.json quantization`, q);
      for (const [path, value] of Object.entries(q as Record<string, unknown>)) {
        if (value === null || typeof value !== "object" && typeof value !== "boolean") continue;
        if (value === false) this.#overrides.set(path, false);
        else if (value !== true) {
          this.#overrides.set(path, parseQuantization(`${dir}/config.json quantization.${path}`, value));
        }
      }
    }
    try {
      for (const file of this.#shardNames()) {
        const st = SafetensorsFile.open(`${dir}/${file}`);
        this.#files.push(st);
        for (const t of st.tensors) {
          const prev = this.#where.get(t.name);
          if (prev) {
            throw new MlxError("InvalidArgument", `tensor ${t.name} is in both ${prev.label} and ${st.label}`);
          }
          this.#where.set(t.name, st);
        }
      }
    } catch (e) {
      this.close();
      throw e;
    }
  }

  /** Opens the checkpoint in directory `dir` (needs --allow-read). */
  static open(dir: string): MlxCheckpoint {
    return new MlxCheckpoint(dir.replace(/\/+$/, ""));
  }

  #shardNames(): string[] {
    const index = `${this.#dir}/model.safetensors.index.json`;
    let exists = false;
    try {
      exists = Deno.statSync(index).isFile;
    } catch (e) {
      if (!(e instanceof Deno.errors.NotFound)) throw fileError(index, e);
    }
    if (exists) {
      const map = (readJson(index) as Record<string, unknown>)?.weight_map;
      if (map === null || typeof map !== "object" || Array.isArray(map)) {
        throw new MlxError("InvalidArgument", `${index} has no weight_map object`);
      }
      const files = new Set<string>();
      for (const [name, file] of Object.entries(map as Record<string, unknown>)) {
        if (typeof file !== "string" || file.includes("/") || file.includes("\\") || !file.endsWith(".safetensors")) {
          throw new MlxError(
            "InvalidArgument",
            `${index}: ${name} maps to ${JSON.stringify(file)}, not a .safetensors file name`,
          );
        }
        files.add(file);
      }
      return [...files].sort();
    }
    let names: string[];
    try {
      names = [...Deno.readDirSync(this.#dir)].filter((e) => e.isFile && e.name.endsWith(".safetensors")).map((e) =>
        e.name
      ).sort();
    } catch (e) {
      throw fileError(this.#dir, e);
    }
    if (names.length === 0) {
      throw new MlxError(
        "InvalidArgument",
        `${this.#dir} has no .safetensors files; is it an MLX checkpoint directory?`,
      );
    }
    return names;
  }

  /** Every tensor name, sorted. */
  get tensorNames(): string[] {
    return [...this.#where.keys()].sort();
  }

  /** Whether tensor `name` exists. */
  has(name: string): boolean {
    return this.#where.has(name);
  }

  /** The info of tensor `name`. */
  tensor(name: string): SafetensorsTensorInfo {
    return this.#file(name).tensor(name);
  }

  #file(name: string): SafetensorsFile {
    const f = this.#where.get(name);
    if (!f) throw new MlxError("InvalidArgument", `no tensor ${JSON.stringify(name)} in the checkpoint ${this.#dir}`);
    return f;
  }

  /** Streams tensor `name` into a device buffer of its dtype (or raw bytes with `asBytes`). */
  upload(device: MlxDevice, name: string, options?: SafetensorsUploadOptions): MlxBuffer {
    return this.#file(name).upload(device, name, options);
  }

  /** The quantization of layer `prefix` (its override, else the checkpoint's), or undefined if dense. */
  quantizationOf(prefix: string): MlxQuantization | undefined {
    if (!this.has(`${prefix}.scales`)) return undefined;
    const o = this.#overrides.get(prefix);
    if (o === false) {
      throw new MlxError("InvalidArgument", `${prefix} has scales but config.json marks it unquantized`);
    }
    const q = o ?? this.quantization;
    if (!q) {
      throw new MlxError("InvalidArgument", `${prefix} has scales but config.json has no quantization group`);
    }
    return q;
  }

  /**
   * The validated shapes of quantized layer `prefix`: weight u32 [n, k·bits/32], scales and biases
   * [n, k/groupSize] of one dtype (bf16, f16 or f32).
   */
  quantizedLayer(prefix: string): MlxQuantizedLayer {
    const q = this.quantizationOf(prefix);
    if (!q) throw new MlxError("InvalidArgument", `${prefix} is not quantized (no ${prefix}.scales)`);
    const weight = this.tensor(`${prefix}.weight`), scales = this.tensor(`${prefix}.scales`);
    const biases = this.tensor(`${prefix}.biases`);
    const bad = (what: string): never => {
      throw new MlxError("InvalidArgument", `quantized layer ${prefix}: ${what}`);
    };
    if (weight.dtype !== "U32" || weight.shape.length !== 2) {
      bad(`weight must be U32 [n, k·bits/32], got ${weight.dtype}${JSON.stringify(weight.shape)}`);
    }
    const n = weight.shape[0]!, words = weight.shape[1]!;
    const k = (words * 32) / q.bits;
    if (!Number.isInteger(k) || k === 0 || k % q.groupSize !== 0) {
      bad(`${words} u32 words per row at ${q.bits} bits is not a whole number of ${q.groupSize}-value groups`);
    }
    const scaleDtype = SCALE_DTYPES[scales.dtype];
    if (!scaleDtype) return bad(`scales must be BF16, F16 or F32, got ${scales.dtype}`);
    if (biases.dtype !== scales.dtype) bad(`biases are ${biases.dtype} but scales are ${scales.dtype}`);
    for (const t of [scales, biases]) {
      if (t.shape.length !== 2 || t.shape[0] !== n || t.shape[1] !== k / q.groupSize) {
        bad(`${t.name} must be [${n}, ${k / q.groupSize}], got ${JSON.stringify(t.shape)}`);
      }
    }
    return Object.freeze({ ...q, n, k, scaleDtype, weight, scales, biases });
  }

  /**
   * A quantized layer's weights in float64 ([n, k] row-major, scale·q + bias exactly), for
   * references and checks; a model's weights belong on the device ({@link uploadQuantizedLayer}).
   */
  dequantizeLayer(prefix: string): Float64Array {
    const layer = this.quantizedLayer(prefix);
    const read = (t: SafetensorsTensorInfo) => this.#file(t.name).readTensorBytes(t.name);
    const half = (b: Uint8Array) => new Uint16Array(b.buffer, b.byteOffset, b.byteLength / 2);
    const scales = read(layer.scales), biases = read(layer.biases);
    const f32 = layer.scaleDtype === "f32";
    return dequantizeAffine({
      bits: layer.bits,
      groupSize: layer.groupSize,
      n: layer.n,
      k: layer.k,
      weights: read(layer.weight),
      scaleDtype: layer.scaleDtype,
      scales: f32 ? new Float32Array(scales.buffer, scales.byteOffset, scales.byteLength / 4) : half(scales),
      biases: f32 ? new Float32Array(biases.buffer, biases.byteOffset, biases.byteLength / 4) : half(biases),
    });
  }

  /** Streams a quantized layer's three tensors into device buffers (codes as bytes). */
  uploadQuantizedLayer(device: MlxDevice, prefix: string, options?: UploadOptions): MlxQuantizedBuffers {
    const layer = this.quantizedLayer(prefix);
    const weights = this.upload(device, layer.weight.name, { ...options, asBytes: true });
    try {
      const scales = this.upload(device, layer.scales.name, options);
      try {
        return { layer, weights, scales, biases: this.upload(device, layer.biases.name, options) };
      } catch (e) {
        scales.dispose();
        throw e;
      }
    } catch (e) {
      weights.dispose();
      throw e;
    }
  }

  /** Closes every file. */
  close(): void {
    for (const f of this.#files) f.close();
  }

  /** Same as {@link MlxCheckpoint.close}. */
  [Symbol.dispose](): void {
    this.close();
  }
}

function readJson(path: string): unknown {
  let text: string;
  try {
    text = Deno.readTextFileSync(path);
  } catch (e) {
    throw fileError(path, e);
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new MlxError("InvalidArgument", `${path} is not valid JSON (${(e as Error).message})`);
  }
}

function fileError(path: string, e: unknown): MlxError {
  if (e instanceof Deno.errors.NotCapable || e instanceof Deno.errors.PermissionDenied) {
    return new MlxError("PermissionDenied", `reading ${path} needs --allow-read`, { cause: e });
  }
  if (e instanceof Deno.errors.NotFound) {
    return new MlxError("InvalidArgument", `no ${path}; is this an MLX checkpoint directory?`, { cause: e });
  }
  return new MlxError("InvalidArgument", `cannot read ${path}: ${(e as Error)?.message ?? e}`, { cause: e });
}
