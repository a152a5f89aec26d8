/**
 * Review of command templates as the library uses them: plan-cache hits and frozen passes that
 * replay decoded records by copying. Each case runs against the same passes without the plan cache
 * (or against a host reference), and counts the command buffers that took a template, so that a
 * case cannot pass by never reaching one: constants that change, change back and alternate; two
 * topologies of one shape; dual-buffer plans whose second buffer alone changes; constants spread
 * over several native arena blocks; buffers disposed or collected while a template binds them;
 * frozen passes disposed mid-flight; profiling and validating encoders; device close; and
 * MLXN_PLAN_CACHE=0.
 */
import { deepStrictEqual, equal, ok, throws } from "node:assert/strict";
import {
  CommandEncoder,
  DType,
  type FinishOptions,
  type FinishReport,
  GraphExecutor,
  type MlxBuffer,
  MlxDevice,
  MlxError,
} from "../mod.ts";
import { reportWithoutTimes, rng, runDeno, testContext } from "./helpers.ts";

const E = 16;

/** Runs `f`, counting the command buffers that took a template (appendTemplate returned true). */
function countingTemplates<T>(f: () => T): { value: T; replayed: number } {
  const replay = CommandEncoder.prototype.appendTemplate;
  let replayed = 0;
  CommandEncoder.prototype.appendTemplate = function (...args) {
    const took = replay.apply(this, args);
    if (took) replayed++;
    return took;
  };
  try {
    return { value: f(), replayed };
  } finally {
    CommandEncoder.prototype.appendTemplate = replay;
  }
}

/** The buffers of one side of a comparison: inputs, a scratch and an accumulator. */
function sideBuffers(device: MlxDevice) {
  const a = device.upload(new Float32Array(E).map((_, i) => (i % 5) - 2));
  const b = device.upload(new Float32Array(E).map((_, i) => 0.5 * i - 3));
  const t = device.alloc(E * 4, DType.F32), u = device.alloc(E * 4, DType.F32);
  const acc = device.alloc(E * 4, DType.F32);
  acc.write(new Float32Array(E));
  return {
    a,
    b,
    t,
    u,
    acc,
    [Symbol.dispose]() {
      for (const x of [a, b, t, u, acc]) x.dispose();
    },
  };
}
type Side = ReturnType<typeof sideBuffers>;

/** One pass: its constants (c), its topology (0 or 1: which input the first op reads) and options. */
interface Pass {
  c: readonly [number, number, number, number];
  topo: 0 | 1;
  autoBarriers: boolean;
  options: FinishOptions;
}

function record(exec: GraphExecutor, s: Side, p: Pass) {
  const session = exec.beginRecorded({ autoBarriers: p.autoBarriers });
  const barrier = () => p.autoBarriers || session.barrier();
  session.axpby(p.topo ? s.b : s.a, s.b, s.t, { alpha: p.c[0], beta: 1 });
  session.axpby(s.a, s.b, s.u, { alpha: 0.5, beta: p.c[1] });
  barrier();
  session.elementwiseMul(s.t, s.u, s.t);
  barrier();
  session.axpby(s.t, s.acc, s.acc, { alpha: p.c[2], beta: 0.5 });
  barrier();
  session.axpby(s.acc, s.a, s.acc, { alpha: 1, beta: p.c[3] });
  return session;
}

const strip = (r: FinishReport) => reportWithoutTimes(r);
const values = (b: MlxBuffer) => Array.from(b.read() as Float32Array);

/** Runs `passes` through a caching executor and a non-caching one, comparing state and reports after each. */
function compareWithoutCache(
  device: MlxDevice,
  passes: readonly Pass[],
  what: string,
): { replayed: number; hits: number } {
  using cachedSide = sideBuffers(device), plainSide = sideBuffers(device);
  const cached = new GraphExecutor(device), plain = new GraphExecutor(device, { planCache: false });
  let replayed = 0, hits = 0;
  passes.forEach((p, k) => {
    const got = countingTemplates(() => record(cached, cachedSide, p).finish(p.options));
    replayed += got.replayed;
    if (got.value.planCache === "hit") hits++;
    const want = record(plain, plainSide, p).finish(p.options);
    const at = `${what}, pass ${k} (${JSON.stringify(p)})`;
    deepStrictEqual(strip(got.value), strip(want), at);
    deepStrictEqual(values(cachedSide.acc), values(plainSide.acc), at);
    deepStrictEqual(values(cachedSide.t), values(plainSide.t), at);
  });
  return { replayed, hits };
}

const C0 = [2, -1, 0.25, 1.5] as const, C1 = [-0.5, 3, 1, 0.75] as const;
const single: FinishOptions = { fuse: true, reorder: true };
const dual: FinishOptions = { fuse: true, reorder: true, dualBuffer: true };

