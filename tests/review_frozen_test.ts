/**
 * Review of the frozen pass, the frozen DecodeLoop and dual-buffer plan-cache replays: hostile
 * inputs and lifecycle edges, each checked against a pass optimised afresh (plan cache off) or
 * against host references.
 */
import { deepStrictEqual, equal, ok, rejects, throws } from "node:assert/strict";
import {
  DecodeLoop,
  type DecodeLoopOptions,
  DType,
  type FinishOptions,
  GraphExecutor,
  type GraphSession,
  type MlxBuffer,
  MlxDevice,
  MlxError,
  ops,
} from "../mod.ts";
import { randomValues, reportWithoutTimes, rng, runDeno, testContext } from "./helpers.ts";
import { refArgmax } from "./reference.ts";

const E = 64;
const strip = reportWithoutTimes;
const live = (d: MlxDevice) => MlxDevice.liveObjects(d).commandBuffers;
const isMlx = (code: string, re?: RegExp) => (e: unknown) =>
  e instanceof MlxError && e.code === code && (re === undefined || re.test(e.message));

Deno.test("freeze: an empty recorded session freezes, commits and reports like an empty finish", () => {
  using ctx = testContext();
  const exec = new GraphExecutor(ctx.device, { planCache: false });
  for (const dualBuffer of [false, true]) {
    const options = { fuse: true, reorder: true, dualBuffer };
    using ref = exec.beginRecorded();
    const want = strip(ref.finish(options));
    using s = exec.beginRecorded();
    const frozen = s.freeze(options);
    equal(frozen.commandBuffers, dualBuffer ? 2 : 1);
    deepStrictEqual(strip(frozen.commit().wait()), want, `dual ${dualBuffer}`);
    deepStrictEqual(strip(frozen.commit().wait()), want, `dual ${dualBuffer}, again`);
  }
});

Deno.test("freeze: many commits in flight accumulate exactly, and every command buffer is released", async () => {
  using ctx = testContext();
  const { device } = ctx;
  for (const validate of [false, true]) {
    for (const dualBuffer of [false, true]) {
      const exec = new GraphExecutor(device, { validate });
      using x = device.upload(new Float32Array(E).fill(1)), acc = device.alloc(E * 4, DType.F32);
      using tmp = device.alloc(E * 4, DType.F32);
      acc.write(new Float32Array(E));
      using s = exec.beginRecorded();
      s.axpby(x, x, tmp, { alpha: 2, beta: 0 }); // tmp = 2
      s.elementwiseAdd(acc, tmp, acc); // acc += 2
      const frozen = s.freeze({ reorder: true, dualBuffer });
      const before = live(device);
      const pending = Array.from({ length: 40 }, () => frozen.commit());
      equal(live(device), before + 40 * frozen.commandBuffers);
      for (const p of pending.slice(0, 20)) p.wait();
      for (const p of pending.slice(20)) await p.completed();
      equal(live(device), before, "every command buffer released");
      deepStrictEqual(Array.from(acc.read() as Float32Array), new Array(E).fill(80), `validate ${validate}`);
    }
  }
});

Deno.test("freeze: inline constants are fixed at freeze time; later mutation of the caller's arrays changes nothing", () => {
  using ctx = testContext();
  const { device } = ctx;
  for (const validate of [false, true]) {
    const exec = new GraphExecutor(device, { validate });
    using x = device.upload(new Float32Array(E).fill(3)), out = device.alloc(E * 4, DType.F32);
    const opts = { alpha: 2, beta: 1 };
    using s = exec.beginRecorded();
    s.axpby(x, x, out, opts);
    const frozen = s.freeze();
    opts.alpha = 100;
    frozen.commit().wait();
    deepStrictEqual(Array.from(out.read() as Float32Array), new Array(E).fill(9), `validate ${validate}`);
  }
});

Deno.test("freeze: the session disposed after freezing leaves the frozen pass working; its buffers stay bound", () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device);
  using x = device.upload(new Float32Array(E).fill(2)), out = device.alloc(E * 4, DType.F32);
  const s = exec.beginRecorded();
  s.elementwiseMul(x, x, out);
  const frozen = s.freeze();
  s.dispose();
  s[Symbol.dispose]();
  frozen.commit().wait();
  deepStrictEqual(Array.from(out.read() as Float32Array), new Array(E).fill(4));
});

