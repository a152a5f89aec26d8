/**
 * Projections y = x · Wᵀ of a loaded model, one kernel family per weight format: dense f32 / bf16 /
 * f16 weights take `matmul` (with its residual and SwiGLU epilogues fused), ggml blocks take
 * `quantizedMatmulGgml`, MLX affine weights take `quantizedMatmul` (both followed by a separate add
 * or silu_mul, since those kernels have no epilogues).
 *
 * @module
 */

import type { MlxBuffer } from "../buffer.ts";
import type { GraphSession } from "../executor.ts";
import type { AffineQuantBits } from "../quant/affine.ts";
import type { GgmlFormat } from "../quant.ts";

/** A projection on the device: W has `n` rows of `k` inputs. */
export interface Linear {
  /** Output rows. */
  readonly n: number;
  /** Inputs per row. */
  readonly k: number;
  /** The weight format, as a short name (`bf16`, `q4_k`, `affine4/64`, …). */
  readonly format: string;
  /** Device bytes its weights take. */
  readonly bytes: number;
  /** y = x · Wᵀ (x f32 [k], y f32 [n]). */
  run(s: GraphSession, x: MlxBuffer, y: MlxBuffer): void;
  /**
   * y += x · Wᵀ: one kernel for dense weights (the product's residual epilogue), else the product
   * into `scratch`, a barrier and an add.
   */
  addInto(s: GraphSession, x: MlxBuffer, y: MlxBuffer, scratch: MlxBuffer, barrier: () => void): void;
  /**
   * For W stacking gate rows then up rows (n = 2·f): y = silu(x · Wgᵀ) ⊙ (x · Wuᵀ). One kernel for
   * dense weights, else the product into `scratch` (2·f), a barrier and silu_mul of its halves.
   */
  gluInto(s: GraphSession, x: MlxBuffer, y: MlxBuffer, scratch: MlxBuffer, barrier: () => void): void;
  /** Frees the weights. */
  dispose(): void;
}

/**
 * Views of a scratch buffer, sliced on first use and kept while the same scratch comes back (a
 * model passes the same one every step), so a step slices nothing.
 */
function scratchViews<T>(make: (scratch: MlxBuffer) => T): (scratch: MlxBuffer) => T {
  let of: MlxBuffer | undefined, views: T | undefined;
  return (scratch) => {
    if (of !== scratch) [of, views] = [scratch, make(scratch)];
    return views!;
  };
}

function unfused(
  n: number,
  k: number,
  format: string,
  buffers: MlxBuffer[],
  run: Linear["run"],
): Linear {
  const half = (n / 2) * 4;
  const part = scratchViews((scratch) => scratch.slice(0, n * 4));
  const halves = scratchViews((scratch) => [scratch.slice(0, half), scratch.slice(half, half)] as const);
  return {
    n,
    k,
    format,
    bytes: buffers.reduce((t, b) => t + b.byteLength, 0),
    run,
    addInto(s, x, y, scratch, barrier) {
      const p = part(scratch);
      run(s, x, p);
      barrier();
      s.elementwiseAdd(y, p, y);
    },
    gluInto(s, x, y, scratch, barrier) {
      run(s, x, part(scratch));
      barrier();
      const [gate, up] = halves(scratch);
      s.siluMul(gate, up, y);
    },
    dispose() {
      for (const b of buffers) b.dispose();
    },
  };
}

/** A dense projection over an f32, bf16 or f16 weight buffer [n, k]. */
export function denseLinear(w: MlxBuffer, n: number, k: number): Linear {
  // Options built once: the ops read them and keep nothing.
  const plain = { m: 1, n, k, constantWeights: true };
  const glu = { m: 1, n: n / 2, k, swiglu: true, constantWeights: true };
  const residual = { m: 1, n, k, residual: undefined as MlxBuffer | undefined, constantWeights: true };
  return {
    n,
    k,
    format: w.dtype,
    bytes: w.byteLength,
    run: (s, x, y) => s.matmul(x, w, y, plain),
    addInto: (s, x, y) => {
      residual.residual = y; // the model's own activation: holding it keeps nothing extra alive
      s.matmul(x, w, y, residual);
    },
    gluInto: (s, x, y) => s.matmul(x, w, y, glu),
    dispose: () => w.dispose(),
  };
}

/** A projection over ggml blocks (u8 buffer of n rows of k/blockValues blocks). */
export function ggmlLinear(w: MlxBuffer, n: number, k: number, format: GgmlFormat): Linear {
  const shape = { m: 1, n, k, format };
  return unfused(n, k, format, [w], (s, x, y) => s.quantizedMatmulGgml(x, w, y, shape));
}

/** A projection over MLX affine-quantized weights (codes as bytes, scales and biases [n, k/groupSize]). */
export function affineLinear(
  w: MlxBuffer,
  scales: MlxBuffer,
  biases: MlxBuffer,
  n: number,
  k: number,
  bits: AffineQuantBits,
  groupSize: 32 | 64 | 128,
): Linear {
  const shape = { m: 1, n, k, bits, groupSize };
  return unfused(
    n,
    k,
    `affine${bits}/${groupSize}`,
    [w, scales, biases],
    (s, x, y) => s.quantizedMatmul(x, w, scales, biases, y, shape),
  );
}
