/**
 * Review of the recorded-session hit path (capture as stream words, nodes and automatic barriers
 * derived on a plan-cache miss, the byte-compared plan-cache key): hostile cases against what a
 * session placing its barriers per dispatch gives.
 */
import { deepStrictEqual, equal } from "node:assert/strict";
import fc from "fast-check";
import { DecodeLoop, type DecodeLoopOptions, DType, GraphExecutor } from "../mod.ts";
import { createLlama } from "../examples/llama.ts";
import { openDevice } from "./helpers.ts";

Deno.test("recorded session: automatic barriers follow the setting each dispatch was recorded under", () => {
  using device = openDevice({ backend: "cpu" });
  const E = 64;
  using x = device.upload(new Float32Array(E).fill(1)), y = device.upload(new Float32Array(E).fill(2));
  using a = device.alloc(E * 4, DType.F32), b = device.alloc(E * 4, DType.F32);
  using c = device.alloc(E * 4, DType.F32), d = device.alloc(E * 4, DType.F32);
  for (const planCache of [true, false]) {
    const exec = new GraphExecutor(device, { planCache });
    for (let pass = 0; pass < 3; pass++) {
      // Recorded with automatic barriers: a = x + y, then b = a + y (RAW on a: a barrier). Then
      // the setting goes off: c = b + y and d = c + y are the user's to separate (they are not).
      using s = exec.beginRecorded();
      s.elementwiseAdd(x, y, a);
      s.elementwiseAdd(a, y, b);
      s.encoder.autoBarriers = false;
      s.elementwiseAdd(x, y, c);
      s.elementwiseAdd(x, y, d);
      const r = s.finish();
      deepStrictEqual(r.barriers, [1], `cache ${planCache}, pass ${pass}: the barrier of the auto part`);
      equal(r.groups, 2);
      deepStrictEqual([...b.read() as Float32Array], new Array(E).fill(5));
    }
    // The other way round: hand-placed first, automatic after the switch; as a direct session places them.
    for (const recorded of [true, false]) {
      using s = recorded ? exec.beginRecorded({ autoBarriers: false }) : exec.begin({ autoBarriers: false });
      s.elementwiseAdd(x, y, a);
      s.elementwiseAdd(x, y, c); // independent: no barrier either way
      s.encoder.autoBarriers = true;
      s.elementwiseAdd(c, y, b);
      s.elementwiseAdd(b, y, d); // RAW on b: a barrier
      deepStrictEqual(s.finish().barriers, [1], `cache ${planCache}, recorded ${recorded}: the auto part's barrier`);
    }
  }
});

type Step =
  | { k: "add"; a: number; b: number; out: number }
  | { k: "axpby"; a: number; b: number; out: number; alpha: number }
  | { k: "barrier" }
  | { k: "auto"; on: boolean };

const SLICES = 6, SLICE = 16; // views: slice i of allocation i % 2 (16 floats each, some overlapping)

Deno.test("property: a recorded pass (miss, then hits with new constants) places the direct session's barriers", () => {
  using device = openDevice({ backend: "cpu" });
  const allocs = [device.alloc(4 * SLICE * 4, DType.F32), device.alloc(4 * SLICE * 4, DType.F32)];
  // Offsets in floats: overlapping views (8 apart) and disjoint ones.
  const offsets = [0, 8, 16, 32, 40, 48];
  const views = offsets.map((o, i) => allocs[i % 2]!.slice(o * 4, SLICE * 4));
  const overlaps = (p: number, q: number) =>
    p % 2 === q % 2 && offsets[p]! < offsets[q]! + SLICE && offsets[q]! < offsets[p]! + SLICE;
  const v = fc.nat(SLICES - 1);
  const step: fc.Arbitrary<Step> = fc.oneof(
    { weight: 6, arbitrary: fc.record({ k: fc.constant("add" as const), a: v, b: v, out: v }) },
    {
      weight: 3,
      arbitrary: fc.record({
        k: fc.constant("axpby" as const),
        a: v,
        b: v,
        out: v,
        alpha: fc.integer({ min: -3, max: 3 }),
      }),
    },
    { weight: 1, arbitrary: fc.constant({ k: "barrier" as const }) },
    { weight: 1, arbitrary: fc.record({ k: fc.constant("auto" as const), on: fc.boolean() }) },
  );
  const valid = (s: Step) =>
    s.k === "barrier" || s.k === "auto" || [s.a, s.b].every((i) => i === s.out || !overlaps(i, s.out));
  const exec = new GraphExecutor(device, { planCacheSize: 4 });
  try {
    fc.assert(
      fc.property(fc.array(step, { minLength: 1, maxLength: 40, size: "max" }), fc.boolean(), (raw, auto0) => {
        const prog = raw.filter(valid);
        exec.planCache!.clear();
        const run = (recorded: boolean, shift: number) => {
          allocs.forEach((a, i) => a.write(new Float32Array(4 * SLICE).map((_, k) => (k % 7) + i)));
          using s = recorded ? exec.beginRecorded({ autoBarriers: auto0 }) : exec.begin({ autoBarriers: auto0 });
          let auto = auto0;
          for (const st of prog) {
            if (st.k === "add") s.elementwiseAdd(views[st.a]!, views[st.b]!, views[st.out]!);
            else if (st.k === "axpby") {
              s.axpby(views[st.a]!, views[st.b]!, views[st.out]!, { alpha: st.alpha + shift, beta: 1 });
            } else if (st.k === "barrier") s.barrier();
            else s.encoder.autoBarriers = auto = st.on;
            // By hand, every dispatch is followed by a barrier (and so is the switch to hand-placed
            // barriers): no pass races, so outputs compare.
            if (!auto && st.k !== "barrier") s.barrier();
          }
          const r = s.finish();
          return {
            barriers: r.barriers,
            groups: r.groups,
            planCache: r.planCache,
            bytes: allocs.map((a) => a.readBytes()),
          };
        };
        for (let pass = 0; pass < 3; pass++) {
          const direct = run(false, pass), recorded = run(true, pass);
          equal(recorded.planCache, pass === 0 ? "miss" : "hit", `pass ${pass}`);
          // (Barriers are compared through the groups: a direct encoder counts back-to-back barriers.)
          equal(recorded.groups, direct.groups, `pass ${pass}: groups`);
          deepStrictEqual(recorded.bytes, direct.bytes, `pass ${pass}: outputs`);
        }
      }),
      { numRuns: 150, seed: 3016 },
    );
  } finally {
    allocs.forEach((a) => a.dispose());
  }
});

