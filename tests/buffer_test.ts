/** MlxBuffer: zero-fill, typed round trips, 16-bit conversions, exact slices, disposal and lifetimes. */
import { deepStrictEqual, equal, ok, throws } from "node:assert/strict";
import { DType, MlxDevice, MlxError, ops } from "../mod.ts";
import { testContext } from "./helpers.ts";

const isCode = (code: string) => (e: unknown) => e instanceof MlxError && e.code === code;

Deno.test("allocations are zero-filled and read back as their dtype's typed array", () => {
  using ctx = testContext();
  const { device } = ctx;
  const cases: [DType, string][] = [
    [DType.F32, "Float32Array"],
    [DType.F16, "Float32Array"],
    [DType.BF16, "Float32Array"],
    [DType.U32, "Uint32Array"],
    [DType.I32, "Int32Array"],
    [DType.U16, "Uint16Array"],
    [DType.U8, "Uint8Array"],
  ];
  for (const [dtype, type] of cases) {
    using b = device.alloc(4096, dtype);
    const v = b.read();
    equal(v.constructor.name, type, dtype);
    ok(v.every((x) => x === 0), `${dtype} zero-filled`);
  }
});

Deno.test("typed uploads round-trip exactly", () => {
  using ctx = testContext();
  const { device } = ctx;
  const f = new Float32Array([1.5, -0, Infinity, 3.4028234663852886e38, 1e-45]);
  using bf = device.upload(f);
  deepStrictEqual(bf.read(), f);
  using bu = device.upload(new Uint32Array([0, 1, 0xffffffff]));
  deepStrictEqual(Array.from(bu.read()), [0, 1, 0xffffffff]);
  using bi = device.upload(new Int32Array([-1, 7]));
  deepStrictEqual(Array.from(bi.read()), [-1, 7]);
  using bn = device.upload([1, 2, 3], DType.F32, [3]);
  deepStrictEqual(bn.shape, [3]);
  deepStrictEqual(Array.from(bn.read()), [1, 2, 3]);
});

Deno.test("f16 and bf16 conversions round to nearest even, both ways", () => {
  using ctx = testContext();
  const { device } = ctx;
  // f16: 1 + 2⁻¹¹ is a tie between 1 and 1 + 2⁻¹⁰ → even (1); 1 + 3·2⁻¹¹ → 1 + 2⁻⁹ (even);
  // 65520 overflows to Inf; 2⁻²⁵ ties to 0; 3·2⁻²⁶ rounds up to the smallest subnormal 2⁻²⁴.
  using h = device.alloc(16, DType.F16);
  h.write([1 + 2 ** -11, 1 + 3 * 2 ** -11, 65520, 2 ** -25, 3 * 2 ** -26, -2, NaN, 0.1]);
  const hv = h.read();
  deepStrictEqual(Array.from(hv.slice(0, 6)), [1, 1 + 2 ** -9, Infinity, 0, 2 ** -24, -2]);
  ok(Number.isNaN(hv[6]));
  equal(hv[7], 0.0999755859375);
  // bf16: 1 + 2⁻⁸ ties to 1; 1 + 3·2⁻⁸ → 1 + 2⁻⁶.
  using b = device.alloc(8, DType.BF16);
  b.write([1 + 2 ** -8, 1 + 3 * 2 ** -8, -3.5, NaN]);
  const bv = b.read();
  deepStrictEqual(Array.from(bv.slice(0, 3)), [1, 1 + 2 ** -6, -3.5]);
  ok(Number.isNaN(bv[3]));
  // A Uint16Array written to a 16-bit float buffer is raw bits.
  using raw = device.alloc(4, DType.F16);
  raw.write(new Uint16Array([0x3c00, 0xc000]));
  deepStrictEqual(Array.from(raw.read()), [1, -2]);
  deepStrictEqual(Array.from(new Uint16Array(raw.readBytes().buffer)), [0x3c00, 0xc000]);
});

Deno.test("slices cover exactly their bytes, nest, and are validated", () => {
  using ctx = testContext();
  const { device } = ctx;
  using b = device.upload(Float32Array.from({ length: 16 }, (_, i) => i));
  const s = b.slice(8, 24); // elements 2..7
  equal(s.byteOffset, 8);
  equal(s.allocId, b.allocId);
  deepStrictEqual(s.range(), [b.allocId, 8, 32]);
  deepStrictEqual(Array.from(s.read()), [2, 3, 4, 5, 6, 7]);
  const t = s.slice(4, 8); // elements 3..4
  deepStrictEqual(t.range(), [b.allocId, 12, 20]);
  t.write([30, 40]);
  deepStrictEqual(Array.from(b.read().slice(2, 6)), [2, 30, 40, 5]);
  throws(() => s.slice(20, 8), isCode("InvalidArgument"));
  throws(() => b.slice(2, 4), isCode("InvalidArgument")); // not f32-aligned
  throws(() => b.slice(-4, 4), isCode("InvalidArgument"));
  throws(() => s.write(new Float32Array(7)), isCode("InvalidArgument"));
  const u8 = b.slice(1, 3, { dtype: DType.U8 });
  equal(u8.length, 3);
});