Deno.test("templates: plan-cache hits whose constants repeat, change, change back and alternate equal passes without the cache", () => {
  using ctx = testContext();
  for (const options of [single, dual]) {
    for (const autoBarriers of [false, true]) {
      const p = (c: Pass["c"], topo: 0 | 1 = 0): Pass => ({ c, topo, autoBarriers, options });
      const passes = [
        ...[C0, C0, C0, C0].map((c) => p(c)), // a template from the third pass on
        p(C1), // changed: the template must go
        p(C1),
        p(C1),
        p(C0), // changed back
        p(C0),
        p(C0),
        p(C1),
        p(C0),
        p(C1),
        p(C0), // alternating every pass
        // two topologies of one shape: each with its own plan, interleaved
        ...[0, 1, 0, 1, 1, 1, 0, 0, 0, 1].map((t, i) => p(i % 3 === 0 ? C1 : C0, t as 0 | 1)),
      ];
      const what = `dual ${options.dualBuffer ?? false}, auto ${autoBarriers}`;
      const { replayed, hits } = compareWithoutCache(ctx.device, passes, what);
      ok(hits >= passes.length - 3, `${what}: ${hits} hits`);
      ok(replayed >= 4 * (options.dualBuffer ? 2 : 1), `${what}: ${replayed} command buffers replayed a template`);
    }
  }
});

Deno.test("templates: a dual-buffer plan whose second buffer's constants alone change replays both buffers exactly", () => {
  using ctx = testContext();
  // Only the last op's constant changes: it is encoded in the second command buffer.
  const passes: Pass[] = [3, 3, 3, 3, -1, -1, -1, 3, 3, 0.5, 3, 3, 3].map((c3) => ({
    c: [C0[0], C0[1], C0[2], c3],
    topo: 0,
    autoBarriers: false,
    options: dual,
  }));
  const { replayed } = compareWithoutCache(ctx.device, passes, "second buffer changes");
  ok(replayed >= 6, `${replayed} command buffers replayed a template`);
});

Deno.test("templates: randomised plan-cache passes (constants from a small set, two topologies, both modes) equal passes without the cache", () => {
  using ctx = testContext();
  const r = rng(0x5eed);
  const set = [C0, C1, [1, 1, 1, 1] as const];
  const passes: Pass[] = Array.from({ length: 160 }, () => ({
    c: set[Math.floor(r() * (r() < 0.6 ? 1 : 3))]!,
    topo: r() < 0.25 ? 1 : 0,
    autoBarriers: r() < 0.5,
    options: r() < 0.5 ? single : dual,
  }));
  const { replayed } = compareWithoutCache(ctx.device, passes, "random");
  ok(replayed > 20, `${replayed} command buffers replayed a template`);
});

Deno.test("templates: a frozen pass with more than 64 KiB of inline constants replays them all exactly, commits in flight", async () => {
  using ctx = testContext();
  const { device } = ctx;
  const D = 4400, W = 4; // 16 bytes of constants each: 70 400 bytes, two native arena blocks
  using x = device.upload(new Float32Array(W).map((_, i) => i + 1));
  using y = device.upload(new Float32Array(W).fill(-2));
  using out = device.alloc(D * W * 4, DType.F32);
  const exec = new GraphExecutor(device);
  const s = exec.beginRecorded();
  const alpha = (i: number) => i / 64 - 30, beta = (i: number) => (i % 13) - 6;
  for (let i = 0; i < D; i++) s.axpby(x, y, out.slice(i * W * 4, W * 4), { alpha: alpha(i), beta: beta(i) });
  const frozen = s.freeze();
  const want = Array.from(
    { length: D * W },
    (_, k) => Math.fround(Math.fround(alpha(k / W | 0) * (k % W + 1)) + Math.fround(beta(k / W | 0) * -2)),
  );
  for (let round = 0; round < 2; round++) {
    out.write(new Float32Array(D * W));
    const { value: pending, replayed } = countingTemplates(() => [frozen.commit(), frozen.commit(), frozen.commit()]);
    equal(replayed, 3, "every commit replayed the template");
    pending[0]!.wait();
    await pending[1]!.completed();
    pending[2]!.wait();
    deepStrictEqual(values(out), want, `round ${round}`);
  }
  frozen.dispose();
});

