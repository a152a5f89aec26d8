/**
 * Deterministic float32 weight rows for the quantizer tests: random values at many magnitudes and
 * the inputs where rounding choices show (halves on the quantization grid, ±0, one outlier, float32
 * subnormals, scales that vanish or overflow in f16, one-signed and constant groups, small integers).
 * The golden digests in the quantizer tests were produced by running the upstream C reference on
 * exactly these rows.
 */
import { rng } from "../helpers.ts";

/** How many kinds {@link adversarialRows} cycles through. */
export const INPUT_KINDS = 14;

function chunk(next: () => number, kind: number): Float32Array {
  const x = new Float32Array(32);
  const normal = () => Math.sqrt(-2 * Math.log(next() + 1e-12)) * Math.cos(2 * Math.PI * next());
  const mag = Math.pow(10, next() * 8 - 4);
  for (let i = 0; i < 32; i++) {
    switch (kind) {
      case 0:
        x[i] = normal() * mag;
        break;
      case 1:
        x[i] = (next() * 2 - 1) * mag;
        break;
      case 2:
        x[i] = Math.round(normal() * 8) * 0.5 * mag;
        break;
      case 3:
        x[i] = Math.round(normal() * 16) / 4;
        break;
      case 4:
        x[i] = next() < 0.5 ? 0 : -0;
        break;
      case 5:
        x[i] = next() < 0.9 ? (next() < 0.5 ? -0 : 0) : normal();
        break;
      case 6:
        x[i] = i === 16 ? 1000 * mag : normal() * mag * 1e-3;
        break;
      case 7:
        x[i] = normal() * 1e-39;
        break;
      case 8:
        x[i] = normal() * 1e-30;
        break;
      case 9:
        x[i] = normal() * 1e5;
        break;
      case 10:
        x[i] = Math.abs(normal()) * mag;
        break;
      case 11:
        x[i] = -Math.abs(normal()) * mag;
        break;
      case 12:
        x[i] = 1.25 * mag;
        break;
      default:
        x[i] = Math.round(next() * 30 - 15);
    }
  }
  return x;
}

/**
 * `n` rows of `k` float32 values (k a multiple of 32). Row r is mostly of kind r mod
 * {@link INPUT_KINDS}, with about 30% of its 32-value chunks of other kinds, so that k-quant super
 * blocks mix them.
 */
export function adversarialRows(n: number, k: number, seed: number, finiteIn: "f32" | "f16" = "f32"): Float32Array {
  const next = rng(seed);
  const out = new Float32Array(n * k);
  for (let r = 0; r < n; r++) {
    for (let c = 0; c < k / 32; c++) {
      const kind = (r + (next() < 0.3 ? c : 0)) % INPUT_KINDS;
      let values = chunk(next, kind);
      if (finiteIn === "f16") values = values.map((v) => Math.abs(v) > 60000 ? v / 1e4 : v);
      out.set(values, r * k + c * 32);
    }
  }
  return out;
}