Deno.test("freeze: a device closed after freezing makes commit an MlxError, not a crash", () => {
  const { device } = testContext();
  const exec = new GraphExecutor(device);
  const x = device.upload(new Float32Array(E).fill(2)), out = device.alloc(E * 4, DType.F32);
  const s = exec.beginRecorded();
  s.elementwiseMul(x, x, out);
  const frozen = s.freeze({ dualBuffer: true });
  device.close();
  throws(() => frozen.commit(), (e) => e instanceof MlxError);
});

Deno.test("freeze: a missing barrier (validation on) is a HazardError at every commit, nothing committed or leaked", () => {
  using ctx = testContext();
  const { device } = ctx;
  // (The dual-buffer split recomputes barriers from ranges, so only the single buffer keeps the hazard.)
  for (const dualBuffer of [false]) {
    const exec = new GraphExecutor(device, { validate: true, autoBarriers: false });
    using x = device.upload(new Float32Array(E).fill(2)), out = device.alloc(E * 4, DType.F32);
    using y = device.alloc(E * 4, DType.F32);
    out.write(new Float32Array(E));
    using s = exec.beginRecorded();
    for (let i = 0; i < 8; i++) s.elementwiseMul(x, x, y);
    s.elementwiseAdd(y, x, out); // reads y with no barrier
    const frozen = s.freeze({ dualBuffer });
    const before = live(device);
    for (let k = 0; k < 2; k++) {
      throws(() => frozen.commit(), isMlx("HazardError"), `dual ${dualBuffer}`);
      equal(live(device), before, "no command buffer left behind");
    }
    deepStrictEqual(Array.from(out.read() as Float32Array), new Array(E).fill(0), "nothing ran");
  }
});

Deno.test("freeze: a device-side failure surfaces at wait and releases the pass; the next commit works", () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device);
  const vocab = 8;
  using table = device.upload(randomValues(vocab * E, 3)), out = device.alloc(E * 4, DType.F32);
  using ids = device.upload(new Uint32Array([vocab + 3]));
  using s = exec.beginRecorded();
  ops.embedGather(s, exec.registry, table, ids, out, { dim: E, vocab });
  const frozen = s.freeze({ dualBuffer: true });
  const before = live(device);
  throws(() => frozen.commit().wait(), isMlx("CommandBufferError"));
  equal(live(device), before);
  ids.write(new Uint32Array([5]));
  frozen.commit().wait();
  deepStrictEqual(out.read(), table.slice(5 * E * 4, E * 4).read());
});

/** A program with user ranges, hand barriers and slices: barrierBetween / trackDispatch annotations. */
function userRangePass(s: GraphSession, x: MlxBuffer, wide: MlxBuffer, out: MlxBuffer): void {
  const parts = Array.from({ length: 6 }, (_, i) => wide.slice(i * E * 4, E * 4));
  for (let i = 0; i < 6; i++) {
    s.barrierBetween([x], [parts[i]!]);
    s.axpby(x, x, parts[i]!, { alpha: i + 1, beta: 0 });
    s.trackDispatch([x], [parts[i]!]);
  }
  s.barrier();
  for (let i = 1; i < 6; i++) {
    s.elementwiseAdd(parts[0]!, parts[i]!, parts[0]!);
    s.barrier();
  }
  s.barrier();
  s.barrier();
  s.elementwiseMul(parts[0]!, x, out);
}

Deno.test("freeze: user ranges and repeated barriers give a fresh optimisation's results and reports", () => {
  using ctx = testContext();
  const { device } = ctx;
  for (const validate of [false, true]) {
    for (const autoBarriers of [false, true]) {
      for (
        const options of [{}, { reorder: true }, { fuse: true, reorder: true, dualBuffer: true }, { dualBuffer: true }]
      ) {
        using x = device.upload(randomValues(E, 9)), out = device.alloc(E * 4, DType.F32);
        using wide = device.alloc(6 * E * 4, DType.F32);
        const fresh = new GraphExecutor(device, { planCache: false, validate, autoBarriers });
        using r = fresh.beginRecorded();
        userRangePass(r, x, wide, out);
        const want = strip(r.finish(options));
        const bytes = [out.readBytes(), wide.readBytes()];
        out.write(new Float32Array(E));
        wide.write(new Float32Array(6 * E));
        const exec = new GraphExecutor(device, { validate, autoBarriers });
        using s = exec.beginRecorded();
        userRangePass(s, x, wide, out);
        const frozen = s.freeze(options);
        const what = `validate ${validate}, auto ${autoBarriers}, ${JSON.stringify(options)}`;
        deepStrictEqual(strip(frozen.commit().wait()), want, what);
        deepStrictEqual([out.readBytes(), wide.readBytes()], bytes, what);
      }
    }
  }
});