Deno.test("DecodeLoop with automatic barriers only (none by hand): every mode gives the hand-placed loop's tokens and logits", () => {
  using device = openDevice({ backend: "cpu" });
  const exec = new GraphExecutor(device);
  const model = createLlama(device, {
    layers: 2,
    hidden: 128,
    heads: 2,
    kvHeads: 1,
    ffn: 256,
    vocab: 300,
    ctx: 24,
    seed: 7,
    quant: "q4_0",
  });
  const select = { temperature: 0.9, topK: 40, topP: 0.95, seed: 11 };
  const steps = 10, logits = model.act.logits!;
  const run = (hand: boolean, options: Partial<DecodeLoopOptions>) => {
    model.resetCache();
    using loop = new DecodeLoop(exec, {
      readBatch: 4,
      session: { autoBarriers: !hand },
      ...options,
      encodeStep: (s, t) => model.tokenStep(s, t, hand ? () => s.barrier() : () => {}, select),
    });
    const r = loop.run({ first: 3, steps });
    return { tokens: [...r.tokens], logits: logits.read() as Float32Array, reports: r.reports };
  };
  const want = run(true, { depth: 1 });
  const modes: [string, Partial<DecodeLoopOptions>][] = [
    ["direct", { depth: 2 }],
    ["direct, step state", { depth: 2, stepState: true }],
    ["recorded", { depth: 2, recorded: true, finish: { fuse: true, reorder: true } }],
    ["recorded, step state", {
      depth: 3,
      recorded: true,
      stepState: true,
      finish: { fuse: true, reorder: true, dualBuffer: true },
    }],
    ["frozen, step state", {
      depth: 2,
      recorded: true,
      stepState: true,
      frozen: true,
      finish: { fuse: true, reorder: true },
    }],
  ];
  for (let round = 0; round < 2; round++) {
    for (const [name, options] of modes) {
      const got = run(false, options);
      deepStrictEqual(got.tokens, want.tokens, `${name}: tokens`);
      deepStrictEqual(got.logits, want.logits, `${name}: last logits`);
      if (options.stepState && options.recorded && !options.frozen) {
        // (A new loop's buffers are a new topology of a known shape: recorded on its second sighting.)
        deepStrictEqual(got.reports.slice(2).map((r) => r.planCache), new Array(steps - 2).fill("hit"), name);
      }
    }
  }
});

Deno.test("plan cache: passes that differ only in a hand barrier, threadgroup memory, a binding's offset or length, or the dispatch kind miss; repeats hit with fresh outputs", () => {
  using device = openDevice({ backend: "cpu" });
  const add = device.kernels.get("elementwise_add_f32");
  using x = device.upload(new Float32Array(64).map((_, i) => i)), y = device.upload(new Float32Array(64).fill(0.5));
  using out = device.alloc(64 * 4, DType.F32);
  type V = { barrier: boolean; tgMem: number; off: number; len: number; kind: "threads" | "threadgroups" };
  const base: V = { barrier: false, tgMem: 0, off: 0, len: 16, kind: "threads" };
  const variants: V[] = [
    base,
    { ...base, barrier: true },
    { ...base, tgMem: 64 },
    { ...base, off: 16 },
    { ...base, len: 8 },
    { ...base, kind: "threadgroups" },
  ];
  const pass = (exec: GraphExecutor, v: V, alpha: number) => {
    out.write(new Float32Array(64));
    using s = exec.beginRecorded({ autoBarriers: false });
    const n = v.len, g = v.kind === "threads" ? n : 1;
    s.dispatch({
      pipeline: add,
      bindings: [x.slice(v.off * 4, n * 4), y.slice(0, n * 4), out.slice(v.off * 4, n * 4), [n]],
      grid: g,
      threadgroup: n,
      threadgroupMemory: v.tgMem || undefined,
      dispatchKind: v.kind,
    });
    if (v.barrier) s.barrier();
    s.axpby(out.slice(32 * 4, 16 * 4), y.slice(0, 16 * 4), out.slice(48 * 4, 16 * 4), { alpha, beta: 1 });
    const r = s.finish({ fuse: true, reorder: true });
    return { planCache: r.planCache, groups: r.groups, bytes: out.readBytes() };
  };
  const cached = new GraphExecutor(device, { planCacheSize: 16 });
  const fresh = new GraphExecutor(device, { planCache: false });
  // A new topology of a known shape is recorded on its second sighting: two rounds before hits.
  for (let round = 0; round < 2; round++) {
    for (const [i, v] of variants.entries()) {
      const r = pass(cached, v, 1 + round);
      if (round === 0) equal(r.planCache, "miss", `variant ${i}: a new topology`);
    }
  }
  for (const [i, v] of variants.entries()) {
    const again = pass(cached, v, 2 + i), ref = pass(fresh, v, 2 + i);
    equal(again.planCache, "hit", `variant ${i}`);
    deepStrictEqual({ ...again, planCache: "" }, { ...ref, planCache: "" }, `variant ${i}`);
  }
});
