/**
 * Hostile review of `mlxn_cmdbuf_replay_like`: a replay of a template by a like stream must run what
 * decoding the same stream runs (the same barriers where they matter, the same values), or decode.
 */
import { deepStrictEqual, equal, ok } from "node:assert/strict";
import { counters, DType, GraphExecutor, type MlxBuffer, type MlxDevice } from "../mod.ts";
import { Op, Stat, Status, UNLIKE } from "../src/native/abi.ts";
import { lastErrorText } from "../src/native/status.ts";
import { rng, testContext } from "./helpers.ts";
import { rawCommandBuffer, RawWords } from "./raw_stream.ts";

const E = 16;
const f32 = (v: number) => new Uint32Array(new Float32Array([v]).buffer)[0]!;

/** out[outAt .. outAt + E) = alpha · x[xAt ..] + beta · y (E elements). */
function axpby(
  w: RawWords,
  device: MlxDevice,
  x: MlxBuffer,
  y: MlxBuffer,
  out: MlxBuffer,
  o: { alpha: number; outAt: number; xAt?: number },
): RawWords {
  w.pipeline(device, "axpby_f32").buffer(0, x, (o.xAt ?? 0) * 4, E * 4).buffer(1, y, 0, E * 4);
  w.buffer(2, out, o.outAt * 4, E * 4);
  w.bytes(3, f32(o.alpha), f32(0), E, 0);
  return w.rec(Op.DISPATCH_THREADS, 0, E, 1, 1, E, 1, 1, 0);
}

function template(device: MlxDevice, stream: Uint8Array): Deno.PointerObject {
  const sym = device.sym, t = sym.mlxn_cmdbuf_new(device.devicePtr())!;
  equal(sym.mlxn_cmdbuf_encode_template(t, stream, stream.byteLength), Status.OK, lastErrorText(sym));
  return t;
}

function like(device: MlxDevice, t: Deno.PointerObject, stream: Uint8Array) {
  const cb = rawCommandBuffer(device), sym = device.sym;
  const rc = sym.mlxn_cmdbuf_replay_like(cb.ptr, t, stream, stream.byteLength);
  return { rc, message: rc < 0 ? lastErrorText(sym) : "", cb };
}

Deno.test("review replay_like: a serial device's moved write range gets the automatic barrier decoding places", () => {
  // On a serial device every dispatch is its own concurrent group, but the tracker's groups (and
  // its barrier counts) span dispatches: a moved range must be judged against those.
  using ctx = testContext({ concurrency: false });
  const { device } = ctx;
  const x = device.upload(new Float32Array(E).map((_, j) => j + 1));
  const y = device.upload(new Float32Array(E));
  const out = device.alloc(4 * E * 4, DType.F32);
  try {
    const pass = (secondAt: number) => {
      const w = new RawWords().rec(Op.AUTO_BARRIERS, 1);
      axpby(w, device, x, y, out, { alpha: 1, outAt: 0 });
      return axpby(w, device, x, y, out, { alpha: 2, outAt: secondAt }).take();
    };
    const t = template(device, pass(E));
    try {
      for (const at of [0, E / 2, 2 * E]) {
        const s = pass(at);
        const r = like(device, t, s);
        const decoded = rawCommandBuffer(device);
        equal(decoded.encode(s).rc, Status.OK);
        if (r.rc === Status.OK) {
          deepStrictEqual(
            Array.from(r.cb.stats().slice(0, Stat.OPEN_GROUP)),
            Array.from(decoded.stats().slice(0, Stat.OPEN_GROUP)),
            `second write at ${at}: the replay's barriers are decoding's`,
          );
        } else {
          equal(r.rc, UNLIKE, r.message);
        }
        r.cb.free();
        decoded.free();
      }
    } finally {
      device.sym.mlxn_cmdbuf_free(t);
    }
  } finally {
    [x, y, out].forEach((b) => b.dispose());
  }
});