Deno.test("freeze: the executor's fusion and reorder switches are honoured as by a fresh optimisation", () => {
  using ctx = testContext();
  const { device } = ctx;
  using x = device.upload(randomValues(E, 4)),
    w = device.upload(randomValues(E, 5)),
    out = device.alloc(E * 4, DType.F32);
  using tmp = device.alloc(E * 4, DType.F32);
  const pass = (s: GraphSession) => {
    s.rmsNorm(x, w, tmp, { rows: 1, dim: E, eps: 1e-5 });
    s.elementwiseMul(tmp, w, out);
  };
  for (const fusion of [false, true]) {
    for (const reorder of [false, true]) {
      const fresh = new GraphExecutor(device, { planCache: false, fusion, reorder });
      using r = fresh.beginRecorded();
      pass(r);
      const want = strip(r.finish({ fuse: true, reorder: true }));
      const bytes = out.readBytes();
      out.write(new Float32Array(E));
      const exec = new GraphExecutor(device, { fusion, reorder });
      using s = exec.beginRecorded();
      pass(s);
      const got = strip(s.freeze({ fuse: true, reorder: true }).commit().wait());
      deepStrictEqual(got, want, `fusion ${fusion} reorder ${reorder}`);
      deepStrictEqual(out.readBytes(), bytes);
      equal(got.fusions, fusion ? 1 : 0);
    }
  }
});

// ---- long dual-buffer programs: plan-cache hits and frozen passes against fresh optimisations ----

const ALLOCS = 3, ELEMS = 1024, DIM = 32;
type View = readonly [alloc: number, first: number];
type LongOp =
  | { op: "add" | "mul"; a: View; b: View; out: View; tg: number }
  | { op: "axpby"; a: View; b: View; out: View; alpha: number; beta: number }
  | { op: "normMul"; x: View; tmp: View; s: View; out: View; eps: number };

const viewOverlap = (p: View, q: View) => p[0] === q[0] && p[1] === q[1];

/** A random program of `n` ops over 64-element views; outputs never alias a different input view. */
function longProgram(n: number, seed: number): LongOp[] {
  const r = rng(seed), pick = (k: number) => Math.floor(r() * k);
  const view = (): View => [pick(ALLOCS), pick(ELEMS / 64) * 64];
  const prog: LongOp[] = [];
  while (prog.length < n) {
    const kind = pick(4);
    if (kind < 2) {
      const o = {
        op: kind === 0 ? "add" as const : "mul" as const,
        a: view(),
        b: view(),
        out: view(),
        tg: 32 << pick(2),
      };
      if ([o.a, o.b].every((v) => !viewOverlap(v, o.out) || v === o.out)) prog.push(o);
    } else if (kind === 2) {
      const o = { op: "axpby" as const, a: view(), b: view(), out: view(), alpha: r() * 2 - 1, beta: r() * 2 - 1 };
      if (!viewOverlap(o.a, o.out) && !viewOverlap(o.b, o.out)) prog.push(o);
    } else {
      const o = { op: "normMul" as const, x: view(), tmp: view(), s: view(), out: view(), eps: 1e-5 + r() * 1e-3 };
      const distinct = [o.x, o.tmp, o.s, o.out].every((v, i, all) =>
        all.every((w, j) => i === j || !viewOverlap(v, w))
      );
      if (distinct) prog.push(o);
    }
  }
  return prog;
}

/** Same topology, every inline constant changed (in both halves of the program). */
function newConstants(prog: LongOp[], seed: number): LongOp[] {
  return prog.map((o, i) => {
    const v = Math.sin(seed * 3.7 + i) * 1.25;
    if (o.op === "axpby") return { ...o, alpha: v, beta: 0.5 - v };
    if (o.op === "normMul") return { ...o, eps: Math.abs(v) * 1e-3 + 1e-6 };
    return o;
  });
}

function emitLong(s: GraphSession, prog: LongOp[], allocs: MlxBuffer[], w: MlxBuffer): void {
  // A new view object per binding: nothing may depend on buffer object identity.
  const v = (x: View) => allocs[x[0]]!.slice(x[1] * 4, 64 * 4);
  const add = s.encoder.resolvePipeline({ name: "elementwise_add_f32" });
  const mul = s.encoder.resolvePipeline({ name: "elementwise_mul_f32" });
  for (const o of prog) {
    if (o.op === "normMul") {
      s.rmsNorm(v(o.x), w, v(o.tmp), { rows: 64 / DIM, dim: DIM, eps: o.eps });
      s.elementwiseMul(v(o.tmp), v(o.s), v(o.out));
    } else if (o.op === "axpby") s.axpby(v(o.a), v(o.b), v(o.out), { alpha: o.alpha, beta: o.beta });
    else {
      s.dispatch({
        pipeline: o.op === "add" ? add : mul,
        bindings: [v(o.a), v(o.b), v(o.out), [64]],
        grid: 64,
        threadgroup: o.tg,
        dispatchKind: "threads",
      });
    }
  }
}

