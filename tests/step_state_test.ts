/**
 * The step state: rope, strided_copy and flash_attn_vec reading the token position from a u32
 * device buffer (whole caches bound once), step_advance_u32 advancing it on the device, and the
 * refusals and device faults that keep every access inside the bound slices whatever the state holds.
 */
import { deepStrictEqual, equal, match, ok, throws } from "node:assert/strict";
import { DType, type MlxBuffer, MlxError, ops } from "../mod.ts";
import { f32Bits } from "../src/ops/common.ts";
import { stepAdvance } from "../src/ops/sample.ts";
import { assertClose, randomValues, testContext } from "./helpers.ts";
import { neoxAngle, refAttentionDecode, refRopeNeox } from "./reference.ts";

type Ctx = ReturnType<typeof testContext>;

/** Normal-mode rope (adjacent pairs (2i, 2i + 1), i < ropeDim/2; dims ≥ ropeDim copied), in f64. */
function refRopeNorm(
  x: ArrayLike<number>,
  positions: ArrayLike<number>,
  o: { theta: number; headDim: number; ropeDim: number; nHeads: number; seqLen: number },
): Float64Array {
  const out = Float64Array.from(x);
  for (let r = 0; r < o.seqLen * o.nHeads; r++) {
    const base = r * o.headDim, p = positions[Math.floor(r / o.nHeads)]!;
    for (let i = 0; i < o.ropeDim / 2; i++) {
      const a = neoxAngle(p, i, o.theta, o.ropeDim), x0 = x[base + 2 * i]!, x1 = x[base + 2 * i + 1]!;
      out[base + 2 * i] = x0 * Math.cos(a) - x1 * Math.sin(a);
      out[base + 2 * i + 1] = x0 * Math.sin(a) + x1 * Math.cos(a);
    }
  }
  return out;
}

const refused = (fn: () => void, why: RegExp) =>
  throws(fn, (e: unknown) => {
    ok(e instanceof MlxError, String(e));
    match(e.message, why);
    return true;
  });

/** Encodes with `fn` and waits; returns the error a failed command buffer throws, if any. */
function run(ctx: Ctx, fn: (enc: ReturnType<Ctx["device"]["commandEncoder"]>) => void): unknown {
  using enc = ctx.device.commandEncoder();
  fn(enc);
  try {
    enc.commitAndWait();
  } catch (e) {
    return e;
  }
  return undefined;
}

const state = (ctx: Ctx, pos: number) => ctx.device.upload(Uint32Array.from([pos, pos + 1, 0, 0]), DType.U32);
const nans = (ctx: Ctx, n: number) => ctx.device.upload(new Float32Array(n).fill(NaN));
const tol = (want: ArrayLike<number>) => (i: number) => 1e-5 * Math.max(1, Math.abs(want[i]!));

// A KV cache laid out [heads, capacity, headDim], as the decode demo and src/model keep it.
const H = 2, CAP = 8, HD = 16;

for (const mode of ["neox", "norm"] as const) {
  Deno.test(`rope_${mode}_f32 with a state: position state[0], K written at its row of the whole cache`, () => {
    using ctx = testContext();
    const rope = mode === "neox" ? ops.ropeNeox : ops.ropeNorm;
    const ref = mode === "neox" ? refRopeNeox : refRopeNorm;
    const o = { theta: 10000, headDim: HD, ropeDim: 12, nHeads: H, seqLen: 1 };
    for (const pos of [0, 5, CAP - 1]) {
      const xv = randomValues(H * HD, 10 + pos);
      using x = ctx.device.upload(xv);
      using cache = nans(ctx, H * CAP * HD);
      using st = state(ctx, pos);
      equal(
        run(ctx, (enc) =>
          rope(enc, ctx.registry, x, cache, undefined, {
            ...o,
            outHeadStride: CAP * HD,
            outTokenStride: HD,
            state: st,
            outPosStride: HD,
            maxPositions: CAP,
          })),
        undefined,
      );
      const want = ref(xv, [pos], o);
      const got = cache.read() as Float32Array;
      for (let h = 0; h < H; h++) {
        const row = got.slice((h * CAP + pos) * HD, (h * CAP + pos + 1) * HD);
        assertClose(row, want.slice(h * HD, (h + 1) * HD), tol(want.slice(h * HD)), `rope ${mode} pos ${pos}`);
      }
      // Every other row is untouched.
      const others = got.filter((_, i) => Math.floor(i / HD) % CAP !== pos);
      ok(others.every(Number.isNaN), `rope ${mode} wrote outside position ${pos}'s rows`);
    }
  });
}

