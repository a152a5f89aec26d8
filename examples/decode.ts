/**
 * The main job (`make demo`, `deno task demo`): a llama-style decoder with random weights (fixed
 * seed) decoding N tokens greedily with a KV cache. Two independent choices make a column of the
 * result table, and every column must produce the same tokens:
 *
 * How a pass is encoded (--modes):
 *   direct/hand    every op encoded directly, barriers placed by hand
 *   direct/auto    every op encoded directly, barriers placed by the conflict tracker
 *   recorded/opt   recorded, then fuse + reorder + barriers recomputed + split over two command buffers
 *   pipelined      recorded/opt in one command buffer per pass, always under the pipelined loop
 *                  (overlapping whole passes already hides the encoding, and a split would add a
 *                  hand-off per token)
 *   frozen         the pipelined mode's pass frozen (GraphSession.freeze): encoded and optimised
 *                  once per run, then the same command stream committed for every token
 *
 * How the token loop is driven (--loop):
 *   sync           commit a pass, wait, read the logits, pick the next token on the host
 *   pipelined      a DecodeLoop: each pass gathers its input embedding from the device id ring and
 *                  picks the next token (argmax) on the device, token n+1 is encoded while token n
 *                  runs, ids are read back in batches, and the position lives in a device step state
 *                  (direct modes re-encode every pass; recorded/opt replays its cached plan)
 *
 * Per layer: RMS_NORM → MUL(weight) (as llama.cpp's graph has them, so fusion can fire), Q/K/V
 * projections, NeoX rope, K/V appended to the cache, flash attention (split + reduce), output
 * projection, residual add, RMS_NORM → MUL, SwiGLU FFN, residual add; then the final norm and a
 * dense bf16 lm-head. Weights are Q4_0 or MLX 4-bit.
 *
 *   deno run --allow-ffi --allow-read --allow-env examples/decode.ts [flags]   (--help lists them)
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
  DecodeLoop,
  type DecodeRunReport,
  DType,
  dualBufferSplit,
  type FinishReport,
  GraphExecutor,
  type GraphSession,
  MlxDevice,
  MlxError,
} from "../mod.ts";
import { createLlama } from "./llama.ts";
import { calibrateDeviceClock, type ClockOffset, pipelineTraceEvents, stepOverlaps } from "./pipeline_trace.ts";

const MODE_HELP: Record<string, string> = {
  "direct/hand": "ops encoded directly, barriers placed by hand",
  "direct/auto": "ops encoded directly, barriers placed by the conflict tracker",
  "recorded/opt": "recorded; fused, reordered, barriers recomputed, 2 cmd buffers",
  "pipelined": "recorded/opt in 1 cmd buffer; runs under the pipelined loop only",
  "frozen": "pipelined, frozen: encoded once per run, re-committed every token",
};

/** The modes run without --modes (the pipelined one is asked for by name). */
const DEFAULT_MODES = ["direct/hand", "direct/auto", "recorded/opt"];

/** How the token loop is driven: the host picks each token, or a pipelined DecodeLoop on the device. */
type Loop = "sync" | "pipelined";
const LOOPS: Record<string, Loop[]> = { sync: ["sync"], pipelined: ["pipelined"], both: ["sync", "pipelined"] };