Deno.test("review replay_like: random moves of read and write views under automatic barriers run as decoding does", () => {
  // Four axpby dispatches reading views of `src` and writing views of `src` and `dst` (reads after
  // writes, writes over reads, in-place): each mutation moves views and constants at random; a
  // replay must give decoding's values (its groups may differ from decoding's, never its results).
  for (const concurrency of [true, false]) {
    using ctx = testContext({ concurrency });
    const { device } = ctx;
    const src = device.upload(new Float32Array(8 * E).map((_, j) => (j % 7) + 1));
    const y = device.upload(new Float32Array(E).fill(3));
    const dst = device.alloc(8 * E * 4, DType.F32);
    const next = rng(concurrency ? 11 : 12);
    const pick = () => Math.floor(next() * 7) * E / 2;
    type Step = { xAt: number; outAt: number; toSrc: boolean; alpha: number };
    const pass = (steps: Step[]) => {
      const w = new RawWords().rec(Op.AUTO_BARRIERS, 1);
      for (const s of steps) axpby(w, device, src, y, s.toSrc ? src : dst, s);
      return w.take();
    };
    const run = (fill: (cb: ReturnType<typeof rawCommandBuffer>) => number) => {
      src.write(new Float32Array(8 * E).map((_, j) => (j % 7) + 1));
      dst.write(new Float32Array(8 * E));
      const cb = rawCommandBuffer(device);
      const rc = fill(cb);
      if (rc !== Status.OK) {
        cb.free();
        return null;
      }
      cb.run();
      return { values: [...(src.read() as Float32Array), ...(dst.read() as Float32Array)] };
    };
    try {
      const base: Step[] = [0, 1, 2, 3].map((i) => ({ xAt: 0, outAt: 2 * E * (i % 2), toSrc: i >= 2, alpha: i + 1 }));
      for (const b of base) if (b.toSrc) b.outAt += 4 * E;
      const t = template(device, pass(base));
      let replays = 0;
      try {
        for (let m = 0; m < 60; m++) {
          const steps = base.map((b) => ({
            ...b,
            xAt: next() < 0.5 ? pick() : b.xAt,
            outAt: next() < 0.5 ? pick() : b.outAt,
            alpha: next() < 0.5 ? Math.floor(next() * 5) : b.alpha,
          }));
          const s = pass(steps);
          const decoded = run((cb) => cb.encode(s).rc)!;
          ok(decoded !== null);
          let rc = -99;
          const replayed = run((cb) => (rc = device.sym.mlxn_cmdbuf_replay_like(cb.ptr, t, s, s.byteLength)));
          if (rc === UNLIKE) continue;
          equal(rc, Status.OK, lastErrorText(device.sym));
          replays++;
          deepStrictEqual(replayed!.values, decoded.values, `mutation ${m}: ${JSON.stringify(steps)}`);
        }
      } finally {
        device.sym.mlxn_cmdbuf_free(t);
      }
      if (concurrency) ok(replays > 0, "some mutations replay");
    } finally {
      [src, y, dst].forEach((b) => b.dispose());
    }
  }
});

