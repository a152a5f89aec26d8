/**
 * The plan cache: a recorded pass with a known topology replays the cached optimised stream. Every
 * replay must equal a fresh optimisation bit for bit (outputs and report), and any change of
 * topology must be a miss.
 */
import { deepStrictEqual, equal, throws } from "node:assert/strict";
import fc from "fast-check";
import {
  counters,
  DType,
  f32Bits,
  type FinishReport,
  GraphExecutor,
  type GraphSession,
  type MlxBuffer,
  MlxError,
} from "../mod.ts";
import { CommandEncoder } from "../src/encoder.ts";
import { type CachedPlan, Fingerprint, PlanCache } from "../src/plan_cache.ts";
import { randomValues, testContext } from "./helpers.ts";

const ALLOCS = 3, ELEMS = 512, DIM = 32;

/** A view: allocation, first element, element count. */
type View = readonly [alloc: number, first: number, count: number];
type Op =
  | { op: "add" | "mul"; a: View; b: View; out: View; tg: number; note?: number | undefined }
  | { op: "axpby"; a: View; b: View; out: View; alpha: number; beta: number }
  | { op: "normMul"; x: View; tmp: View; s: View; out: View; eps: number };

const overlaps = (p: View, q: View) => p[0] === q[0] && p[1] < q[1] + q[2] && q[1] < p[1] + p[2];
const same = (p: View, q: View) => p[0] === q[0] && p[1] === q[1] && p[2] === q[2];
const outputOk = (out: View, inputs: View[]) => inputs.every((i) => same(i, out) || !overlaps(i, out));

const viewArb = fc.tuple(fc.integer({ min: 0, max: ALLOCS - 1 }), fc.integer({ min: 0, max: ELEMS / 64 - 1 }))
  .map(([a, k]): View => [a, k * 64, 64]);
const constArb = fc.float({ min: -2, max: 2, noNaN: true, noDefaultInfinity: true });
const opArb: fc.Arbitrary<Op | null> = fc.oneof(
  fc.record({
    op: fc.constantFrom("add", "mul") as fc.Arbitrary<"add" | "mul">,
    a: viewArb,
    b: viewArb,
    out: viewArb,
    tg: fc.constantFrom(32, 64),
    note: fc.option(fc.integer({ min: 0, max: 7 }), { nil: undefined }),
  }).map((o) => outputOk(o.out, [o.a, o.b]) ? o : null),
  fc.record({
    op: fc.constant("axpby" as const),
    a: viewArb,
    b: viewArb,
    out: viewArb,
    alpha: constArb,
    beta: constArb,
  })
    .map((o) => outputOk(o.out, [o.a, o.b]) ? o : null),
  fc.record({ op: fc.constant("normMul" as const), x: viewArb, tmp: viewArb, s: viewArb, out: viewArb, eps: constArb })
    .map((o) =>
      outputOk(o.tmp, [o.x]) && !overlaps(o.tmp, o.s) && outputOk(o.out, [o.tmp, o.s])
        ? { ...o, eps: Math.abs(o.eps) + 1e-6 }
        : null
    ),
);
const programArb = fc.array(opArb, { minLength: 1, maxLength: 80, size: "max" })
  .map((ops) => ops.filter((o): o is Op => o !== null))
  .filter((ops) => ops.length > 0);

/** New inline constants, same topology. */
function withNewConstants(prog: Op[], seed: number): Op[] {
  return prog.map((o, i) => {
    const v = Math.sin(seed * 7.1 + i) * 1.5;
    if (o.op === "axpby") return { ...o, alpha: v, beta: 1 - v };
    if (o.op === "normMul") return { ...o, eps: Math.abs(v) + 1e-4 };
    return o;
  });
}

