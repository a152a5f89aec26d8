/**
 * Review of command templates through the raw C ABI (`mlxn_cmdbuf_replay`): every refusal leaves
 * the target failed for good (a replay that did not happen must never run as an empty command
 * buffer); inline constants spread over many arena blocks, in any slot order, replay bit-exactly
 * against decoding the same stream; one template replays into many command buffers in flight and
 * may be freed while they run; a freed buffer refuses the replay and keeps its memory only as long
 * as the template; a dispatch after a replay starts a new group; barrier statistics equal those of
 * decoding the stream.
 */
import { deepStrictEqual, equal, match, notEqual, ok } from "node:assert/strict";
import { DType, type MlxBuffer, MlxDevice } from "../mod.ts";
import { CbStatus, Op, Stat, Status } from "../src/native/abi.ts";
import { lastErrorText } from "../src/native/status.ts";
import { rng, testContext } from "./helpers.ts";
import { RawWords as Words } from "./raw_stream.ts";

const N = 16; // elements per axpby dispatch
const f32 = (v: number) => new Uint32Array(new Float32Array([v]).buffer)[0]!;

type Sym = MlxDevice["sym"];
type Ptr = Deno.PointerObject;

/** A raw command buffer on `device`. */
function newCb(device: MlxDevice): Ptr {
  const cb = device.sym.mlxn_cmdbuf_new(device.devicePtr());
  ok(cb !== null, lastErrorText(device.sym));
  return cb;
}

/** Encodes `chunk` into `cb`, asserting success. */
function encodeOk(sym: Sym, cb: Ptr, chunk: Uint8Array): void {
  equal(sym.mlxn_cmdbuf_encode(cb, chunk, chunk.byteLength), Status.OK, lastErrorText(sym));
}

/** Commits, waits and frees `cb`, asserting success. */
function run(sym: Sym, cb: Ptr): void {
  equal(sym.mlxn_cmdbuf_commit(cb), Status.OK, lastErrorText(sym));
  equal(sym.mlxn_cmdbuf_wait(cb), Status.OK, lastErrorText(sym));
  sym.mlxn_cmdbuf_free(cb);
}

/** Every barrier statistic, group sizes included (Stat.COUNT words, the small-size histogram, the wide sizes). */
function allStats(sym: Sym, cb: Ptr): number[] {
  const out = new Uint32Array(Stat.COUNT + Stat.SMALL_SIZES + 64);
  const n = sym.mlxn_cmdbuf_barrier_stats(cb, out, out.length);
  return Array.from(out.subarray(0, n));
}

/** out[slice i] = alpha·x + beta·y (axpby_f32); `pad` extra words of inline bytes after the params. */
function axpby(
  w: Words,
  device: MlxDevice,
  b: { x: MlxBuffer; y: MlxBuffer; out: MlxBuffer },
  i: number,
  alpha: number,
  beta: number,
  pad = 0,
): Words {
  w.pipeline(device, "axpby_f32").buffer(0, b.x, 0, N * 4).buffer(1, b.y, 0, N * 4).buffer(2, b.out, i * N * 4, N * 4);
  w.bytes(3, f32(alpha), f32(beta), N, 0, ...Array.from({ length: pad }, (_, k) => (i * 7919 + k) >>> 0));
  return w.threads([N, 1, 1], [N, 1, 1]);
}

function axpbyBuffers(device: MlxDevice, slices: number) {
  const x = device.upload(new Float32Array(N).map((_, k) => k + 1));
  const y = device.upload(new Float32Array(N).map((_, k) => 0.5 * k - 3));
  const out = device.alloc(slices * N * 4, DType.F32);
  return {
    x,
    y,
    out,
    /** Host reference of slice i. */
    want: (alpha: number, beta: number) =>
      Array.from(
        { length: N },
        (_, k) => Math.fround(Math.fround(alpha * (k + 1)) + Math.fround(beta * (0.5 * k - 3))),
      ),
    [Symbol.dispose]() {
      x.dispose();
      y.dispose();
      out.dispose();
    },
  };
}

/** A template of two axpby dispatches (slices 0 and 1), encoded and never committed. */
function twoDispatchTemplate(device: MlxDevice, b: ReturnType<typeof axpbyBuffers>): Ptr {
  const t = newCb(device);
  const w = new Words();
  axpby(w, device, b, 0, 3, 1);
  encodeOk(device.sym, t, axpby(w, device, b, 1, -2, 0.5).take());
  return t;
}