Deno.test("bad allocations are refused with clear errors", () => {
  using ctx = testContext();
  const { device } = ctx;
  throws(() => device.alloc(0), isCode("InvalidArgument"));
  throws(() => device.alloc(-8), isCode("InvalidArgument"));
  throws(() => device.alloc(1.5), isCode("InvalidArgument"));
  throws(() => device.alloc(6, DType.F32), isCode("InvalidArgument"));
  throws(() => device.alloc(8, "f64" as DType), isCode("InvalidArgument"));
  throws(() => device.alloc(8, DType.F32, [3]), isCode("InvalidArgument"));
  throws(() => device.upload(new Float32Array(0)), isCode("InvalidArgument"));
  throws(() => device.alloc(2 ** 50), isCode("OutOfMemory"));
});

Deno.test("disposal: idempotent, later use is a Disposed error, native memory is released", () => {
  using ctx = testContext();
  const { device } = ctx;
  const before = MlxDevice.liveObjects(device);
  const b = device.alloc(1024, DType.F32);
  const view = b.slice(0, 16);
  equal(MlxDevice.liveObjects(device).buffers, before.buffers + 1);
  view.dispose(); // any view frees the allocation
  b.dispose();
  ok(b.disposed && view.disposed);
  equal(MlxDevice.liveObjects(device).buffers, before.buffers);
  equal(MlxDevice.liveObjects(device).bufferBytes, before.bufferBytes);
  throws(() => b.read(), isCode("Disposed"));
  throws(() => b.write([1]), isCode("Disposed"));
  throws(() => b.slice(0, 4), isCode("Disposed"));
});

Deno.test("a buffer disposed while a committed command buffer binds it is freed only after completion", async () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const base = MlxDevice.liveObjects(device).buffers;
  const rows = 64, dim = 1 << 16;
  const x = device.upload(new Float32Array(rows * dim).fill(2));
  const w = device.upload(new Float32Array(dim).fill(1));
  using y = device.alloc(rows * dim * 4, DType.F32);
  const enc = device.commandEncoder();
  ops.rmsNorm(enc, registry, x, w, y, { rows, dim, eps: 0 });
  enc.commit();
  x.dispose(); // still bound by the in-flight command buffer
  w.dispose();
  await enc.completed();
  ok(y.read().every((v) => v === 1), "the kernel read valid memory");
  equal(MlxDevice.liveObjects(device).buffers, base + 1, "deferred frees happened at completion");
});

Deno.test("a buffer disposed after dispatch but before commit still reaches the kernel", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const a = device.upload(new Float32Array([1, 2, 3]));
  using out = device.alloc(12, DType.F32);
  using enc = device.commandEncoder();
  ops.elementwiseAdd(enc, registry, a, a, out);
  a.dispose(); // the record naming it is handed over first, so the native side keeps it alive
  enc.commitAndWait();
  deepStrictEqual(Array.from(out.read()), [2, 4, 6]);
});

Deno.test("alloc defaults to f32: the buffer reads back as floats and writes count f32 elements", () => {
  using device = MlxDevice.open();
  using b = device.alloc(16); // 16 bytes = 4 f32 elements
  equal(b.dtype, DType.F32);
  equal(b.length, 4);
  b.write([1.5, 2.5], 2); // offset in elements
  deepStrictEqual(Array.from(b.read() as Float32Array), [0, 0, 1.5, 2.5]);
  deepStrictEqual(Array.from(b.slice(8, 8).read() as Float32Array), [1.5, 2.5]); // slice in bytes
  throws(() => device.alloc(6), isCode("InvalidArgument")); // not a whole number of f32 elements
});

Deno.test("readBytesInto copies a view's stored bytes into a reused target of exactly its length", () => {
  using ctx = testContext();
  const { device } = ctx;
  using f = device.upload(new Float32Array([1.5, -2, 3, 4]));
  const into = new Float32Array(8).fill(9);
  const view = f.slice(4, 8); // elements 1 and 2
  view.readBytesInto(into.subarray(2, 4));
  deepStrictEqual([...into], [9, 9, -2, 3, 9, 9, 9, 9]);
  // bf16 is copied as stored, not widened: the raw halves read() widens.
  using h = device.upload(new Float32Array([1, -0.5]), DType.BF16);
  const raw = new Uint16Array(2);
  h.readBytesInto(raw);
  deepStrictEqual([...raw], [0x3f80, 0xbf00]);
  throws(() => f.readBytesInto(new Float32Array(3)), isCode("InvalidArgument"));
  throws(() => f.readBytesInto(new Uint8Array(17)), isCode("InvalidArgument"));
  throws(() => f.readBytesInto([1, 2, 3, 4] as unknown as Float32Array), isCode("InvalidArgument"));
  const gone = device.upload(new Float32Array(2));
  gone.dispose();
  throws(() => gone.readBytesInto(new Float32Array(2)), isCode("Disposed"));
});