const USAGE = `Usage: deno run --allow-ffi --allow-read --allow-env examples/decode.ts [flags]
       (or: make demo; deno task demo [flags])

A llama-style decoder with random weights decodes tokens greedily in each mode and loop; every
column (mode, loop) must produce identical tokens (and logits: the pipelined loop keeps the last).

Model:
  --layers N      transformer layers (default 4)
  --hidden N      hidden size, a multiple of 64; hidden / heads is 64, 128, 256 or 512 (default 512)
  --heads N       attention heads (default 8)
  --kv-heads N    key/value heads, dividing heads (default 2)
  --ffn N         feed-forward size, a multiple of 64 (default 1408)
  --vocab N       vocabulary size (default 2048)
  --quant KIND    weights: q4_0, mlx4 or bf16 (default q4_0)
  --seed N        weight seed (default 1234)
Run:
  --tokens N      tokens measured per mode (default 16)
  --warmup N      tokens decoded first in each mode, not measured (default 0)
  --rounds N      run the modes N times round-robin; report each mode's median-wall run
                  (default 1)
  --ctx N         KV-cache capacity in tokens (default warmup + tokens)
  --modes LIST    comma-separated, of ${Object.keys(MODE_HELP).join(", ")}
                  (default ${DEFAULT_MODES.join(",")})
  --loop KIND     how the modes' token loop is driven (default sync; the pipelined mode
                  always runs under the pipelined loop):
                    sync       wait for each pass, read the logits, pick the token on the host
                    pipelined  a DecodeLoop: embedding gather and argmax on the device,
                               --depth passes in flight, ids read back in batches
                    both       each mode under each loop
  --depth N       pipelined loop: passes in flight (default 2; 1 waits for each pass)
  --read-batch N  pipelined loop: read token ids back every N tokens (default 16)
  --backend NAME  cpu, cuda or metal (default: the best available)
  --threads N     CPU backend worker threads (default 0: one per core)
  --wait-spin-us N  a wait polls the pass this long before it sleeps (default 0;
                  DeviceOptions.waitSpinUs: the sync loop's thread stays on an awake core)
  --trace FILE    write a Chrome / Perfetto trace at the end (needs --allow-write); each
                  pipelined-loop column also writes one of host encode, wait and readback
                  spans beside the device's command buffers: FILE's name + ".pipelined.json"
                  for the pipelined mode, + ".MODE.pipelined.json" for the others (MODE with
                  "/" as "-", e.g. ".direct-hand.pipelined.json")
  -h, --help      print this help`;

/** Prints `message` and the usage to stderr and exits with status 2. */
function usageError(message: string): never {
  console.error(`decode: ${message}\n\n${USAGE}`);
  Deno.exit(2);
}

