/**
 * DecodeLoop: the pipelined token loop produces exactly the tokens of an unpipelined loop and of a
 * host loop that reads the logits and picks with the references of tests/reference.ts (argmax, and
 * the sampler's definition), on whatever backend MLXN_BACKEND selects.
 */
import { deepStrictEqual, equal, match, ok, rejects, throws } from "node:assert/strict";
import { DecodeLoop, type DecodeLoopOptions, DType, GraphExecutor, MlxDevice, MlxError, ops } from "../mod.ts";
import { createLlama, type Llama, type TokenSelection } from "../examples/llama.ts";
import { calibrateDeviceClock, pipelineTraceEvents, stepOverlaps } from "../examples/pipeline_trace.ts";
import { randomValues, runDeno, testContext } from "./helpers.ts";
import { refArgmax, refSample } from "./reference.ts";

const MODEL = {
  layers: 2,
  hidden: 128,
  heads: 2,
  kvHeads: 1,
  ffn: 256,
  vocab: 300,
  ctx: 24,
  quant: "q4_0" as const,
  seed: 7,
};

/** The classic loop: host writes x and the position, waits, reads the logits and picks on the host. */
function hostLoop(model: Llama, exec: GraphExecutor, first: number, steps: number, select: TokenSelection): number[] {
  model.resetCache();
  const { act, embedding } = model, hidden = model.cfg.hidden;
  const out: number[] = [];
  let token = first;
  for (let pos = 0; pos < steps; pos++) {
    act.x!.write(embedding.subarray(token * hidden, (token + 1) * hidden));
    act.pos!.write(new Uint32Array([pos]));
    const s = exec.begin({ autoBarriers: false });
    model.step(s, pos, () => s.barrier());
    s.finish();
    const logits = act.logits!.read() as Float32Array;
    const t = select.temperature
      ? refSample(logits, {
        ...select,
        temperature: select.temperature,
        seed: BigInt(select.seed ?? 0),
        counter: pos,
        row: 0,
      })
      : refArgmax(logits);
    ok(t !== null, `step ${pos}: the reference sampler rejects the logits`);
    out.push(t);
    token = t;
  }
  return out;
}

function loopTokens(
  model: Llama,
  exec: GraphExecutor,
  first: number,
  steps: number,
  select: TokenSelection,
  options: Partial<DecodeLoopOptions>,
): number[] {
  model.resetCache();
  using loop = new DecodeLoop(exec, {
    session: { autoBarriers: false },
    ...options,
    encodeStep: (s, t) => model.tokenStep(s, t, () => s.barrier(), select),
  });
  return [...loop.run({ first, steps }).tokens];
}

const VARIANTS: [string, Partial<DecodeLoopOptions>][] = [
  ["unpipelined (depth 1, read every step)", { depth: 1, readBatch: 1 }],
  ["pipelined depth 2, direct", { depth: 2, readBatch: 5 }],
  ["pipelined depth 3, recorded + fuse/reorder/dual buffer", {
    depth: 3,
    readBatch: 4,
    recorded: true,
    finish: { fuse: true, reorder: true, dualBuffer: true },
  }],
];

for (
  const [name, select] of [
    ["greedy", {}],
    ["seeded sampling", { temperature: 0.9, topK: 50, topP: 0.95, seed: 11 }],
  ] as [string, TokenSelection][]
) {
  Deno.test(`DecodeLoop, ${name}: pipelined = unpipelined = the host loop with reference selection`, () => {
    using ctx = testContext();
    const exec = new GraphExecutor(ctx.device);
    const model = createLlama(ctx.device, MODEL);
    const steps = 20, first = 5;
    const want = hostLoop(model, exec, first, steps, select);
    ok(new Set(want).size > 3, `the reference run should not be degenerate: ${want}`);
    for (const [variant, options] of VARIANTS) {
      deepStrictEqual(loopTokens(model, exec, first, steps, select, options), want, variant);
    }
  });
}

