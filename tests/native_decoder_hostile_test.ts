/**
 * The native decoder against a hostile caller of the raw C ABI, on the paths its fast version
 * rewrote: a buffer handle is accepted only while it names the live allocation (one compare against
 * the entry's handle), also after its slot was freed and handed out again, in every kind of buffer
 * record and inside a run of buffer records; pipeline handles are table indices, refused past the
 * table; a binding whose buffer the host frees before the dispatch arrives keeps its memory; inline
 * constants of any length arrive intact wherever their record ends; tracking switched on mid-chunk
 * covers buffers allocated after the tracker was sized; and size products that overflow are refused.
 */
import { deepStrictEqual, equal, match, notEqual } from "node:assert/strict";
import type { MlxDevice } from "../mod.ts";
import { Op, Stat, Status, Track } from "../src/native/abi.ts";
import { lastErrorText } from "../src/native/status.ts";
import { allContracts } from "../src/kernels.ts";
import { testContext } from "./helpers.ts";
import { rawCommandBuffer, RawWords as Words } from "./raw_stream.ts";

const INDEX_BITS = 20, INDEX_MASK = (1 << INDEX_BITS) - 1;

/** Raw buffers of one device (alloc, write, read, free by handle), freed at the end of the test. */
function rawBuffers(device: MlxDevice) {
  const sym = device.sym, dev = device.devicePtr();
  const live = new Set<number>();
  return {
    alloc(bytes: number): number {
      const h = sym.mlxn_buffer_alloc(dev, BigInt(bytes));
      notEqual(h, 0, lastErrorText(sym));
      live.add(h);
      return h;
    },
    write(h: number, data: Float32Array): void {
      const bytes = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
      equal(sym.mlxn_buffer_write(dev, h, 0n, bytes, BigInt(bytes.byteLength)), Status.OK, lastErrorText(sym));
    },
    read(h: number, n: number): number[] {
      const out = new Float32Array(n);
      equal(sym.mlxn_buffer_read(dev, h, 0n, new Uint8Array(out.buffer), BigInt(n * 4)), Status.OK);
      return Array.from(out);
    },
    free(h: number): void {
      equal(sym.mlxn_buffer_free(dev, h), Status.OK, lastErrorText(sym));
      live.delete(h);
    },
    [Symbol.dispose](): void {
      for (const h of live) sym.mlxn_buffer_free(dev, h);
    },
  };
}

/** strided_copy_f32 (src, dst, params, optional state) of one row of `cols` floats, no state. */
function copyRow(device: MlxDevice, w: Words, src: number, dst: number, cols = 4): Words {
  w.rec(Op.SET_PIPELINE, 0, device.kernels.get("strided_copy_f32").handle);
  w.rec(Op.SET_BUFFER, 0, src, 0, cols * 4).rec(Op.SET_BUFFER, 1, dst, 0, cols * 4);
  return w.rec(Op.SET_BYTES, 2, 28, 1, cols, cols, cols, 0, cols, 4);
}
const run = (w: Words, cols = 4) => w.rec(Op.DISPATCH_THREADS, 0, cols, 1, 1, cols, 1, 1, 0);

Deno.test("a freed handle stays refused after its slot is reallocated, in every buffer record", () => {
  using ctx = testContext();
  const { device } = ctx;
  using bufs = rawBuffers(device);
  const src = bufs.alloc(16), dst = bufs.alloc(16);
  bufs.write(src, new Float32Array([1, 2, 3, 4]));
  const old = bufs.alloc(16);
  bufs.free(old);
  const reused = bufs.alloc(16); // LIFO: the freed slot, one generation on
  equal(reused & INDEX_MASK, old & INDEX_MASK, "the slot was not reused; the test needs it to be");
  notEqual(reused, old);
  bufs.write(reused, new Float32Array([5, 6, 7, 8]));
  const records: [string, (w: Words, h: number) => Words][] = [
    ["SET_BUFFER", (w, h) => w.rec(Op.SET_BUFFER, 0, h, 0, 16)],
    ["SET_BUFFER_WHOLE", (w, h) => w.rec(Op.SET_BUFFER_WHOLE, 0, h)],
    ["SET_BUFFER64", (w, h) => w.rec(Op.SET_BUFFER64, 0, h, 0, 0, 16, 0)],
    ["TRACK", (w, h) => w.rec(Op.TRACK, 0, dst, Track.READ, 0, 0, 16, 0, h, Track.READ, 0, 0, 16, 0)],
  ];
  for (const [name, bind] of records) {
    // The stale handle: refused at its record, naming the cause.
    const cb = rawCommandBuffer(device);
    const w = copyRow(device, new Words(), src, dst);
    const at = w.at;
    const got = cb.encode(bind(w, old).take());
    cb.free();
    deepStrictEqual([got.rc, got.offset], [Status.E_BAD_HANDLE, at], `${name}: ${got.message}`);
    match(got.message, /was freed \(a stale handle\)/, name);
    if (name === "TRACK") continue;
    // The new buffer in the same slot binds and is what the kernel reads.
    const ok = rawCommandBuffer(device);
    deepStrictEqual(ok.encode(run(bind(copyRow(device, new Words(), src, dst), reused)).take()).rc, Status.OK);
    ok.run();
    deepStrictEqual(bufs.read(dst, 4), [5, 6, 7, 8], name);
    bufs.write(dst, new Float32Array(4));
  }
});