/** A change of topology: a range, a pipeline, a geometry or a user-given range. */
function mutateTopology(prog: Op[], pick: number, kind: number): Op[] | null {
  const i = pick % prog.length, o = prog[i]!;
  let m: Op | null = null;
  if (kind === 0 && o.op !== "normMul") { // pipeline: add ↔ mul
    if (o.op === "add" || o.op === "mul") m = { ...o, op: o.op === "add" ? "mul" : "add" };
  } else if (kind === 1 && (o.op === "add" || o.op === "mul")) { // geometry only
    m = { ...o, tg: o.tg === 32 ? 64 : 32 };
  } else if (kind === 3 && (o.op === "add" || o.op === "mul")) { // a user range (barrierBetween)
    m = { ...o, note: o.note === undefined ? 0 : o.note === 7 ? undefined : o.note + 1 };
  } else { // range: move the output to another allocation's bytes
    const out = o.out;
    const moved: View = [(out[0] + 1) % ALLOCS, out[1], out[2]];
    const inputs = o.op === "normMul" ? [o.tmp, o.s] : [o.a, o.b];
    if (outputOk(moved, inputs) && (o.op !== "normMul" || !overlaps(moved, o.x))) m = { ...o, out: moved };
  }
  if (m === null) return null;
  const copy = [...prog];
  copy[i] = m;
  return copy;
}

function emit(s: GraphSession, prog: Op[], views: (v: View) => MlxBuffer, w: MlxBuffer, notes: MlxBuffer): void {
  const add = s.encoder.resolvePipeline({ name: "elementwise_add_f32" });
  const mul = s.encoder.resolvePipeline({ name: "elementwise_mul_f32" });
  for (const o of prog) {
    switch (o.op) {
      case "add":
      case "mul": // raw dispatches: the threadgroup size is part of the topology
        // A user range on a buffer no kernel touches: never covered by the derived accesses.
        if (o.note !== undefined) s.barrierBetween([notes.slice(o.note * 16, 16)], []);
        s.dispatch({
          pipeline: o.op === "add" ? add : mul,
          bindings: [views(o.a), views(o.b), views(o.out), [o.out[2]]],
          grid: o.out[2],
          threadgroup: o.tg,
          dispatchKind: "threads",
        });
        break;
      case "axpby":
        s.axpby(views(o.a), views(o.b), views(o.out), { alpha: o.alpha, beta: o.beta });
        break;
      case "normMul":
        s.rmsNorm(views(o.x), w, views(o.tmp), { rows: o.x[2] / DIM, dim: DIM, eps: o.eps });
        s.elementwiseMul(views(o.tmp), views(o.s), views(o.out));
        break;
    }
  }
}

type Flags = { fuse: boolean; reorder: boolean; dualBuffer: boolean };
const stripTimes = (r: FinishReport) => ({
  fusions: r.fusions,
  reordered: r.reordered,
  barriers: r.barriers,
  dispatches: r.dispatches,
  groups: r.groups,
});

Deno.test("plan cache property: replays equal fresh optimisations bit for bit; topology changes miss", () => {
  using ctx = testContext();
  const { device } = ctx;
  const cached = new GraphExecutor(device, { planCacheSize: 4 });
  const fresh = new GraphExecutor(device, { planCache: false });
  const allocs = Array.from({ length: ALLOCS }, () => device.alloc(ELEMS * 4, DType.F32));
  const init = allocs.map((_, i) => randomValues(ELEMS, 500 + i));
  using w = device.upload(randomValues(DIM, 7, DType.F32, 0.5, 1.5));
  using notes = device.alloc(128, DType.F32);
  // A new view object per binding: a hit must not depend on buffer object identity.
  const views = (v: View) => allocs[v[0]]!.slice(v[1] * 4, v[2] * 4);
  const run = (exec: GraphExecutor, prog: Op[], flags: Flags) => {
    allocs.forEach((a, i) => a.write(init[i]!));
    using s = exec.beginRecorded({ autoBarriers: true });
    emit(s, prog, views, w, notes);
    const report = s.finish(flags);
    return { report, bytes: allocs.map((a) => a.readBytes()) };
  };
  let hits = 0, misses = 0, fusions = 0;
  fc.assert(
    fc.property(
      programArb,
      fc.record({ fuse: fc.boolean(), reorder: fc.boolean(), dualBuffer: fc.boolean() }),
      fc.nat(),
      fc.integer({ min: 0, max: 3 }),
      fc.integer({ min: 1, max: 1000 }),
      (prog, flags, pick, kind, seed) => {
        cached.planCache!.clear();
        equal(run(cached, prog, flags).report.planCache, "miss");
        misses++;
        // Same topology, new constants: a hit, and exactly what a fresh optimisation gives.
        const next = withNewConstants(prog, seed);
        const replay = run(cached, next, flags), reference = run(fresh, next, flags);
        equal(replay.report.planCache, "hit");
        equal(reference.report.planCache, "off");
        hits++;
        fusions += replay.report.fusions;
        deepStrictEqual(stripTimes(replay.report), stripTimes(reference.report));
        deepStrictEqual(replay.bytes, reference.bytes);
        // Any change of topology: a miss (and still correct).
        const changed = mutateTopology(next, pick, kind);
        if (changed !== null) {
          const r = run(cached, changed, flags);
          equal(r.report.planCache, "miss", `mutation ${kind} of op ${pick % prog.length}`);
          deepStrictEqual(r.bytes, run(fresh, changed, flags).bytes);
          misses++;
        }
        // Other finish options are another plan.
        const other = { ...flags, reorder: !flags.reorder };
        equal(run(cached, next, other).report.planCache, "miss");
      },
    ),
    { numRuns: 40, seed: 1602 },
  );
  equal(hits, 40);
  deepStrictEqual(cached.planCache!.stats().capacity, 4);
  if (fusions === 0) throw new Error("no replay contained a fusion: the generator no longer exercises fusion");
  allocs.forEach((a) => a.dispose());
  void misses;
});

