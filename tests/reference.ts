/**
 * Independent reference implementations of every kernel, in float64 JavaScript arithmetic, written
 * from the ops' definitions (not from the native code). Inputs are plain numbers; outputs are exact
 * up to float64 rounding, and the tests compare them with tolerances derived per dtype.
 */

/** a + b. */
export function refAdd(a: ArrayLike<number>, b: ArrayLike<number>): Float64Array {
  return Float64Array.from({ length: a.length }, (_, i) => a[i]! + b[i]!);
}

/** a · b. */
export function refMul(a: ArrayLike<number>, b: ArrayLike<number>): Float64Array {
  return Float64Array.from({ length: a.length }, (_, i) => a[i]! * b[i]!);
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
    for (let i = 0; i < dim; i++) ss += x[r * dim + i]! ** 2;
    const inv = 1 / Math.sqrt(ss / dim + eps);
    for (let i = 0; i < dim; i++) out[r * dim + i] = x[r * dim + i]! * inv * (weight ? weight[i] : 1)!;
  }
  return out;
}

/** Per row softmax. */
export function refSoftmax(x: ArrayLike<number>, rows: number, cols: number): Float64Array {
  const out = new Float64Array(rows * cols);
  for (let r = 0; r < rows; r++) {
    let m = -Infinity;
    for (let i = 0; i < cols; i++) m = Math.max(m, x[r * cols + i]!);
    let s = 0;
    for (let i = 0; i < cols; i++) s += Math.exp(x[r * cols + i]! - m);
    for (let i = 0; i < cols; i++) out[r * cols + i] = Math.exp(x[r * cols + i]! - m) / s;
  }
  return out;
}

/** GELU, tanh approximation with the tanh argument clamped to ±15. */
export function refGelu(x: ArrayLike<number>): Float64Array {
  return Float64Array.from({ length: x.length }, (_, i) => {
    const v = x[i]!;
    const inner = Math.max(-15, Math.min(15, Math.sqrt(2 / Math.PI) * (v + 0.044715 * v ** 3)));
    return 0.5 * v * (1 + Math.tanh(inner));
  });
}

/** tanh(x / cap) · cap. */
export function refSoftcap(x: ArrayLike<number>, cap: number): Float64Array {
  return Float64Array.from({ length: x.length }, (_, i) => Math.tanh(x[i]! / cap) * cap);
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
      const ang = positions[t]! * theta ** (-2 * i / hd);
      const [x0, x1] = [x[t * hd + 2 * i], x[t * hd + 2 * i + 1]];
      out[t * hd + 2 * i] = x0! * Math.cos(ang) - x1! * Math.sin(ang);
      out[t * hd + 2 * i + 1] = x0! * Math.sin(ang) + x1! * Math.cos(ang);
    }
  }
  return out;
}

/** The rotation angle of pair i of a neox row. */
export function neoxAngle(pos: number, i: number, theta: number, ropeDim: number, ff?: ArrayLike<number>): number {
  return pos * theta ** (-2 * i / ropeDim) / (ff ? ff[i] : 1)!;
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
    const pos = positions[Math.floor(r / nHeads)]!;
    for (let i = 0; i < half; i++) {
      const ang = neoxAngle(pos, i, o.theta, rd, ff);
      const x0 = x[r * hd + i]!, x1 = x[r * hd + i + half]!;
      out[r * hd + i] = x0 * Math.cos(ang) - x1 * Math.sin(ang);
      out[r * hd + i + half] = x0 * Math.sin(ang) + x1 * Math.cos(ang);
    }
    for (let d = rd; d < hd; d++) out[r * hd + d] = x[r * hd + d]!;
  }
  return out;
}

/** y = x · Wᵀ (x [m, k], w [n, k]) in float64, with Σ|x·w| per output for error bounds. */
export function refMatmul(
  x: ArrayLike<number>,
  w: ArrayLike<number>,
  m: number,
  n: number,
  k: number,
): { y: Float64Array; mag: Float64Array } {
  const y = new Float64Array(m * n), mag = new Float64Array(m * n);
  for (let i = 0; i < m; i++) {
    for (let j = 0; j < n; j++) {
      let s = 0, a = 0;
      for (let t = 0; t < k; t++) {
        const p = x[i * k + t]! * w[j * k + t]!;
        s += p;
        a += Math.abs(p);
      }
      y[i * n + j] = s;
      mag[i * n + j] = a;
    }
  }
  return { y, mag };
}

