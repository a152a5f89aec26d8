/**
 * Review of the frozen pass, the frozen DecodeLoop and dual-buffer plan-cache replays: hostile
 * inputs and lifecycle edges, each checked against a pass optimised afresh (plan cache off) or
 * against host references.
 */
import { deepStrictEqual, equal, notDeepStrictEqual, ok, rejects, throws } from "node:assert/strict";
import {
  DecodeLoop,
  type DecodeLoopOptions,
  DType,
  type FinishOptions,
  type FinishReport,
  GraphExecutor,
  type GraphSession,
  type MlxBuffer,
  MlxDevice,
  MlxError,
  ops,
} from "../mod.ts";
import { randomValues, rng, testContext } from "./helpers.ts";
import { refArgmax } from "./reference.ts";

const E = 64;
const strip = (r: FinishReport) => ({
  mode: r.mode,
  fusions: r.fusions,
  reordered: r.reordered,
  barriers: r.barriers,
  dispatches: r.dispatches,
  groups: r.groups,
});
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