let parsed;
try {
  parsed = parseArgs({
    strict: true,
    options: {
      help: { type: "boolean", short: "h" },
      layers: { type: "string", default: "4" },
      hidden: { type: "string", default: "512" },
      heads: { type: "string", default: "8" },
      "kv-heads": { type: "string", default: "2" },
      ffn: { type: "string", default: "1408" },
      vocab: { type: "string", default: "2048" },
      tokens: { type: "string", default: "16" },
      ctx: { type: "string" },
      warmup: { type: "string", default: "0" },
      modes: { type: "string", default: DEFAULT_MODES.join(",") },
      quant: { type: "string", default: "q4_0" },
      backend: { type: "string" },
      trace: { type: "string" },
      seed: { type: "string", default: "1234" },
      depth: { type: "string", default: "2" },
      "read-batch": { type: "string", default: "16" },
      threads: { type: "string", default: "0" },
      "wait-spin-us": { type: "string", default: "0" },
      rounds: { type: "string", default: "1" },
      loop: { type: "string", default: "sync" },
    },
  });
} catch (e) {
  usageError(e instanceof Error ? e.message : String(e));
}
const a = parsed.values;
if (a.help) {
  console.log(USAGE);
  Deno.exit(0);
}
const cfg = {
  layers: Number(a.layers),
  hidden: Number(a.hidden),
  heads: Number(a.heads),
  kvHeads: Number(a["kv-heads"]),
  ffn: Number(a.ffn),
  vocab: Number(a.vocab),
  tokens: Number(a.tokens),
};
const loopCfg = { depth: Number(a.depth), "read-batch": Number(a["read-batch"]), rounds: Number(a.rounds) };
const rounds = loopCfg.rounds;
const quant = a.quant as "q4_0" | "mlx4" | "bf16";
const warmup = Number(a.warmup);
const seed = Number(a.seed);
const threads = Number(a.threads);
const waitSpinUs = Number(a["wait-spin-us"]);
const ctx = a.ctx !== undefined ? Number(a.ctx) : cfg.tokens + warmup;
const headDim = cfg.hidden / cfg.heads;
const wantedModes = a.modes.split(",").map((m) => m.trim()).filter((m) => m !== "");
const unknownModes = wantedModes.filter((m) => !(m in MODE_HELP));
const problems = [
  ...Object.entries({ ...cfg, ...loopCfg }).filter(([, v]) => !Number.isInteger(v) || v <= 0).map(([k]) =>
    `${k} must be a positive integer`
  ),
  ...(Number.isInteger(headDim) && [64, 128, 256, 512].includes(headDim)
    ? []
    : ["hidden / heads must be 64, 128, 256 or 512"]),
  ...(cfg.heads % cfg.kvHeads === 0 ? [] : ["kv-heads must divide heads"]),
  ...(quant === "q4_0" || quant === "mlx4" || quant === "bf16" ? [] : ["quant must be q4_0, mlx4 or bf16"]),
  ...(Number.isInteger(warmup) && warmup >= 0 ? [] : ["warmup must be a non-negative integer"]),
  ...(Number.isSafeInteger(seed) ? [] : ["seed must be an integer"]),
  ...(Number.isInteger(threads) && threads >= 0 && threads <= 1024 ? [] : ["threads must be an integer in 0..1024"]),
  ...(waitSpinUs >= 0 && waitSpinUs <= 1e6 ? [] : ["wait-spin-us must be a number in 0..1000000"]),
  ...(Number.isInteger(ctx) && ctx >= cfg.tokens + warmup ? [] : ["ctx must hold warmup + tokens positions"]),
  ...(cfg.hidden % 64 === 0 && cfg.ffn % 64 === 0 ? [] : ["hidden and ffn must be multiples of 64"]),
  ...(a.backend === undefined || ["cpu", "cuda", "metal"].includes(a.backend)
    ? []
    : ["backend must be cpu, cuda or metal"]),
  ...(unknownModes.length ? [`unknown mode ${unknownModes.join(", ")}`] : []),
  ...(wantedModes.length ? [] : ["modes must name at least one mode"]),
  ...(new Set(wantedModes).size === wantedModes.length ? [] : ["modes must not repeat a mode"]),
  // The DecodeLoop's id ring has depth + read-batch slots, at most 65,536.
  ...(loopCfg.depth + loopCfg["read-batch"] <= 65536 ? [] : ["depth + read-batch must be at most 65536"]),
  ...(Object.hasOwn(LOOPS, a.loop) ? [] : [`loop must be sync, pipelined or both, not "${a.loop}"`]),
];
if (problems.length) usageError(problems.join("; "));

// ---- setup ------------------------------------------------------------------------------------

let device: MlxDevice;
try {
  device = MlxDevice.open({ backend: a.backend as BackendName | undefined, trace: a.trace, threads, waitSpinUs });
} catch (e) {
  if (!(e instanceof MlxError)) throw e;
  console.error(`decode: cannot open a device (${e.code}): ${e.message}`);
  Deno.exit(1);
}
const exec = new GraphExecutor(device);
console.log(`device: ${device.info.name} — ${device.backend} backend (${device.libraryPath})`);
console.log(
  `model: ${cfg.layers} layers, hidden ${cfg.hidden} (${cfg.heads} heads × ${headDim}, ${cfg.kvHeads} kv heads), ` +
    `ffn ${cfg.ffn},\n       vocab ${cfg.vocab}, ctx ${ctx}, ${quant} weights; ${cfg.tokens} tokens per mode` +
    (warmup ? ` after ${warmup} warm-up tokens` : "") + "\n",
);

const model = createLlama(device, { ...cfg, ctx, quant, seed });
const { act, embedding } = model;
const { hidden } = cfg;

// ---- modes and loops ---------------------------------------------------------------------------

