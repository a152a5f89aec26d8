/**
 * Independent reference implementations of every kernel, in float64 JavaScript arithmetic, written
 * from the ops' definitions (not from the native code). Inputs are plain numbers; outputs are exact
 * up to float64 rounding, and the tests compare them with tolerances derived per dtype.
 */

/** a + b. */
export function refAdd(a: ArrayLike<number>, b: ArrayLike<number>): Float64Array {
  return Float64Array.from({ length: a.length }, (_, i) => a[i] + b[i]);
}

/** a · b. */
export function refMul(a: ArrayLike<number>, b: ArrayLike<number>): Float64Array {
  return Float64Array.from({ length: a.length }, (_, i) => a[i] * b[i]);
}

/** Per row: x / sqrt(mean(x²) + eps) · weight (weight optional). */
export function refRmsNorm(
  x: ArrayLike<number>,
  weight: ArrayLike<number> | null,
  rows: number,
  dim: number,
  eps: number,
): Float64Array {
  const out = new Float64Array(rows * dim);
  for (let r = 0; r < rows; r++) {
    let ss = 0;
    for (let i = 0; i < dim; i++) ss += x[r * dim + i] ** 2;
    const inv = 1 / Math.sqrt(ss / dim + eps);
    for (let i = 0; i < dim; i++) out[r * dim + i] = x[r * dim + i] * inv * (weight ? weight[i] : 1);
  }
  return out;
}

/** Per row softmax. */
export function refSoftmax(x: ArrayLike<number>, rows: number, cols: number): Float64Array {
  const out = new Float64Array(rows * cols);
  for (let r = 0; r < rows; r++) {
    let m = -Infinity;
    for (let i = 0; i < cols; i++) m = Math.max(m, x[r * cols + i]);
    let s = 0;
    for (let i = 0; i < cols; i++) s += Math.exp(x[r * cols + i] - m);
    for (let i = 0; i < cols; i++) out[r * cols + i] = Math.exp(x[r * cols + i] - m) / s;
  }
  return out;
}

/** GELU, tanh approximation with the tanh argument clamped to ±15. */
export function refGelu(x: ArrayLike<number>): Float64Array {
  return Float64Array.from({ length: x.length }, (_, i) => {
    const v = x[i];
    const inner = Math.max(-15, Math.min(15, Math.sqrt(2 / Math.PI) * (v + 0.044715 * v ** 3)));
    return 0.5 * v * (1 + Math.tanh(inner));
  });
}

/** tanh(x / cap) · cap. */
export function refSoftcap(x: ArrayLike<number>, cap: number): Float64Array {
  return Float64Array.from({ length: x.length }, (_, i) => Math.tanh(x[i] / cap) * cap);
}

/** Rope over [seq, hd]: pair (2i, 2i+1) rotated by pos · theta^(−2i/hd). */
export function refRope(
  x: ArrayLike<number>,
  positions: ArrayLike<number>,
  theta: number,
  hd: number,
  seq: number,
): Float64Array {
  const out = new Float64Array(seq * hd);
  for (let t = 0; t < seq; t++) {
    for (let i = 0; i < hd / 2; i++) {
      const ang = positions[t] * theta ** (-2 * i / hd);
      const [x0, x1] = [x[t * hd + 2 * i], x[t * hd + 2 * i + 1]];
      out[t * hd + 2 * i] = x0 * Math.cos(ang) - x1 * Math.sin(ang);
      out[t * hd + 2 * i + 1] = x0 * Math.sin(ang) + x1 * Math.cos(ang);
    }
  }
  return out;
}

/** The rotation angle of pair i of a neox row. */
export function neoxAngle(pos: number, i: number, theta: number, ropeDim: number, ff?: ArrayLike<number>): number {
  return pos * theta ** (-2 * i / ropeDim) / (ff ? ff[i] : 1);
}

/** NeoX rope over [seq·heads, hd]: pairs (i, i + ropeDim/2); dims ≥ ropeDim copied. */
export function refRopeNeox(
  x: ArrayLike<number>,
  positions: ArrayLike<number>,
  o: { theta: number; headDim: number; ropeDim: number; nHeads: number; seqLen: number },
  ff?: ArrayLike<number>,
): Float64Array {
  const { headDim: hd, ropeDim: rd, nHeads, seqLen } = o;
  const out = new Float64Array(seqLen * nHeads * hd);
  const half = rd / 2;
  for (let r = 0; r < seqLen * nHeads; r++) {
    const pos = positions[Math.floor(r / nHeads)];
    for (let i = 0; i < half; i++) {
      const ang = neoxAngle(pos, i, o.theta, rd, ff);
      const x0 = x[r * hd + i], x1 = x[r * hd + i + half];
      out[r * hd + i] = x0 * Math.cos(ang) - x1 * Math.sin(ang);
      out[r * hd + i + half] = x0 * Math.sin(ang) + x1 * Math.cos(ang);
    }
    for (let d = rd; d < hd; d++) out[r * hd + d] = x[r * hd + d];
  }
  return out;
}