Deno.test("DecodeLoop: a generation split into runs (startPosition) equals one run, sampling included", () => {
  using ctx = testContext();
  const exec = new GraphExecutor(ctx.device);
  const model = createLlama(ctx.device, MODEL);
  const select = { temperature: 1.2, topK: 0, topP: 0.9, seed: 3 };
  const whole = loopTokens(model, exec, 9, 16, select, {});
  model.resetCache();
  using loop = new DecodeLoop(exec, {
    session: { autoBarriers: false },
    encodeStep: (s, t) => model.tokenStep(s, t, () => s.barrier(), select),
  });
  const a = loop.run({ first: 9, steps: 7 }).tokens;
  const b = loop.run({ first: a[6]!, steps: 9, startPosition: 7 }).tokens;
  deepStrictEqual([...a, ...b], whole);
});

/**
 * A model small enough to check by hand: x = table[id] (vocab values) and the next id is
 * argmax(x), for `rows` sequences side by side.
 */
function tableLoop(
  exec: GraphExecutor,
  vocab: number,
  rows: number,
  options: Partial<DecodeLoopOptions>,
  hook = () => {},
) {
  const device = exec.device;
  const values = randomValues(vocab * vocab, 21);
  const table = device.upload(values), x = device.alloc(rows * vocab * 4, DType.F32);
  const next = (id: number) => refArgmax(values.subarray(id * vocab, (id + 1) * vocab));
  const loop = new DecodeLoop(exec, {
    rows,
    ...options,
    encodeStep(s, t) {
      hook();
      ops.embedGather(s, exec.registry, table, t.input, x, { dim: vocab, vocab, rows });
      s.barrier();
      ops.argmax(s, exec.registry, x, t.output, { vocab, rows });
    },
  });
  return {
    loop,
    next,
    [Symbol.dispose]() {
      loop.dispose();
      table.dispose();
      x.dispose();
    },
  };
}

Deno.test("DecodeLoop: rows side by side, the ring wraps many times, ids come back in batches of readBatch", () => {
  using ctx = testContext();
  const exec = new GraphExecutor(ctx.device, { autoBarriers: false });
  const vocab = 64, rows = 3, steps = 41;
  using m = tableLoop(exec, vocab, rows, { depth: 2, readBatch: 3 });
  equal(m.loop.ringSlots, 5);
  const batches: [number, number[]][] = [];
  const r = m.loop.run({ first: [1, 2, 63], steps, onTokens: (ids, from) => batches.push([from, [...ids]]) });
  const want: number[] = [];
  let cur = [1, 2, 63];
  for (let k = 0; k < steps; k++) {
    cur = cur.map(m.next);
    want.push(...cur);
  }
  deepStrictEqual([...r.tokens], want);
  deepStrictEqual(batches.map(([from]) => from), Array.from({ length: 14 }, (_, i) => 3 * i));
  deepStrictEqual(batches.flatMap(([, ids]) => ids), want);
  deepStrictEqual(r.readbacks.map((b) => b.steps), [...Array(13).fill(3), 2]);
  equal(r.reports.length, steps);
});

Deno.test("DecodeLoop: depth 2 encodes and commits step k+1 before waiting for step k; depth 1 waits first", () => {
  using ctx = testContext();
  const exec = new GraphExecutor(ctx.device, { autoBarriers: false });
  for (const depth of [1, 2, 3]) {
    using m = tableLoop(exec, 32, 1, { depth, readBatch: 4 });
    const t = m.loop.run({ first: 0, steps: 8 }).timings;
    deepStrictEqual(t.map((s) => s.index), [0, 1, 2, 3, 4, 5, 6, 7]);
    for (let k = 0; k + 1 < t.length; k++) {
      if (depth === 1) ok(t[k]!.waitEndNs <= t[k + 1]!.encodeStartNs, `depth 1, step ${k}`);
      else {
        // Step k + depth − 1 is committed before the host starts waiting for step k.
        const ahead = t[Math.min(k + depth - 1, t.length - 1)]!;
        ok(ahead.committedNs <= t[k]!.waitStartNs, `depth ${depth}, step ${k}`);
      }
      ok(t[k]!.deviceSpans.length === 1 && t[k]!.deviceSpans[0]![1] >= t[k]!.deviceSpans[0]![0]);
    }
  }
});

