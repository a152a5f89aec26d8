/**
 * The native stream decoder against malformed input: every bad record is refused with its code and
 * byte offset, nothing crashes, the device keeps working and nothing leaks.
 */
import { deepStrictEqual, equal, match, ok } from "node:assert/strict";
import { DType, MlxDevice, MlxError, ops } from "../mod.ts";
import { Op, recordHeader, Status } from "../src/native/abi.ts";
import { lastErrorText } from "../src/native/status.ts";
import { rng, testContext } from "./helpers.ts";

/** Builds raw stream words. */
class Raw {
  words: number[] = [];
  rec(op: number, slot: number, ...payload: number[]): this {
    this.words.push(recordHeader(op, 1 + payload.length, slot), ...payload);
    return this;
  }
  pipeline(h: number) {
    return this.rec(Op.SET_PIPELINE, 0, h);
  }
  buffer(slot: number, handle: number, off: number, len: number) {
    return this.rec(Op.SET_BUFFER, slot, handle, off, len);
  }
  bytes(slot: number, ...u32: number[]) {
    return this.rec(Op.SET_BYTES, slot, u32.length * 4, ...u32);
  }
  threads(g: number, t: number) {
    return this.rec(Op.DISPATCH_THREADS, 0, g, 1, 1, t, 1, 1, 0);
  }
  u8(): Uint8Array {
    return new Uint8Array(Uint32Array.from(this.words).buffer);
  }
  byteOffsetOfRecord(index: number): number {
    let off = 0;
    for (let i = 0; i < index; i++) off += (this.words[off / 4]! >>> 16) * 4;
    return off;
  }
}

function encodeRaw(device: MlxDevice, bytes: Uint8Array, len = bytes.byteLength) {
  const sym = device.sym;
  const cb = sym.mlxn_cmdbuf_new(device.devicePtr())!;
  const rc = sym.mlxn_cmdbuf_encode(cb, bytes, len);
  const offset = sym.mlxn_cmdbuf_error_offset(cb);
  const message = rc === Status.OK ? "" : lastErrorText(sym);
  // A failed command buffer must refuse to commit (sticky error).
  const commitRc = rc === Status.OK ? Status.OK : sym.mlxn_cmdbuf_commit(cb);
  sym.mlxn_cmdbuf_free(cb);
  return { rc, offset, message, commitRc };
}