/** Softmax-weighted sum of value rows for one query over the given keys (float64). */
function attendOne(
  q: ArrayLike<number>,
  qOff: number,
  keys: number[],
  kv: { k: ArrayLike<number>; v: ArrayLike<number>; base: number; hd: number },
  scale: number,
  softcap: number,
): Float64Array {
  const scores = keys.map((key) => {
    let s = 0;
    for (let d = 0; d < kv.hd; d++) s += q[qOff + d]! * kv.k[kv.base + key * kv.hd + d]!;
    s *= scale;
    return softcap > 0 ? softcap * Math.tanh(s / softcap) : s;
  });
  const m = Math.max(...scores);
  const p = scores.map((s) => Math.exp(s - m));
  const l = p.reduce((a, b) => a + b, 0);
  const out = new Float64Array(kv.hd);
  keys.forEach((key, i) => {
    for (let d = 0; d < kv.hd; d++) out[d]! += (p[i]! / l) * kv.v[kv.base + key * kv.hd + d]!;
  });
  return out;
}

/** Causal GQA attention: Q/O [batch, heads, seq, hd], K/V [batch, kvHeads, cap, hd]. */
export function refSdpa(
  q: ArrayLike<number>,
  k: ArrayLike<number>,
  v: ArrayLike<number>,
  o: {
    batch: number;
    nHeads: number;
    nKvHeads: number;
    headDim: number;
    seqLen: number;
    kvSeqLen: number;
    kvCapacity: number;
    scale: number;
  },
): Float64Array {
  const { batch, nHeads, nKvHeads, headDim: hd, seqLen, kvSeqLen, kvCapacity } = o;
  const out = new Float64Array(batch * nHeads * seqLen * hd);
  for (let b = 0; b < batch; b++) {
    for (let h = 0; h < nHeads; h++) {
      const kvh = Math.floor(h / (nHeads / nKvHeads));
      const base = (b * nKvHeads + kvh) * kvCapacity * hd;
      for (let r = 0; r < seqLen; r++) {
        const last = kvSeqLen - seqLen + r;
        const keys = Array.from({ length: last + 1 }, (_, i) => i);
        const qOff = ((b * nHeads + h) * seqLen + r) * hd;
        out.set(attendOne(q, qOff, keys, { k, v, base, hd }, o.scale, 0), qOff);
      }
    }
  }
  return out;
}

/** Decode attention of one query per head, with a mask and an optional softcap. */
export function refAttentionDecode(
  q: ArrayLike<number>,
  k: ArrayLike<number>,
  v: ArrayLike<number>,
  o: {
    nHeads: number;
    nKvHeads: number;
    headDim: number;
    kvSeqLen: number;
    kvCapacity: number;
    scale: number;
    mask: "none" | "causal" | "sliding";
    slidingWindow?: number;
    softcap?: number;
  },
): Float64Array {
  const hd = o.headDim, pos = o.kvSeqLen - 1;
  const out = new Float64Array(o.nHeads * hd);
  const keys = Array.from({ length: o.kvSeqLen }, (_, i) => i)
    .filter((key) => o.mask !== "sliding" || pos - key < (o.slidingWindow ?? 0));
  for (let h = 0; h < o.nHeads; h++) {
    const base = Math.floor(h / (o.nHeads / o.nKvHeads)) * o.kvCapacity * hd;
    out.set(attendOne(q, h * hd, keys, { k, v, base, hd }, o.scale, o.softcap ?? 0), h * hd);
  }
  return out;
}

/** SiLU: x · sigmoid(x). */
export function refSilu(x: ArrayLike<number>): Float64Array {
  return Float64Array.from({ length: x.length }, (_, i) => x[i]! / (1 + Math.exp(-x[i]!)));
}