Deno.test("review replay_like: hostile views, dead records and wide changes agree with decoding", () => {
  using ctx = testContext();
  const { device } = ctx;
  const sym = device.sym;
  const x = device.upload(new Float32Array(E).map((_, j) => j + 1));
  const y = device.upload(new Float32Array(E).fill(10));
  const N = 200;
  const out = device.alloc(N * E * 4, DType.F32);
  // What a stream does when decoded and when replayed like template t: a replay either declines
  // (UNLIKE), or is refused as decoding refuses it (same status), or runs decoding's values.
  const agree = (t: Deno.PointerObject, s: Uint8Array, what: string): number => {
    const results = [false, true].map((replay) => {
      out.write(new Float32Array(N * E));
      const cb = rawCommandBuffer(device);
      const rc = replay ? sym.mlxn_cmdbuf_replay_like(cb.ptr, t, s, s.byteLength) : cb.encode(s).rc;
      if (rc !== Status.OK) {
        cb.free();
        return { rc, values: [] as number[] };
      }
      cb.run();
      return { rc, values: Array.from(out.read() as Float32Array) };
    });
    const [decoded, replayed] = results as [{ rc: number; values: number[] }, { rc: number; values: number[] }];
    if (replayed.rc !== UNLIKE) deepStrictEqual(replayed, decoded, what);
    return replayed.rc;
  };
  const view64 = (w: RawWords, off: bigint, len: bigint) =>
    w.rec(
      Op.SET_BUFFER64,
      2,
      out.handle,
      Number(off & 0xffffffffn),
      Number(off >> 32n),
      Number(len & 0xffffffffn),
      Number(len >> 32n),
    );
  const one = (head: (w: RawWords) => void, tail: (w: RawWords) => void) => {
    const w = new RawWords().pipeline(device, "axpby_f32").buffer(0, x, 0, E * 4).buffer(1, y, 0, E * 4);
    head(w);
    tail(w);
    w.bytes(3, f32(2), f32(1), E, 0);
    return w.rec(Op.DISPATCH_THREADS, 0, E, 1, 1, E, 1, 1, 0).take();
  };
  try {
    // SET_BUFFER64: above 4 GiB, offset + length past 2^64, a zero length, a valid move.
    const t64 = template(device, one((w) => view64(w, 0n, BigInt(E * 4)), () => {}));
    try {
      const cases: [bigint, bigint][] = [
        [1n << 32n, BigInt(E * 4)],
        [BigInt(E * 4), (1n << 64n) - 4n],
        [0n, 0n],
        [
          BigInt(E * 4),
          BigInt(E * 4),
        ],
        [BigInt(N * E * 4), 0n],
        [BigInt(N * E * 4 - 4), 8n],
      ];
      for (const [o, l] of cases) agree(t64, one((w) => view64(w, o, l), () => {}), `SET_BUFFER64 ${o} + ${l}`);
      equal(agree(t64, one((w) => view64(w, BigInt(E * 4), BigInt(E * 4)), () => {}), "moved"), Status.OK);
    } finally {
      sym.mlxn_cmdbuf_free(t64);
    }
    // Records a later binding of the slot replaces: their words reach no dispatch.
    const heads: [string, (w: RawWords, v: number) => void, (w: RawWords) => void][] = [
      ["bytes then buffer", (w, v) => w.bytes(2, v, v), (w) => w.buffer(2, out, 0, E * 4)],
      ["buffer then whole", (w, v) => w.buffer(2, out, v * 4, E * 4), (w) => w.rec(Op.SET_BUFFER_WHOLE, 2, out.handle)],
      ["buffer twice", (w, v) => w.buffer(2, out, v * 4, E * 4), (w) => w.buffer(2, out, 0, E * 4)],
    ];
    for (const [what, dead, live] of heads) {
      const t = template(device, one((w) => dead(w, 0), live));
      try {
        equal(agree(t, one((w) => dead(w, E), live), what), UNLIKE, `${what}: a dead record's change decodes`);
      } finally {
        sym.mlxn_cmdbuf_free(t);
      }
    }
    // Many dispatches, each view and constant moved (more changed records than the replay's first
    // table holds), then one more than the limit.
    const many = (shift: number, count: number) => {
      const w = new RawWords();
      for (let k = 0; k < N; k++) {
        // The moved dispatches rotate among themselves: no two write one slice (with no barrier
        // between them, which one lands last would be up to the backend).
        const at = k < count ? (k + shift) % count : k;
        w.pipeline(device, "axpby_f32").buffer(0, x, 0, E * 4).buffer(1, y, 0, E * 4).buffer(2, out, at * E * 4, E * 4);
        w.bytes(3, f32(k < count ? shift + 1 : 1), f32(0), E, 0).rec(Op.DISPATCH_THREADS, 0, E, 1, 1, E, 1, 1, 0);
      }
      return w.take();
    };
    const tm = template(device, many(0, 0));
    try {
      equal(agree(tm, many(0, N), "unchanged"), Status.OK);
      // A dispatch changes both its view and its constants: two records.
      equal(agree(tm, many(1, 25), "50 records"), Status.OK);
      agree(tm, many(1, 49), "98 records");
      equal(agree(tm, many(1, 60), "120 records"), UNLIKE, "past n/2 changed records: decoded");
    } finally {
      sym.mlxn_cmdbuf_free(tm);
    }
  } finally {
    [x, y, out].forEach((b) => b.dispose());
  }
});

