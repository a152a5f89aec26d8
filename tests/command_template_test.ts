/**
 * Command templates: a stream decoded once into a command buffer that is never committed, then
 * copied into new command buffers (`mlxn_cmdbuf_replay`) with no decoding. These tests check that a
 * replay runs exactly what decoding the same stream runs (inline constants over several arena
 * blocks included), that frozen passes and unchanged plan-cache hits replay through templates, and
 * that a template never keeps a freed buffer's memory.
 */
import { deepStrictEqual, equal, match, ok } from "node:assert/strict";
import { CommandEncoder, DecodeLoop, DType, GraphExecutor, MlxDevice } from "../mod.ts";
import { createLlama } from "../examples/llama.ts";
import { StreamRepeats } from "../src/command_template.ts";
import { Op, PATCH_WORDS, Stat, Status } from "../src/native/abi.ts";
import { testContext } from "./helpers.ts";
import { lastErrorText } from "../src/native/status.ts";
import { rawCommandBuffer, RawWords as Words } from "./raw_stream.ts";

const E = 32;
const f32 = (v: number) => new Uint32Array(new Float32Array([v]).buffer)[0]!;

/**
 * axpby dispatches into D slices of `out`, each with its own alpha and beta in a 256-byte inline
 * block (the most a CUDA launch takes; enough dispatches fill several 64 KiB arena blocks), a
 * barrier every fifth.
 */
function axpbyStream(
  device: MlxDevice,
  x: { handle: number },
  y: { handle: number },
  out: { handle: number },
  D: number,
) {
  const w = new Words().pipeline(device, "axpby_f32");
  for (let i = 0; i < D; i++) {
    if (i > 0 && i % 5 === 0) w.rec(Op.BARRIER, 0);
    w.rec(Op.SET_BUFFER, 0, x.handle, 0, E * 4).rec(Op.SET_BUFFER, 1, y.handle, 0, E * 4);
    w.rec(Op.SET_BUFFER, 2, out.handle, i * E * 4, E * 4);
    const block = new Array<number>(64).fill(0x5a5a5a5a);
    block[0] = f32(i + 0.5), block[1] = f32(-i), block[2] = E, block[3] = 0;
    w.bytes(3, ...block);
    w.threads([E, 1, 1], [E, 1, 1]);
  }
  return w.take();
}

/** What that stream computes, in f32 arithmetic. */
function axpbyExpected(D: number): Float32Array {
  const out = new Float32Array(D * E);
  for (let i = 0; i < D; i++) {
    for (let j = 0; j < E; j++) {
      out[i * E + j] = Math.fround(Math.fround(Math.fround(i + 0.5) * (j + 1)) + Math.fround(-i) * 1);
    }
  }
  return out;
}

Deno.test("a replayed template runs what decoding its stream runs, constants over several arena blocks", () => {
  using ctx = testContext();
  const { device } = ctx;
  const D = 600; // 600 × 256 bytes of constants: three arena blocks
  using x = device.upload(new Float32Array(E).map((_, j) => j + 1)), y = device.upload(new Float32Array(E).fill(1));
  using out = device.alloc(D * E * 4, DType.F32);
  const stream = axpbyStream(device, x, y, out, D);
  const template = rawCommandBuffer(device);
  deepStrictEqual(template.encode(stream), { rc: Status.OK, offset: -1, message: "" });
  const decoded = rawCommandBuffer(device);
  decoded.encode(stream);
  const expected = axpbyExpected(D);
  for (let round = 0; round < 3; round++) {
    out.write(new Float32Array(D * E));
    const replayed = rawCommandBuffer(device);
    deepStrictEqual(replayed.replay(template.ptr), { rc: Status.OK, message: "" });
    deepStrictEqual(replayed.stats(), decoded.stats(), "the same dispatches in the same groups");
    equal(replayed.stats()[Stat.GROUPS], 120);
    if (round === 2) template.free(); // a replay owns what it copied: the template may go first
    replayed.run();
    deepStrictEqual(out.read(), expected, `round ${round}`);
  }
  decoded.free();
});