Deno.test("plan cache: counters, LRU eviction, the switch, and option checks", () => {
  using ctx = testContext();
  const { device } = ctx;
  using a = device.upload(new Float32Array(64).fill(1)), b = device.upload(new Float32Array(64).fill(2));
  using out = device.alloc(256, DType.F32), other = device.alloc(256, DType.F32);
  const pass = (exec: GraphExecutor, dst: MlxBuffer, alpha: number) => {
    using s = exec.beginRecorded();
    s.axpby(a, b, dst, { alpha, beta: 1 });
    s.elementwiseAdd(dst, a, dst);
    if (dst === other) s.elementwiseAdd(dst, a, dst); // another shape of key, which is cached at once
    return s.finish({ fuse: true, reorder: true }).planCache;
  };
  const exec = new GraphExecutor(device, { planCacheSize: 1 });
  counters.reset();
  deepStrictEqual([pass(exec, out, 1), pass(exec, out, 3)], ["miss", "hit"]);
  deepStrictEqual(Array.from(out.read() as Float32Array).slice(0, 2), [6, 6]); // 3·1 + 2, then + 1
  deepStrictEqual([pass(exec, other, 1), pass(exec, out, 1)], ["miss", "miss"], "capacity 1 evicts");
  const c = counters.snapshot();
  deepStrictEqual([c.planCacheHits, c.planCacheMisses], [1, 3]);
  deepStrictEqual(exec.planCache!.stats(), { hits: 1, misses: 3, size: 1, capacity: 1 });
  const off = new GraphExecutor(device, { planCache: false });
  deepStrictEqual([pass(off, out, 1), pass(off, out, 1)], ["off", "off"]);
  equal(off.planCache, null);
  using s = exec.begin();
  s.elementwiseAdd(a, b, out);
  equal(s.finish().planCache, "off", "direct passes have no plan");
  throws(() => new GraphExecutor(device, { planCacheSize: -1 }), (e) => e instanceof MlxError);
  throws(() => new GraphExecutor(device, { planCacheSize: 1.5 }), (e) => e instanceof MlxError);
});