Deno.test("long dual-buffer programs (>= 200 dispatches): plan-cache hits and frozen passes equal fresh optimisations", () => {
  using ctx = testContext();
  const { device } = ctx;
  const allocs = Array.from({ length: ALLOCS }, () => device.alloc(ELEMS * 4, DType.F32));
  const init = allocs.map((_, i) => randomValues(ELEMS, 900 + i, DType.F32, -1, 1));
  using w = device.upload(randomValues(DIM, 8, DType.F32, 0.5, 1.5));
  const reset = () => allocs.forEach((a, i) => a.write(init[i]!));
  const state = () => allocs.map((a) => a.readBytes());
  let secondChunkDispatches = 0, fusions = 0;
  for (let seed = 1; seed <= 6; seed++) {
    const validate = seed % 2 === 0;
    const flags: FinishOptions = { fuse: seed % 3 !== 0, reorder: seed % 3 !== 1, dualBuffer: true };
    const prog = longProgram(200 + 23 * seed, seed);
    const cached = new GraphExecutor(device, { validate });
    const fresh = new GraphExecutor(device, { validate, planCache: false });
    const run = (exec: GraphExecutor, p: LongOp[]) => {
      reset();
      using s = exec.beginRecorded();
      emitLong(s, p, allocs, w);
      const pending = s.commit(flags);
      const perBuffer = pending.encoders.map((e) => e.dispatchCount);
      const report = pending.wait();
      return { report, bytes: state(), perBuffer };
    };
    equal(run(cached, prog).report.planCache, "miss");
    for (let k = 1; k <= 3; k++) {
      const next = newConstants(prog, seed * 10 + k);
      const hit = run(cached, next), want = run(fresh, next);
      const what = `seed ${seed}, validate ${validate}, pass ${k}`;
      equal(hit.report.planCache, "hit", what);
      deepStrictEqual(strip(hit.report), strip(want.report), what);
      deepStrictEqual(hit.perBuffer, want.perBuffer, what);
      deepStrictEqual(hit.bytes, want.bytes, what);
      // The same pass frozen, committed twice.
      reset();
      using s = cached.beginRecorded();
      emitLong(s, next, allocs, w);
      const frozen = s.freeze(flags);
      equal(frozen.commandBuffers, 2);
      deepStrictEqual(strip(frozen.commit().wait()), strip(want.report), `${what}, frozen`);
      deepStrictEqual(state(), want.bytes, `${what}, frozen`);
      const second = run(fresh, next).bytes; // the fresh pass from the frozen pass's results
      reset();
      frozen.commit().wait();
      deepStrictEqual(state(), second, `${what}, frozen again`);
      secondChunkDispatches += want.perBuffer[1]!;
      fusions += want.report.fusions;
    }
  }
  ok(secondChunkDispatches > 0 && fusions > 0, "the programs fill both command buffers and exercise fusion");
  allocs.forEach((a) => a.dispose());
});

Deno.test("plan cache, dual buffer: an allocation disposed and replaced between passes gives a fresh optimisation's results", () => {
  using ctx = testContext();
  const { device } = ctx;
  const allocs = Array.from({ length: ALLOCS }, () => device.alloc(ELEMS * 4, DType.F32));
  const init = allocs.map((_, i) => randomValues(ELEMS, 700 + i, DType.F32, -1, 1));
  using w = device.upload(randomValues(DIM, 8, DType.F32, 0.5, 1.5));
  const prog = longProgram(240, 77);
  const flags = { fuse: true, reorder: true, dualBuffer: true };
  const cached = new GraphExecutor(device), fresh = new GraphExecutor(device, { planCache: false });
  const run = (exec: GraphExecutor, p: LongOp[]) => {
    allocs.forEach((a, i) => a.write(init[i]!));
    using s = exec.beginRecorded();
    emitLong(s, p, allocs, w);
    return { report: s.finish(flags), bytes: allocs.map((a) => a.readBytes()) };
  };
  run(cached, prog);
  for (let k = 0; k < 4; k++) {
    // Replace one allocation (its native handle may be reused by the new one).
    const i = k % ALLOCS;
    const old = allocs[i]!;
    const stale = old.slice(0, 256);
    old.dispose();
    allocs[i] = device.alloc(ELEMS * 4, DType.F32);
    const next = newConstants(prog, k + 5);
    const got = run(cached, next), want = run(fresh, next);
    deepStrictEqual(strip(got.report), strip(want.report), `replacement ${k} (${got.report.planCache})`);
    deepStrictEqual(got.bytes, want.bytes, `replacement ${k}`);
    // A pass binding the stale view is refused when it is recorded.
    using s = cached.beginRecorded();
    throws(() => s.elementwiseAdd(stale, stale, allocs[i]!.slice(0, 256)), isMlx("Disposed"));
  }
  allocs.forEach((a) => a.dispose());
});