Deno.test("bad handles inside a run of buffer records are refused at their own record", () => {
  using ctx = testContext();
  const { device } = ctx;
  using bufs = rawBuffers(device);
  const a = bufs.alloc(64), b = bufs.alloc(64);
  const gen = (h: number, g: number) => ((g << INDEX_BITS) | (h & INDEX_MASK)) >>> 0;
  const bad: [string, number][] = [
    ["zero", 0],
    ["slot 0 with generation bits", gen(0, 3)],
    ["the last index", INDEX_MASK],
    ["all ones", 0xffff_ffff],
    ["a live slot, the next generation", gen(b, (b >>> INDEX_BITS) + 1)],
    ["a live slot, the last generation", gen(b, 0xfff)],
  ];
  for (const [name, h] of bad) {
    for (const position of [1, 2]) { // second or third record of the run
      const w = new Words().rec(Op.SET_PIPELINE, 0, device.kernels.get("elementwise_add_f32").handle);
      w.rec(Op.SET_BUFFER_WHOLE, 0, a);
      if (position === 2) w.rec(Op.SET_BUFFER, 1, b, 0, 64);
      const at = w.at;
      w.rec(Op.SET_BUFFER, 2, h, 0, 16).rec(Op.SET_BUFFER_WHOLE, 3, a);
      const cb = rawCommandBuffer(device);
      const got = cb.encode(w.take());
      cb.free();
      deepStrictEqual([got.rc, got.offset], [Status.E_BAD_HANDLE, at], `${name} at ${position}: ${got.message}`);
      match(got.message, new RegExp(`slot 2: buffer handle 0x${h.toString(16)} is not a live buffer`), name);
    }
  }
});

Deno.test("pipeline handles are accepted up to the table's last entry and refused past it", () => {
  using ctx = testContext();
  const { device } = ctx;
  const sym = device.sym, dev = device.devicePtr();
  const sig = new Uint8Array(64);
  let count = 0; // the table's entries: handles 1..count have a signature
  while (sym.mlxn_pipeline_signature(dev, count + 1, sig, sig.byteLength) > 0) count++;
  const last = Math.max(
    ...allContracts().flatMap((c) => {
      try {
        return [device.kernels.get(c.name).handle];
      } catch {
        return []; // not a kernel of this backend
      }
    }),
  );
  equal(last <= count && last > 10, true, `last kernel ${last} of ${count}`);
  for (const h of [0, count + 1, count + 2, 0x8000_0000, 0xffff_ffff]) {
    const cb = rawCommandBuffer(device);
    // A good pipeline is set first: a refused handle must not fall back to it.
    const got = cb.encode(new Words().rec(Op.SET_PIPELINE, 0, last).rec(Op.SET_PIPELINE, 0, h).take());
    cb.free();
    deepStrictEqual([got.rc, got.offset], [Status.E_BAD_HANDLE, 8], `handle ${h}: ${got.message}`);
    match(got.message, new RegExp(`unknown pipeline handle ${h >>> 0}`));
  }
});