Deno.test("templates: a buffer disposed while a template binds it is released at once; later commits are refused cleanly", () => {
  using ctx = testContext();
  const { device } = ctx;
  const BIG = 1 << 20;
  using x = device.upload(new Float32Array(E).fill(1)), out = device.alloc(E * 4, DType.F32);
  const exec = new GraphExecutor(device);
  const live = () => MlxDevice.liveObjects(device);
  const start = live();

  // A plan-cache template (third pass of one topology) binds `big`; disposing it frees its memory.
  const big = device.alloc(BIG, DType.F32);
  const pass = (src: MlxBuffer) => {
    const s = exec.beginRecorded();
    s.axpby(x, src.slice(0, E * 4), out, { alpha: 2, beta: 1 });
    return s.finish();
  };
  const { replayed } = countingTemplates(() => [0, 1, 2, 3].map(() => pass(big)));
  ok(replayed >= 1, "the cache replayed a template");
  equal(live().commandBuffers, start.commandBuffers + 1, "the cached plan holds its template");
  big.dispose();
  deepStrictEqual(live(), start, "memory and template gone at once");

  // A frozen pass's template: the disposed buffer's memory goes; the next commit says why it fails.
  const victim = device.alloc(BIG, DType.F32);
  const s = exec.beginRecorded();
  s.axpby(x, victim.slice(0, E * 4), out, { alpha: 1, beta: 1 });
  const frozen = s.freeze();
  frozen.commit().wait();
  equal(live().commandBuffers, start.commandBuffers + 1);
  victim.dispose();
  deepStrictEqual(live(), start, "the frozen pass's template let the memory go");
  throws(
    () => frozen.commit(),
    (e: unknown) => e instanceof MlxError && e.code === "Disposed" && /freeze a new pass/.test(e.message),
  );
  deepStrictEqual(live(), start, "the refused commit left nothing behind");
  frozen.dispose();
  pass(x); // the executor carries on
});

Deno.test("templates: a buffer collected while a cached plan's template binds it is released at the next safe point", async () => {
  const mod = new URL("../mod.ts", import.meta.url).href;
  const code = `
    import { DType, GraphExecutor, MlxDevice } from "${mod}";
    const device = MlxDevice.open({ backend: "cpu" });
    const x = device.upload(new Float32Array(16).fill(1)), out = device.alloc(64, DType.F32);
    const exec = new GraphExecutor(device);
    const live = () => MlxDevice.liveObjects(device);
    const start = live();
    (() => {
      const lost = device.alloc(3 << 20, DType.F32);
      for (let k = 0; k < 4; k++) {
        const s = exec.beginRecorded();
        s.axpby(x, lost.slice(0, 64), out, { alpha: 2, beta: 1 });
        s.finish();
      }
    })();
    const held = live();
    for (let i = 0; i < 50 && live().bufferBytes !== start.bufferBytes; i++) {
      globalThis.gc();
      await new Promise((r) => setTimeout(r, 2));
      device.commandEncoder().dispose(); // a safe point: collected buffers are freed here
    }
    console.log(JSON.stringify({ start, held, end: live() }));
  `;
  const r = await runDeno(["eval", "--v8-flags=--expose-gc", code]);
  ok(r.success, r.stderr);
  const { start, held, end } = JSON.parse(r.stdout);
  deepStrictEqual(held, {
    ...start,
    buffers: start.buffers + 1,
    bufferBytes: start.bufferBytes + (3 << 20),
    commandBuffers: start.commandBuffers + 1,
  }, "the cached plan's template binds it");
  deepStrictEqual(end, start, "collected: its memory and the template are gone");
});

Deno.test("templates: a frozen pass disposed while its commits are in flight leaves them exact and releases everything", async () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device);
  for (const dualBuffer of [false, true]) {
    using x = device.upload(new Float32Array(E).fill(1)), acc = device.alloc(E * 4, DType.F32);
    using tmp = device.alloc(E * 4, DType.F32);
    acc.write(new Float32Array(E));
    const before = MlxDevice.liveObjects(device);
    const s = exec.beginRecorded();
    s.axpby(x, x, tmp, { alpha: 3, beta: 0 }); // tmp = 3
    s.elementwiseAdd(acc, tmp, acc); // acc += 3
    const frozen = s.freeze({ reorder: true, dualBuffer });
    const { value: pending, replayed } = countingTemplates(() => Array.from({ length: 30 }, () => frozen.commit()));
    equal(replayed, 30 * frozen.commandBuffers);
    frozen.dispose(); // while they run
    throws(() => frozen.commit(), (e: unknown) => e instanceof MlxError && e.code === "InvalidState");
    for (const p of pending.slice(0, 15)) await p.completed();
    for (const p of pending.slice(15)) p.wait();
    deepStrictEqual(values(acc), new Array(E).fill(90), `dual ${dualBuffer}`);
    deepStrictEqual(MlxDevice.liveObjects(device), before, `dual ${dualBuffer}: nothing left`);
  }
});

