/**
 * The main job (`make demo`, `deno task demo`): a llama-style decoder with random weights (fixed
 * seed) decoding N tokens greedily with a KV cache, in three modes that must agree:
 *
 *   direct/hand    every op encoded directly, barriers placed by hand
 *   direct/auto    every op encoded directly, barriers placed by the conflict tracker
 *   recorded/opt   recorded, then fuse + reorder + barriers recomputed + split over two command buffers
 *
 * Per layer: RMS_NORM → MUL(weight) (as llama.cpp's graph has them, so fusion can fire), Q/K/V
 * projections, NeoX rope, K/V appended to the cache, flash attention (split + reduce), output
 * projection, residual add, RMS_NORM → MUL, SwiGLU FFN, residual add; then the final norm and a
 * dense bf16 lm-head. Weights are Q4_0 or MLX 4-bit.
 *
 *   deno run --allow-ffi --allow-read --allow-env examples/decode.ts [--layers 4] [--hidden 512]
 *     [--heads 8] [--kv-heads 2] [--ffn 1408] [--vocab 2048] [--tokens 16] [--ctx tokens]
 *     [--warmup 0] [--quant q4_0|mlx4|bf16] [--modes direct/hand,direct/auto,recorded/opt]
 *     [--backend cpu|cuda|metal] [--trace file.json (needs --allow-write)]
 *
 * bf16 weights use dense matmuls with synthetic random values (made fast, for large shapes).
 */
import { parseArgs } from "node:util";
import {
  type BackendName,
  barrierLowerBound,
  type CapturedNode,
  ComputeGraph,
  counters,
  dualBufferSplit,
  GraphExecutor,
  MlxDevice,
} from "../mod.ts";
import { createLlama } from "./llama.ts";

const { values: a } = parseArgs({
  options: {
    layers: { type: "string", default: "4" },
    hidden: { type: "string", default: "512" },
    heads: { type: "string", default: "8" },
    "kv-heads": { type: "string", default: "2" },
    ffn: { type: "string", default: "1408" },
    vocab: { type: "string", default: "2048" },
    tokens: { type: "string", default: "16" },
    ctx: { type: "string" },
    warmup: { type: "string", default: "0" },
    modes: { type: "string", default: "direct/hand,direct/auto,recorded/opt" },
    quant: { type: "string", default: "q4_0" },
    backend: { type: "string" },
    trace: { type: "string" },
    seed: { type: "string", default: "1234" },
  },
});
const cfg = {
  layers: Number(a.layers),
  hidden: Number(a.hidden),
  heads: Number(a.heads),
  kvHeads: Number(a["kv-heads"]),
  ffn: Number(a.ffn),
  vocab: Number(a.vocab),
  tokens: Number(a.tokens),
};
const quant = a.quant as "q4_0" | "mlx4" | "bf16";
const warmup = Number(a.warmup);
const ctx = a.ctx !== undefined ? Number(a.ctx) : cfg.tokens + warmup;
const headDim = cfg.hidden / cfg.heads;
const problems = [
  ...Object.entries(cfg).filter(([, v]) => !Number.isInteger(v) || v <= 0).map(([k]) =>
    `${k} must be a positive integer`
  ),
  ...(Number.isInteger(headDim) && [64, 128, 256, 512].includes(headDim)
    ? []
    : ["hidden / heads must be 64, 128, 256 or 512"]),
  ...(cfg.heads % cfg.kvHeads === 0 ? [] : ["kv-heads must divide heads"]),
  ...(quant === "q4_0" || quant === "mlx4" || quant === "bf16" ? [] : ["quant must be q4_0, mlx4 or bf16"]),
  ...(Number.isInteger(warmup) && warmup >= 0 ? [] : ["warmup must be a non-negative integer"]),
  ...(Number.isInteger(ctx) && ctx >= cfg.tokens + warmup ? [] : ["ctx must hold warmup + tokens positions"]),
  ...(cfg.hidden % 64 === 0 && cfg.ffn % 64 === 0 ? [] : ["hidden and ffn must be multiples of 64"]),
];
if (problems.length) {
  console.error(`decode: ${problems.join("; ")}`);
  Deno.exit(2);
}

// ---- setup ------------------------------------------------------------------------------------

const device = MlxDevice.open({ backend: a.backend as BackendName | undefined, trace: a.trace });
const exec = new GraphExecutor(device);
console.log(`device: ${device.info.name} — ${device.backend} backend (${device.libraryPath})`);
console.log(
  `model: ${cfg.layers} layers, hidden ${cfg.hidden} (${cfg.heads} heads × ${headDim}, ${cfg.kvHeads} kv heads), ` +
    `ffn ${cfg.ffn}, vocab ${cfg.vocab}, ctx ${ctx}, ${quant} weights; ${cfg.tokens} tokens per mode` +
    (warmup ? ` after ${warmup} warm-up tokens` : "") + "\n",
);

const model = createLlama(device, { ...cfg, ctx, quant, seed: Number(a.seed) });
const { act, embedding } = model;
const { hidden } = cfg;

// ---- modes --------------------------------------------------------------------------------------

type Mode = { name: string; recorded: boolean; auto: boolean };
const modes: Mode[] = [
  { name: "direct/hand", recorded: false, auto: false },
  { name: "direct/auto", recorded: false, auto: true },
  { name: "recorded/opt", recorded: true, auto: false },
];

interface Result {
  tokens: number[];
  logits: Float32Array[];
  wallMs: number;
  encodeNs: number;
  gpuNs: number;
  dispatches: number;
  barriers: number;
  groups: number;
  commandBuffers: number;
  fusions: number;
  reordered: number;
}