// ---- DecodeLoop({ frozen: true, recorded: true, stepState: true }) --------------------------------

/**
 * A state-driven token loop over a table: x = table[id] (dim wide, `vocab` rows), next id =
 * argmax(x[0, pick)). With pick > vocab an id ≥ vocab can come out mid-run and fail the next gather.
 */
function stateTableLoop(
  exec: GraphExecutor,
  o: { vocab: number; dim: number; pick: number; rows?: number; seed?: number; values?: Float32Array },
  options: Partial<DecodeLoopOptions>,
) {
  const device = exec.device, rows = o.rows ?? 1;
  const values = o.values ?? randomValues(o.vocab * o.dim, o.seed ?? 31);
  const table = device.upload(values);
  const bufs = { x: device.alloc(rows * o.dim * 4, DType.F32) };
  let encoded = 0;
  const next = (id: number) => refArgmax(values.subarray(id * o.dim, id * o.dim + o.pick));
  const loop = new DecodeLoop(exec, {
    rows,
    recorded: true,
    stepState: true,
    ...options,
    encodeStep(s, t) {
      encoded++;
      const st = t.state!;
      ops.embedGather(s, exec.registry, table, st.ring, bufs.x, {
        dim: o.dim,
        vocab: o.vocab,
        rows,
        cursor: st.position,
        ring: st.ringSlots,
      });
      s.barrier();
      // argmax over the first `pick` columns of each row: rows of x strided by dim, as a view per row
      ops.argmax(s, exec.registry, bufs.x, st.ring, { vocab: o.pick, rows, cursor: st.next, ring: st.ringSlots });
    },
  });
  return {
    loop,
    next,
    bufs,
    get encoded() {
      return encoded;
    },
    [Symbol.dispose]() {
      loop.dispose();
      table.dispose();
      bufs.x.dispose();
    },
  };
}

/** The host reference: the chain of next ids. */
function chain(next: (id: number) => number, first: number, steps: number): number[] {
  const out: number[] = [];
  for (let k = 0, cur = first; k < steps; k++) out.push(cur = next(cur));
  return out;
}

Deno.test("frozen DecodeLoop: tokens equal the re-encoding loop and the host chain; encodeStep twice per run; runAsync too", async () => {
  using ctx = testContext();
  const { device } = ctx;
  for (const validate of [false, true]) {
    for (const finish of [{}, { fuse: true, reorder: true }, { fuse: true, reorder: true, dualBuffer: true }]) {
      const exec = new GraphExecutor(device, { validate });
      const base = { depth: 3, readBatch: 2, finish };
      using plain = stateTableLoop(exec, { vocab: 40, dim: 40, pick: 40 }, base);
      using frozen = stateTableLoop(exec, { vocab: 40, dim: 40, pick: 40 }, { ...base, frozen: true });
      const what = `validate ${validate}, ${JSON.stringify(finish)}`;
      const want = chain(frozen.next, 7, 23);
      ok(new Set(want).size > 3, `a non-degenerate chain: ${want}`);
      deepStrictEqual([...plain.loop.run({ first: 7, steps: 23 }).tokens], want, what);
      const a = frozen.loop.run({ first: 7, steps: 11 });
      const b = frozen.loop.run({ first: a.tokens[10]!, steps: 12, startPosition: 11 });
      deepStrictEqual([...a.tokens, ...b.tokens], want, what);
      // Twice per run: the first step's pass, and the next step's (never committed) to check it is the same.
      equal(frozen.encoded, 4, `${what}: encodeStep twice per run`);
      deepStrictEqual(a.reports.map((r) => r.planCache), ["miss", ...new Array(10).fill("hit")]);
      const c = await frozen.loop.runAsync({ first: 7, steps: 23 });
      deepStrictEqual([...c.tokens], want, `${what}: runAsync`);
      equal(frozen.encoded, 6);
    }
  }
});

