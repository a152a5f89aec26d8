/**
 * Plan-cache hits whose constants change on every pass: from the third such hit in a row the plan's
 * records replay through a template whose patch list the key comparison keeps (one entry per word
 * changed since decoding), and every pass computes what the same pass computes without the cache.
 * Also the template's patch list itself against a host reference, and when a template is made,
 * kept and dropped.
 */
import { deepStrictEqual, equal, ok } from "node:assert/strict";
import { CommandEncoder, DType, type FinishOptions, GraphExecutor, type MlxBuffer, type MlxDevice } from "../mod.ts";
import { hitTemplate, maxPlanPatchWords, type PlanRecords, PlanTemplate } from "../src/plan_cache.ts";
import { LEN_SHIFT, Op, OP_MASK } from "../src/native/abi.ts";
import { rng, testContext } from "./helpers.ts";
import { rawCommandBuffer, RawWords } from "./raw_stream.ts";

const E = 32;
const f32 = (v: number) => new Uint32Array(new Float32Array([v]).buffer)[0]!;

/** Counts the command buffers that took plan records by template and by decoding, around `body`. */
function countTakes<T>(body: () => T): { value: T; replayed: number; decoded: number } {
  const replay = CommandEncoder.prototype.appendTemplate, append = CommandEncoder.prototype.appendPlanRecords;
  let replayed = 0, decoded = 0;
  CommandEncoder.prototype.appendTemplate = function (...a) {
    const took = replay.apply(this, a);
    if (took) replayed++;
    return took;
  };
  CommandEncoder.prototype.appendPlanRecords = function (...a) {
    const took = append.apply(this, a);
    if (took) decoded++;
    return took;
  };
  try {
    return { value: body(), replayed, decoded };
  } finally {
    CommandEncoder.prototype.appendTemplate = replay;
    CommandEncoder.prototype.appendPlanRecords = append;
  }
}

/** N axpby dispatches into N slices of `wide` (alpha and beta per dispatch), then a gelu on slice 0. */
function runPass(
  exec: GraphExecutor,
  io: { x: MlxBuffer; y: MlxBuffer; slices: MlxBuffer[] },
  alphas: readonly number[],
  betas: readonly number[],
  options: FinishOptions,
) {
  const s = exec.beginRecorded();
  for (let i = 0; i < alphas.length; i++) s.axpby(io.x, io.y, io.slices[i]!, { alpha: alphas[i]!, beta: betas[i]! });
  s.gelu(io.slices[0]!, io.slices[0]!);
  const report = s.finish(options);
  return report;
}

function setup(device: MlxDevice, n: number) {
  const x = device.upload(new Float32Array(E).map((_, j) => j - 7.5));
  const y = device.upload(new Float32Array(E).map((_, j) => 1 / (j + 1)));
  const wide = device.alloc(n * E * 4, DType.F32);
  const slices = Array.from({ length: n }, (_, i) => wide.slice(i * E * 4, E * 4));
  return { x, y, wide, slices, [Symbol.dispose]: () => [x, y, wide].forEach((b) => b.dispose()) };
}

Deno.test("hits whose constants change every pass replay a template from the third hit on, each pass exact", () => {
  using ctx = testContext();
  const { device } = ctx;
  const N = 6;
  for (const options of [{ fuse: true, reorder: true }, { fuse: true, reorder: true, dualBuffer: true }]) {
    using io = setup(device, N);
    const exec = new GraphExecutor(device), plain = new GraphExecutor(device, { planCache: false });
    // Every dispatch's alpha differs from the pass before's; some passes go back to earlier values
    // (so a patched word takes its decoded value again), the last ones change beta as well.
    const bases = [1, 2, 3, 4, 3, 5, -2, 0.5, 1, 7, 8];
    const takes: number[] = [];
    for (let p = 0; p < bases.length; p++) {
      const alphas = Array.from({ length: N }, (_, i) => bases[p]! + i / 4);
      const betas = Array.from({ length: N }, (_, i) => (p >= 9 ? p : 1) - i / 8);
      io.wide.write(new Float32Array(N * E).fill(-3));
      runPass(plain, io, alphas, betas, options);
      const want = io.wide.read();
      io.wide.write(new Float32Array(N * E).fill(-3));
      const got = countTakes(() => runPass(exec, io, alphas, betas, options));
      deepStrictEqual(io.wide.read(), want, `${JSON.stringify(options)}, pass ${p}`);
      equal(got.value.planCache, p === 0 ? "miss" : "hit");
      takes.push(got.replayed);
    }
    const buffers = options.dualBuffer ? 2 : 1;
    if (!options.dualBuffer) {
      // The miss and the first two hits decode; every later hit replays, its constants patched.
      deepStrictEqual(takes, [0, 0, 0, ...new Array(bases.length - 3).fill(1)]);
    } else {
      // A buffer whose constants repeat replays from its second hit, one whose change from its third.
      deepStrictEqual(takes.slice(0, 2), [0, 0]);
      deepStrictEqual(takes.slice(3), new Array(bases.length - 3).fill(buffers));
    }
  }
});