/** How a pass is encoded. */
interface Mode {
  name: string;
  recorded: boolean;
  auto: boolean;
  /** A recorded pass is split over two command buffers (the pipelined mode keeps one). */
  dualBuffer: boolean;
  /** The pass is frozen once per run and committed again for every token. */
  frozen: boolean;
  /** The mode runs under the pipelined loop only. */
  pipelinedOnly: boolean;
}

/** One column of the result: a mode's passes driven by a loop. */
interface Column {
  mode: Mode;
  loop: Loop;
  /** The column's name in progress lines and summaries. */
  label: string;
}

const modes: Mode[] = wantedModes.map((name) => ({
  name,
  recorded: name === "recorded/opt" || name === "pipelined" || name === "frozen",
  auto: name === "direct/auto",
  dualBuffer: name === "recorded/opt",
  frozen: name === "frozen",
  pipelinedOnly: name === "pipelined" || name === "frozen",
}));
const loops = LOOPS[a.loop]!;
// One loop: the columns follow --modes (the first is the reference). Both: the sync columns, then
// the pipelined loop's; the pipelined and frozen modes run under the pipelined loop only.
const columns: Column[] = loops.flatMap((loop) =>
  modes.filter((m) => loops.length === 1 || loop === "pipelined" || !m.pipelinedOnly).map((mode) => {
    const l: Loop = mode.pipelinedOnly ? "pipelined" : loop;
    return { mode, loop: l, label: l === "sync" || mode.pipelinedOnly ? mode.name : `${mode.name}, pipelined` };
  })
);

/** The median of `xs` (NaN when empty). */
function median(xs: readonly number[]): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b), m = s.length >> 1;
  return s.length % 2 === 1 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

interface Result {
  /** Recorded passes that replayed a cached plan. */
  planHits: number;
  tokens: number[];
  /** Every measured token's logits (sync loop), or the last token's (pipelined loop). */
  logits: Float32Array[];
  wallMs: number;
  encodeNs: number;
  /** Each measured token's host encode time, ns. */
  encodeSamples: number[];
  gpuNs: number;
  dispatches: number;
  barriers: number;
  groups: number;
  commandBuffers: number;
  fusions: number;
  reordered: number;
  /** The pipelined loop's report (for its overlap summary and trace). */
  loopRun?: DecodeRunReport;
}

const interactive = Deno.stderr.isTerminal();
const progress = (text: string) => Deno.stderr.writeSync(new TextEncoder().encode(text));

/** The index of the largest value (the first on ties). A plain loop: a reduce callback boxes each
 * float, and the garbage it leaves would be collected inside the next pass's encode. */
function argmax(values: Float32Array): number {
  let best = 0;
  for (let i = 1; i < values.length; i++) if (values[i]! > values[best]!) best = i;
  return best;
}

/** Each pipelined-loop column's DecodeLoop, made on its first run and kept for the next rounds. */
const decodeLoops = new Map<Column, DecodeLoop>();

/**
 * The column's DecodeLoop: every pass gathers its input embedding from the id ring and writes its
 * argmax into the next slot, `depth` passes in flight, the position in the loop's step state. Direct
 * modes encode each pass afresh (hand barriers or the tracker's); recorded ones fuse and reorder
 * it, and their identical passes replay the plan cached at the first.
 */
function decodeLoop(c: Column): DecodeLoop {
  let loop = decodeLoops.get(c);
  if (loop) return loop;
  const m = c.mode;
  loop = new DecodeLoop(exec, {
    depth: loopCfg.depth,
    readBatch: loopCfg["read-batch"],
    recorded: m.recorded,
    frozen: m.frozen,
    stepState: true,
    session: { autoBarriers: m.auto },
    ...(m.recorded ? { finish: { fuse: true, reorder: true, dualBuffer: m.dualBuffer } } : {}),
    encodeStep: (s, t) => model.tokenStep(s, t, m.auto ? () => {} : () => s.barrier()),
  });
  decodeLoops.set(c, loop);
  return loop;
}