Deno.test("DecodeLoop: bad options and arguments are InvalidArgument errors that say what to do", () => {
  using ctx = testContext();
  const exec = new GraphExecutor(ctx.device);
  const encodeStep = () => {};
  const bad = (f: () => unknown, re: RegExp) =>
    throws(f, (e: unknown) => e instanceof MlxError && e.code === "InvalidArgument" && re.test(e.message));
  bad(() => new DecodeLoop(exec, {} as DecodeLoopOptions), /pass encodeStep/);
  bad(() => new DecodeLoop(exec, { encodeStep, depth: 0 }), /depth must be an integer/);
  bad(() => new DecodeLoop(exec, { encodeStep, rows: 1.5 }), /rows must be an integer/);
  bad(() => new DecodeLoop(exec, { encodeStep, depth: 2, readBatch: 8, ring: 9 }), /use ring >= 10/);
  bad(() => new DecodeLoop(exec, { encodeStep, depth: 1e9 }), /exceeds 65536 slots: lower depth/);
  bad(() => new DecodeLoop(exec, { encodeStep, readBatch: 16, ring: 2 ** 20 }), /exceeds 65536 slots/);
  using loop = new DecodeLoop(exec, { encodeStep, rows: 2 });
  bad(() => loop.run({ first: 1, steps: 1 }), /first must be 2 u32 token id/);
  bad(() => loop.run({ first: [1, -1], steps: 1 }), /first must be 2/);
  bad(() => loop.run({ first: [1, 2], steps: -1 }), /steps must be a non-negative integer/);
  bad(() => loop.run({ first: [1, 2], steps: 2, startPosition: 2 ** 32 - 1 }), /startPosition/);
  deepStrictEqual([...loop.run({ first: [1, 2], steps: 0 }).tokens], []);
});

Deno.test("DecodeLoop: a failing pass or callback surfaces after in-flight passes drain; the loop stays usable", async () => {
  using ctx = testContext();
  const exec = new GraphExecutor(ctx.device, { autoBarriers: false });
  const vocab = 16;
  const liveCommandBuffers = () => MlxDevice.liveObjects(ctx.device).commandBuffers;
  using m = tableLoop(exec, vocab, 1, { depth: 3, readBatch: 2 });
  const before = liveCommandBuffers();
  // An id past the table fails the gather on the device: a CommandBufferError, not a hang or garbage.
  const gatherFailed = (e: unknown) =>
    e instanceof MlxError && e.code === "CommandBufferError" && /embed_gather/.test(e.message);
  throws(() => m.loop.run({ first: vocab + 4, steps: 6 }), gatherFailed);
  equal(liveCommandBuffers(), before, "every pass in flight was waited for and released");
  await rejects(m.loop.runAsync({ first: vocab + 4, steps: 6 }), gatherFailed);
  equal(liveCommandBuffers(), before);
  equal(m.loop.run({ first: 3, steps: 4 }).tokens[0], m.next(3));

  let calls = 0, reenter = false;
  using hooked = tableLoop(exec, vocab, 1, { depth: 3 }, () => {
    if (reenter) hooked.loop.run({ first: 0, steps: 1 });
    if (++calls % 3 === 0) throw new Error("model bug");
  });
  // The callback throws at step 2, with steps 0 and 1 in flight: both are drained.
  throws(() => hooked.loop.run({ first: 0, steps: 5 }), /model bug/);
  equal(liveCommandBuffers(), before);
  await rejects(hooked.loop.runAsync({ first: 0, steps: 5 }), /model bug/);
  equal(liveCommandBuffers(), before);
  reenter = true;
  throws(
    () => hooked.loop.run({ first: 0, steps: 1 }),
    (e: unknown) => e instanceof MlxError && e.code === "InvalidState" && /in progress/.test(e.message),
  );
  reenter = false;
  calls = 0;
  deepStrictEqual([...hooked.loop.run({ first: 0, steps: 2 }).tokens], [hooked.next(0), hooked.next(hooked.next(0))]);
});