Deno.test("rope with a state and several tokens: token t at state[0] + t", () => {
  using ctx = testContext();
  const o = { theta: 500, headDim: HD, ropeDim: HD, nHeads: H, seqLen: 3 };
  const xv = randomValues(3 * H * HD, 3);
  using x = ctx.device.upload(xv);
  using out = nans(ctx, 3 * H * HD);
  using st = state(ctx, 4);
  equal(
    run(ctx, (enc) => ops.ropeNeox(enc, ctx.registry, x, out, undefined, { ...o, state: st, maxPositions: 8 })),
    undefined,
  );
  const want = refRopeNeox(xv, [4, 5, 6], o);
  assertClose(out.read() as Float32Array, want, tol(want), "rope seq 3");
});

Deno.test("strided_copy_f32 with a state: V written at state[0]'s rows of the whole cache", () => {
  using ctx = testContext();
  for (const pos of [0, 3, CAP - 1]) {
    const vv = randomValues(H * HD, 20 + pos);
    using v = ctx.device.upload(vv);
    using cache = nans(ctx, H * CAP * HD);
    using st = state(ctx, pos);
    equal(
      run(ctx, (enc) =>
        ops.stridedCopy(enc, ctx.registry, v, cache, {
          rows: H,
          cols: HD,
          dstStride: CAP * HD,
          state: st,
          dstPosStride: HD,
          maxPositions: CAP,
        })),
      undefined,
    );
    const want = new Float32Array(H * CAP * HD).fill(NaN);
    for (let h = 0; h < H; h++) want.set(vv.slice(h * HD, (h + 1) * HD), (h * CAP + pos) * HD);
    deepStrictEqual(cache.read(), want);
  }
});

Deno.test("flash_attn_vec with a state: keys 0 … state[0], kvSeqLen the static bound", () => {
  using ctx = testContext();
  const o = { nHeads: 4, nKvHeads: 2, headDim: 64 as const, kvCapacity: 12, scale: 0.125, nwg: 4 };
  const qv = randomValues(o.nHeads * 64, 1), kv = randomValues(2 * 12 * 64, 2), vv = randomValues(2 * 12 * 64, 3);
  using q = ctx.device.upload(qv), k = ctx.device.upload(kv), v = ctx.device.upload(vv);
  using tmp = ctx.device.alloc(ops.flashAttnVecScratchBytes(o), DType.F32);
  for (const pos of [0, 6, 11]) {
    using out = nans(ctx, o.nHeads * 64);
    using st = state(ctx, pos);
    equal(
      run(ctx, (enc) => ops.flashAttnVec(enc, ctx.registry, q, k, v, tmp, out, { ...o, kvSeqLen: 12, state: st })),
      undefined,
    );
    const want = refAttentionDecode(qv, kv, vv, { ...o, kvSeqLen: pos + 1, mask: "causal" });
    assertClose(out.read() as Float32Array, want, (i) => 1e-5 * Math.max(1, Math.abs(want[i]!)), `pos ${pos}`);
  }
});