Deno.test("frozen DecodeLoop: an out-of-range id mid-run throws after draining; nothing leaks; the loop stays usable", async () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device);
  const vocab = 12, dim = 32;
  for (const finish of [{}, { dualBuffer: true }]) {
    // Rows 0..4 lead to the next row, row 5 to id 20 (past the table); rows 6..11 cycle.
    const values = randomValues(vocab * dim, 5, DType.F32, -1, 0);
    const target = (i: number) => i < 5 ? i + 1 : i === 5 ? 20 : 6 + (i - 5) % 6;
    for (let i = 0; i < vocab; i++) values[i * dim + target(i)] = 1;
    using m = stateTableLoop(exec, { vocab, dim, pick: dim, values }, { depth: 3, readBatch: 2, frozen: true, finish });
    const first = 0, at = 5;
    deepStrictEqual(chain(m.next, first, 6), [1, 2, 3, 4, 5, 20]);
    const before = live(device);
    const failed = isMlx("CommandBufferError", /embed_gather/);
    let seen: number[] = [];
    throws(() => m.loop.run({ first, steps: 10, onTokens: (ids) => seen.push(...ids) }), failed);
    equal(live(device), before, "every pass in flight was waited for and released");
    deepStrictEqual(seen, chain(m.next, first, seen.length), "ids read before the failure are the chain's");
    ok(seen.length <= at + 1);
    seen = [];
    await rejects(m.loop.runAsync({ first, steps: 10 }), failed);
    equal(live(device), before);
    // A good start afterwards decodes normally (the state and the frozen pass are per run).
    const good = 7;
    deepStrictEqual([...m.loop.run({ first: good, steps: 6 }).tokens], chain(m.next, good, 6));
  }
});

Deno.test("frozen DecodeLoop: a buffer disposed mid-run is a Disposed error after draining; the next run re-freezes", () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device);
  using m = stateTableLoop(exec, { vocab: 30, dim: 30, pick: 30 }, { depth: 2, readBatch: 1, frozen: true });
  const before = live(device);
  throws(
    () =>
      m.loop.run({
        first: 3,
        steps: 8,
        onTokens: (_, from) => {
          if (from === 2) {
            m.bufs.x.dispose();
            m.bufs.x = device.alloc(30 * 4, DType.F32);
          }
        },
      }),
    isMlx("Disposed", /freeze a new pass/),
  );
  equal(live(device), before);
  deepStrictEqual([...m.loop.run({ first: 3, steps: 8 }).tokens], chain(m.next, 3, 8));
});

Deno.test("frozen DecodeLoop: option checks say what to do", () => {
  using ctx = testContext();
  const exec = new GraphExecutor(ctx.device);
  const encodeStep = () => {};
  for (const o of [{ frozen: true }, { frozen: true, recorded: true }, { frozen: true, stepState: true }]) {
    throws(() => new DecodeLoop(exec, { encodeStep, ...o }), isMlx("InvalidArgument", /recorded: true and stepState/));
  }
});

// ---- examples/decode.ts: --loop and the frozen mode --------------------------------------------

const demo = new URL("../examples/decode.ts", import.meta.url).pathname;
const demoFlags = ["run", "--no-prompt", "--allow-ffi", "--allow-read", "--allow-env"];
const small = ["--layers", "1", "--hidden", "128", "--heads", "2", "--kv-heads", "1", "--ffn", "128", "--vocab", "64"];
const backendEnv: Record<string, string> = Deno.env.get("MLXN_BACKEND")
  ? { MLXN_BACKEND: Deno.env.get("MLXN_BACKEND")! }
  : {};

Deno.test({
  name: "decode demo: a --depth or --read-batch past the id ring's bound is a usage error, not an uncaught stack trace",
  fn: async () => {
    for (const args of [["--depth", "70000"], ["--read-batch", "65530", "--depth", "7"]]) {
      const r = await runDeno(
        [...demoFlags, demo, ...small, "--tokens", "2", "--modes", "frozen", ...args],
        backendEnv,
      );
      ok(r.code !== 0, args.join(" "));
      ok(/^decode: .*(depth|read-batch)/m.test(r.stderr), `${args.join(" ")}: ${r.stderr}`);
      ok(!/^\s+at /m.test(r.stderr), `${args.join(" ")}: a stack trace was printed:\n${r.stderr}`);
    }
  },
});