Deno.test("plan cache hit: counters, groups and outputs equal a fresh optimisation's, with and without validation", () => {
  using ctx = testContext();
  const { device } = ctx;
  using a = device.upload(new Float32Array(64).fill(1)), b = device.upload(new Float32Array(64).fill(2));
  using wide = device.alloc(64 * 4 * 6, DType.F32);
  const slices = Array.from({ length: 6 }, (_, i) => wide.slice(i * 256, 256));
  // Three independent dispatches, then a chain that needs barriers (RAW on slices[0]).
  const pass = (exec: GraphExecutor, alpha: number) => {
    wide.write(new Float32Array(64 * 6));
    using s = exec.beginRecorded();
    for (let i = 0; i < 3; i++) s.axpby(a, b, slices[i]!, { alpha: alpha + i, beta: 1 });
    s.elementwiseAdd(slices[0]!, a, slices[3]!);
    s.elementwiseMul(slices[3]!, b, slices[4]!);
    const before = counters.snapshot();
    const report = s.finish({ fuse: true, reorder: true });
    const after = counters.snapshot();
    return {
      outcome: report.planCache,
      report: stripTimes(report),
      dispatches: after.dispatches - before.dispatches,
      barriers: after.barriers - before.barriers,
      bytes: wide.readBytes(),
    };
  };
  for (const validate of [false, true]) {
    const cached = new GraphExecutor(device, { validate }), fresh = new GraphExecutor(device, { planCache: false });
    equal(pass(cached, 1).outcome, "miss");
    for (const alpha of [2, 5]) {
      const hit = pass(cached, alpha), reference = pass(fresh, alpha);
      equal(hit.outcome, "hit");
      deepStrictEqual({ ...hit, outcome: "" }, { ...reference, outcome: "" }, `validate ${validate}, alpha ${alpha}`);
      deepStrictEqual(hit.report.barriers, [2]);
    }
  }
});

Deno.test("plan cache hit: constants are those at dispatch time; a buffer disposed before finish is refused", () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device);
  const add = device.kernels.get("elementwise_add_f32");
  using a = device.upload(new Float32Array(8).fill(1)), out = device.alloc(32, DType.F32);
  const pass = (n: number, victim?: MlxBuffer, disposeIt = false) => {
    using s = exec.beginRecorded();
    const params = [n];
    s.dispatch({
      pipeline: add,
      bindings: [a, victim ?? a, out, params],
      grid: 8,
      threadgroup: 8,
      dispatchKind: "threads",
    });
    params[0] = 8; // later edits of the caller's array change nothing
    if (disposeIt) victim!.dispose();
    return s.finish({ reorder: true }).planCache;
  };
  out.write(new Float32Array(8));
  equal(pass(2), "miss");
  deepStrictEqual(Array.from(out.read() as Float32Array), [2, 2, 0, 0, 0, 0, 0, 0]);
  out.write(new Float32Array(8));
  equal(pass(4), "hit");
  deepStrictEqual(Array.from(out.read() as Float32Array), [2, 2, 2, 2, 0, 0, 0, 0]);
  const victim = device.upload(new Float32Array(8).fill(1));
  equal(pass(2, victim), "miss"); // its topology, cached
  throws(() => pass(2, victim, true), (e) => e instanceof MlxError && e.code === "Disposed");
  out.write(new Float32Array(8));
  equal(pass(3), "hit", "the refused pass left the cache and the device usable");
  deepStrictEqual(Array.from(out.read() as Float32Array), [2, 2, 2, 0, 0, 0, 0, 0]);
});