Deno.test("replay: a dispatch after it starts a new group; refused into a non-empty target or with a freed buffer", () => {
  using ctx = testContext();
  const { device } = ctx;
  using x = device.upload(new Float32Array(E).fill(1)), y = device.upload(new Float32Array(E).fill(2));
  using out = device.alloc(4 * E * 4, DType.F32);
  const template = rawCommandBuffer(device);
  template.encode(axpbyStream(device, x, y, out, 3)); // one group of three
  const after = rawCommandBuffer(device);
  equal(after.replay(template.ptr).rc, Status.OK);
  // An independent dispatch (slice 3) after the replay still goes into a group of its own.
  const w = new Words().pipeline(device, "axpby_f32");
  w.buffer(0, x, 0, E * 4).buffer(1, y, 0, E * 4).buffer(2, out, 3 * E * 4, E * 4).bytes(3, f32(1), f32(1), E, 0);
  equal(after.encode(w.threads([E, 1, 1], [E, 1, 1]).take()).rc, Status.OK);
  equal(after.stats()[Stat.GROUPS], 2);
  after.run();
  deepStrictEqual(Array.from(out.read() as Float32Array).slice(3 * E, 3 * E + 2), [3, 3]);

  // A target that holds a dispatch already is refused, and stays usable for nothing else.
  const busy = rawCommandBuffer(device);
  w.pipeline(device, "axpby_f32").buffer(0, x, 0, E * 4).buffer(1, y, 0, E * 4).buffer(2, out, 0, E * 4);
  busy.encode(w.bytes(3, f32(1), f32(1), E, 0).threads([E, 1, 1], [E, 1, 1]).take());
  const refused = busy.replay(template.ptr);
  equal(refused.rc, Status.E_STATE);
  match(refused.message, /empty command buffer/);
  busy.free();

  // A buffer the template binds, freed: the replay is refused (and its memory goes with the template).
  const extra = device.alloc(E * 4, DType.F32);
  const t2 = rawCommandBuffer(device);
  const w2 = new Words().pipeline(device, "axpby_f32");
  w2.buffer(0, x, 0, E * 4).buffer(1, y, 0, E * 4).buffer(2, extra, 0, E * 4).bytes(3, f32(1), f32(1), E, 0);
  t2.encode(w2.threads([E, 1, 1], [E, 1, 1]).take());
  const bytesBefore = MlxDevice.liveObjects(device).bufferBytes;
  extra.dispose();
  equal(MlxDevice.liveObjects(device).bufferBytes, bytesBefore, "the template still references it");
  const late = rawCommandBuffer(device);
  const r = late.replay(t2.ptr);
  equal(r.rc, Status.E_BAD_HANDLE);
  match(r.message, /freed after the template was encoded/);
  equal(late.encode(new Uint8Array(0)).rc, Status.E_STREAM, "the refused target is failed for good");
  late.free();
  t2.free();
  equal(MlxDevice.liveObjects(device).bufferBytes, bytesBefore - E * 4, "freed with the template");
  template.free();
});

/** Counts the command buffers that took records by template and by decoding, around `body`. */
function countTakes(body: () => void): { replayed: number; decoded: number } {
  const replay = CommandEncoder.prototype.appendTemplate, append = CommandEncoder.prototype.appendPlanRecords;
  const n = { replayed: 0, decoded: 0 };
  CommandEncoder.prototype.appendTemplate = function (...a) {
    const took = replay.apply(this, a);
    if (took) n.replayed++;
    return took;
  };
  CommandEncoder.prototype.appendPlanRecords = function (...a) {
    const took = append.apply(this, a);
    if (took) n.decoded++;
    return took;
  };
  try {
    body();
  } finally {
    CommandEncoder.prototype.appendTemplate = replay;
    CommandEncoder.prototype.appendPlanRecords = append;
  }
  return n;
}

