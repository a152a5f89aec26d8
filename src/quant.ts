/**
 * Weight quantizers and dequantizers (pure TypeScript; for tests, model writers and offline
 * conversion): byte-exact ports of ggml's reference quantizers and MLX's affine quantizer, and
 * exact float64 dequantizers. Formats and the matched upstream versions: src/quant/ggml.ts and
 * src/quant/affine.ts.
 *
 * @module
 */

import type { GgmlBlockLayout, GgmlQuantFormat } from "./quant/ggml.ts";
import { GGML_FORMATS, ggmlMatrixBytes } from "./quant/ggml.ts";

export {
  type AffineBits,
  type AffineGroupSize,
  type AffineQuantBits,
  type AffineQuantized,
  type AffineQuantizeOptions,
  type AffineScaleDtype,
  dequantizeAffine,
  quantizeAffine,
} from "./quant/affine.ts";
export {
  dequantizeGgml,
  GGML_FORMATS,
  type GgmlBlockLayout,
  type GgmlQuantFormat,
  quantizeGgml,
} from "./quant/ggml.ts";

/** The ggml block formats the quantized matmul kernels take. */
export type GgmlFormat = "q4_0" | "q4_1" | "q5_0" | "q5_1" | "q8_0" | "q4_k" | "q5_k" | "q6_k";

/** Values and bytes per block of each kernel format ({@link GGML_FORMATS} lists every format). */
export const GGML_BLOCK: Readonly<Record<GgmlFormat, GgmlBlockLayout>> = Object.freeze({
  q4_0: GGML_FORMATS.q4_0,
  q4_1: GGML_FORMATS.q4_1,
  q5_0: GGML_FORMATS.q5_0,
  q5_1: GGML_FORMATS.q5_1,
  q8_0: GGML_FORMATS.q8_0,
  q4_k: GGML_FORMATS.q4_k,
  q5_k: GGML_FORMATS.q5_k,
  q6_k: GGML_FORMATS.q6_k,
});

/** Bytes of a ggml [n, k] matrix in `format`. */
export function ggmlBytes(format: GgmlQuantFormat, n: number, k: number): number {
  return ggmlMatrixBytes(format, n, k);
}