function assertTemplateWorks(device: MlxDevice, b: ReturnType<typeof axpbyBuffers>, t: Ptr, what: string): void {
  const sym = device.sym;
  b.out.write(new Float32Array(2 * N));
  const cb = newCb(device);
  equal(sym.mlxn_cmdbuf_replay(cb, t), Status.OK, `${what}: ${lastErrorText(sym)}`);
  run(sym, cb);
  const got = Array.from(b.out.read() as Float32Array);
  deepStrictEqual(got, [...b.want(3, 1), ...b.want(-2, 0.5)], `${what}: the template still replays`);
}

Deno.test("replay: every refusal says why and leaves the target failed for good; the template stays usable", () => {
  using ctx = testContext();
  const { device } = ctx;
  const sym = device.sym;
  using b = axpbyBuffers(device, 2);
  const t = twoDispatchTemplate(device, b);
  using other = MlxDevice.open({ backend: "cpu" });
  const closing = MlxDevice.open({ backend: "cpu" });

  // Templates that cannot be replayed, each made by the step that spoils it.
  const spoiled = (f: (cb: Ptr) => void) => {
    const cb = newCb(device);
    f(cb);
    return cb;
  };
  const w = new Words();
  const committed = spoiled((cb) => {
    axpby(w, device, b, 0, 1, 1);
    encodeOk(sym, cb, w.take());
    equal(sym.mlxn_cmdbuf_commit(cb), Status.OK);
    equal(sym.mlxn_cmdbuf_wait(cb), Status.OK);
  });
  const failed = spoiled((cb) => notEqual(sym.mlxn_cmdbuf_encode(cb, w.rec(Op.BARRIER, 3).take(), 8), Status.OK));
  const pending = spoiled((cb) => encodeOk(sym, cb, w.pipeline(device, "axpby_f32").buffer(0, b.x, 0, 64).take()));
  const tgPending = spoiled((cb) => encodeOk(sym, cb, w.rec(Op.SET_TG_MEMORY, 0, 256).take()));
  const otherDevice = newCb(other);
  encodeOk(other.sym, otherDevice, new Uint8Array(0));
  const closedDevice = newCb(closing);
  closing.close();

  // Targets that cannot take a replay (still encoding, so the refusal must fail them).
  const cases: { what: string; target: (cb: Ptr) => void; from: Ptr | null | "self"; rc: number; re: RegExp }[] = [
    { what: "null template", target: () => {}, from: null, rc: Status.E_INVALID_ARGUMENT, re: /null template/ },
    { what: "self", target: () => {}, from: "self", rc: Status.E_INVALID_ARGUMENT, re: /itself/ },
    {
      what: "another device's",
      target: () => {},
      from: otherDevice,
      rc: Status.E_INVALID_ARGUMENT,
      re: /another device/,
    },
    { what: "closed device's", target: () => {}, from: closedDevice, rc: Status.E_STATE, re: /was closed/ },
    { what: "committed", target: () => {}, from: committed, rc: Status.E_STATE, re: /never committed/ },
    { what: "failed", target: () => {}, from: failed, rc: Status.E_STATE, re: /failed to encode: .*BARRIER/ },
    { what: "mid-dispatch", target: () => {}, from: pending, rc: Status.E_STATE, re: /inside a dispatch/ },
    {
      what: "threadgroup memory pending",
      target: () => {},
      from: tgPending,
      rc: Status.E_STATE,
      re: /inside a dispatch/,
    },
    {
      what: "target holds a dispatch",
      target: (cb) => encodeOk(sym, cb, axpby(w, device, b, 0, 1, 1).take()),
      from: t,
      rc: Status.E_STATE,
      re: /empty command buffer/,
    },
    {
      what: "target holds a tracked range",
      target: (cb) => encodeOk(sym, cb, w.rec(Op.TRACK, 0, b.out.handle, 1, 0, 0, 64, 0).take()),
      from: t,
      rc: Status.E_STATE,
      re: /empty command buffer/,
    },
    {
      what: "target has automatic barriers on",
      target: (cb) => encodeOk(sym, cb, w.rec(Op.AUTO_BARRIERS, 1).take()),
      from: t,
      rc: Status.E_STATE,
      re: /empty command buffer/,
    },
    {
      what: "target replayed once already",
      target: (cb) => equal(sym.mlxn_cmdbuf_replay(cb, t), Status.OK),
      from: t,
      rc: Status.E_STATE,
      re: /empty command buffer/,
    },
  ];
  for (const c of cases) {
    const cb = newCb(device);
    c.target(cb);
    const from = c.from === "self" ? cb : c.from;
    const rc = sym.mlxn_cmdbuf_replay(cb, from);
    const message = lastErrorText(sym);
    equal(rc, c.rc, `${c.what}: ${message}`);
    match(message, c.re, c.what);
    // The replay did not happen: the command buffer must never run without it.
    equal(sym.mlxn_cmdbuf_status(cb), CbStatus.ERROR, `${c.what}: the target failed`);
    notEqual(sym.mlxn_cmdbuf_commit(cb), Status.OK, `${c.what}: the target is never committed`);
    match(lastErrorText(sym), c.re, `${c.what}: the commit says why`);
    equal(sym.mlxn_cmdbuf_replay(cb, t), Status.E_STREAM, `${c.what}: nor replayed into again`);
    sym.mlxn_cmdbuf_free(cb);
  }

  // A target that is committed or failed already is refused without changing it.
  const done = newCb(device);
  encodeOk(sym, done, new Uint8Array(0));
  equal(sym.mlxn_cmdbuf_commit(done), Status.OK);
  equal(sym.mlxn_cmdbuf_wait(done), Status.OK);
  equal(sym.mlxn_cmdbuf_replay(done, t), Status.E_STATE);
  match(lastErrorText(sym), /already committed/);
  equal(sym.mlxn_cmdbuf_status(done), CbStatus.COMPLETED);
  sym.mlxn_cmdbuf_free(done);
  const broken = newCb(device);
  notEqual(sym.mlxn_cmdbuf_encode(broken, new Uint8Array(2), 2), Status.OK);
  equal(sym.mlxn_cmdbuf_replay(broken, t), Status.E_STREAM);
  match(lastErrorText(sym), /already failed: stream length 2/);
  sym.mlxn_cmdbuf_free(broken);
  equal(sym.mlxn_cmdbuf_replay(null, t), Status.E_INVALID_ARGUMENT);

  assertTemplateWorks(device, b, t, "after every refusal");
  for (const cb of [t, committed, failed, pending, tgPending]) sym.mlxn_cmdbuf_free(cb);
  other.sym.mlxn_cmdbuf_free(otherDevice);
  closing.sym.mlxn_cmdbuf_free(closedDevice); // each library frees (and counts) its own
});