Deno.test("plan-cache hits replay a template once their records repeat, then patch the constants that change", () => {
  using ctx = testContext();
  const { device } = ctx;
  const N = 6;
  using x = device.upload(new Float32Array(E).map((_, j) => j)), y = device.upload(new Float32Array(E).fill(1));
  using wide = device.alloc(N * E * 4, DType.F32);
  const slices = Array.from({ length: N }, (_, i) => wide.slice(i * E * 4, E * 4));
  const exec = new GraphExecutor(device), plain = new GraphExecutor(device, { planCache: false });
  const pass = (on: GraphExecutor, alpha: number) => {
    const s = on.beginRecorded();
    for (let i = 0; i < N; i++) s.axpby(x, y, slices[i]!, { alpha: alpha + i, beta: 2 });
    s.gelu(slices[0]!, slices[0]!);
    return s.finish({ fuse: true, reorder: true, dualBuffer: true });
  };
  // alpha per pass: a miss, hits with changed constants, then the same constants again and again.
  const alphas = [1, 2, 3, 3, 3, 3, 4, 4, 4];
  const takes: { replayed: number; decoded: number }[] = [];
  for (const alpha of alphas) {
    pass(plain, alpha);
    const want = wide.read();
    wide.write(new Float32Array(N * E));
    takes.push(countTakes(() => pass(exec, alpha)));
    deepStrictEqual(wide.read(), want, `alpha ${alpha}`);
  }
  // The miss and hits with changed constants decode the records, until a hit finds them as the hit
  // before left them: from then on the templates replay, constants that change patched natively.
  // One of the two command buffers takes no alpha: its records repeat from the first hit on.
  deepStrictEqual(takes.map((t) => t.replayed), [0, 0, 1, 2, 2, 2, 2, 2, 2]);
  deepStrictEqual(takes.map((t) => t.decoded), [2, 2, 1, 0, 0, 0, 0, 0, 0]);
});

Deno.test("disposing a buffer a frozen pass binds frees its memory at once; the next commit is refused", () => {
  using ctx = testContext();
  const { device } = ctx;
  using x = device.upload(new Float32Array(E).fill(1));
  const out = device.alloc(E * 4, DType.F32);
  const exec = new GraphExecutor(device);
  const s = exec.beginRecorded();
  s.axpby(x, x, out, { alpha: 1, beta: 1 });
  const frozen = s.freeze();
  frozen.commit().wait();
  deepStrictEqual(Array.from(out.read() as Float32Array).slice(0, 2), [2, 2]);
  const before = MlxDevice.liveObjects(device);
  out.dispose();
  const after = MlxDevice.liveObjects(device);
  equal(after.bufferBytes, before.bufferBytes - E * 4, "the template let the memory go");
  equal(after.commandBuffers, before.commandBuffers - 1, "its template was dropped");
  try {
    frozen.commit();
    ok(false, "a commit after the dispose must throw");
  } catch (e) {
    equal((e as { code?: string }).code, "Disposed");
  }
  frozen.dispose();
});