Deno.test("malformed streams are refused with a code, the record's byte offset and a reason", async (t) => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const before = MlxDevice.liveObjects(device);
  using a = device.alloc(64, DType.F32), b = device.alloc(64, DType.F32), c = device.alloc(64, DType.F32);
  const add = registry.get("elementwise_add_f32").handle;
  const freed = device.alloc(16);
  const staleHandle = freed.handle;
  freed.dispose();
  const valid = () => new Raw().pipeline(add).buffer(0, a.handle, 0, 64).buffer(1, b.handle, 0, 64);

  const cases: { name: string; raw: Raw; rc: number; record: number; reason: RegExp; len?: number }[] = [
    {
      name: "truncated record (stream ends inside it)",
      raw: (() => {
        const r = valid();
        r.words.push(recordHeader(Op.SET_BUFFER, 4, 2), c.handle); // claims 4 words, 2 present
        return r;
      })(),
      rc: Status.E_STREAM,
      record: 3,
      reason: /truncated record: SET_BUFFER claims 4 words, 8 bytes remain/,
    },
    {
      name: "fixed-size record with the wrong length",
      raw: valid().rec(Op.SET_BUFFER, 2, c.handle, 0),
      rc: Status.E_STREAM,
      record: 3,
      reason: /SET_BUFFER must be 4 words, header says 3/,
    },
    {
      name: "whole-buffer record with the wrong length",
      raw: valid().rec(Op.SET_BUFFER_WHOLE, 2, c.handle, 0),
      rc: Status.E_STREAM,
      record: 3,
      reason: /SET_BUFFER_WHOLE must be 2 words, header says 3/,
    },
    {
      name: "truncated whole-buffer record",
      raw: (() => {
        const r = valid();
        r.words.push(recordHeader(Op.SET_BUFFER_WHOLE, 2, 2)); // claims 2 words, 1 present
        return r;
      })(),
      rc: Status.E_STREAM,
      record: 3,
      reason: /truncated record: SET_BUFFER_WHOLE claims 2 words, 4 bytes remain/,
    },
    {
      name: "whole-buffer record with a stale handle",
      raw: valid().rec(Op.SET_BUFFER_WHOLE, 2, staleHandle),
      rc: Status.E_BAD_HANDLE,
      record: 3,
      reason: /not a live buffer/,
    },
    {
      name: "whole-buffer record, slot out of range",
      raw: valid().rec(Op.SET_BUFFER_WHOLE, 31, c.handle),
      rc: Status.E_STREAM,
      record: 3,
      reason: /slot 31/,
    },
    {
      name: "unknown opcode",
      raw: valid().rec(99, 0, 1, 2),
      rc: Status.E_STREAM,
      record: 3,
      reason: /unknown opcode 99/,
    },
    { name: "zero-length record", raw: valid().rec(0, 0), rc: Status.E_STREAM, record: 3, reason: /.+/ },
    {
      name: "bad buffer handle",
      raw: valid().buffer(2, 0xdead, 0, 64),
      rc: Status.E_BAD_HANDLE,
      record: 3,
      reason: /not a live buffer/,
    },
    {
      name: "stale (freed) buffer handle",
      raw: valid().buffer(2, staleHandle, 0, 16),
      rc: Status.E_BAD_HANDLE,
      record: 3,
      reason: /not a live buffer/,
    },
    {
      name: "bad pipeline handle",
      raw: new Raw().pipeline(99999),
      rc: Status.E_BAD_HANDLE,
      record: 0,
      reason: /pipeline/,
    },
    {
      name: "offset past the end",
      raw: valid().buffer(2, c.handle, 68, 0),
      rc: Status.E_STREAM,
      record: 3,
      reason: /past the end/,
    },
    {
      name: "range past the end",
      raw: valid().buffer(2, c.handle, 8, 64),
      rc: Status.E_STREAM,
      record: 3,
      reason: /past the end/,
    },
    {
      name: "slot out of range",
      raw: valid().buffer(31, c.handle, 0, 64),
      rc: Status.E_STREAM,
      record: 3,
      reason: /slot 31/,
    },
    {
      name: "inline bytes too large",
      raw: valid().rec(Op.SET_BYTES, 3, 5000, ...new Array(1250).fill(0)),
      rc: Status.E_STREAM,
      record: 3,
      reason: /inline bytes/,
    },
    {
      name: "inline byte count disagrees with the record length",
      raw: valid().rec(Op.SET_BYTES, 3, 16, 1),
      rc: Status.E_STREAM,
      record: 3,
      reason: /SET_BYTES/,
    },
    {
      name: "dispatch before any pipeline",
      raw: new Raw().threads(4, 4),
      rc: Status.E_STREAM,
      record: 0,
      reason: /before any SET_PIPELINE/,
    },
    {
      name: "missing binding",
      raw: valid().bytes(3, 16).threads(16, 16),
      rc: Status.E_STREAM,
      record: 4,
      reason: /slot 2 .*not bound/,
    },
    {
      name: "extra binding",
      raw: valid().buffer(2, c.handle, 0, 64).bytes(3, 16).buffer(4, c.handle, 0, 4).threads(16, 16),
      rc: Status.E_STREAM,
      record: 6,
      reason: /slot 4 is bound/,
    },
    {
      name: "mistyped binding (bytes in a buffer slot)",
      raw: valid().bytes(2, 1).bytes(3, 16).threads(16, 16),
      rc: Status.E_STREAM,
      record: 5,
      reason: /expects a buffer/,
    },
    {
      name: "zero grid",
      raw: valid().buffer(2, c.handle, 0, 64).bytes(3, 16).threads(0, 16),
      rc: Status.E_STREAM,
      record: 5,
      reason: /zero dimension/,
    },
    {
      name: "threadgroup above the device limit",
      raw: valid().buffer(2, c.handle, 0, 64).bytes(3, 16).threads(16, 2048),
      rc: Status.E_STREAM,
      record: 5,
      reason: /1\.\.1024 threads/,
    },
    {
      name: "slice too small for the kernel's n",
      raw: valid().buffer(2, c.handle, 0, 32).bytes(3, 16).threads(16, 16),
      rc: Status.E_STREAM,
      record: 5,
      reason: /slot 2: bound slice has 32 bytes, kernel needs 64/,
    },
    {
      name: "threadgroup memory above the limit",
      raw: valid().rec(Op.SET_TG_MEMORY, 0, 65536),
      rc: Status.E_STREAM,
      record: 3,
      reason: /threadgroup memory/,
    },
    {
      name: "a slot on a record that has none",
      raw: valid().rec(Op.BARRIER, 5),
      rc: Status.E_STREAM,
      record: 3,
      reason: /BARRIER has no slot/,
    },
    {
      name: "64-bit binding past the end",
      raw: valid().rec(Op.SET_BUFFER64, 2, c.handle, 0, 1, 64, 0),
      rc: Status.E_STREAM,
      record: 3,
      reason: /past the end/,
    },
    {
      name: "length not a multiple of 4",
      raw: valid(),
      len: 10,
      rc: Status.E_INVALID_ARGUMENT,
      record: 0,
      reason: /whole number of words/,
    },
  ];
  for (const k of cases) {
    await t.step(k.name, () => {
      const r = encodeRaw(device, k.raw.u8(), k.len);
      equal(r.rc, k.rc, `${k.name}: rc ${r.rc} (${r.message})`);
      if (k.rc === Status.E_STREAM || k.rc === Status.E_BAD_HANDLE) {
        equal(r.offset, k.raw.byteOffsetOfRecord(k.record), `${k.name}: offset (${r.message})`);
        match(r.message, new RegExp(`record at byte ${r.offset}`));
      }
      match(r.message, k.reason);
      ok(r.commitRc !== Status.OK, "a command buffer that failed to encode must not commit");
    });
  }

  await t.step("the device still computes correctly afterwards, and nothing leaked", () => {
    a.write(new Float32Array(16).fill(1.5));
    b.write(new Float32Array(16).fill(2));
    using enc = device.commandEncoder();
    ops.elementwiseAdd(enc, registry, a, b, c);
    enc.commitAndWait();
    deepStrictEqual(Array.from(c.read()), new Array(16).fill(3.5));
    const now = MlxDevice.liveObjects(device);
    equal(now.commandBuffers, before.commandBuffers);
    equal(now.buffers, before.buffers + 3);
  });
});