const interactive = Deno.stderr.isTerminal();
const progress = (text: string) => Deno.stderr.writeSync(new TextEncoder().encode(text));

function run(mode: Mode): Result {
  model.resetCache();
  counters.reset();
  const r: Result = {
    tokens: [],
    logits: [],
    wallMs: 0,
    encodeNs: 0,
    gpuNs: 0,
    dispatches: 0,
    barriers: 0,
    groups: 0,
    commandBuffers: 0,
    fusions: 0,
    reordered: 0,
  };
  let token = 1;
  let t0 = performance.now();
  for (let pos = 0; pos < cfg.tokens + warmup; pos++) {
    if (pos === warmup) { // only tokens after the warm-up are measured and compared
      t0 = performance.now();
      counters.reset();
      Object.assign(r, {
        tokens: [],
        logits: [],
        encodeNs: 0,
        gpuNs: 0,
        dispatches: 0,
        barriers: 0,
        groups: 0,
        commandBuffers: 0,
        fusions: 0,
        reordered: 0,
      });
    }
    act.x.write(embedding.subarray(token * hidden, (token + 1) * hidden));
    act.pos.write(new Uint32Array([pos]));
    const s = mode.recorded ? exec.beginRecorded() : exec.begin({ autoBarriers: mode.auto });
    model.step(s, pos, mode.auto ? () => {} : () => s.barrier());
    const rep = s.finish(
      mode.recorded
        ? { fuse: true, reorder: true, dualBuffer: true, label: `token ${pos}` }
        : { label: `token ${pos}` },
    );
    const logits = act.logits.read() as Float32Array;
    token = logits.reduce((best, v, i) => v > logits[best] ? i : best, 0);
    r.tokens.push(token);
    r.logits.push(logits);
    r.encodeNs += rep.encodingNs;
    r.gpuNs += rep.gpuNs;
    r.dispatches += rep.dispatches;
    r.barriers += rep.barriers.reduce((x, y) => x + y, 0);
    r.groups += rep.groups;
    r.commandBuffers += rep.barriers.length;
    r.fusions += rep.fusions;
    r.reordered += rep.reordered;
    if (interactive) progress(`\r${mode.name.padEnd(13)} token ${pos + 1}/${cfg.tokens + warmup}   `);
  }
  r.wallMs = performance.now() - t0;
  if (!interactive) progress(`${mode.name}: ${cfg.tokens} tokens in ${r.wallMs.toFixed(0)} ms\n`);
  return r;
}

/** The lower bound on barriers per token: the dependency depth of one recorded step (− 1). */
function bounds(): { plain: number; fused: number } {
  const s = exec.beginRecorded();
  model.step(s, 0, () => s.barrier());
  const nodes: CapturedNode[] = s.encoder.takeCapture()!;
  s.dispose();
  const fused = new ComputeGraph(nodes);
  fused.fuse();
  return { plain: barrierLowerBound(nodes), fused: barrierLowerBound(fused.nodes) };
}

const wanted = new Set(a.modes.split(","));
const results = modes.filter((m) => wanted.has(m.name)).map((m) => [m, run(m)] as const);
if (results.length === 0) {
  console.error(`decode: --modes must name some of ${modes.map((m) => m.name).join(", ")}`);
  Deno.exit(2);
}
if (interactive) progress("\r" + " ".repeat(40) + "\r");
const bound = bounds();
const [, ref] = results[0];
const n = cfg.tokens;
const table: Record<string, Record<string, string | number>> = {};
let agree = true;
for (const [m, r] of results) {
  let maxDiff = 0;
  r.logits.forEach((l, i) => l.forEach((v, j) => (maxDiff = Math.max(maxDiff, Math.abs(v - ref.logits[i][j])))));
  const sameTokens = r.tokens.every((t, i) => t === ref.tokens[i]);
  agree &&= sameTokens && maxDiff === 0;
  table[m.name] = {
    "ms/token": +(r.wallMs / n).toFixed(2),
    "device ms/token": +(r.gpuNs / n / 1e6).toFixed(2),
    "encode µs/token": +(r.encodeNs / n / 1e3).toFixed(0),
    "dispatches/token": r.dispatches / n,
    "barriers/token": r.barriers / n,
    // A command-buffer boundary orders like a barrier, so a split lowers the bound by one (a step of
    // at most dualBufferSplit() dispatches is not split: its second command buffer is empty).
    "barrier bound": (m.recorded ? bound.fused : bound.plain) -
      (r.commandBuffers / n > 1 && r.dispatches / n > dualBufferSplit(r.dispatches / n) ? 1 : 0),
    "cmd bufs/token": r.commandBuffers / n,
    "fusions/token": r.fusions / n,
    "reordered/token": r.reordered / n,
    "mean group size": +(r.dispatches / r.groups).toFixed(2),
    [`max |Δ logits| vs ${results[0][0].name}`]: maxDiff,
    "same tokens": sameTokens ? "yes" : "NO",
  };
}
console.table(table);
console.log(`tokens: ${ref.tokens.join(" ")}`);
if (device.profiler && device.profiler.kernels().size > 0) {
  console.log("device time per kernel (all modes and tokens, warm-up included):");
  console.table(device.profiler.kernelTable());
}
if (device.profiler?.tracePath) console.log(`trace: ${device.profiler.tracePath} (open in https://ui.perfetto.dev)`);
device.close();
if (!agree) {
  console.error("FAILED: the three modes disagree");
  Deno.exit(1);
}
console.log("ok: the three modes produce identical logits and tokens");
