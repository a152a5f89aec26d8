/**
 * Replays of a template by a stream like its own (`mlxn_cmdbuf_replay_like`): what may differ (inline
 * constants, buffer-view offsets and lengths), what must be decoded instead, what is refused, and
 * direct sessions begun with `reuse`, against decoding the same streams.
 */
import { deepStrictEqual, equal, match, notEqual, ok } from "node:assert/strict";
import { counters, DType, GraphExecutor, type MlxBuffer, type MlxDevice } from "../mod.ts";
import { createLlama } from "../examples/llama.ts";
import { Op, Status, Track, UNLIKE } from "../src/native/abi.ts";
import { lastErrorText } from "../src/native/status.ts";
import { testContext } from "./helpers.ts";
import { rawCommandBuffer, RawWords } from "./raw_stream.ts";

const E = 16;
const f32 = (v: number) => new Uint32Array(new Float32Array([v]).buffer)[0]!;

/** One axpby dispatch: out[outAt .. outAt + E) = alpha · x + beta · y (E elements). */
function axpby(
  w: RawWords,
  device: MlxDevice,
  x: MlxBuffer,
  y: MlxBuffer,
  out: MlxBuffer,
  o: { alpha?: number; beta?: number; outAt?: number; outLen?: number; n?: number; tag?: number } = {},
): RawWords {
  w.pipeline(device, "axpby_f32").buffer(0, x, 0, E * 4).buffer(1, y, 0, E * 4);
  w.buffer(2, out, (o.outAt ?? 0) * 4, o.outLen ?? E * 4);
  w.bytes(3, f32(o.alpha ?? 1), f32(o.beta ?? 0), o.n ?? E, 0);
  return w.rec(Op.DISPATCH_THREADS, 0, o.n ?? E, 1, 1, E, 1, 1, o.tag ?? 0);
}

/** A template of `stream` (kept stream), freed by the caller. */
function template(device: MlxDevice, stream: Uint8Array): Deno.PointerObject {
  const sym = device.sym, t = sym.mlxn_cmdbuf_new(device.devicePtr())!;
  equal(sym.mlxn_cmdbuf_encode_template(t, stream, stream.byteLength), Status.OK, lastErrorText(sym));
  return t;
}

/** replay_like of `stream` into a new command buffer: its status and message, and the buffer. */
function like(device: MlxDevice, t: Deno.PointerObject, stream: Uint8Array) {
  const cb = rawCommandBuffer(device), sym = device.sym;
  const rc = sym.mlxn_cmdbuf_replay_like(cb.ptr, t, stream, stream.byteLength);
  return { rc, message: rc < 0 ? lastErrorText(sym) : "", cb };
}

function setup(device: MlxDevice) {
  const x = device.upload(new Float32Array(E).map((_, j) => j + 1));
  const y = device.upload(new Float32Array(E).fill(100));
  const out = device.alloc(4 * E * 4, DType.F32);
  return { x, y, out, [Symbol.dispose]: () => [x, y, out].forEach((b) => b.dispose()) };
}

const values = (out: MlxBuffer) => Array.from(out.read() as Float32Array);
/** What out holds after alpha · x + beta · y into elements [at, at + E) of zeros. */
function expected(at: number, alpha: number, beta = 0): number[] {
  const r = new Array<number>(4 * E).fill(0);
  for (let j = 0; j < E; j++) r[at + j] = alpha * (j + 1) + beta * 100;
  return r;
}

Deno.test("replay_like: changed constants and a changed view offset replay patched, as decoding runs them", () => {
  using ctx = testContext();
  const { device } = ctx;
  using b = setup(device);
  const t = template(device, axpby(new RawWords(), device, b.x, b.y, b.out, { alpha: 2 }).take());
  try {
    const cases = [
      { alpha: 2, outAt: 0 }, // identical
      { alpha: 3, beta: 1, outAt: 0 }, // constants
      { alpha: 4, outAt: 2 * E }, // the view's offset (and a constant)
      { alpha: 5, outAt: E, outLen: 2 * E * 4 }, // offset and length
    ];
    for (const c of cases) {
      b.out.write(new Float32Array(4 * E));
      const r = like(device, t, axpby(new RawWords(), device, b.x, b.y, b.out, c).take());
      equal(r.rc, Status.OK, r.message);
      r.cb.run();
      deepStrictEqual(values(b.out), expected(c.outAt, c.alpha, c.beta ?? 0), JSON.stringify(c));
    }
  } finally {
    device.sym.mlxn_cmdbuf_free(t);
  }
});