Deno.test("DecodeLoop.runAsync gives run's tokens and batches without blocking the event loop", async () => {
  using ctx = testContext();
  const exec = new GraphExecutor(ctx.device, { autoBarriers: false });
  using m = tableLoop(exec, 40, 2, { depth: 2, readBatch: 3 });
  const sync = m.loop.run({ first: [4, 9], steps: 10 });
  const batches: number[] = [];
  const r = await m.loop.runAsync({ first: [4, 9], steps: 10, onTokens: (_, from) => batches.push(from) });
  deepStrictEqual([...r.tokens], [...sync.tokens]);
  deepStrictEqual(batches, [0, 3, 6, 9]);
  equal(r.timings.length, 10);
});

Deno.test("pipeline trace: step overlaps and device gaps from a hand-made report, events on one clock", () => {
  const step = (index: number, enc: [number, number], wait: [number, number], dev: [number, number][]) => ({
    index,
    encodeStartNs: enc[0],
    committedNs: enc[1],
    waitStartNs: wait[0],
    waitEndNs: wait[1],
    deviceSpans: dev,
  });
  // Host clock + 1000 = device clock. Step 1 is encoded during step 0's device work; step 2 only
  // after step 1 ended, so the device idles 500 ns.
  const report = {
    tokens: new Uint32Array(3),
    wallNs: 0,
    deviceNs: 0,
    encodeNs: 0,
    reports: [],
    readbacks: [{ firstStep: 0, steps: 3, startNs: 5000, endNs: 5100 }],
    timings: [
      step(0, [0, 100], [250, 1300], [[1150, 1800], [1800, 2200]]),
      step(1, [150, 400], [1400, 2600], [[2200, 3000]]),
      step(2, [2100, 2500], [2600, 3900], [[3500, 4000]]),
    ],
  };
  const clock = { offsetNs: 1000, errorNs: 5 };
  deepStrictEqual(stepOverlaps(report, clock), [
    { index: 0, overlapNs: 250, encodeBeganBeforeDeviceEnd: true, deviceGapNs: 0 },
    { index: 1, overlapNs: 0, encodeBeganBeforeDeviceEnd: false, deviceGapNs: 500 },
  ]);
  const events = pipelineTraceEvents(report, clock, { depth: 2, readBatch: 4 });
  const spans = events.filter((e) => e.ph === "X").map((e) => [e.cat, e.name, e.tid, e.ts, e.dur]);
  deepStrictEqual(spans.slice(0, 4), [
    ["host encode", "encode 0", 1, 0, 0.1],
    ["host wait", "wait 0", 1, 0.25, 1.05],
    ["command buffer", "step 0", 2, 0.15, 0.65],
    ["command buffer", "step 0", 2, 0.8, 0.4],
  ]);
  deepStrictEqual(spans.at(-1), ["host readback", "read ids", 1, 5, 0.1]);
  ok(events.some((e) => e.ph === "M" && e.args?.name === "DecodeLoop (depth 2, read every 4)"));
  const titled = pipelineTraceEvents(report, clock, { depth: 2, readBatch: 4 }, "direct/hand, pipelined");
  ok(titled.some((e) => e.ph === "M" && e.args?.name === "direct/hand, pipelined: DecodeLoop (depth 2, read every 4)"));
});

