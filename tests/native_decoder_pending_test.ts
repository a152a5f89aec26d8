/**
 * The native decoder writes each binding straight into the dispatch record it is building (the
 * pending dispatch) and keeps its tracker sized to the buffer table. These tests pin what that must
 * not change, through the raw C ABI: an optional slot a dispatch leaves unbound reads as unbound
 * even where recycled storage held an earlier dispatch's binding; bindings that arrive in one chunk
 * and their dispatch in the next survive the dispatch array growing in between; slots past the
 * kernel's signature are refused; and automatic barriers stay exact for buffers allocated after
 * tracking started.
 */
import { deepStrictEqual, equal, match } from "node:assert/strict";
import { DType, type MlxBuffer } from "../mod.ts";
import { Op, Stat, Status } from "../src/native/abi.ts";
import { testContext } from "./helpers.ts";
import { rawCommandBuffer, RawWords as Words } from "./raw_stream.ts";

/** strided_copy_f32 params: rows, cols, src_stride, dst_stride, has_state, dst_pos_stride, max_pos. */
const copyParams = (cols: number, hasState: number) => [1, cols, cols, cols, hasState, cols, 4];

Deno.test("an optional slot left unbound reads as unbound after recycled storage held a binding of it", () => {
  using ctx = testContext();
  const { device } = ctx;
  using src = device.upload(new Float32Array([1, 2, 3, 4]));
  using dst = device.alloc(16 * 4, DType.F32);
  using state = device.upload(new Uint32Array([1]));
  for (let round = 0; round < 8; round++) {
    // A command buffer whose dispatch binds the optional state slot (3), freed unrun: its storage,
    // that binding included, goes back to the device for the next command buffer.
    const first = rawCommandBuffer(device);
    const w = new Words().pipeline(device, "strided_copy_f32");
    w.buffer(0, src, 0, 16).buffer(1, dst, 0, 64).bytes(2, ...copyParams(4, 1)).buffer(3, state, 0, 4);
    deepStrictEqual(first.encode(w.threads([4, 1, 1], [4, 1, 1]).take()), { rc: Status.OK, offset: -1, message: "" });
    first.free();
    // The next one leaves slot 3 unbound, as has_state = 0 requires: the kernel must see it unbound.
    const second = rawCommandBuffer(device);
    w.pipeline(device, "strided_copy_f32").buffer(0, src, 0, 16).buffer(1, dst, 0, 64).bytes(2, ...copyParams(4, 0));
    deepStrictEqual(second.encode(w.threads([4, 1, 1], [4, 1, 1]).take()), { rc: Status.OK, offset: -1, message: "" });
    second.run();
    deepStrictEqual(Array.from(dst.read() as Float32Array).slice(0, 4), [1, 2, 3, 4]);
    dst.write(new Float32Array(16));
  }
});

Deno.test("bindings in one chunk and their dispatch in the next survive the dispatch array growing", () => {
  using ctx = testContext();
  const { device } = ctx;
  const n = 3000, cols = 4; // far past any capacity an earlier command buffer left in the spare storage
  const data = Float32Array.from({ length: n * cols }, (_, i) => i + 0.5);
  using src = device.upload(data);
  using dst = device.alloc(n * cols * 4, DType.F32);
  const cb = rawCommandBuffer(device);
  const w = new Words().pipeline(device, "strided_copy_f32");
  const bind = (i: number) =>
    w.buffer(0, src, i * cols * 4, cols * 4).buffer(1, dst, i * cols * 4, cols * 4).bytes(2, ...copyParams(cols, 0));
  // Each dispatch's bindings end one chunk, its dispatch record starts the next, and the next
  // dispatch's bindings follow it in that chunk: they land after the array grew for them.
  bind(0);
  for (let i = 1; i <= n; i++) {
    deepStrictEqual(cb.encode(w.take()), { rc: Status.OK, offset: -1, message: "" });
    w.threads([cols, 1, 1], [cols, 1, 1]);
    if (i < n) bind(i);
  }
  deepStrictEqual(cb.encode(w.take()), { rc: Status.OK, offset: -1, message: "" });
  cb.run();
  deepStrictEqual(dst.read(), data);
});

Deno.test("a binding past the kernel's signature is refused at the dispatch, buffer or inline bytes", () => {
  using ctx = testContext();
  const { device } = ctx;
  using src = device.upload(new Float32Array(4));
  using dst = device.alloc(16, DType.F32);
  for (const extra of [{ slot: 11, bytes: false }, { slot: 12, bytes: false }, { slot: 30, bytes: true }]) {
    const cb = rawCommandBuffer(device);
    const w = new Words().pipeline(device, "strided_copy_f32");
    w.buffer(0, src, 0, 16).buffer(1, dst, 0, 16).bytes(2, ...copyParams(4, 0));
    if (extra.bytes) w.bytes(extra.slot, 7);
    else w.buffer(extra.slot, src, 0, 16);
    const { rc, message } = cb.encode(w.threads([4, 1, 1], [4, 1, 1]).take());
    equal(rc, Status.E_STREAM);
    match(message, new RegExp(`kernel strided_copy_f32 takes 4 slots but slot ${extra.slot} is bound`));
    cb.free();
  }
});

Deno.test("automatic barriers stay exact for buffers allocated after tracking started", () => {
  using ctx = testContext();
  const { device } = ctx;
  using a = device.upload(new Float32Array([1, 2, 3, 4]));
  using b = device.alloc(16, DType.F32);
  const cb = rawCommandBuffer(device);
  const w = new Words().rec(Op.AUTO_BARRIERS, 1).pipeline(device, "strided_copy_f32");
  const copy = (from: MlxBuffer, to: MlxBuffer) =>
    w.buffer(0, from, 0, 16).buffer(1, to, 0, 16).bytes(2, ...copyParams(4, 0)).threads([4, 1, 1], [4, 1, 1]);
  copy(a, b);
  deepStrictEqual(cb.encode(w.take()), { rc: Status.OK, offset: -1, message: "" });
  // Enough new buffers that their table indices lie past the tracker's room when tracking started.
  const later = Array.from({ length: 300 }, () => device.alloc(16, DType.F32));
  try {
    const c = later[later.length - 1]!, d = later[later.length - 2]!;
    copy(b, c); // reads what the first wrote: a barrier
    copy(c, d); // reads what the second wrote: a barrier
    copy(a, later[0]!); // reads a (only read so far) into a buffer nothing touched: none
    deepStrictEqual(cb.encode(w.take()), { rc: Status.OK, offset: -1, message: "" });
    const s = cb.stats();
    deepStrictEqual([s[Stat.DISPATCHES], s[Stat.AUTO_BARRIERS], s[Stat.AUTO_CONCURRENT]], [4, 2, 2]);
    cb.run();
    deepStrictEqual(Array.from(d.read() as Float32Array), [1, 2, 3, 4]);
  } finally {
    for (const x of later) x.dispose();
  }
});