Deno.test("replay_like: any other difference is unlike (nothing done); patched values are validated", () => {
  using ctx = testContext();
  const { device } = ctx;
  const sym = device.sym;
  using b = setup(device);
  using other = device.alloc(4 * E * 4, DType.F32);
  const base = { alpha: 2 };
  const t = template(device, axpby(new RawWords(), device, b.x, b.y, b.out, base).take());
  try {
    // Another buffer, another tag, another grid, another length: decoded instead, cb untouched.
    const unlike = [
      axpby(new RawWords(), device, b.x, b.y, other, base).take(),
      axpby(new RawWords(), device, b.x, b.y, b.out, { ...base, tag: 7 }).take(),
      new RawWords().pipeline(device, "axpby_f32").buffer(0, b.x, 0, E * 4).buffer(1, b.y, 0, E * 4)
        .buffer(2, b.out, 0, E * 4).bytes(3, f32(2), f32(0), E, 0).rec(Op.DISPATCH_THREADS, 0, E, 1, 1, 8, 1, 1, 0)
        .take(),
      axpby(axpby(new RawWords(), device, b.x, b.y, b.out, base), device, b.x, b.y, b.out, base).take(),
    ];
    for (const s of unlike) {
      const r = like(device, t, s);
      equal(r.rc, UNLIKE);
      equal(r.cb.encode(s).rc, Status.OK, "the command buffer still takes the stream");
      r.cb.run();
    }
    // Values a decode refuses are refused, and the command buffer fails for good.
    const refused: [Uint8Array, RegExp][] = [
      [axpby(new RawWords(), device, b.x, b.y, b.out, { outAt: 3 * E + 1 }).take(), /past the end of a 256-byte/],
      [
        axpby(new RawWords(), device, b.x, b.y, b.out, { outLen: 8 * 4 }).take(),
        /patched dispatch 0: kernel axpby_f32/,
      ],
      [axpby(new RawWords(), device, b.x, b.y, b.out, { n: 2 * E }).take(), /./], // n is a fixed grid word too
    ];
    for (const [s, why] of refused.slice(0, 2)) {
      const r = like(device, t, s);
      equal(r.rc, Status.E_STREAM);
      match(r.message, why);
      notEqual(sym.mlxn_cmdbuf_commit(r.cb.ptr), Status.OK, "a refused replay never runs");
      r.cb.free();
    }
    const grid = like(device, t, refused[2]![0]);
    equal(grid.rc, UNLIKE);
    grid.cb.free();
  } finally {
    sym.mlxn_cmdbuf_free(t);
  }
});

Deno.test("replay_like: refusals — no kept stream, a template takes nothing more, a freed buffer", () => {
  using ctx = testContext();
  const { device } = ctx;
  const sym = device.sym;
  using b = setup(device);
  const s = axpby(new RawWords(), device, b.x, b.y, b.out).take();
  const plain = rawCommandBuffer(device);
  equal(plain.encode(s).rc, Status.OK);
  const r = like(device, plain.ptr, s);
  equal(r.rc, Status.E_INVALID_ARGUMENT);
  match(r.message, /keeps no stream/);
  r.cb.free();
  plain.free();

  const t = template(device, s);
  equal(sym.mlxn_cmdbuf_encode(t, s, s.byteLength), Status.E_STATE);
  match(lastErrorText(sym), /takes no more records/);
  equal(sym.mlxn_cmdbuf_commit(t), Status.E_STATE);
  match(lastErrorText(sym), /never committed/);
  const again = rawCommandBuffer(device);
  equal(sym.mlxn_cmdbuf_encode_template(again.ptr, s, s.byteLength), Status.OK);
  equal(sym.mlxn_cmdbuf_encode_template(again.ptr, s, s.byteLength), Status.E_STATE, "a template is made once");
  again.free();

  using gone = device.alloc(4 * E * 4, DType.F32);
  const withGone = template(device, axpby(new RawWords(), device, b.x, b.y, gone).take());
  const next = axpby(new RawWords(), device, b.x, b.y, gone, { outAt: E }).take();
  gone.dispose();
  const r2 = like(device, withGone, next);
  ok(r2.rc < 0, "a freed buffer is refused");
  r2.cb.free();
  sym.mlxn_cmdbuf_free(withGone);
  sym.mlxn_cmdbuf_free(t);
});