Deno.test("templates: profiling and validating encoders never take one, and their passes equal the template passes", () => {
  const run = (device: MlxDevice, validate: boolean) => {
    using side = sideBuffers(device);
    const exec = new GraphExecutor(device, { validate });
    const reports: unknown[] = [];
    let replayed = 0;
    for (const options of [single, dual]) {
      for (let k = 0; k < 4; k++) {
        const p: Pass = { c: k === 3 ? C1 : C0, topo: 0, autoBarriers: k % 2 === 0, options };
        const got = countingTemplates(() => record(exec, side, p).finish(options));
        replayed += got.replayed;
        reports.push({ ...strip(got.value), planCache: got.value.planCache });
      }
      const s = record(exec, side, { c: C1, topo: 1, autoBarriers: false, options });
      const frozen = s.freeze(options);
      for (let k = 0; k < 3; k++) {
        const got = countingTemplates(() => frozen.commit().wait());
        replayed += got.replayed;
        reports.push({ ...strip(got.value), planCache: got.value.planCache });
      }
      frozen.dispose();
    }
    return { reports, acc: values(side.acc), t: values(side.t), replayed };
  };
  let reference: ReturnType<typeof run>;
  {
    using ctx = testContext();
    reference = run(ctx.device, false);
    ok(reference.replayed > 0, "the plain device replays templates");
  }
  for (
    const [what, open, validate] of [
      ["profiling", () => MlxDevice.open({ backend: "cpu", profile: "dispatch" }), false],
      ["profiling command buffers", () => MlxDevice.open({ backend: "cpu", profile: "cb" }), false],
      ["validating", () => MlxDevice.open({ backend: "cpu" }), true],
    ] as const
  ) {
    using device = open();
    const got = run(device, validate);
    equal(got.replayed, 0, `${what}: no template taken`);
    deepStrictEqual({ ...got, replayed: 0 }, { ...reference, replayed: 0 }, what);
  }
});

Deno.test("templates: closing the device with cached templates and frozen passes frees them; later use is refused", async () => {
  const device = MlxDevice.open({ backend: "cpu" });
  const before = MlxDevice.liveObjects(device);
  const side = sideBuffers(device);
  const exec = new GraphExecutor(device);
  for (const options of [single, dual]) {
    for (let k = 0; k < 4; k++) record(exec, side, { c: C0, topo: 0, autoBarriers: false, options }).finish(options);
  }
  const frozen = record(exec, side, { c: C1, topo: 1, autoBarriers: false, options: dual }).freeze(dual);
  const inFlight = frozen.commit();
  ok(MlxDevice.liveObjects(device).commandBuffers >= before.commandBuffers + 3 + 2, "templates are live");
  inFlight.wait();
  device.close();
  const after = MlxDevice.liveObjects(device);
  deepStrictEqual({ ...after, devices: 0 }, { ...before, devices: 0 }, "no template, buffer or command buffer is left");
  throws(() => frozen.commit(), (e: unknown) => e instanceof MlxError && e.code === "Disposed");
  throws(
    () => record(exec, side, { c: C0, topo: 0, autoBarriers: false, options: single }),
    (e: unknown) => e instanceof MlxError && e.code === "Disposed",
  );
  frozen.dispose();
  (globalThis as { gc?: () => void }).gc?.(); // the templates' finalizers find them freed
  await new Promise((r) => setTimeout(r, 5));
});

Deno.test("templates: with MLXN_PLAN_CACHE=0 frozen passes still replay theirs and recorded passes take none", async () => {
  const mod = new URL("../mod.ts", import.meta.url).href;
  const code = `
    import { CommandEncoder, DType, GraphExecutor, MlxDevice } from "${mod}";
    const replay = CommandEncoder.prototype.appendTemplate;
    let replayed = 0;
    CommandEncoder.prototype.appendTemplate = function (...a) { const t = replay.apply(this, a); if (t) replayed++; return t; };
    const device = MlxDevice.open({ backend: "cpu" });
    const x = device.upload(new Float32Array(8).fill(2)), out = device.alloc(32, DType.F32);
    const exec = new GraphExecutor(device);
    const outcomes = [];
    for (let k = 0; k < 4; k++) {
      const s = exec.beginRecorded();
      s.axpby(x, x, out, { alpha: 1, beta: 2 });
      outcomes.push(s.finish().planCache);
    }
    const recordedReplays = replayed;
    const s = exec.beginRecorded();
    s.axpby(x, x, out, { alpha: 3, beta: 1 });
    const frozen = s.freeze();
    for (let k = 0; k < 3; k++) frozen.commit().wait();
    console.log(JSON.stringify({ outcomes, recordedReplays, frozenReplays: replayed - recordedReplays, out: Array.from(out.read()) }));
  `;
  const r = await runDeno(["eval", code], { MLXN_PLAN_CACHE: "0" });
  ok(r.success, r.stderr);
  deepStrictEqual(JSON.parse(r.stdout), {
    outcomes: ["off", "off", "off", "off"],
    recordedReplays: 0,
    frozenReplays: 3,
    out: new Array(8).fill(8),
  });
});