/** Index of the largest value, ties to the lowest index (−0 equals +0); NaN ranks below −inf. */
export function refArgmax(x: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < x.length; i++) {
    if (Number.isNaN(x[best]) ? !Number.isNaN(x[i]) : x[i]! > x[best]!) best = i;
  }
  return best;
}

/** E[j] = round(2³¹ · 2^(−j/256)), j = 0..256: the sampler's weight table. */
export function refSampleTable(): number[] {
  return Array.from({ length: 257 }, (_, j) => Math.round(2 ** 31 * 2 ** (-j / 256)));
}

/** Philox4x32-10 of a 4-word counter and a 2-word key (Salmon et al., SC'11). */
export function refPhilox4x32(counter: readonly number[], key: readonly number[]): number[] {
  const mulhilo = (a: bigint, b: number): [number, number] => {
    const p = a * BigInt(b >>> 0);
    return [Number(p >> 32n), Number(p & 0xffffffffn)];
  };
  let [c0, c1, c2, c3] = counter.map((v) => v >>> 0);
  let [k0, k1] = key.map((v) => v >>> 0);
  for (let round = 0; round < 10; round++) {
    if (round > 0) {
      k0 = (k0! + 0x9e3779b9) >>> 0;
      k1 = (k1! + 0xbb67ae85) >>> 0;
    }
    const [hi0, lo0] = mulhilo(0xd2511f53n, c0!), [hi1, lo1] = mulhilo(0xcd9e8d57n, c2!);
    [c0, c1, c2, c3] = [(hi1 ^ c1! ^ k0!) >>> 0, lo1, (hi0 ^ c3! ^ k1!) >>> 0, lo0];
  }
  return [c0!, c1!, c2!, c3!];
}

/** The sampler's integer weight of logit x below maximum m (see ops.sample, step 3). */
export function refSampleWeight(x: number, m: number, c: number, table: readonly number[]): number {
  const flush = (v: number) => (Math.abs(v) < 2 ** -126 ? 0 : v);
  const xf = flush(x), mf = flush(m);
  const d = xf === mf ? 0 : Math.fround(Math.fround(mf - xf) * c);
  if (!(d < 31)) return 0;
  const q = Math.floor(d * 65536), h = (q >>> 8) & 0xff, l = q & 0xff;
  const v = table[h]! - Math.floor(((table[h]! - table[h + 1]!) * l) / 256);
  return Math.floor(v / 2 ** (q >>> 16));
}

/**
 * One row's sampled token, from the definition in ops.sample: a full sort, BigInt prefix sums and
 * the thresholds as stated. Returns null where the kernel must fail (NaN, or only −inf).
 */
export function refSample(
  x: ArrayLike<number>,
  o: { temperature: number; topK?: number; topP?: number; seed: bigint; counter: number; row: number },
): number | null {
  const n = x.length;
  let m = -Infinity;
  for (let i = 0; i < n; i++) {
    if (Number.isNaN(x[i])) return null;
    m = Math.max(m, x[i]!);
  }
  if (m === -Infinity) return null;
  if (o.temperature === 0) return refArgmax(x);
  const c = Math.fround(Math.LOG2E / o.temperature), table = refSampleTable();
  const order = Array.from({ length: n }, (_, i) => i).sort((a, b) => (x[b]! - x[a]!) || (a - b));
  const w = order.map((i) => BigInt(refSampleWeight(x[i]!, m, c, table)));
  const cum = [0n];
  for (const v of w) cum.push(cum[cum.length - 1]! + v);
  const k = o.topK ? Math.min(o.topK, n) : n;
  let total = cum[k]!;
  const pq = Math.max(1, Math.min(2 ** 31, Math.round((o.topP ?? 1) * 2 ** 31)));
  if (pq < 2 ** 31) {
    const target = (total * BigInt(pq)) >> 31n;
    let len = 1;
    while (cum[len]! < target) len++;
    total = cum[len]!;
  }
  const [x0, x1] = refPhilox4x32([o.counter, o.row, 0, 0], [Number(o.seed & 0xffffffffn), Number(o.seed >> 32n)]);
  const r = (total * ((BigInt(x1!) << 32n) | BigInt(x0!))) >> 64n;
  let j = 1;
  while (cum[j]! <= r) j++;
  return order[j - 1]!;
}