Deno.test("random corruptions of a valid stream never crash the decoder", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  using a = device.alloc(4096, DType.F32), b = device.alloc(4096, DType.F32);
  using c = device.alloc(4096, DType.F32), w = device.alloc(4096, DType.F32);
  // A realistic stream: two kernels, inline constants, a barrier, both dispatch kinds.
  const words: number[] = [];
  const add = registry.get("elementwise_add_f32").handle, norm = registry.get("rms_norm_f32").handle;
  const raw = new Raw()
    .pipeline(add).buffer(0, a.handle, 0, 4096).buffer(1, b.handle, 0, 4096).buffer(2, c.handle, 0, 4096)
    .bytes(3, 1024).threads(1024, 256).rec(Op.BARRIER, 0)
    .pipeline(norm).buffer(0, c.handle, 0, 4096).buffer(1, w.handle, 0, 4096).buffer(2, a.handle, 0, 4096)
    .bytes(3, 0x3727c5ac, 256).rec(Op.DISPATCH_GROUPS, 0, 4, 1, 1, 256, 1, 1, 1)
    .rec(Op.SET_BUFFER64, 0, a.handle, 0, 0, 4096, 0);
  words.push(...raw.words);
  const r = rng(1234);
  let refused = 0, accepted = 0;
  const iterations = 20000;
  for (let i = 0; i < iterations; i++) {
    const mutated = Uint32Array.from(words);
    const flips = 1 + Math.floor(r() * 3);
    for (let f = 0; f < flips; f++) {
      const at = Math.floor(r() * mutated.length);
      const mode = r();
      mutated[at] = mode < 0.4
        ? (r() * 2 ** 32) >>> 0
        : mode < 0.7
        ? mutated[at]! ^ (1 << Math.floor(r() * 32))
        : Math.floor(r() * 8);
    }
    const cut = r() < 0.2 ? Math.floor(r() * mutated.length) * 4 : mutated.length * 4;
    const res = encodeRaw(device, new Uint8Array(mutated.buffer), cut);
    if (res.rc === Status.OK) accepted++;
    else refused++;
  }
  equal(accepted + refused, iterations);
  ok(refused > iterations / 2, `most corruptions must be refused (refused ${refused})`);
  equal(MlxDevice.liveObjects(device).commandBuffers, 0);
});