/** rope_neox_f32 over one row of 8 dims: theta (slot 2) and the layout (slot 4) both matter. */
function ropeDispatch(
  w: Words,
  device: MlxDevice,
  io: { input: MlxBuffer; out: MlxBuffer; pos: MlxBuffer },
  i: number,
  theta: number,
  padHeads: number,
  padLayout: number,
  layoutFirst: boolean,
): void {
  const HD = 8;
  w.pipeline(device, "rope_neox_f32");
  w.buffer(0, io.input, 0, HD * 4).buffer(1, io.out, i * HD * 4, HD * 4).buffer(3, io.pos, 0, 4);
  const fill = (n: number, salt: number) => Array.from({ length: n }, (_, k) => (salt * 131 + k) >>> 0);
  const heads = () => w.bytes(2, f32(theta), HD, HD, ...fill(padHeads, i));
  const layout = () => w.bytes(4, 1, 0, HD, HD, 0, HD, 1, ...fill(padLayout, i + 1));
  // A stale value first (overwritten before the dispatch): its copy stays in the arena, unused.
  w.bytes(2, f32(1e30), 1, 1);
  if (layoutFirst) {
    layout();
    heads();
  } else {
    heads();
    layout();
  }
  w.threads([HD / 2, 1, 1], [HD / 2, 1, 1]);
}

// A CUDA launch takes at most 256 bytes of inline constants (it refuses more when it runs); the
// arena handling these two exercise is the core's, the same on every backend.
const largeConstants = Deno.env.get("MLXN_BACKEND") !== "cuda";

