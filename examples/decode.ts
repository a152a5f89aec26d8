/**
 * The main job (`make demo`). Until attention and quantized matmul land, this runs the kernels that
 * exist today as a decoder-shaped pipeline per token and layer — RMSNorm, NeoX rope over the heads,
 * softcap'd scores → softmax, GELU, scaled residual add — all in ONE command buffer per token with
 * barriers only between dependent steps, and checks every token against the float64 references.
 *
 *   deno run --allow-ffi --allow-read --allow-env examples/decode.ts [--tokens 16] [--layers 4]
 *     [--hidden 2048] [--heads 16] [--backend cpu|cuda|metal]
 */
import { parseArgs } from "node:util";
import { type BackendName, counters, DType, KernelRegistry, MlxDevice, ops } from "../mod.ts";
import { maxAbsDiff, randomValues } from "../tests/helpers.ts";
import { refGelu, refMul, refRmsNorm, refRopeNeox, refSoftcap, refSoftmax } from "../tests/reference.ts";

const { values: args } = parseArgs({
  options: {
    tokens: { type: "string", default: "16" },
    layers: { type: "string", default: "4" },
    hidden: { type: "string", default: "2048" },
    heads: { type: "string", default: "16" },
    backend: { type: "string" },
  },
});
const tokens = Number(args.tokens), layers = Number(args.layers);
const hidden = Number(args.hidden), heads = Number(args.heads);
const headDim = hidden / heads;
if (![tokens, layers, hidden, heads].every((v) => Number.isInteger(v) && v > 0) || !Number.isInteger(headDim)) {
  console.error("tokens, layers, hidden, heads must be positive integers and heads must divide hidden");
  Deno.exit(2);
}

using device = MlxDevice.open({ backend: args.backend as BackendName | undefined });
const registry = new KernelRegistry(device);
console.log(`device: ${device.info.name} (${device.backend} backend, ${device.libraryPath})`);
console.log(`shape: ${layers} layers, hidden ${hidden} = ${heads} heads × ${headDim}, ${tokens} tokens\n`);

const eps = 1e-5, theta = 10000, cap = 30, residualScale = 0.5;
const normW = Array.from({ length: layers }, (_, l) => randomValues(hidden, 100 + l, DType.F32, 0.5, 1.5));
using x = device.upload(randomValues(hidden, 7));
using h = device.alloc(hidden * 4, DType.F32), r = device.alloc(hidden * 4, DType.F32);
using s = device.alloc(hidden * 4, DType.F32), p = device.alloc(hidden * 4, DType.F32);
using g = device.alloc(hidden * 4, DType.F32), pos = device.alloc(4, DType.U32);
const weights = normW.map((w) => device.upload(w));

/** The same pipeline in float64 on the host. */
function reference(x0: Float32Array, t: number): Float64Array {
  let v: ArrayLike<number> = x0;
  for (let l = 0; l < layers; l++) {
    const hh = refRmsNorm(v, normW[l], 1, hidden, eps);
    const rr = refRopeNeox(hh, [t], { theta, headDim, ropeDim: headDim, nHeads: heads, seqLen: 1 });
    const pp = refSoftmax(refSoftcap(rr, cap), heads, headDim);
    const gg = refGelu(refMul(pp, rr));
    v = Float64Array.from(gg, (gv, i) => residualScale * gv + v[i]);
  }
  return Float64Array.from(v);
}

counters.reset();
let worst = 0, gpuNs = 0;
const t0 = performance.now();
for (let t = 0; t < tokens; t++) {
  pos.write(new Uint32Array([t]));
  const x0 = x.read() as Float32Array;
  using enc = device.commandEncoder();
  for (let l = 0; l < layers; l++) {
    enc.memoryBarrier(); // the previous layer's residual write → this layer's norm (no-op at first)
    ops.rmsNorm(enc, registry, x, weights[l], h, { rows: 1, dim: hidden, eps });
    enc.memoryBarrier();
    ops.ropeNeox(enc, registry, h, r, pos, { theta, headDim, ropeDim: headDim, nHeads: heads, seqLen: 1 });
    enc.memoryBarrier();
    ops.softcap(enc, registry, r, s, { cap });
    enc.memoryBarrier();
    ops.softmax(enc, registry, s, p, { rows: heads, cols: headDim });
    enc.memoryBarrier();
    ops.elementwiseMul(enc, registry, p, r, g);
    enc.memoryBarrier();
    ops.gelu(enc, registry, g, g);
    enc.memoryBarrier();
    ops.axpby(enc, registry, g, x, x, { alpha: residualScale, beta: 1 });
  }
  enc.commitAndWait(`token ${t}`);
  gpuNs += enc.gpuNs;
  const diff = maxAbsDiff(x.read(), reference(x0, t));
  worst = Math.max(worst, diff);
  Deno.stdout.writeSync(
    new TextEncoder().encode(`\rtoken ${t + 1}/${tokens}  max |diff| vs float64 reference ${diff.toExponential(2)}`),
  );
}
const wallMs = performance.now() - t0;
const c = counters.snapshot();
console.log("\n");
console.table({
  "ms/token (wall, incl. host reference check)": +(wallMs / tokens).toFixed(3),
  "ms/token (device execution)": +(gpuNs / tokens / 1e6).toFixed(3),
  "dispatches/token": c.dispatches / tokens,
  "barriers/token": c.barriers / tokens,
  "command buffers/token": c.commandBuffers / tokens,
  "max |diff| vs reference": +worst.toExponential(2),
});
for (const w of weights) w.dispose();
if (!(worst < 1e-3)) {
  console.error(`FAILED: device result differs from the reference by ${worst}`);
  Deno.exit(1);
}
console.log("ok: every token matches the float64 reference");