Deno.test("hits whose constants change in more words than the bound decode every pass, exactly", () => {
  using ctx = testContext();
  const { device } = ctx;
  const N = 20; // 21 dispatches: 16 < 21 < 40 changed words
  using io = setup(device, N);
  const exec = new GraphExecutor(device), plain = new GraphExecutor(device, { planCache: false });
  const takes: number[] = [];
  for (let p = 0; p < 6; p++) {
    const alphas = Array.from({ length: N }, (_, i) => p + i), betas = Array.from({ length: N }, (_, i) => -p - i);
    runPass(plain, io, alphas, betas, { fuse: true, reorder: true });
    const want = io.wide.read();
    io.wide.write(new Float32Array(N * E));
    const got = countTakes(() => runPass(exec, io, alphas, betas, { fuse: true, reorder: true }));
    deepStrictEqual(io.wide.read(), want, `pass ${p}`);
    takes.push(got.decoded);
  }
  deepStrictEqual(takes, [1, 1, 1, 1, 1, 1]);
});

Deno.test("randomised hits (changing constants, two topologies, both modes) equal passes without the cache", () => {
  using ctx = testContext();
  const { device } = ctx;
  const N = 5, rand = rng(1234);
  using io = setup(device, N + 1);
  for (const options of [{ fuse: true, reorder: true }, { fuse: true, reorder: true, dualBuffer: true }]) {
    const exec = new GraphExecutor(device), plain = new GraphExecutor(device, { planCache: false });
    let replayed = 0;
    for (let p = 0; p < 40; p++) {
      // Topology 1 writes the last slice instead of slice 1; constants from a small set, so that words
      // change, repeat and change back, in varying numbers.
      const topo = rand() < 0.3 ? 1 : 0;
      const alphas = Array.from({ length: N }, () => [0.5, -1, 2, 3][Math.floor(rand() * 4)]!);
      const betas = Array.from({ length: N }, () => (rand() < 0.2 ? 2 : 1));
      const slices = io.slices.slice();
      if (topo === 1) [slices[1], slices[N]] = [slices[N]!, slices[1]!];
      io.wide.write(new Float32Array((N + 1) * E).fill(1));
      runPass(plain, { ...io, slices }, alphas, betas, options);
      const want = io.wide.read();
      io.wide.write(new Float32Array((N + 1) * E).fill(1));
      const got = countTakes(() => runPass(exec, { ...io, slices }, alphas, betas, options));
      deepStrictEqual(io.wide.read(), want, `pass ${p} (${JSON.stringify({ topo, alphas, betas, options })})`);
      replayed += got.replayed;
    }
    ok(replayed > 10, `${replayed} command buffers replayed a template`);
  }
});

/** Plan records of `n` axpby dispatches (constants: alpha i + 0.5, beta -i, E, 0, then `pad` words). */
function axpbyRecords(device: MlxDevice, x: MlxBuffer, y: MlxBuffer, out: MlxBuffer, n: number, pad: number) {
  const w = new RawWords().pipeline(device, "axpby_f32");
  for (let i = 0; i < n; i++) {
    w.buffer(0, x, 0, E * 4).buffer(1, y, 0, E * 4).buffer(2, out, i * E * 4, E * 4);
    w.bytes(3, f32(i + 0.5), f32(-i), E, 0, ...new Array(pad).fill(0));
    w.threads([E, 1, 1], [E, 1, 1]);
  }
  const bytes = w.take(), words = new Uint32Array(bytes.buffer);
  const records: PlanRecords = {
    words,
    bytes,
    patches: new Int32Array(0),
    groupSizes: Int32Array.of(n),
    dispatches: n,
    lastPipeline: device.kernels.get("axpby_f32").handle,
    template: null,
    unchangedHits: 0,
    changedWords: 0,
  };
  return records;
}

/** The word index of constant word `q` of dispatch `i` in `words` (its SET_BYTES record's data). */
function constantWord(words: Uint32Array, i: number, q: number): number {
  for (let at = 0, k = 0; at < words.length; at += words[at]! >>> LEN_SHIFT) {
    const op = words[at]! & OP_MASK;
    if (op === Op.SET_BYTES && k === i) return at + 2 + q;
    if (op === Op.DISPATCH_THREADS) k++;
  }
  throw new Error("no such constant");
}

