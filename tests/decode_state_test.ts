/**
 * State-driven token passes: with a DecodeLoop's step state, every pass of the demo model
 * (examples/llama.ts) and of a loaded model (src/model/llama.ts) encodes the same command stream,
 * replays the plan cache from the second token on, and produces exactly the tokens and logits of the
 * position-driven passes (greedy and seeded sampling) on the backend MLXN_BACKEND selects.
 */
import { deepStrictEqual, equal, ok, throws } from "node:assert/strict";
import {
  DecodeLoop,
  type DecodeLoopOptions,
  type DecodeStep,
  DType,
  type FinishReport,
  GraphExecutor,
  type GraphSession,
  loadLlama,
  type MlxBuffer,
  MlxError,
} from "../mod.ts";
import { createLlama, type TokenSelection } from "../examples/llama.ts";
import { stepAdvance } from "../src/ops/sample.ts";
import { openDevice } from "./helpers.ts";
import { writeTinyLlamaGguf } from "./helpers/gguf_writer.ts";

const MODEL = { layers: 2, hidden: 128, heads: 2, kvHeads: 1, ffn: 256, vocab: 300, ctx: 24, seed: 7 };
const SELECTIONS: [string, TokenSelection][] = [
  ["greedy", {}],
  ["seeded sampling", { temperature: 0.9, topK: 40, topP: 0.95, seed: 11 }],
];

interface Run {
  tokens: number[];
  logits: Float32Array;
  reports: readonly FinishReport[];
}

/** Runs `steps` tokens from id 3 in a DecodeLoop; `logits` is the last pass's. */
function decode(
  exec: GraphExecutor,
  encodeStep: DecodeLoopOptions["encodeStep"],
  logits: MlxBuffer,
  steps: number,
  options: Partial<DecodeLoopOptions>,
  startPosition = 0,
): Run {
  using loop = new DecodeLoop(exec, { encodeStep, readBatch: 4, ...options });
  const rep = loop.run({ first: 3, steps, startPosition });
  return { tokens: [...rep.tokens], logits: logits.read() as Float32Array, reports: rep.reports };
}

/** The stream words and bound buffers (allocation, offset, length) of one captured pass. */
function capturedPass(exec: GraphExecutor, encode: (s: GraphSession) => void): { words: number[]; bufs: string[] } {
  const s = exec.beginRecorded({ autoBarriers: false });
  try {
    encode(s);
    const c = s.encoder.takeCompactCapture()!;
    const out = {
      words: [...c.words.subarray(0, c.length)],
      bufs: c.boundBuffers().map((b) => `${b.allocId}:${b.byteOffset}:${b.byteLength}`),
    };
    c.release();
    return out;
  } finally {
    s.dispose();
  }
}

for (const quant of ["q4_0", "bf16"] as const) {
  for (const [what, select] of SELECTIONS) {
    Deno.test(`demo model (${quant}), ${what}: state-driven passes give the position-driven tokens and logits`, () => {
      using device = openDevice();
      const exec = new GraphExecutor(device);
      const model = createLlama(device, { ...MODEL, quant });
      const encodeStep: DecodeLoopOptions["encodeStep"] = (s, t) => model.tokenStep(s, t, () => s.barrier(), select);
      const steps = 10, logits = model.act.logits!;
      model.resetCache();
      const plain = decode(exec, encodeStep, logits, steps, { depth: 1 });
      for (const options of [{ depth: 1 }, { depth: 2, recorded: true, finish: { fuse: true, reorder: true } }]) {
        model.resetCache();
        const st = decode(exec, encodeStep, logits, steps, { ...options, stepState: true });
        deepStrictEqual(st.tokens, plain.tokens, `${JSON.stringify(options)}: tokens`);
        deepStrictEqual(st.logits, plain.logits, `${JSON.stringify(options)}: last logits`);
        if (options.recorded) {
          equal(st.reports[0]!.planCache, "miss");
          deepStrictEqual(st.reports.slice(1).map((r) => r.planCache), new Array(steps - 1).fill("hit"));
        }
      }
    });
  }
}

Deno.test("a state-driven run split in two continues the same sequence", () => {
  using device = openDevice();
  const exec = new GraphExecutor(device);
  const model = createLlama(device, { ...MODEL, quant: "q4_0" });
  const select = { temperature: 0.8, seed: 5 };
  const encodeStep: DecodeLoopOptions["encodeStep"] = (s, t) => model.tokenStep(s, t, () => s.barrier(), select);
  const logits = model.act.logits!;
  model.resetCache();
  const whole = decode(exec, encodeStep, logits, 9, { stepState: true });
  model.resetCache();
  using loop = new DecodeLoop(exec, { encodeStep, readBatch: 4, stepState: true });
  const a = loop.run({ first: 3, steps: 5 });
  const b = loop.run({ first: a.tokens[4]!, steps: 4, startPosition: 5 });
  deepStrictEqual([...a.tokens, ...b.tokens], whole.tokens);
});