Deno.test("plan cache: a new topology of a known shape is recorded on its second sighting only", () => {
  using ctx = testContext();
  const { device } = ctx;
  using a = device.upload(new Float32Array(64).fill(1));
  using wide = device.alloc(64 * 4 * 4, DType.F32);
  const axpby = device.kernels.get("axpby_f32");
  // The key of a pass of `count` axpby dispatches into slice k (the slice moves: a new topology).
  const key = (k: number, count = 1, alpha = 1) => {
    using enc = device.commandEncoder();
    enc.startCapture();
    for (let i = 0; i < count; i++) {
      enc.dispatch({
        pipeline: axpby,
        bindings: [a, a, wide.slice(k * 256, 256), [f32Bits(alpha), f32Bits(1), 64, 0]],
        grid: 64,
        threadgroup: 64,
        dispatchKind: "threads",
      });
    }
    const fp = new Fingerprint();
    fp.compute(enc.takeCompactCapture()!, 3);
    return fp;
  };
  const plan = {} as CachedPlan; // the cache only holds it
  const cache = new PlanCache(4);
  const missThenShould = (fp: Fingerprint) => {
    equal(cache.lookup(fp), undefined);
    return cache.shouldRecord(fp);
  };
  const first = key(0);
  equal(missThenShould(first), true, "a shape with no plan yet: recorded at once");
  cache.store(first, plan);
  equal(cache.lookup(key(0, 1, 5)), plan, "new constants: a hit");
  equal(missThenShould(key(1)), false, "same shape, new ranges: remembered, not recorded");
  equal(missThenShould(key(2)), false);
  equal(missThenShould(key(1, 1, 3)), true, "seen before (constants aside): recorded now");
  const again = key(1);
  cache.store(again, plan);
  equal(cache.lookup(again), plan);
  equal(missThenShould(key(3, 2)), true, "another shape (two dispatches): recorded at once");
  equal(missThenShould(key(3)), false);
  cache.clear();
  equal(missThenShould(key(3)), true, "clear() forgets the sightings too");
  const none = new PlanCache(0);
  equal(none.lookup(first), undefined);
  equal(none.shouldRecord(first), false, "a cache of capacity 0 records nothing");
});

Deno.test("plan cache hit, dual buffer: both command buffers take this pass's constants, as a fresh optimisation", () => {
  using ctx = testContext();
  const { device } = ctx;
  const N = 100, E = 64;
  using a = device.upload(new Float32Array(E).fill(1)), b = device.upload(new Float32Array(E).fill(2));
  using wide = device.alloc(2 * N * E * 4, DType.F32);
  const slices = Array.from({ length: 2 * N }, (_, i) => wide.slice(i * E * 4, E * 4));
  // N independent axpbys, then N more that read them: a barrier between the halves, and constants
  // that change every pass on both sides of the dual-buffer split.
  const pass = (exec: GraphExecutor, base: number) => {
    wide.write(new Float32Array(2 * N * E));
    using s = exec.beginRecorded();
    for (let i = 0; i < N; i++) s.axpby(a, b, slices[i]!, { alpha: base + i, beta: 1 });
    for (let i = 0; i < N; i++) s.axpby(slices[i]!, a, slices[N + i]!, { alpha: 1, beta: base });
    const before = counters.snapshot();
    const report = s.finish({ fuse: true, reorder: true, dualBuffer: true });
    const after = counters.snapshot();
    const values = wide.read() as Float32Array;
    return {
      outcome: report.planCache,
      report: stripTimes(report),
      counted: [after.dispatches - before.dispatches, after.barriers - before.barriers],
      firsts: Array.from({ length: 2 * N }, (_, i) => values[i * E]!),
      bytes: wide.readBytes(),
    };
  };
  // Counts the command buffers that took a plan's records by copying (the fast path of a hit).
  const append = CommandEncoder.prototype.appendPlanRecords;
  let appended = 0;
  CommandEncoder.prototype.appendPlanRecords = function (...args) {
    const took = append.apply(this, args);
    if (took) appended++;
    return took;
  };
  try {
    for (const validate of [false, true]) {
      const cached = new GraphExecutor(device, { validate }), fresh = new GraphExecutor(device, { planCache: false });
      equal(pass(cached, 1).outcome, "miss");
      for (const base of [3, -2.5]) {
        appended = 0;
        const hit = pass(cached, base);
        // Without validation both buffers copy their records; a validating encoder replays the steps.
        equal(appended, validate ? 0 : 2, `records appended, validate ${validate}`);
        const reference = pass(fresh, base);
        equal(hit.outcome, "hit");
        equal(hit.report.barriers.length, 2, "two command buffers");
        // axpby: alpha·x + beta·y with a = 1, b = 2.
        const expected = Array.from({ length: 2 * N }, (_, i) => i < N ? base + i + 2 : base + (i - N) + 2 + base);
        deepStrictEqual(hit.firsts, expected, `validate ${validate}, base ${base}`);
        deepStrictEqual({ ...hit, outcome: "" }, { ...reference, outcome: "" }, `validate ${validate}, base ${base}`);
      }
    }
  } finally {
    CommandEncoder.prototype.appendPlanRecords = append;
  }
});