Deno.test("a binding whose buffer is freed before its dispatch arrives reads the memory it bound", () => {
  using ctx = testContext();
  const { device } = ctx;
  using bufs = rawBuffers(device);
  const src = bufs.alloc(16), dst = bufs.alloc(16);
  bufs.write(src, new Float32Array([1, 2, 3, 4]));
  const cb = rawCommandBuffer(device);
  equal(cb.encode(copyRow(device, new Words(), src, dst).take()).rc, Status.OK);
  // Between the chunks the host frees the bound buffer and allocates and fills others.
  bufs.free(src);
  const others = Array.from({ length: 8 }, () => bufs.alloc(16));
  for (const o of others) bufs.write(o, new Float32Array([9, 9, 9, 9]));
  equal(cb.encode(run(new Words()).take()).rc, Status.OK);
  cb.run();
  deepStrictEqual(bufs.read(dst, 4), [1, 2, 3, 4]);
  // Bound again after the free, in a later chunk of another command buffer: stale.
  const late = rawCommandBuffer(device);
  const got = late.encode(new Words().rec(Op.SET_BUFFER_WHOLE, 0, src).take());
  late.free();
  deepStrictEqual([got.rc, got.offset], [Status.E_BAD_HANDLE, 0]);
});

Deno.test("inline constants of every length arrive intact, also where their record ends the chunk", () => {
  using ctx = testContext();
  const { device } = ctx;
  using bufs = rawBuffers(device);
  const cols = 4, src = bufs.alloc(64), dst = bufs.alloc(64);
  bufs.write(src, Float32Array.from({ length: 16 }, (_, i) => i + 1));
  // The params are 28 bytes; longer records carry trailing bytes the kernel ignores. Each length
  // ends a chunk (its padding is the chunk's last word), and earlier records of the same slot fill
  // the command buffer's 64 KiB arena block so that the copy ends exactly at the block's end.
  for (let n = 1; n <= 72; n++) {
    const cb = rawCommandBuffer(device);
    const w = new Words().rec(Op.SET_PIPELINE, 0, device.kernels.get("strided_copy_f32").handle);
    for (let fill = 65536 - Math.ceil(n / 16) * 16; fill > 0; fill -= Math.min(fill, 4096)) {
      const bytes = Math.min(fill, 4096);
      w.rec(Op.SET_BYTES, 2, bytes, ...new Array(bytes / 4).fill(0xdead_beef));
    }
    // rows 2, cols 4: row r of dst is row r of src; strides of 8 floats (every other row)
    const params = [2, cols, 8, 8, 0, 8, 4], words = Math.ceil(n / 4);
    const payload = Array.from({ length: words }, (_, i) => i < params.length ? params[i]! : 0x7f7f_7f7f);
    w.rec(Op.SET_BUFFER, 0, src, 0, 64).rec(Op.SET_BUFFER, 1, dst, 0, 64).rec(Op.SET_BYTES, 2, n, ...payload);
    equal(cb.encode(w.take()).rc, Status.OK, `${n} bytes`);
    const got = cb.encode(w.rec(Op.DISPATCH_THREADS, 0, cols, 2, 1, cols, 1, 1, 0).take());
    if (n < 28) {
      equal(got.rc, Status.E_STREAM, `${n} bytes`);
      match(got.message, new RegExp(`slot 2: inline constants need 28 bytes, got ${n}`));
      cb.free();
      continue;
    }
    equal(got.rc, Status.OK, `${n} bytes: ${got.message}`);
    cb.run();
    const out = bufs.read(dst, 16);
    deepStrictEqual(out, [1, 2, 3, 4, 0, 0, 0, 0, 9, 10, 11, 12, 0, 0, 0, 0], `${n} bytes`);
    bufs.write(dst, new Float32Array(16));
  }
});