Deno.test("a state position past the static bound fails the dispatch and writes nothing", () => {
  using ctx = testContext();
  using x = ctx.device.upload(randomValues(H * HD, 9));
  using cache = nans(ctx, H * CAP * HD);
  for (const pos of [CAP, CAP + 1, 0xffffffff]) {
    using st = ctx.device.upload(Uint32Array.from([pos, 0, 0, 0]), DType.U32);
    const opts = { outHeadStride: CAP * HD, outTokenStride: HD, state: st, outPosStride: HD, maxPositions: CAP };
    const e1 = run(ctx, (enc) =>
      ops.ropeNeox(enc, ctx.registry, x, cache, undefined, {
        theta: 10000,
        headDim: HD,
        ropeDim: HD,
        nHeads: H,
        seqLen: 1,
        ...opts,
      }));
    ok(e1 instanceof MlxError && e1.code === "CommandBufferError", `rope at ${pos}: ${e1}`);
    const e2 = run(ctx, (enc) =>
      ops.stridedCopy(enc, ctx.registry, x, cache, {
        rows: H,
        cols: HD,
        dstStride: CAP * HD,
        state: st,
        dstPosStride: HD,
        maxPositions: CAP,
      }));
    ok(e2 instanceof MlxError && e2.code === "CommandBufferError", `copy at ${pos}: ${e2}`);
    ok((cache.read() as Float32Array).every(Number.isNaN), `something was written at position ${pos}`);
  }
  const o = { nHeads: 2, nKvHeads: 2, headDim: 64 as const, kvCapacity: 4, nwg: 2 };
  using q = ctx.device.upload(randomValues(2 * 64, 1)), k = ctx.device.upload(randomValues(2 * 4 * 64, 2));
  using tmp = nans(ctx, ops.flashAttnVecScratchBytes(o) / 4), out = nans(ctx, 2 * 64);
  using st = ctx.device.upload(Uint32Array.from([3, 0, 0, 0]), DType.U32);
  // kvSeqLen 3 bounds the keys below the capacity: position 3 (4 keys) is past it.
  const e = run(ctx, (enc) => ops.flashAttnVec(enc, ctx.registry, q, k, k, tmp, out, { ...o, kvSeqLen: 3, state: st }));
  ok(e instanceof MlxError && e.code === "CommandBufferError", `flash: ${e}`);
  ok((tmp.read() as Float32Array).every(Number.isNaN), "flash wrote its partials");
});

Deno.test("step_advance_u32 adds to the leading words on the device", () => {
  using ctx = testContext();
  using st = ctx.device.upload(Uint32Array.from([7, 8, 100, 200]), DType.U32);
  equal(run(ctx, (enc) => stepAdvance(enc, ctx.registry, st)), undefined);
  deepStrictEqual(st.read(), Uint32Array.from([8, 9, 100, 200]));
  equal(run(ctx, (enc) => stepAdvance(enc, ctx.registry, st, { words: 3, add: 0xffffffff })), undefined);
  deepStrictEqual(st.read(), Uint32Array.from([7, 8, 99, 200])); // mod 2³²
  refused(() => stepAdvance(ctx.device.commandEncoder(), ctx.registry, st, { words: 5 }), /state/);
  refused(() => stepAdvance(ctx.device.commandEncoder(), ctx.registry, st, { words: 0 }), /words/);
});

/** A raw dispatch of `kernel` with `bindings` (past the ops' checks: the native validator decides). */
function raw(ctx: Ctx, kernel: string, bindings: (MlxBuffer | number[] | undefined)[], grid: number[], tg: number[]) {
  using enc = ctx.device.commandEncoder();
  enc.dispatch({ pipeline: ctx.registry.get(kernel), bindings, grid, threadgroup: tg, dispatchKind: "threads" });
  enc.commitAndWait();
}