Deno.test("a patched replay changes the constants it names and validates the patched dispatches again", () => {
  using ctx = testContext();
  const { device } = ctx;
  const sym = device.sym;
  using x = device.upload(new Float32Array(E).map((_, j) => j + 1)), y = device.upload(new Float32Array(E).fill(1));
  using out = device.alloc(3 * E * 4, DType.F32);
  const template = rawCommandBuffer(device);
  template.encode(axpbyStream(device, x, y, out, 3)); // dispatch i: alpha i + 0.5, beta -i
  const replay = (...entries: number[][]) => {
    const cb = rawCommandBuffer(device), patch = new Uint32Array(entries.flat());
    const rc = sym.mlxn_cmdbuf_replay_patched(cb.ptr, template.ptr, patch, patch.length);
    return { cb, rc, message: rc === Status.OK ? "" : lastErrorText(sym) };
  };
  // Dispatch 1's alpha (word 0) becomes 4 and dispatch 2's beta (byte 4) becomes 10.
  const good = replay([1, 3, 0, f32(4)], [2, 3, 4, f32(10)]);
  equal(good.rc, Status.OK, good.message);
  good.cb.run();
  const got = out.read() as Float32Array;
  deepStrictEqual([got[0], got[E + 1], got[2 * E + 1]], [0.5 * 1 - 0, 4 * 2 - 1, 2.5 * 2 + 10]);
  // Each bad entry fails the command buffer with what is wrong; nothing runs.
  const bad: [number[], RegExp][] = [
    [[3, 3, 0, 0], /dispatch 3, but the command buffer has 3/],
    [[0, 2, 0, 0], /slot 2 of kernel axpby_f32 \(dispatch 0\) holds no inline constants/],
    [[0, 3, 2, 0], /byte offset 2 of slot 3/],
    [[0, 3, 256, 0], /byte offset 256 of slot 3 \(dispatch 0\) is not a whole word inside its 256/],
    [[0, 3, 8, E + 1], /patched dispatch 0: kernel axpby_f32/], // n past the bound slices
  ];
  for (const [entry, why] of bad) {
    const r = replay(entry);
    equal(r.rc, Status.E_STREAM, `${entry}`);
    match(r.message, why);
    equal(r.cb.encode(new Uint8Array(0)).rc, Status.E_STREAM, "failed for good");
    r.cb.free();
  }
  const cb = rawCommandBuffer(device);
  equal(sym.mlxn_cmdbuf_replay_patched(cb.ptr, template.ptr, new Uint32Array(3), 3), Status.E_INVALID_ARGUMENT);
  match(lastErrorText(sym), new RegExp(`${PATCH_WORDS} words per entry`));
  cb.free();
  template.free();
});

Deno.test("a state-driven direct DecodeLoop replays its repeated passes from a template, the same tokens, nothing kept after", () => {
  using ctx = testContext();
  const { device } = ctx;
  const model = createLlama(device, {
    layers: 2,
    hidden: 128,
    heads: 2,
    kvHeads: 1,
    ffn: 256,
    vocab: 100,
    ctx: 16,
    quant: "q4_0",
    seed: 3,
  });
  const exec = new GraphExecutor(device);
  let before: ReturnType<typeof MlxDevice.liveObjects> | undefined; // after the first run (the model allocates lazily)
  const encodeInto = StreamRepeats.prototype.encodeInto;
  const run = (autoBarriers: boolean, repeats: boolean) => {
    let replayed = 0;
    StreamRepeats.prototype.encodeInto = function (...a) {
      const rc = repeats ? encodeInto.apply(this, a) : null;
      if (rc === Status.OK) replayed++;
      return rc;
    };
    try {
      model.resetCache();
      using loop = new DecodeLoop(exec, {
        depth: 2,
        readBatch: 4,
        stepState: true,
        session: { autoBarriers },
        encodeStep: (s, t) => model.tokenStep(s, t, autoBarriers ? () => {} : () => s.barrier()),
      });
      return { tokens: [...loop.run({ first: 5, steps: 10 }).tokens], replayed };
    } finally {
      StreamRepeats.prototype.encodeInto = encodeInto;
    }
  };
  for (const auto of [false, true]) {
    const plain = run(auto, false);
    before ??= MlxDevice.liveObjects(device);
    const fast = run(auto, true);
    deepStrictEqual(fast.tokens, plain.tokens, `auto ${auto}: the same tokens`);
    equal(fast.replayed, 9, `auto ${auto}: passes 2..10 replay the template the second pass made`);
    deepStrictEqual(MlxDevice.liveObjects(device), before, "the run's templates went with it");
  }
});