Deno.test("decode demo: --loop both runs the frozen mode once, under the pipelined loop, with the sync columns' tokens", async () => {
  const r = await runDeno([
    ...demoFlags,
    demo,
    ...small,
    ...["--tokens", "5", "--warmup", "2", "--depth", "1", "--read-batch", "1"],
    ...["--modes", "direct/hand,frozen", "--loop", "both"],
  ], backendEnv);
  equal(r.code, 0, r.stderr + r.stdout);
  const header = r.stdout.split("\n").find((l) => /^\s+direct\/hand\s/.test(l))!.trim().split(/\s{2,}/);
  deepStrictEqual(header, ["direct/hand", "direct/hand", "frozen"]);
  const row = (name: string) =>
    r.stdout.split("\n").find((l) => l.startsWith(name + " "))!.slice(name.length).trim().split(/\s+/);
  deepStrictEqual(row("loop"), ["sync", "pipelined", "pipelined"]);
  deepStrictEqual(row("same tokens"), ["yes", "yes", "yes"]);
  deepStrictEqual(row("plan hits"), ["-", "-", "4/5"]);
});

Deno.test({
  name: "DecodeLoop: run on a disposed loop says the loop was disposed and what to do",
  fn: () => {
    using ctx = testContext();
    const exec = new GraphExecutor(ctx.device);
    for (const frozen of [false, true]) {
      using m = stateTableLoop(exec, { vocab: 8, dim: 8, pick: 8 }, { frozen });
      m.loop.dispose();
      throws(() => m.loop.run({ first: 1, steps: 2 }), isMlx("Disposed", /DecodeLoop.*(new DecodeLoop|create)/));
    }
  },
});

Deno.test({
  name:
    "frozen DecodeLoop: a pass that is not the same at every step is refused, never replayed with step 0's bindings",
  fn: () => {
    using ctx = testContext();
    const { device } = ctx;
    const exec = new GraphExecutor(device);
    const vocab = 24;
    const values = randomValues(vocab * vocab, 41);
    using table = device.upload(values), x = device.alloc(vocab * 4, DType.F32);
    const next = (id: number) => refArgmax(values.subarray(id * vocab, (id + 1) * vocab));
    const want = chain(next, 2, 9);
    ok(new Set(want).size > 2, `a non-degenerate chain: ${want}`);
    for (const frozen of [false, true]) {
      using loop = new DecodeLoop(exec, {
        recorded: true,
        stepState: true,
        frozen,
        readBatch: 3,
        encodeStep(s, t) {
          ops.embedGather(s, exec.registry, table, t.input, x, { dim: vocab, vocab });
          s.barrier();
          ops.argmax(s, exec.registry, x, t.output, { vocab });
        },
      });
      let tokens: number[] | undefined;
      try {
        tokens = [...loop.run({ first: 2, steps: 9 }).tokens];
      } catch (e) {
        ok(frozen && e instanceof MlxError && e.code === "InvalidArgument", `frozen ${frozen}: ${e}`);
      }
      if (tokens !== undefined) deepStrictEqual(tokens, want, `frozen ${frozen}`);
    }
  },
});

Deno.test({
  name: "freeze/commit of a recorded session whose capture was taken through s.encoder is an InvalidState MlxError",
  fn: () => {
    using ctx = testContext();
    const { device } = ctx;
    const exec = new GraphExecutor(device);
    using x = device.upload(new Float32Array(E).fill(2)), out = device.alloc(E * 4, DType.F32);
    const before = live(device);
    for (const end of [(s: GraphSession) => s.freeze(), (s: GraphSession) => s.commit()]) {
      const s = exec.beginRecorded();
      s.elementwiseMul(x, x, out);
      s.encoder.takeCapture();
      throws(() => end(s), isMlx("InvalidState"));
      s.dispose();
      equal(live(device), before);
    }
  },
});