Deno.test({
  name: "replay: inline constants over many arena blocks, in either slot order, equal decoding the same stream",
  ignore: !largeConstants,
}, () => {
  using ctx = testContext();
  const { device } = ctx;
  const sym = device.sym;
  const D = 96, HD = 8;
  using input = device.upload(new Float32Array(HD).map((_, k) => 0.25 * k - 1));
  using pos = device.upload(new Uint32Array([5]));
  using decoded = device.alloc(D * HD * 4, DType.F32), replayed = device.alloc(D * HD * 4, DType.F32);
  const r = rng(0x7e3a);
  const plan = Array.from({ length: D }, () => ({
    theta: 100 + Math.floor(r() * 10000),
    padHeads: Math.floor(r() * 1020),
    padLayout: Math.floor(r() * 1017),
    layoutFirst: r() < 0.5,
  }));
  const stream = (out: MlxBuffer) => {
    const w = new Words();
    plan.forEach((p, i) =>
      ropeDispatch(w, device, { input, out, pos }, i, p.theta, p.padHeads, p.padLayout, p.layoutFirst)
    );
    return w.take();
  };
  const once = stream(decoded);
  ok(once.byteLength > 4 * 65536, `${once.byteLength} bytes of stream: the constants fill several arena blocks`);
  const reference = newCb(device);
  encodeOk(sym, reference, once);
  const stats = allStats(sym, reference);
  run(sym, reference);
  const want = Array.from(decoded.read() as Float32Array);
  ok(new Set(want).size > D, "every dispatch's constants show in its output");

  const t = newCb(device);
  encodeOk(sym, t, stream(replayed));
  for (let k = 0; k < 3; k++) {
    replayed.write(new Float32Array(D * HD));
    const cb = newCb(device);
    equal(sym.mlxn_cmdbuf_replay(cb, t), Status.OK, lastErrorText(sym));
    deepStrictEqual(allStats(sym, cb), stats, "the replay's barrier statistics are the decoder's");
    run(sym, cb);
    deepStrictEqual(Array.from(replayed.read() as Float32Array), want, `replay ${k}`);
  }
  sym.mlxn_cmdbuf_free(t);
});

Deno.test({
  name: "replay: 4 KiB constants per dispatch over 300 KiB replay exactly against a host reference",
  ignore: !largeConstants,
}, () => {
  using ctx = testContext();
  const { device } = ctx;
  const sym = device.sym;
  const D = 75;
  using b = axpbyBuffers(device, D);
  const coeff = (i: number) => [i * 0.75 - 20, 3 - i / 8];
  const w = new Words();
  for (let i = 0; i < D; i++) axpby(w, device, b, i, coeff(i)[0]!, coeff(i)[1]!, 1020); // 4096 bytes each
  const t = newCb(device);
  encodeOk(sym, t, w.take());
  const want = Array.from({ length: D }, (_, i) => b.want(coeff(i)[0]!, coeff(i)[1]!)).flat();
  for (let k = 0; k < 2; k++) {
    b.out.write(new Float32Array(D * N));
    const cb = newCb(device);
    equal(sym.mlxn_cmdbuf_replay(cb, t), Status.OK, lastErrorText(sym));
    run(sym, cb);
    deepStrictEqual(Array.from(b.out.read() as Float32Array), want, `replay ${k}`);
  }
  sym.mlxn_cmdbuf_free(t);
});

Deno.test("replay: one template in many command buffers in flight, freed while they run; nothing leaks", () => {
  using ctx = testContext();
  const { device } = ctx;
  const sym = device.sym;
  using x = device.upload(new Float32Array(N).fill(1));
  using acc = device.alloc(N * 4, DType.F32);
  acc.write(new Float32Array(N));
  const before = MlxDevice.liveObjects(device);
  // acc += 2·x, with 64 bytes of constants: each command buffer adds 2.
  const t = newCb(device);
  const w = new Words().pipeline(device, "axpby_f32").buffer(0, x, 0, N * 4).buffer(1, acc, 0, N * 4);
  encodeOk(
    sym,
    t,
    w.buffer(2, acc, 0, N * 4).bytes(3, f32(2), f32(1), N, 0, ...new Array(12).fill(0)).threads([N, 1, 1], [N, 1, 1])
      .take(),
  );
  const cbs = Array.from({ length: 48 }, () => newCb(device));
  for (const cb of cbs) equal(sym.mlxn_cmdbuf_replay(cb, t), Status.OK, lastErrorText(sym));
  for (const cb of cbs.slice(0, 24)) equal(sym.mlxn_cmdbuf_commit(cb), Status.OK);
  sym.mlxn_cmdbuf_free(t); // while half of its replays run and half wait: each holds its own copy
  for (const cb of cbs.slice(24)) equal(sym.mlxn_cmdbuf_commit(cb), Status.OK);
  equal(MlxDevice.liveObjects(device).commandBuffers, before.commandBuffers + 48);
  for (const cb of cbs) {
    equal(sym.mlxn_cmdbuf_wait(cb), Status.OK);
    sym.mlxn_cmdbuf_free(cb);
  }
  deepStrictEqual(Array.from(acc.read() as Float32Array), new Array(N).fill(96));
  deepStrictEqual(MlxDevice.liveObjects(device), before);
});

