/**
 * ggml tensor types as GGUF files name them: type id, name, values per block and bytes per block
 * (ggml-org/ggml d99724f2, include/ggml.h `enum ggml_type` and the block sizes of ggml-common.h).
 *
 * @module
 */

import type { DType } from "../dtype.ts";
import type { GgmlQuantFormat } from "../quant/ggml.ts";

/** One ggml tensor type. */
export interface GgmlType {
  /** The id stored in GGUF tensor infos. */
  readonly id: number;
  /** ggml's name, lower case (`q4_k`, `bf16`, …). */
  readonly name: string;
  /** Values per block (1 for plain types). */
  readonly blockValues: number;
  /** Bytes per block. */
  readonly blockBytes: number;
}

const TABLE: readonly (readonly [number, string, number, number])[] = [
  [0, "f32", 1, 4],
  [1, "f16", 1, 2],
  [2, "q4_0", 32, 18],
  [3, "q4_1", 32, 20],
  [6, "q5_0", 32, 22],
  [7, "q5_1", 32, 24],
  [8, "q8_0", 32, 34],
  [9, "q8_1", 32, 36],
  [10, "q2_k", 256, 84],
  [11, "q3_k", 256, 110],
  [12, "q4_k", 256, 144],
  [13, "q5_k", 256, 176],
  [14, "q6_k", 256, 210],
  [15, "q8_k", 256, 292],
  [16, "iq2_xxs", 256, 66],
  [17, "iq2_xs", 256, 74],
  [18, "iq3_xxs", 256, 98],
  [19, "iq1_s", 256, 50],
  [20, "iq4_nl", 32, 18],
  [21, "iq3_s", 256, 110],
  [22, "iq2_s", 256, 82],
  [23, "iq4_xs", 256, 136],
  [24, "i8", 1, 1],
  [25, "i16", 1, 2],
  [26, "i32", 1, 4],
  [27, "i64", 1, 8],
  [28, "f64", 1, 8],
  [29, "iq1_m", 256, 56],
  [30, "bf16", 1, 2],
  [34, "tq1_0", 256, 54],
  [35, "tq2_0", 256, 66],
  [39, "mxfp4", 32, 17],
  [40, "nvfp4", 64, 36],
  [41, "q1_0", 128, 18],
  [42, "q2_0", 64, 18],
];

const BY_ID = new Map<number, GgmlType>(
  TABLE.map(([id, name, blockValues, blockBytes]) => [id, Object.freeze({ id, name, blockValues, blockBytes })]),
);
const BY_NAME = new Map<string, GgmlType>([...BY_ID.values()].map((t) => [t.name, t]));

/** The ggml type with id `id`, or undefined for an unknown or removed id. */
export function ggmlTypeById(id: number): GgmlType | undefined {
  return BY_ID.get(id);
}

/** The ggml type named `name` (lower case), or undefined. */
export function ggmlTypeByName(name: string): GgmlType | undefined {
  return BY_NAME.get(name);
}

/**
 * The types this library can load and dequantize, with the device dtype their bytes upload as
 * (quantized blocks as raw bytes).
 */
export const LOADABLE_GGML_TYPES: Readonly<
  Record<string, { readonly dtype: DType; readonly format?: GgmlQuantFormat }>
> = Object.freeze({
  f32: { dtype: "f32" },
  f16: { dtype: "f16", format: "f16" },
  bf16: { dtype: "bf16" },
  q4_0: { dtype: "u8", format: "q4_0" },
  q4_1: { dtype: "u8", format: "q4_1" },
  q5_0: { dtype: "u8", format: "q5_0" },
  q5_1: { dtype: "u8", format: "q5_1" },
  q8_0: { dtype: "u8", format: "q8_0" },
  q4_k: { dtype: "u8", format: "q4_k" },
  q5_k: { dtype: "u8", format: "q5_k" },
  q6_k: { dtype: "u8", format: "q6_k" },
});