/** A column under the pipelined loop; the logits are read once, after the run. */
function runPipelined(c: Column): Result {
  const loop = decodeLoop(c);
  model.resetCache();
  counters.reset();
  let first = 1;
  if (warmup > 0) first = loop.run({ first, steps: warmup }).tokens[warmup - 1]!;
  counters.reset();
  const rep = loop.run({ first, steps: cfg.tokens, startPosition: warmup });
  const sum = (f: (r: FinishReport) => number) => rep.reports.reduce((x, r) => x + f(r), 0);
  const r: Result = {
    planHits: rep.reports.filter((x) => x.planCache === "hit").length,
    tokens: [...rep.tokens],
    logits: [act.logits!.read() as Float32Array],
    wallMs: rep.wallNs / 1e6,
    encodeNs: rep.encodeNs,
    encodeSamples: rep.timings.map((t) => t.committedNs - t.encodeStartNs),
    gpuNs: rep.deviceNs,
    dispatches: sum((r) => r.dispatches),
    barriers: sum((r) => r.barriers.reduce((x, y) => x + y, 0)),
    groups: sum((r) => r.groups),
    commandBuffers: sum((r) => r.barriers.length),
    fusions: sum((r) => r.fusions),
    reordered: sum((r) => r.reordered),
    loopRun: rep,
  };
  if (!interactive) progress(`${c.label}: ${cfg.tokens} tokens in ${r.wallMs.toFixed(0)} ms\n`);
  return r;
}

