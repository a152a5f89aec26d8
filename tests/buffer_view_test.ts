/** MlxBuffer views: shapes, freezing and errors of slices, and views that allocate no shape of their own. */
import { deepStrictEqual, equal, notStrictEqual, ok, strictEqual, throws } from "node:assert/strict";
import { DType, MlxError } from "../mod.ts";
import { isDType } from "../src/dtype.ts";
import { testContext } from "./helpers.ts";

const isCode = (code: string, text: RegExp) => (e: unknown) =>
  e instanceof MlxError && e.code === code && text.test(e.message);

Deno.test("a view's shape is its element count, frozen, for every length and dtype", () => {
  using ctx = testContext();
  using buf = ctx.device.alloc(1 << 20, DType.U8);
  // Element counts that share a slot of any small power-of-two table, and their neighbours.
  const counts = [1, 2, 3, 255, 256, 257, 511, 512, 513, 1024, 1536, 4096, 65536, 65537, 131072, 262144];
  for (let round = 0; round < 2; round++) {
    for (const n of counts) {
      for (const [dtype, size] of [[DType.U8, 1], [DType.F16, 2], [DType.F32, 4]] as const) {
        if (n * size > buf.byteLength) continue;
        const view = buf.slice(0, n * size, { dtype });
        deepStrictEqual([...view.shape], [n], `${n} ${dtype}`);
        equal(view.length, n);
        ok(Object.isFrozen(view.shape), "frozen");
        throws(() => (view.shape as number[]).push(1), TypeError);
        throws(() => ((view.shape as number[])[0] = 7), TypeError);
        deepStrictEqual([...view.shape], [n], "unchanged by the attempts");
      }
    }
  }
  using f = ctx.device.alloc(4096, DType.F32);
  deepStrictEqual([...f.shape], [1024]);
  ok(Object.isFrozen(f.shape));
});

Deno.test("views of one length share one frozen shape array; views of others never see it", () => {
  using ctx = testContext();
  using buf = ctx.device.alloc(1 << 16, DType.F32);
  const a = buf.slice(0, 256), b = buf.slice(256, 256), c = buf.slice(512, 512);
  strictEqual(a.shape, b.shape, "no shape array of its own per view");
  deepStrictEqual([...c.shape], [128]);
  deepStrictEqual([...a.shape], [64]);
  // A colliding length replaces the shared entry; earlier views keep theirs.
  for (let n = 1; n < 4096; n++) deepStrictEqual([...buf.slice(0, n * 4).shape], [n]);
  deepStrictEqual([...a.shape], [64]);
  deepStrictEqual([...buf.slice(4, 256).shape], [64]);
});

Deno.test("an explicit shape is copied and frozen: later changes to the caller's array do not reach the view", () => {
  using ctx = testContext();
  using buf = ctx.device.alloc(64, DType.F32);
  const shape = [2, 4];
  const view = buf.slice(0, 32, { shape });
  notStrictEqual(view.shape, shape);
  shape[0] = 9;
  deepStrictEqual([...view.shape], [2, 4]);
  ok(Object.isFrozen(view.shape));
  // A shape with holes, a non-array, or one whose elements do not fit the view is refused.
  const refused = (e: unknown) => e instanceof MlxError && e.code === "InvalidArgument" && /shape/.test(e.message);
  throws(() => buf.slice(0, 60, { shape: [3, , 5] as number[] }), refused);
  throws(() => buf.slice(0, 16, { shape: new Set([4]) as unknown as number[] }), refused);
  throws(() => buf.slice(0, 16, { shape: [2, 3] }), refused);
  const alloc = [4, 4];
  using m = ctx.device.alloc(64, DType.F32, alloc);
  alloc[1] = 1;
  deepStrictEqual([...m.shape], [4, 4]);
  ok(Object.isFrozen(m.shape));
});

Deno.test("slice errors: unknown dtype, out of range, misaligned, disposed (in that order)", () => {
  using ctx = testContext();
  const buf = ctx.device.alloc(64, DType.F32);
  throws(() => buf.slice(0, 4, { dtype: "f64" as DType }), isCode("InvalidArgument", /unknown dtype f64/));
  throws(() => buf.slice(0, 68, { dtype: "f64" as DType }), isCode("InvalidArgument", /unknown dtype/));
  throws(() => buf.slice(60, 8), isCode("InvalidArgument", /outside this 64-byte view/));
  throws(() => buf.slice(-4, 4), isCode("InvalidArgument", /outside/));
  throws(() => buf.slice(0.5, 4), isCode("InvalidArgument", /outside/));
  throws(() => buf.slice(2, 4), isCode("InvalidArgument", /multiples of 4 bytes for f32/));
  throws(() => buf.slice(0, 6), isCode("InvalidArgument", /multiples of 4 bytes/));
  const bytes = buf.slice(2, 6, { dtype: DType.U8 });
  throws(() => bytes.slice(1, 2, { dtype: DType.F16 }), isCode("InvalidArgument", /offset 3 .*multiples of 2/));
  equal(bytes.slice(0, 2, { dtype: DType.F16 }).dtype, DType.F16);
  // An explicit undefined dtype keeps the view's own.
  equal(bytes.slice(0, 1, { dtype: undefined as unknown as DType }).dtype, DType.U8);
  equal(buf.slice(0, 4, {}).dtype, DType.F32);
  buf.dispose();
  throws(() => buf.slice(0, 4), isCode("Disposed", /was disposed/));
  throws(() => bytes.slice(0, 2), isCode("Disposed", /was disposed/));
  throws(() => buf.slice(60, 8), isCode("InvalidArgument", /outside/), "range checks come before the disposed check");
});

Deno.test("names inherited from Object.prototype are no dtype: alloc and slice refuse them with InvalidArgument", () => {
  using ctx = testContext();
  const { device } = ctx;
  for (const name of ["toString", "constructor", "__proto__", "hasOwnProperty"]) {
    equal(isDType(name), false, name);
    throws(() => device.alloc(8, name as DType), (e) => e instanceof MlxError && e.code === "InvalidArgument", name);
    using b = device.alloc(8, DType.F32);
    throws(() => b.slice(0, 8, { dtype: name as DType }), (e) => e instanceof MlxError, name);
  }
});