Deno.test("consecutive state-driven passes encode byte-identical command streams", () => {
  using device = openDevice();
  const exec = new GraphExecutor(device);
  for (const quant of ["q4_0", "bf16"] as const) {
    const model = createLlama(device, { ...MODEL, quant });
    using ids = device.alloc(8 * 4, DType.U32);
    using state = device.alloc(16, DType.U32);
    const views = { position: state.slice(0, 4), next: state.slice(4, 4), ring: ids, ringSlots: 8 };
    const step = (k: number, withState: boolean): DecodeStep => ({
      index: k,
      position: k,
      input: ids.slice((k % 8) * 4, 4),
      output: ids.slice(((k + 1) % 8) * 4, 4),
      ...(withState ? { state: views } : {}),
    });
    for (const select of [{}, { temperature: 0.7, seed: 3 }]) {
      const pass = (k: number, withState: boolean) =>
        capturedPass(exec, (s) => {
          model.tokenStep(s, step(k, withState), () => s.barrier(), select);
          s.barrier();
          stepAdvance(s, exec.registry, state);
        });
      deepStrictEqual(pass(5, true), pass(6, true), `${quant}: passes 5 and 6`);
      deepStrictEqual(pass(0, true), pass(17, true), `${quant}: passes 0 and 17`);
      // The position-driven pass does differ (the check above can fail).
      ok(JSON.stringify(pass(5, false)) !== JSON.stringify(pass(6, false)), "position-driven passes differ");
    }
  }
});

/** A 2-layer GGUF whose head dim (64) the decode attention takes. */
function tinyGguf(): string {
  const dir = Deno.makeTempDirSync({ prefix: "mlxn-state-" });
  const path = `${dir}/tiny.gguf`;
  Deno.writeFileSync(
    path,
    writeTinyLlamaGguf({
      layers: 2,
      hidden: 256,
      heads: 4,
      kvHeads: 2,
      ffn: 512,
      vocab: 300,
      seed: 9,
      typeOf: (role: string) => (role === "output" ? "q6_k" : role === "token_embd" ? "q8_0" : "q4_k"),
    }),
  );
  return path;
}

for (const [what, select] of SELECTIONS) {
  Deno.test(`loaded model, ${what}: state-driven passes give the same tokens and logits and hit the plan cache`, () => {
    using device = openDevice();
    const exec = new GraphExecutor(device);
    using model = loadLlama(device, tinyGguf(), { ctx: 16 });
    const encodeStep: DecodeLoopOptions["encodeStep"] = (s, t) => model.encodeTokenStep(s, t, select);
    const steps = 8;
    model.resetCache();
    const plain = decode(exec, encodeStep, model.logits, steps, { depth: 1 });
    model.resetCache();
    const st = decode(exec, encodeStep, model.logits, steps, {
      stepState: true,
      recorded: true,
      finish: { fuse: true, reorder: true },
    });
    deepStrictEqual(st.tokens, plain.tokens);
    deepStrictEqual(st.logits, plain.logits);
    deepStrictEqual(st.reports.map((r) => r.planCache), ["miss", ...new Array(steps - 1).fill("hit")]);
  });
}

Deno.test("a frozen loop encodes twice per run and gives the tokens and logits of the re-encoding loop", () => {
  using device = openDevice();
  const exec = new GraphExecutor(device);
  const model = createLlama(device, { ...MODEL, quant: "q4_0" });
  const logits = model.act.logits!;
  for (const [what, select] of SELECTIONS) {
    let encoded = 0;
    const encodeStep: DecodeLoopOptions["encodeStep"] = (s, t) => {
      encoded++;
      model.tokenStep(s, t, () => s.barrier(), select);
    };
    const recorded = { stepState: true, recorded: true, depth: 2, finish: { fuse: true, reorder: true } };
    model.resetCache();
    const reference = decode(exec, encodeStep, logits, 9, recorded);
    for (const dualBuffer of [false, true]) {
      model.resetCache();
      encoded = 0;
      const options = { ...recorded, frozen: true, finish: { ...recorded.finish, dualBuffer } };
      using loop = new DecodeLoop(exec, { encodeStep, readBatch: 4, ...options });
      const a = loop.run({ first: 3, steps: 5 });
      const b = loop.run({ first: a.tokens[4]!, steps: 4, startPosition: 5 });
      const what2 = `${what}, dual ${dualBuffer}`;
      // Twice per run: the first step's pass, and the next step's (never committed) to check it is the same.
      equal(encoded, 4, `${what2}: encodeStep twice per run`);
      deepStrictEqual([...a.tokens, ...b.tokens], reference.tokens, `${what2}: tokens`);
      deepStrictEqual(logits.read() as Float32Array, reference.logits, `${what2}: last logits`);
      deepStrictEqual(a.reports.map((r) => r.planCache), ["miss", "hit", "hit", "hit", "hit"]);
      deepStrictEqual(a.reports.map((r) => r.barriers.length), new Array(5).fill(dualBuffer ? 2 : 1));
    }
  }
  throws(
    () => new DecodeLoop(exec, { encodeStep: () => {}, frozen: true, recorded: true }),
    (e) => e instanceof MlxError && e.code === "InvalidArgument" && /stepState/.test(e.message),
  );
});