Deno.test("a plan template replays the records' current constants through its patch list, up to its bound", () => {
  using ctx = testContext();
  const { device } = ctx;
  const D = 3;
  using x = device.upload(new Float32Array(E).map((_, j) => j + 1)), y = device.upload(new Float32Array(E).fill(1));
  using out = device.alloc(D * E * 4, DType.F32);
  const r = axpbyRecords(device, x, y, out, D, 8);
  const template = new PlanTemplate(device, r);
  const alpha = [0.5, 1.5, 2.5], beta = [0, -1, -2];
  const check = (what: string) => {
    const cb = rawCommandBuffer(device), [patch, n] = template.patchList();
    equal(device.sym.mlxn_cmdbuf_replay_patched(cb.ptr, template.ptr, patch, n), 0, what);
    cb.run();
    const want = new Float32Array(D * E);
    for (let i = 0; i < D; i++) {
      for (let j = 0; j < E; j++) want[i * E + j] = Math.fround(Math.fround(alpha[i]! * (j + 1)) + beta[i]!);
    }
    deepStrictEqual(out.read(), want, what);
  };
  const set = (i: number, q: number, v: number) => {
    const at = constantWord(r.words, i, q);
    r.words[at] = f32(v);
    ok(template.wordChanged(at), `word ${at} patchable`);
    (q === 0 ? alpha : beta)[i] = v;
  };
  check("as decoded");
  equal(template.patchList()[1], 0, "nothing to patch");
  set(1, 0, 4);
  set(2, 1, 10);
  check("two words patched");
  set(1, 0, -3); // an entry's value updated in place
  check("a patched word changed again");
  equal(template.patchList()[1], 8, "two entries");
  set(1, 0, 1.5); // back to the decoded value
  check("a patched word changed back");
  // Not constants: the header and the byte count of a SET_BYTES record, a dispatch record.
  const c = constantWord(r.words, 0, 0);
  ok(!template.wordChanged(c - 1) && !template.wordChanged(c - 2) && !template.wordChanged(r.words.length - 1));
  // The bound: 16 words for 3 dispatches (36 constant words); the 17th distinct one is refused.
  equal(maxPlanPatchWords(D), 16);
  let took = 2;
  for (let i = 0; i < D; i++) {
    for (let q = 4; q < 12; q++) {
      const at = constantWord(r.words, i, q);
      if (took < 16) ok(template.wordChanged(at), `entry ${++took}`);
    }
  }
  equal(template.patchList()[1], 16 * 4);
  ok(!template.wordChanged(constantWord(r.words, 2, 3)), "past the bound");
  ok(template.wordChanged(constantWord(r.words, 1, 0)), "a word with an entry still updates");
  check("sixteen entries (the padding words patched to what they hold)");
  template.dispose();
});

Deno.test("a plan template never patches constants a later record of the same slot replaces", () => {
  using ctx = testContext();
  const { device } = ctx;
  using x = device.upload(new Float32Array(E).fill(1)), y = device.upload(new Float32Array(E).fill(2));
  using out = device.alloc(E * 4, DType.F32);
  const w = new RawWords().pipeline(device, "axpby_f32");
  w.buffer(0, x, 0, E * 4).buffer(1, y, 0, E * 4).buffer(2, out, 0, E * 4);
  w.bytes(3, f32(100), f32(100), E, 0).bytes(3, f32(2), f32(3), E, 0).threads([E, 1, 1], [E, 1, 1]);
  const bytes = w.take(), words = new Uint32Array(bytes.buffer);
  const r: PlanRecords = {
    ...axpbyRecords(device, x, y, out, 1, 0),
    words,
    bytes,
  };
  const template = new PlanTemplate(device, r);
  const first = constantWord(words, 0, 0); // the replaced record's alpha
  ok(!template.wordChanged(first), "replaced before the dispatch: not patchable");
  ok(template.wordChanged(first + 6), "the record the dispatch takes");
  template.dispose();
});

Deno.test("hitTemplate: made on a hit that repeats the last, or the third patchable one; never past the bound", () => {
  using ctx = testContext();
  const { device } = ctx;
  using x = device.upload(new Float32Array(E)), y = device.upload(new Float32Array(E));
  using out = device.alloc(8 * E * 4, DType.F32);
  const fresh = () => axpbyRecords(device, x, y, out, 8, 0); // bound: 16 words
  const hits = (r: PlanRecords, changed: number[]) =>
    changed.map((n) => {
      r.changedWords = n;
      return hitTemplate(device, r) !== null;
    });
  const repeat = fresh();
  deepStrictEqual(hits(repeat, [0, 0, 0]), [false, true, true], "records as the hit before left them");
  repeat.template?.dispose();
  const changing = fresh();
  deepStrictEqual(hits(changing, [3, 16, 5, 2]), [false, false, true, true], "patchable changes");
  changing.template?.dispose();
  const many = fresh();
  deepStrictEqual(hits(many, [17, 3, 17, 3, 3, 3]), [false, false, false, false, false, true], "past the bound");
  many.template?.dispose();
});