Deno.test("native validators bound the worst state statically and refuse a state they cannot trust", () => {
  using ctx = testContext();
  using x = ctx.device.upload(randomValues(H * HD, 9));
  using cache = ctx.device.alloc(H * CAP * HD * 4, DType.F32);
  using st = state(ctx, 0);
  using pos = ctx.device.upload(Uint32Array.from([0]), DType.U32);
  const ropeParams = [f32Bits(10000), HD, HD];
  const layout = (hasState: number, maxPos: number) => [H, 0, CAP * HD, HD, hasState, HD, maxPos];
  // Accepted: the whole cache holds position CAP − 1's rows.
  raw(ctx, "rope_neox_f32", [x, cache, ropeParams, undefined, layout(1, CAP), undefined, st], [HD / 2, H, 1], [
    8,
    1,
    1,
  ]);
  // max_pos one past the cache: the worst row would fall outside the bound slice.
  refused(
    () =>
      raw(ctx, "rope_neox_f32", [x, cache, ropeParams, undefined, layout(1, CAP + 1), undefined, st], [8, H, 1], [
        8,
        1,
        1,
      ]),
    /slot 1/,
  );
  refused(
    () =>
      raw(ctx, "rope_neox_f32", [x, cache, ropeParams, pos, layout(1, CAP), undefined, undefined], [8, H, 1], [
        8,
        1,
        1,
      ]),
    /state slot is not bound/,
  );
  refused(
    () => raw(ctx, "rope_neox_f32", [x, cache, ropeParams, pos, layout(0, 0), undefined, st], [8, H, 1], [8, 1, 1]),
    /has_state is 0/,
  );
  refused(
    () =>
      raw(ctx, "rope_neox_f32", [x, cache, ropeParams, undefined, layout(1, 0), undefined, st], [8, H, 1], [8, 1, 1]),
    /max_pos/,
  );
  // The state inside the output: threads would race on the position they read.
  const inCache = cache.slice(0, 16, { dtype: DType.U32 });
  refused(
    () =>
      raw(ctx, "rope_neox_f32", [x, cache, ropeParams, undefined, layout(1, CAP), undefined, inCache], [8, H, 1], [
        8,
        1,
        1,
      ]),
    /overlaps/,
  );
  // strided_copy: the same rules.
  const copy = (hasState: number, maxPos: number) => [H, HD, HD, CAP * HD, hasState, HD, maxPos];
  raw(ctx, "strided_copy_f32", [x, cache, copy(1, CAP), st], [HD, H, 1], [HD, 1, 1]);
  refused(() => raw(ctx, "strided_copy_f32", [x, cache, copy(1, CAP + 1), st], [HD, H, 1], [HD, 1, 1]), /slot 1/);
  refused(() => raw(ctx, "strided_copy_f32", [x, cache, copy(1, CAP), undefined], [HD, H, 1], [HD, 1, 1]), /not bound/);
  refused(() => raw(ctx, "strided_copy_f32", [x, cache, copy(2, CAP), st], [HD, H, 1], [HD, 1, 1]), /has_state/);
  // step_advance: the words it advances must be bound.
  refused(() => raw(ctx, "step_advance_u32", [pos, [2, 1]], [1, 1, 1], [1, 1, 1]), /slot 0/);
  refused(() => raw(ctx, "step_advance_u32", [st, [65, 1]], [1, 1, 1], [1, 1, 1]), /count/);
});

Deno.test("ops refuse state options that do not fit", () => {
  using ctx = testContext();
  using x = ctx.device.upload(randomValues(H * HD, 9));
  using cache = ctx.device.alloc(H * CAP * HD * 4, DType.F32);
  using st = state(ctx, 0);
  using enc = ctx.device.commandEncoder();
  const o = {
    theta: 10000,
    headDim: HD,
    ropeDim: HD,
    nHeads: H,
    seqLen: 1,
    outHeadStride: CAP * HD,
    outTokenStride: HD,
  };
  refused(() => ops.ropeNeox(enc, ctx.registry, x, cache, undefined, o), /positions/);
  refused(
    () =>
      ops.ropeNeox(enc, ctx.registry, x, cache, undefined, {
        ...o,
        state: st,
        outPosStride: HD,
        maxPositions: CAP + 1,
      }),
    /output/,
  );
  refused(
    () => ops.ropeNeox(enc, ctx.registry, x, cache, undefined, { ...o, state: st, outPosStride: HD }),
    /maxPositions/,
  );
  refused(
    () => ops.stridedCopy(enc, ctx.registry, x, cache, { rows: H, cols: HD, dstPosStride: HD, maxPositions: 2 }),
    /need a step state/,
  );
  equal(enc.dispatchCount, 0);
});