Deno.test("review replay_like: wide groups, switched automatic barriers, other and closed devices", () => {
  using ctx = testContext();
  const { device } = ctx;
  const sym = device.sym;
  const x = device.upload(new Float32Array(E).map((_, j) => j + 1));
  const y = device.upload(new Float32Array(E));
  const N = 80;
  const out = device.alloc(N * E * 4, DType.F32);
  try {
    // One concurrent group of `width` writes into disjoint slices; the last one moved to `lastAt`.
    const wide = (width: number, lastAt: number, prefix: (w: RawWords) => void = (w) => w.rec(Op.AUTO_BARRIERS, 1)) => {
      const w = new RawWords();
      prefix(w);
      for (let k = 0; k < width; k++) {
        axpby(w, device, x, y, out, { alpha: k + 1, outAt: (k === width - 1 ? lastAt : k) * E });
      }
      return w.take();
    };
    for (const width of [64, 65, 70]) {
      const t = template(device, wide(width, width - 1));
      try {
        const decoded = rawCommandBuffer(device);
        equal(decoded.encode(wide(width, N - 1)).rc, Status.OK);
        const groups = decoded.stats()[Stat.GROUPS];
        decoded.free();
        const r = like(device, t, wide(width, N - 1));
        if (width > 64) equal(r.rc, UNLIKE, `a group of ${width}: decoded`);
        else {
          equal(r.rc, Status.OK, r.message);
          equal(r.cb.stats()[Stat.GROUPS], groups);
        }
        r.cb.free();
        const overlap = like(device, t, wide(width, 0));
        equal(overlap.rc, UNLIKE, `a group of ${width}: the moved write meets the first one`);
        overlap.cb.free();
      } finally {
        sym.mlxn_cmdbuf_free(t);
      }
    }
    // Automatic barriers switched off after the first dispatch: its ranges stay as they are.
    const switched = (at: number) => {
      const w = new RawWords().rec(Op.AUTO_BARRIERS, 1);
      axpby(w, device, x, y, out, { alpha: 1, outAt: 0 });
      w.rec(Op.AUTO_BARRIERS, 0);
      return axpby(w, device, x, y, out, { alpha: 2, outAt: at }).take();
    };
    const ts = template(device, switched(E));
    try {
      for (const at of [0, 2 * E]) {
        const r = like(device, ts, switched(at));
        equal(r.rc, UNLIKE, `switched, second write at ${at}`);
        r.cb.free();
      }
      // A command buffer of another device, and one whose template's device closed.
      const other = testContext();
      const cb = rawCommandBuffer(other.device);
      const s = switched(E);
      equal(other.device.sym.mlxn_cmdbuf_replay_like(cb.ptr, ts, s, s.byteLength), Status.E_INVALID_ARGUMENT);
      cb.free();
      const x2 = other.device.upload(new Float32Array(E)), out2 = other.device.alloc(E * 4, DType.F32);
      const t2 = template(
        other.device,
        axpby(new RawWords(), other.device, x2, x2, out2, { alpha: 1, outAt: 0 }).take(),
      );
      const s2 = axpby(new RawWords(), other.device, x2, x2, out2, { alpha: 1, outAt: 0 }).take();
      other.device.close();
      const mine = rawCommandBuffer(device);
      equal(sym.mlxn_cmdbuf_replay_like(mine.ptr, t2, s2, s2.byteLength), Status.E_STATE, lastErrorText(sym));
      mine.free();
      sym.mlxn_cmdbuf_free(t2);
    } finally {
      sym.mlxn_cmdbuf_free(ts);
    }
  } finally {
    [x, y, out].forEach((b) => b.dispose());
  }
});

Deno.test("review replay_like: sessions begun with reuse across a freed buffer and its recycled handle", () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device);
  const a = device.upload(new Float32Array(E).map((_, j) => j));
  const b = device.upload(new Float32Array(E).fill(1));
  let out = device.alloc(E * 4, DType.F32);
  try {
    const pass = (target: MlxBuffer, scale: number) => {
      const s = exec.begin({ reuse: true });
      s.elementwiseAdd(a, b, target);
      s.axpby(target, a, target, { alpha: scale, beta: 0 });
      s.finish();
      return Array.from(target.read() as Float32Array);
    };
    const want = (scale: number) => Array.from({ length: E }, (_, j) => scale * (j + 1));
    counters.reset();
    for (let i = 0; i < 3; i++) deepStrictEqual(pass(out, i + 1), want(i + 1));
    ok(counters.snapshot().passReplays > 0, "the loop replays");
    // The template binds `out`: freed, and a new buffer (its table slot recycled) takes its place.
    out.dispose();
    out = device.alloc(E * 4, DType.F32);
    for (let i = 0; i < 3; i++) deepStrictEqual(pass(out, i + 5), want(i + 5), `after the free, pass ${i}`);
  } finally {
    [a, b, out].forEach((x) => x.dispose());
  }
});
