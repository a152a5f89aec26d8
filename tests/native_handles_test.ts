/**
 * Buffer handles at the C ABI: a handle names one buffer of one device for good. A buffer of one
 * device bound on another is refused, and a handle stays dead after its slot is reused thousands
 * of times (the slot is retired before its generation would wrap).
 */
import { equal, match, notEqual, ok, throws } from "node:assert/strict";
import { DType, MlxError } from "../mod.ts";
import { Status } from "../src/native/abi.ts";
import { lastErrorText } from "../src/native/status.ts";
import { testContext } from "./helpers.ts";

Deno.test("a buffer of one device bound on another is refused, naming the cause", () => {
  using a = testContext();
  using b = testContext();
  using onA = a.device.upload(new Float32Array([1, 2, 3, 4]));
  using onB = b.device.upload(new Float32Array([10, 20, 30, 40]));
  using out = b.device.alloc(16, DType.F32);
  notEqual(onA.handle, onB.handle, "two live buffers share a handle across devices");
  using enc = b.device.commandEncoder();
  throws(
    () => {
      enc.dispatch({
        pipeline: b.device.kernels.get("elementwise_add_f32"),
        bindings: [onA, onB, out, new Uint8Array(new Uint32Array([4]).buffer)],
        grid: 4,
        threadgroup: 4,
        dispatchKind: "threads",
      });
      enc.commitAndWait();
    },
    (e: unknown) => e instanceof MlxError && /belongs to another device/.test(e.message),
  );
  // The raw ABI refuses it too: read, write and free of a foreign handle.
  const sym = b.device.sym, dev = b.device.devicePtr();
  const host = new Uint8Array(4);
  equal(sym.mlxn_buffer_read(dev, onA.handle, 0n, host, 4n), Status.E_BAD_HANDLE);
  match(lastErrorText(sym), /belongs to another device/);
  equal(sym.mlxn_buffer_free(dev, onA.handle), Status.E_BAD_HANDLE);
  deepEqualF32(onA.read() as Float32Array, [1, 2, 3, 4]);
});

function deepEqualF32(got: Float32Array, want: number[]) {
  equal(got.length, want.length);
  for (let i = 0; i < want.length; i++) equal(got[i], want[i], `element ${i}`);
}

Deno.test("a buffer handle never repeats: a slot whose generation is used up is retired", () => {
  using ctx = testContext();
  const { device } = ctx;
  const sym = device.sym, dev = device.devicePtr();
  const first = sym.mlxn_buffer_alloc(dev, 16n);
  notEqual(first, 0);
  equal(sym.mlxn_buffer_free(dev, first), Status.OK);
  const seen = new Set<number>([first]);
  // LIFO reuse sends every cycle to the same slot: 4,096 generations, then it must not wrap.
  for (let i = 0; i < 5000; i++) {
    const h = sym.mlxn_buffer_alloc(dev, 16n);
    notEqual(h, 0, lastErrorText(sym));
    ok(!seen.has(h), `cycle ${i}: handle 0x${h.toString(16)} came back`);
    seen.add(h);
    equal(sym.mlxn_buffer_free(dev, h), Status.OK);
  }
  // The first handle stays dead while a buffer lives in its former slot's successors.
  using live = device.alloc(16);
  const host = new Uint8Array(16);
  equal(sym.mlxn_buffer_read(dev, first, 0n, host, 16n), Status.E_BAD_HANDLE);
  match(lastErrorText(sym), /freed|stale/);
  ok(!seen.has(live.handle));
});

Deno.test("a bad handle's error names the cause: freed, freed while in use, never allocated", () => {
  using ctx = testContext();
  const sym = ctx.device.sym, dev = ctx.device.devicePtr();
  const host = new Uint8Array(4);
  const readError = (h: number) => {
    equal(sym.mlxn_buffer_read(dev, h, 0n, host, 4n), Status.E_BAD_HANDLE);
    return lastErrorText(sym);
  };
  const freed = sym.mlxn_buffer_alloc(dev, 16n);
  equal(sym.mlxn_buffer_free(dev, freed), Status.OK);
  match(readError(freed), /was freed \(a stale handle\)/);
  // Freed by the host while a command buffer still holds it: its memory waits, the handle is dead.
  const held = sym.mlxn_buffer_alloc(dev, 16n);
  const cb = sym.mlxn_cmdbuf_new(dev)!;
  const bind = new Uint8Array(Uint32Array.from([(2 << 16) | 9, held]).buffer);
  equal(sym.mlxn_cmdbuf_encode(cb, bind, bind.byteLength), Status.OK);
  equal(sym.mlxn_buffer_free(dev, held), Status.OK);
  match(readError(held), /was freed \(a stale handle\)/);
  sym.mlxn_cmdbuf_free(cb);
  match(readError(0x000f_fffe), /was never allocated/);
});