Deno.test("replay: a buffer freed after the template was encoded is refused, and its memory goes with the template", () => {
  using ctx = testContext();
  const { device } = ctx;
  const sym = device.sym;
  using b = axpbyBuffers(device, 2);
  const extra = device.alloc(1 << 20, DType.F32);
  const t = newCb(device);
  const w = new Words();
  axpby(w, device, b, 0, 1, 1);
  w.pipeline(device, "axpby_f32").buffer(0, b.x, 0, N * 4).buffer(1, b.y, 0, N * 4).buffer(2, extra, 0, N * 4);
  encodeOk(sym, t, w.bytes(3, f32(1), f32(1), N, 0).threads([N, 1, 1], [N, 1, 1]).take());
  const before = MlxDevice.liveObjects(device);
  extra.dispose();
  // The template's reference defers the free: the memory stays while the template does.
  deepStrictEqual(MlxDevice.liveObjects(device), before, "freed, but the template still references it");
  const cb = newCb(device);
  equal(sym.mlxn_cmdbuf_replay(cb, t), Status.E_BAD_HANDLE);
  match(lastErrorText(sym), /freed after the template was encoded/);
  equal(sym.mlxn_cmdbuf_status(cb), CbStatus.ERROR);
  notEqual(sym.mlxn_cmdbuf_commit(cb), Status.OK, "the refused command buffer never runs");
  sym.mlxn_cmdbuf_free(cb);
  deepStrictEqual(MlxDevice.liveObjects(device), before, "the refused replay took no reference");
  sym.mlxn_cmdbuf_free(t);
  const after = MlxDevice.liveObjects(device);
  equal(after.buffers, before.buffers - 1);
  equal(after.bufferBytes, before.bufferBytes - (1 << 20));
  equal(after.commandBuffers, before.commandBuffers - 1);
});

Deno.test("replay: a dispatch after it starts a new group, in statistics and in the order it runs", () => {
  using ctx = testContext();
  const { device } = ctx;
  const sym = device.sym;
  using b = axpbyBuffers(device, 2);
  const t = twoDispatchTemplate(device, b); // writes slices 0 and 1 in one group
  // Then slice 1 = 1·slice0 + 0·y, tracked or not: it must read what the template wrote.
  const follow = (w: Words) =>
    w.pipeline(device, "axpby_f32").buffer(0, b.out, 0, N * 4).buffer(1, b.y, 0, N * 4).buffer(2, b.out, N * 4, N * 4)
      .bytes(3, f32(1), f32(0), N, 0).threads([N, 1, 1], [N, 1, 1]);
  for (const tracked of [false, true]) {
    b.out.write(new Float32Array(2 * N));
    const cb = newCb(device);
    equal(sym.mlxn_cmdbuf_replay(cb, t), Status.OK, lastErrorText(sym));
    deepStrictEqual(allStats(sym, cb).slice(0, Stat.COUNT), [2, 1, 0, 0, 0, 2], "as the template left it");
    const w = new Words();
    if (tracked) w.rec(Op.AUTO_BARRIERS, 1);
    encodeOk(sym, cb, follow(w).take());
    const s = allStats(sym, cb);
    equal(s[Stat.DISPATCHES], 3);
    equal(s[Stat.GROUPS], 2, `tracked ${tracked}: the dispatch after the replay is in a group of its own`);
    equal(s[Stat.OPEN_GROUP], 1);
    equal(s[Stat.AUTO_BARRIERS], 0, "no automatic barrier was needed for it");
    run(sym, cb);
    deepStrictEqual(Array.from(b.out.read() as Float32Array), [...b.want(3, 1), ...b.want(3, 1)], `tracked ${tracked}`);
  }
  sym.mlxn_cmdbuf_free(t);
});

Deno.test("replay: a template whose device was closed is detached, refused, and freed afterwards", () => {
  const device = MlxDevice.open({ backend: "cpu" });
  const sym = device.sym;
  const before = MlxDevice.liveObjects(device);
  const b = axpbyBuffers(device, 2);
  const t = twoDispatchTemplate(device, b);
  device.close(); // the template still references its buffers: the close frees them anyway
  const after = MlxDevice.liveObjects(device);
  equal(after.buffers, before.buffers);
  equal(after.commandBuffers, before.commandBuffers, "a detached template no longer counts");
  equal(sym.mlxn_cmdbuf_status(t), CbStatus.ERROR);
  // A second device of the same library (under MLXN_BACKEND=cuda, testContext's is another library,
  // whose command buffers its own functions must create, count and free).
  using live = MlxDevice.open({ backend: "cpu" });
  const cb = newCb(live);
  equal(sym.mlxn_cmdbuf_replay(cb, t), Status.E_STATE);
  match(lastErrorText(sym), /template's device was closed/);
  sym.mlxn_cmdbuf_free(cb);
  sym.mlxn_cmdbuf_free(t);
});