Deno.test("pipeline trace: the clocks calibrate, and every pass runs on the device within its host span", () => {
  using ctx = testContext();
  const exec = new GraphExecutor(ctx.device, { autoBarriers: false });
  const clock = calibrateDeviceClock(ctx.device, 8);
  ok(Number.isFinite(clock.offsetNs) && clock.errorNs >= 0);
  using m = tableLoop(exec, 64, 2, { depth: 2, readBatch: 2 });
  const r = m.loop.run({ first: [0, 1], steps: 6 });
  // The calibration's error bound comes from a few samples; a thread descheduled on a loaded 2-core VM
  // can exceed it, so the check allows 0.5 ms more (it still catches a misaligned clock, off by ms).
  const slack = clock.errorNs + 500_000;
  for (const t of r.timings) {
    // Causality holds whatever the scheduling: a pass cannot start before its encoding began, nor end
    // after the wait for it returned. (committedNs is read after commit returns, and the device may
    // already be running by then, by more than the slack when the host thread is descheduled.)
    ok(t.deviceSpans[0]![0] >= t.encodeStartNs + clock.offsetNs - slack, `step ${t.index} start`);
    ok(t.encodeStartNs <= t.committedNs && t.committedNs <= t.waitStartNs, `step ${t.index} host order`);
    ok(t.deviceSpans[0]![1] <= t.waitEndNs + clock.offsetNs + slack, `step ${t.index} end`);
  }
  equal(stepOverlaps(r, clock).length, 5);
});

Deno.test("decode demo: the pipelined mode agrees with recorded/opt and writes the host + device trace", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const trace = `${dir}/decode.json`;
    const backend = Deno.env.get("MLXN_BACKEND");
    const r = await runDeno([
      "run",
      "--no-prompt",
      "--allow-ffi",
      "--allow-read",
      "--allow-env",
      `--allow-write=${dir}`,
      new URL("../examples/decode.ts", import.meta.url).pathname,
      ...["--layers", "1", "--tokens", "4", "--warmup", "1", "--modes", "recorded/opt,pipelined"],
      ...["--read-batch", "2", "--trace", trace],
    ], backend ? { MLXN_BACKEND: backend } : {});
    equal(r.code, 0, r.stderr + r.stdout);
    // The flags mean what they meant before --loop: recorded/opt under the sync loop (2 command
    // buffers per token), the pipelined mode under the pipelined loop (1).
    match(r.stdout, /^loop\s+sync\s+pipelined$/m);
    match(r.stdout, /^cmd buffers\s+2\s+1$/m);
    match(r.stdout, /^same tokens\s+yes\s+yes$/m);
    match(r.stdout, /^max \|Δ logits\|\s+0\s+0$/m);
    match(r.stdout, /pipelined: depth 2, ids read every 2 tokens \(2 reads\)/);
    match(r.stdout, /ok: the modes produce identical logits and tokens/);
    const events = JSON.parse(await Deno.readTextFile(`${dir}/decode.pipelined.json`)).traceEvents as {
      cat: string;
      name: string;
      tid: number;
    }[];
    const named = (cat: string) => events.filter((e) => e.cat === cat).map((e) => e.name);
    deepStrictEqual(named("host encode"), ["encode 0", "encode 1", "encode 2", "encode 3"]);
    deepStrictEqual(named("command buffer"), ["step 0", "step 1", "step 2", "step 3"]);
    deepStrictEqual(named("host readback"), ["read ids", "read ids"]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("DecodeLoop: the smallest ring (depth + readBatch) never loses an id, for depth and readBatch 1..4", () => {
  using ctx = testContext();
  const exec = new GraphExecutor(ctx.device, { autoBarriers: false });
  const vocab = 48, steps = 13;
  for (let depth = 1; depth <= 4; depth++) {
    for (let readBatch = 1; readBatch <= 4; readBatch++) {
      using m = tableLoop(exec, vocab, 1, { depth, readBatch });
      equal(m.loop.ringSlots, depth + readBatch);
      const want: number[] = [];
      for (let k = 0, id = 7; k < steps; k++) want.push(id = m.next(id));
      deepStrictEqual([...m.loop.run({ first: 7, steps }).tokens], want, `depth ${depth}, readBatch ${readBatch}`);
    }
  }
});
