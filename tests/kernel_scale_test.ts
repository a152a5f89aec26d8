/**
 * scale_f32 (out = alpha · x), added through its description alone (kernels/spec/kernels.ts), one body
 * per backend and this test: the values against a host reference, in place, and the generated
 * validator refusing what every backend's body would get wrong.
 */
import { deepStrictEqual, match, ok, throws } from "node:assert/strict";
import { DType, type MlxBuffer, MlxError } from "../mod.ts";
import { packScaleParams, SCALE_PARAMS } from "../src/kernels.gen.ts";
import "../src/ops/mod.ts";
import { randomValues, testContext } from "./helpers.ts";

type Ctx = ReturnType<typeof testContext>;

/** Dispatches scale_f32 over `n` elements: one thread each, threadgroups of up to 64. */
function scale(ctx: Ctx, x: MlxBuffer, out: MlxBuffer, alpha: number, n: number, grid = n): void {
  const words = new Array<number>(SCALE_PARAMS.words).fill(0);
  packScaleParams(words, alpha, n);
  using enc = ctx.device.commandEncoder();
  enc.dispatch({
    pipeline: ctx.registry.get("scale_f32"),
    bindings: [x, out, words],
    grid,
    threadgroup: Math.min(64, grid),
    dispatchKind: "threads",
  });
  enc.commitAndWait();
}

const refused = (fn: () => void, why: RegExp) =>
  throws(fn, (e: unknown) => {
    ok(e instanceof MlxError, String(e));
    match(e.message, why);
    return true;
  });

Deno.test("scale_f32: out = alpha · x for each element, rounded to f32", () => {
  using ctx = testContext();
  for (const n of [1, 63, 64, 1000]) {
    const xs = randomValues(n, n);
    using x = ctx.device.upload(xs);
    using out = ctx.device.alloc(n * 4, DType.F32);
    const alpha = -1.75;
    scale(ctx, x, out, alpha, n);
    deepStrictEqual(out.read(), xs.map((v) => Math.fround(alpha * v)));
  }
});

Deno.test("scale_f32: only the first n elements are written; in place works", () => {
  using ctx = testContext();
  const xs = randomValues(100, 7);
  using x = ctx.device.upload(xs);
  using out = ctx.device.upload(new Float32Array(100).fill(9));
  scale(ctx, x, out, 3, 40, 64); // more threads than elements: the extra ones write nothing
  const got = out.read() as Float32Array;
  deepStrictEqual(got.slice(0, 40), xs.slice(0, 40).map((v) => Math.fround(3 * v)));
  deepStrictEqual(got.slice(40), new Float32Array(60).fill(9));
  scale(ctx, x, x, 0.5, 100);
  deepStrictEqual(x.read(), xs.map((v) => Math.fround(0.5 * v)));
});

Deno.test("scale_f32: the generated validator refuses short buffers, a short grid and shifted overlap", () => {
  using ctx = testContext();
  using x = ctx.device.upload(new Float32Array(64));
  using out = ctx.device.alloc(32 * 4, DType.F32);
  refused(() => scale(ctx, x, out, 1, 64), /slot 1: bound slice has 128 bytes, kernel needs 256/);
  refused(() => scale(ctx, x, x, 1, 64, 32), /grid dimension 0 has 32 threads but needs 64/);
  const shifted = x.slice(4, 63 * 4);
  refused(() => scale(ctx, x.slice(0, 63 * 4), shifted, 1, 63), /slot 1 \(output\) partly overlaps slot 0 \(input\)/);
});