Deno.test("replay_like with automatic barriers: a changed range that would meet its group decodes", () => {
  using ctx = testContext();
  const { device } = ctx;
  const sym = device.sym;
  using b = setup(device);
  // Two writes into disjoint slices of out: one concurrent group under automatic barriers.
  const pass = (secondAt: number, track = false) => {
    const w = new RawWords().rec(Op.AUTO_BARRIERS, 1);
    axpby(w, device, b.x, b.y, b.out, { alpha: 1, outAt: 0 });
    if (track) w.rec(Op.TRACK, 0, b.y.handle, Track.READ, 0, 0, 4, 0);
    return axpby(w, device, b.x, b.y, b.out, { alpha: 2, outAt: secondAt }).take();
  };
  const stats = (cb: ReturnType<typeof rawCommandBuffer>) => Array.from(cb.stats().slice(0, 3));
  const t = template(device, pass(E));
  try {
    // Another disjoint slice: replayed, still one group.
    b.out.write(new Float32Array(4 * E));
    const ok1 = like(device, t, pass(2 * E));
    equal(ok1.rc, Status.OK, ok1.message);
    const decoded = rawCommandBuffer(device);
    equal(decoded.encode(pass(2 * E)).rc, Status.OK);
    deepStrictEqual(stats(ok1.cb), stats(decoded), "the barrier counts decoding gives");
    decoded.free();
    ok1.cb.run();
    const want = expected(0, 1);
    for (let j = 0; j < E; j++) want[2 * E + j] = 2 * (j + 1);
    deepStrictEqual(values(b.out), want);
    // Overlapping the first write: decoding must place a barrier the template lacks.
    for (const at of [0, E / 2]) {
      const r = like(device, t, pass(at));
      equal(r.rc, UNLIKE, `second write at ${at}`);
      r.cb.free();
    }
  } finally {
    sym.mlxn_cmdbuf_free(t);
  }
  // Host-given ranges (TRACK) keep the ranges fixed; constants may still change.
  const tt = template(device, pass(E, true));
  try {
    const r = like(device, tt, pass(2 * E, true));
    equal(r.rc, UNLIKE);
    r.cb.free();
  } finally {
    sym.mlxn_cmdbuf_free(tt);
  }
});

Deno.test("replay_like: a SET_BYTES a later one replaces is no patch site", () => {
  using ctx = testContext();
  const { device } = ctx;
  const sym = device.sym;
  using b = setup(device);
  const pass = (dead: number) =>
    new RawWords().pipeline(device, "axpby_f32").buffer(0, b.x, 0, E * 4).buffer(1, b.y, 0, E * 4)
      .buffer(2, b.out, 0, E * 4).bytes(3, f32(dead), f32(0), E, 0).bytes(3, f32(2), f32(0), E, 0)
      .rec(Op.DISPATCH_THREADS, 0, E, 1, 1, E, 1, 1, 0).take();
  const t = template(device, pass(7));
  try {
    const r = like(device, t, pass(9));
    equal(r.rc, UNLIKE);
    r.cb.free();
  } finally {
    sym.mlxn_cmdbuf_free(t);
  }
});

Deno.test("sessions begun with reuse: a token loop with host positions replays, the same tokens and logits", () => {
  using ctx = testContext();
  const { device } = ctx;
  const cfg = { layers: 2, hidden: 128, heads: 2, kvHeads: 1, ffn: 256, vocab: 100, ctx: 32 };
  const model = createLlama(device, { ...cfg, quant: "q4_0", seed: 5 });
  const exec = new GraphExecutor(device);
  const { act, embedding } = model;
  const logits = new Float32Array(cfg.vocab);
  const run = (reuse: boolean, auto: boolean) => {
    model.resetCache();
    counters.reset();
    let token = 3;
    const tokens: number[] = [], last: number[] = [];
    for (let pos = 0; pos < 12; pos++) {
      act.x!.write(embedding.subarray(token * cfg.hidden, (token + 1) * cfg.hidden));
      act.pos!.write(new Uint32Array([pos]));
      const s = exec.begin({ autoBarriers: auto, reuse });
      model.step(s, pos, auto ? () => {} : () => s.barrier());
      s.finish();
      act.logits!.readBytesInto(logits);
      token = logits.indexOf(Math.max(...logits));
      tokens.push(token);
      last.splice(0, last.length, ...logits);
    }
    return { tokens, last, replays: counters.snapshot().passReplays, barriers: counters.snapshot().barriers };
  };
  for (const auto of [false, true]) {
    const plain = run(false, auto), reused = run(true, auto);
    equal(plain.replays, 0);
    equal(reused.replays, 11, `auto ${auto}: every pass after the first replays`);
    deepStrictEqual(reused.tokens, plain.tokens);
    deepStrictEqual(reused.last, plain.last, "bit-identical logits");
    equal(reused.barriers, plain.barriers);
  }
});