Deno.test("tracking switched on mid-chunk covers buffers allocated after the tracker was sized", () => {
  using ctx = testContext();
  const { device } = ctx;
  using bufs = rawBuffers(device);
  const a = bufs.alloc(16);
  bufs.write(a, new Float32Array([1, 2, 3, 4]));
  const cb = rawCommandBuffer(device);
  // Tracking on, then off: the tracker is sized to the table as it is now (indices below `a`'s
  // and room in steps of 64 entries doubling; the device allocated nothing else).
  equal(cb.encode(new Words().rec(Op.AUTO_BARRIERS, 1).rec(Op.AUTO_BARRIERS, 0).take()).rc, Status.OK);
  let room = 64;
  while (room <= (a & INDEX_MASK) - 1) room *= 2;
  // Buffers until one's table index lies past that room.
  const later: number[] = [];
  while (later.length < 1 << 17 && (later.at(-1) === undefined || (later.at(-1)! & INDEX_MASK) - 1 < room)) {
    later.push(bufs.alloc(16));
  }
  equal((later.at(-1)! & INDEX_MASK) - 1 >= room, true, "no buffer past the tracker's room");
  const b = later.at(-1)!, c = bufs.alloc(16), d = bufs.alloc(16);
  // The first binding arrives before tracking is back on; the dispatch after it is tracked.
  const w = copyRow(device, new Words(), a, b).rec(Op.AUTO_BARRIERS, 1);
  run(w);
  run(copyRow(device, w, b, c)); // reads what the first wrote: a barrier
  run(copyRow(device, w, a, d)); // reads only a: none
  run(copyRow(device, w, c, b)); // writes what the second read, reads what it wrote: a barrier
  equal(cb.encode(w.take()).rc, Status.OK);
  const s = cb.stats();
  deepStrictEqual([s[Stat.DISPATCHES], s[Stat.AUTO_BARRIERS], s[Stat.AUTO_CONCURRENT]], [4, 2, 2]);
  cb.run();
  deepStrictEqual([bufs.read(b, 4), bufs.read(d, 4)], [[1, 2, 3, 4], [1, 2, 3, 4]]);
});

Deno.test("TRACK ranges at and past a buffer's end, and ones whose end overflows, are judged exactly", () => {
  using ctx = testContext();
  const { device } = ctx;
  using bufs = rawBuffers(device);
  const h = bufs.alloc(64);
  const track = (off: bigint, len: bigint) => {
    const cb = rawCommandBuffer(device);
    const lo = (x: bigint) => Number(x & 0xffff_ffffn), hi = (x: bigint) => Number(x >> 32n);
    const got = cb.encode(new Words().rec(Op.TRACK, 0, h, Track.WRITE, lo(off), hi(off), lo(len), hi(len)).take());
    cb.free();
    return got;
  };
  for (const [off, len] of [[0n, 64n], [64n, 0n], [63n, 1n], [0n, 0n]] as [bigint, bigint][]) {
    equal(track(off, len).rc, Status.OK);
  }
  const max = (1n << 64n) - 1n;
  for (
    const [off, len] of [[65n, 0n], [64n, 1n], [1n, max], [max, 2n], [32n, max - 31n], [1n << 63n, 1n << 63n]] as [
      bigint,
      bigint,
    ][]
  ) {
    const got = track(off, len);
    deepStrictEqual([got.rc, got.offset], [Status.E_STREAM, 0], `[${off}, +${len})`);
    match(got.message, /TRACK range 0: \[\d+, \+\d+\) is past the end of a 64-byte buffer/);
  }
});

Deno.test("threadgroup counts whose products overflow are refused before any kernel sees them", () => {
  using ctx = testContext();
  const { device } = ctx;
  using bufs = rawBuffers(device);
  const a = bufs.alloc(16), b = bufs.alloc(16);
  const cases: [string, number[], RegExp][] = [
    [
      "groups × threadgroup past 32 bits",
      [0x40_0000, 1, 1, 1024, 1, 1],
      /4194304 threadgroups of 1024 threads overflow dimension 0/,
    ],
    ["threadgroup past the limit", [1, 1, 1, 1024, 2, 1], /threadgroup 1024x2x1 must have 1\.\.1024 threads/],
    ["threadgroup product wrapping 32 bits", [1, 1, 1, 0x1_0000, 0x1_0000, 1], /must have 1\.\.1024 threads/],
    ["threadgroups past 64 bits", [0xffff_ffff, 0xffff_ffff, 0xffff_ffff, 1, 1, 1], /threadgroups overflow 64 bits/],
  ];
  for (const [name, dims, reason] of cases) {
    const cb = rawCommandBuffer(device);
    const w = copyRow(device, new Words(), a, b);
    const at = w.at;
    const got = cb.encode(w.rec(Op.DISPATCH_GROUPS, 0, ...dims, 0).take());
    cb.free();
    deepStrictEqual([got.rc, got.offset], [Status.E_STREAM, at], `${name}: ${got.message}`);
    match(got.message, reason, name);
  }
});