Deno.test("frozen DecodeLoop: encodeStep throwing, or a hazard at the frozen pass's commit, leaves nothing behind", () => {
  using ctx = testContext();
  const { device } = ctx;
  const before = live(device);
  const vocab = 16;
  const values = randomValues(vocab * vocab, 13);
  using table = device.upload(values), x = device.alloc(vocab * 4, DType.F32);
  const next = (id: number) => refArgmax(values.subarray(id * vocab, (id + 1) * vocab));
  for (const validate of [false, true]) {
    let fail: "throw" | "hazard" | null = "throw";
    const exec = new GraphExecutor(device, { validate, autoBarriers: false });
    using loop = new DecodeLoop(exec, {
      recorded: true,
      stepState: true,
      frozen: true,
      depth: 2,
      readBatch: 2,
      encodeStep(s, t) {
        const st = t.state!;
        if (fail === "throw") throw new Error("model bug");
        ops.embedGather(s, exec.registry, table, st.ring, x, {
          dim: vocab,
          vocab,
          cursor: st.position,
          ring: st.ringSlots,
        });
        if (fail !== "hazard") s.barrier(); // without it the argmax reads x with no barrier
        ops.argmax(s, exec.registry, x, st.ring, { vocab, cursor: st.next, ring: st.ringSlots });
      },
    });
    throws(() => loop.run({ first: 1, steps: 4 }), /model bug/);
    equal(live(device), before);
    if (validate) {
      fail = "hazard";
      throws(() => loop.run({ first: 1, steps: 4 }), isMlx("HazardError"));
      equal(live(device), before);
    }
    fail = null;
    deepStrictEqual([...loop.run({ first: 1, steps: 6 }).tokens], chain(next, 1, 6), `validate ${validate}`);
    equal(live(device), before);
  }
});

Deno.test("freeze under MLXN_FUSION=0 / MLXN_REORDER=0 (read once per process): no fusion / no reorder, same bytes", async () => {
  const mod = new URL("../mod.ts", import.meta.url).href;
  const code = `
    import { DType, GraphExecutor, MlxDevice } from "${mod}";
    const device = MlxDevice.open();
    const exec = new GraphExecutor(device);
    const E = 64, v = (s) => new Float32Array(E).map((_, i) => Math.sin(s * 7 + i));
    const x = device.upload(v(1)), w = device.upload(v(2)), y = device.upload(v(3));
    const tmp = device.alloc(E * 4, DType.F32), out = device.alloc(E * 4, DType.F32), z = device.alloc(E * 4, DType.F32);
    const a = device.alloc(E * 4, DType.F32);
    const s = exec.beginRecorded({ autoBarriers: true });
    s.rmsNorm(x, w, tmp, { rows: 1, dim: E, eps: 1e-5 });
    s.elementwiseMul(tmp, y, out);
    s.elementwiseAdd(x, y, a);
    s.elementwiseMul(a, y, a);
    s.elementwiseAdd(a, x, a);
    s.axpby(y, y, z, { alpha: 2, beta: 1 }); // independent: the reorder pass moves it up
    const frozen = s.freeze({ fuse: true, reorder: true, dualBuffer: true });
    const r = frozen.commit().wait();
    console.log(JSON.stringify({ fusions: r.fusions, reordered: r.reordered, out: [...out.readBytes()], z: [...z.readBytes(), ...a.readBytes()] }));
    device.close();
  `;
  const results: Record<string, { fusions: number; reordered: number; out: number[]; z: number[] }> = {};
  for (const env of [{}, { MLXN_FUSION: "0" }, { MLXN_REORDER: "0" }]) {
    const r = await runDeno(["eval", "--no-prompt", code], { ...backendEnv, ...env });
    equal(r.code, 0, r.stderr);
    results[JSON.stringify(env)] = JSON.parse(r.stdout.trim().split("\n").pop()!);
  }
  const [on, noFusion, noReorder] = Object.values(results) as [
    typeof results[string],
    typeof results[string],
    typeof results[string],
  ];
  equal(on.fusions, 1);
  ok(on.reordered > 0, "the pass is reordered by default");
  equal(noFusion.fusions, 0);
  equal(noReorder.reordered, 0);
  equal(noReorder.fusions, 1);
  deepStrictEqual([noFusion.out, noFusion.z], [on.out, on.z], "fusion is bit-identical");
  deepStrictEqual([noReorder.out, noReorder.z], [on.out, on.z]);
});

Deno.test("frozen DecodeLoop: rows side by side and a ring that wraps many times give each row's host chain", () => {
  using ctx = testContext();
  const exec = new GraphExecutor(ctx.device);
  const rows = 3, steps = 37, firsts = [0, 9, 33];
  using m = stateTableLoop(exec, { vocab: 34, dim: 34, pick: 34, rows }, {
    frozen: true,
    depth: 2,
    readBatch: 3,
    finish: { fuse: true, reorder: true, dualBuffer: true },
  });
  equal(m.loop.ringSlots, 5);
  const r = m.loop.run({ first: firsts, steps, startPosition: 3 });
  const perRow = firsts.map((f) => chain(m.next, f, steps));
  const want = Array.from({ length: steps }, (_, k) => perRow.map((c) => c[k]!)).flat();
  deepStrictEqual([...r.tokens], want);
  equal(m.encoded, 2, "the first step's pass, and the next step's to check it is the same");
});