Deno.test("the TS encoder rejects bad dispatches before they reach native code", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  using a = device.alloc(64, DType.F32);
  using enc = device.commandEncoder();
  const add = registry.get("elementwise_add_f32");
  const bad = (d: Parameters<typeof enc.dispatch>[0], re: RegExp) => {
    try {
      enc.dispatch(d);
    } catch (e) {
      ok(e instanceof MlxError && e.code === "InvalidArgument", String(e));
      match((e as Error).message, re);
      return;
    }
    throw new Error("dispatch should have thrown");
  };
  const n = new Uint8Array(new Uint32Array([16]).buffer);
  bad({ pipeline: add, bindings: [a, a, a, n, a], grid: 16, threadgroup: 16 }, /5 bindings given/);
  bad({ pipeline: add, bindings: [a, a, n, n], grid: 16, threadgroup: 16 }, /slot 2 \(out\) needs an MlxBuffer/);
  bad({ pipeline: add, bindings: [a, a, a, a], grid: 16, threadgroup: 16 }, /slot 3 .* needs inline constants/);
  bad({ pipeline: add, bindings: [a, a, a, new Uint8Array(8)], grid: 16, threadgroup: 16 }, /takes 4 inline bytes/);
  bad({ pipeline: add, bindings: [a, a, a, n], grid: 0, threadgroup: 16 }, /grid/);
  bad({ pipeline: add, bindings: [a, a, a, n], grid: 16, threadgroup: [64, 32, 1] }, /at most 1024/);
  bad({ pipeline: add, bindings: [a, a, a, n], grid: 1.5, threadgroup: 1 }, /grid/);
  // Rejected only after three buffer records were written: the writer must rewind them.
  bad({ pipeline: add, bindings: [a, a, a, [-1]], grid: 16, threadgroup: 16 }, /word 0 is -1, not a u32/);
  bad({ pipeline: add, bindings: [a, a, a, [16, 0]], grid: 16, threadgroup: 16 }, /takes 4 inline bytes, got 8/);
  equal(enc.dispatchCount, 0);
  // The same encoder still encodes correctly: no half-written record reached the stream. A stale
  // binding of slot 2 would make the two-slot gelu fail natively ("slot 2 is bound").
  using x = device.upload([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], DType.F32, [16]);
  using y = device.alloc(64, DType.F32);
  using zeros = device.upload(new Float32Array(16)), g = device.upload(new Float32Array(16).fill(7));
  enc.dispatch({
    pipeline: registry.get("gelu_f32"),
    bindings: [zeros, g],
    grid: 16,
    threadgroup: 16,
    dispatchKind: "threads",
  });
  enc.dispatch({ pipeline: add, bindings: [x, x, y, [16]], grid: 16, threadgroup: 16 });
  enc.commitAndWait();
  deepStrictEqual(Array.from(g.read() as Float32Array), new Array(16).fill(0)); // gelu(0) = 0
  deepStrictEqual(Array.from(y.read() as Float32Array), Array.from({ length: 16 }, (_, i) => 2 * (i + 1)));
});