function run(c: Column): Result {
  if (c.loop === "pipelined") return runPipelined(c);
  const mode = c.mode;
  model.resetCache();
  counters.reset();
  const r: Result = {
    planHits: 0,
    tokens: [],
    logits: [],
    wallMs: 0,
    encodeNs: 0,
    encodeSamples: [],
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
  // Recorded passes read the position from the device step state and advance it themselves, so
  // every token's pass has the same commands (and replays the plan cached at the first).
  const state = act.state!, position = state.slice(0, 4);
  const logitsStore = new Float32Array(cfg.tokens * cfg.vocab);
  if (mode.recorded) state.write(Uint32Array.from([0, 1, 0, 0]));
  for (let pos = 0; pos < cfg.tokens + warmup; pos++) {
    if (pos === warmup) { // only tokens after the warm-up are measured and compared
      t0 = performance.now();
      counters.reset();
      Object.assign(r, {
        planHits: 0,
        tokens: [],
        logits: [],
        encodeNs: 0,
        encodeSamples: [],
        gpuNs: 0,
        dispatches: 0,
        barriers: 0,
        groups: 0,
        commandBuffers: 0,
        fusions: 0,
        reordered: 0,
      });
    }
    act.x!.write(embedding.subarray(token * hidden, (token + 1) * hidden));
    act.pos!.write(new Uint32Array([pos]));
    // Direct passes differ per token only in the position's constants and KV-cache rows: `reuse`
    // replays the previous pass's decoded commands with those patched.
    const s = mode.recorded ? exec.beginRecorded() : exec.begin({ autoBarriers: mode.auto, reuse: true });
    if (mode.recorded) {
      model.step(s, pos, () => s.barrier(), undefined, position);
      s.barrier();
      s.stepAdvance(state);
    } else model.step(s, pos, mode.auto ? () => {} : () => s.barrier());
    const rep = s.finish(
      mode.recorded
        ? { fuse: true, reorder: true, dualBuffer: mode.dualBuffer, label: `token ${pos}` }
        : { label: `token ${pos}` },
    );
    // Read into the column's preallocated logits (no 128 KB allocation per token to collect later).
    const at = pos < warmup ? 0 : pos - warmup, logits = logitsStore.subarray(at * cfg.vocab, (at + 1) * cfg.vocab);
    act.logits!.readBytesInto(logits);
    token = argmax(logits);
    r.tokens.push(token);
    r.logits.push(logits);
    r.encodeNs += rep.encodingNs;
    r.encodeSamples.push(rep.encodingNs);
    r.gpuNs += rep.gpuNs;
    r.dispatches += rep.dispatches;
    r.barriers += rep.barriers.reduce((x, y) => x + y, 0);
    r.groups += rep.groups;
    r.commandBuffers += rep.barriers.length;
    r.fusions += rep.fusions;
    r.reordered += rep.reordered;
    if (rep.planCache === "hit") r.planHits++;
    if (interactive) progress(`\r${c.label.padEnd(13)} token ${pos + 1}/${cfg.tokens + warmup}   `);
  }
  r.wallMs = performance.now() - t0;
  if (!interactive) progress(`${c.label}: ${cfg.tokens} tokens in ${r.wallMs.toFixed(0)} ms\n`);
  return r;
}

/**
 * The lower bound on barriers per token: the dependency depth (− 1) of one direct step and of one
 * recorded (state-driven, fused) step under the sync loop, and of one token pass (gather + step +
 * argmax + state advance) under the pipelined loop, unfused and fused.
 */
function bounds(): { plain: number; fused: number; passPlain: number; passFused: number } {
  const depthBound = (encode: (s: GraphSession) => void) => {
    const s = exec.beginRecorded();
    encode(s);
    const nodes: CapturedNode[] = s.encoder.takeCapture()!;
    s.dispose();
    const fused = new ComputeGraph(nodes);
    fused.fuse();
    return { plain: barrierLowerBound(nodes), fused: barrierLowerBound(fused.nodes) };
  };
  const direct = depthBound((s) => model.step(s, 0, () => s.barrier()));
  // The recorded modes' passes are state-driven and end with the state's advance.
  const state = act.state!, position = state.slice(0, 4);
  const advanced = (s: GraphSession, encode: () => void) => {
    encode();
    s.barrier();
    s.stepAdvance(state);
  };
  const step = depthBound((s) => advanced(s, () => model.step(s, 0, () => s.barrier(), undefined, position)));
  using ids = device.alloc(8, DType.U32);
  const token = {
    index: 0,
    position: 0,
    input: ids.slice(0, 4),
    output: ids.slice(4, 4),
    state: { position, next: state.slice(4, 4), ring: ids, ringSlots: 2 },
  };
  const pass = depthBound((s) => advanced(s, () => model.tokenStep(s, token, () => s.barrier())));
  return { plain: direct.plain, fused: step.fused, passPlain: pass.plain, passFused: pass.fused };
}

/**
 * Runs every column `rounds` times, round-robin (so drifting machine load hits every column alike),
 * and keeps each column's run of median wall time.
 */
function runRounds(): (readonly [Column, Result])[] {
  const all = columns.map(() => [] as Result[]);
  for (let round = 0; round < rounds; round++) columns.forEach((c, i) => all[i]!.push(run(c)));
  return columns.map((c, i) => [c, all[i]!.sort((x, y) => x.wallMs - y.wallMs)[(rounds - 1) >> 1]!] as const);
}

const results = runRounds();
if (interactive) progress("\r" + " ".repeat(40) + "\r");
const bound = bounds();
const [refColumn, ref] = results[0]!;
const n = cfg.tokens;
/** A loop row names each column's loop when any column is not the sync loop's. */
const showLoops = columns.some((c) => c.loop !== "sync");
const refName = showLoops ? "column 1" : refColumn.mode.name;

/** One row of the result table: its label, its meaning, and its value for each column. */
interface Row {
  label: string;
  help: string;
  value: (c: Column, r: Result, maxDiff: number) => string | number;
}

const rows: Row[] = [
  ...(showLoops
    ? [{ label: "loop", help: "how the token loop is driven (see loops)", value: (c: Column) => c.loop }]
    : []),
  { label: "wall ms", help: "host wall time: encode + submit + wait", value: (_, r) => (r.wallMs / n).toFixed(2) },
  { label: "device ms", help: "device execution time", value: (_, r) => (r.gpuNs / n / 1e6).toFixed(2) },
  {
    label: "wall / device",
    help: "wall over device time (1.00: the device never waits)",
    value: (_, r) => (r.wallMs * 1e6 / r.gpuNs).toFixed(3),
  },
  { label: "encode µs", help: "host time spent encoding the step", value: (_, r) => (r.encodeNs / n / 1e3).toFixed(0) },
  {
    label: "encode p50 µs",
    help: "the median step's encode (the mean includes the slow tail)",
    value: (_, r) => (median(r.encodeSamples) / 1e3).toFixed(0),
  },
  { label: "dispatches", help: "kernel dispatches", value: (_, r) => r.dispatches / n },
  { label: "barriers", help: "memory barriers between concurrent groups", value: (_, r) => r.barriers / n },
  {
    label: "barrier bound",
    help: "fewest barriers the step's dependencies allow",
    // A command-buffer boundary orders like a barrier, so a split lowers the bound by one (a step of
    // at most dualBufferSplit() dispatches is not split: its second command buffer is empty).
    value: (c, r) =>
      (c.loop === "pipelined"
        ? (c.mode.recorded ? bound.passFused : bound.passPlain)
        : (c.mode.recorded ? bound.fused : bound.plain)) -
      (r.commandBuffers / n > 1 && r.dispatches / n > dualBufferSplit(r.dispatches / n) ? 1 : 0),
  },
  { label: "cmd buffers", help: "command buffers", value: (_, r) => r.commandBuffers / n },
  {
    label: "plan hits",
    help: "recorded passes that replayed a cached plan",
    value: (c, r) => c.mode.recorded ? `${r.planHits}/${n}` : "-",
  },
  { label: "fusions", help: "rms_norm + mul (+ add) fused into one dispatch", value: (_, r) => r.fusions / n },
  { label: "reordered", help: "dispatches moved by the reorder pass", value: (_, r) => r.reordered / n },
  {
    label: "group size",
    help: "mean dispatches per concurrent group",
    value: (_, r) => (r.dispatches / r.groups).toFixed(2),
  },
  {
    label: "max |Δ logits|",
    help: `largest logit difference from ${refName} (pipelined: last)`,
    value: (_c, _r, d) => d === 0 ? 0 : d.toPrecision(3),
  },
  {
    label: "same tokens",
    help: `greedy tokens equal ${refName}'s`,
    value: (_c, r) => sameTokens(r) ? "yes" : "NO",
  },
];

function sameTokens(r: Result): boolean {
  return r.tokens.length === ref.tokens.length && r.tokens.every((t, i) => t === ref.tokens[i]);
}

/**
 * How a pipelined-loop column overlapped: per step, whether the host began encoding token n+1
 * before the device finished token n, and the device's idle time between passes; with --trace, the
 * host and device spans on one timeline.
 */
function summarisePipelined(c: Column, report: DecodeRunReport, clock: ClockOffset): void {
  const loop = decodeLoops.get(c)!;
  const o = stepOverlaps(report, clock);
  const early = o.filter((x) => x.encodeBeganBeforeDeviceEnd).length;
  const mean = (f: (x: (typeof o)[number]) => number) => o.reduce((t, x) => t + f(x), 0) / Math.max(1, o.length) / 1e3;
  console.log(
    `${c.label}: depth ${loop.depth}, ids read every ${loop.readBatch} tokens (${report.readbacks.length} reads);\n` +
      `  token n+1's encoding began before the device finished token n in ${early}/${o.length} steps;\n` +
      `  mean overlap ${mean((x) => x.overlapNs).toFixed(0)} µs, mean device idle between passes ` +
      `${mean((x) => x.deviceGapNs).toFixed(0)} µs\n  (host and device clocks aligned to ± ${
        (clock.errorNs / 1e3).toFixed(1)
      } µs)`,
  );
  if (a.trace !== undefined) {
    const mode = c.mode.name === "pipelined" ? "" : `.${c.mode.name.replace("/", "-")}`;
    const path = a.trace.replace(/(\.json)?$/, `${mode}.pipelined.json`);
    Deno.writeTextFileSync(path, JSON.stringify({ traceEvents: pipelineTraceEvents(report, clock, loop, c.label) }));
    console.log(`${c.label} trace: ${path}\n  (host encode/wait/readback spans beside the device's passes)`);
  }
}

let agree = true;
const diffs = results.map(([, r]) => {
  // The pipelined loop keeps only the last token's logits: compare the tokens both columns kept.
  let maxDiff = 0;
  const kept = Math.min(r.logits.length, ref.logits.length);
  for (let i = 1; i <= kept; i++) {
    const l = r.logits[r.logits.length - i]!, want = ref.logits[ref.logits.length - i]!;
    l.forEach((v, j) => (maxDiff = Math.max(maxDiff, Math.abs(v - want[j]!))));
  }
  agree &&= sameTokens(r) && maxDiff === 0;
  return maxDiff;
});
const labelWidth = Math.max(...rows.map((r) => r.label.length));
const colWidth = Math.max(...results.map(([c]) => Math.max(c.mode.name.length, showLoops ? c.loop.length : 0))) + 2;
// One table when the columns fit 80 characters; else one per loop (each split further if need be).
const perTable = Math.max(1, Math.floor((80 - labelWidth) / colWidth));
const tables: number[][] = [];
results.forEach(([c], i) => {
  const last = tables.at(-1);
  const fitsAll = results.length <= perTable;
  if (last && last.length < perTable && (fitsAll || results[last[0]!]![0].loop === c.loop)) last.push(i);
  else tables.push([i]);
});
console.log(`per token, over ${n} tokens${rounds > 1 ? ` (median-wall run of ${rounds} rounds)` : ""}:`);
tables.forEach((cols, t) => {
  if (t > 0) console.log("");
  console.log(" ".repeat(labelWidth) + cols.map((i) => results[i]![0].mode.name.padStart(colWidth)).join(""));
  for (const row of rows) {
    const cells = cols.map((i) => String(row.value(results[i]![0], results[i]![1], diffs[i]!)).padStart(colWidth));
    console.log(row.label.padEnd(labelWidth) + cells.join(""));
  }
});
console.log("\nmodes:");
for (const name of new Set(results.map(([c]) => c.mode.name))) {
  console.log(`  ${name.padEnd(colWidth)}${MODE_HELP[name]}`);
}
if (showLoops) {
  console.log("loops:");
  console.log(
    `  ${"sync".padEnd(colWidth)}wait, pick the token on the host; direct passes begun with reuse`,
  );
  console.log(
    `  ${"pipelined".padEnd(colWidth)}DecodeLoop: gather + argmax on device, ${loopCfg.depth} passes in flight`,
  );
}
console.log("rows:");
for (const row of rows) console.log(`  ${row.label.padEnd(labelWidth + 2)}${row.help}`);
console.log(`tokens: ${ref.tokens.join(" ")}`);
if (device.profiler && device.profiler.kernels().size > 0) {
  console.log("device time per kernel (all modes and tokens, warm-up included):");
  console.table(device.profiler.kernelTable());
}
if (device.profiler?.tracePath) console.log(`trace: ${device.profiler.tracePath} (open in https://ui.perfetto.dev)`);
const piped = results.filter(([c]) => c.loop === "pipelined");
if (piped.length) {
  const clock = calibrateDeviceClock(device);
  for (const [c, r] of piped) summarisePipelined(c, r.loopRun!, clock);
}
for (const loop of decodeLoops.values()) loop.dispose();
device.close();
if (!agree) {
  console.error("FAILED: the columns disagree");
  Deno.exit(1);
}
console.log(`ok: ${results.length === 1 ? "one mode ran" : "the modes produce identical logits and tokens"}`);
