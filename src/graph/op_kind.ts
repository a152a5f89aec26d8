/**
 * Operation kinds attached to dispatches, used by graph passes (fusion matches on them; reorder stops
 * at kinds that are not reorderable).
 *
 * @module
 */

/** What a dispatch computes, as far as the graph passes care. */
export const CapturedOpKind = {
  /** RMS normalisation with a learned scale. */
  RmsNorm: "RmsNorm",
  /** Elementwise multiply. */
  ElemMul: "ElemMul",
  /** Elementwise add. */
  ElemAdd: "ElemAdd",
  /** Fused RMS norm × scale. */
  RmsNormMul: "RmsNormMul",
  /** Scaled dot-product attention (not reorderable). */
  Sdpa: "Sdpa",
  /** Softmax (not reorderable). */
  Softmax: "Softmax",
  /** Rotary embedding. */
  Rope: "Rope",
  /** Matrix products (dense or quantized). */
  MatMul: "MatMul",
  /** Activation functions (gelu, softcap). */
  Activation: "Activation",
  /** Anything else. */
  Other: "Other",
} as const;

/** One of the {@link CapturedOpKind} values. */
export type CapturedOpKind = typeof CapturedOpKind[keyof typeof CapturedOpKind];

const NOT_REORDERABLE: ReadonlySet<CapturedOpKind> = new Set([CapturedOpKind.Sdpa, CapturedOpKind.Softmax]);

/** Whether the reorder pass may move other dispatches across this kind (llama.cpp's safe list). */
export function isReorderable(kind: CapturedOpKind): boolean {
  return !NOT_REORDERABLE.has(kind);
}
