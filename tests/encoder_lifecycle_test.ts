/**
 * The device's open command buffers under random lifecycles: encoders opened, committed, disposed
 * and left open in any order while buffers they bind are freed (every open stream is flushed first)
 * and at device close (the open ones are disposed, the rest keep their outcome).
 */
import { deepStrictEqual, equal, ok, throws } from "node:assert/strict";
import { type CommandEncoder, DType, type MlxBuffer, MlxDevice, MlxError, ops } from "../mod.ts";
import { rng, testContext } from "./helpers.ts";

const isCode = (code: string) => (e: unknown) => e instanceof MlxError && e.code === code;

interface Open {
  enc: CommandEncoder;
  out: MlxBuffer;
  expect: number; // out's value once the encoder ran
}

for (const seed of [1, 2, 3, 4, 5, 6]) {
  Deno.test(`random encoder lifecycles keep every open stream flushed and accounted for (seed ${seed})`, () => {
    const ctx = testContext();
    const { device, registry } = ctx;
    const random = rng(seed);
    const pick = <T>(list: T[]): T => list.splice(Math.floor(random() * list.length), 1)[0]!;
    const n = 16;
    const baseline = MlxDevice.liveObjects(device).commandBuffers;
    let open: Open[] = [];
    const ran: Open[] = [], dropped: Open[] = [];
    // Inputs shared by the open encoders; freeing one flushes every open stream that names it.
    let input = device.upload(new Float32Array(n).fill(1));
    let inputValue = 1;
    for (let step = 0; step < 300; step++) {
      const r = random();
      if (r < 0.4 || open.length === 0) {
        const enc = device.commandEncoder();
        const out = device.alloc(n * 4, DType.F32);
        const k = step + 2;
        const addend = device.upload(new Float32Array(n).fill(k));
        ops.elementwiseAdd(enc, registry, input, addend, out); // out = input + k
        addend.dispose(); // freed while only this open stream names it
        open.push({ enc, out, expect: inputValue + k });
      } else if (r < 0.6) {
        const o = pick(open);
        o.enc.commitAndWait();
        equal(o.enc.state, "completed");
        ran.push(o);
      } else if (r < 0.75) {
        const o = pick(open);
        o.enc.dispose();
        equal(o.enc.state, "disposed");
        throws(() => o.enc.dispatch(undefined as never), isCode("Disposed"));
        dropped.push(o);
      } else if (r < 0.9) {
        // Free the input every open encoder reads: their records must reach the native side first.
        input.dispose();
        inputValue = 1 + Math.floor(random() * 100);
        input = device.upload(new Float32Array(n).fill(inputValue));
      } else if (open.length > 0) {
        // A commit that is never waited for here: the device waits at close.
        const o = pick(open);
        o.enc.commit();
        ran.push(o);
      }
    }
    // Half of the still-open encoders run now; the device closes under the rest.
    const left = open.length;
    for (let i = 0; i < left / 2; i++) {
      const o = pick(open);
      o.enc.commitAndWait();
      ran.push(o);
    }
    for (const o of ran) {
      o.enc.waitUntilCompleted();
      deepStrictEqual(Array.from(o.out.read() as Float32Array), new Array(n).fill(o.expect));
    }
    for (const o of dropped) ok((o.out.read() as Float32Array).every((v) => v === 0), "disposed work never ran");
    for (const o of open) ok((o.out.read() as Float32Array).every((v) => v === 0), "open work has not run");
    ok(ran.length > 20 && dropped.length > 5, `a mix of outcomes (${ran.length} ran, ${dropped.length} dropped)`);
    const stillOpen = open;
    open = [];
    device.close();
    for (const o of stillOpen) {
      equal(o.enc.state, "disposed", "an encoder open at close is disposed");
      throws(() => o.enc.commit(), isCode("Disposed"));
    }
    for (const o of ran) equal(o.enc.state, "completed", "committed encoders keep their outcome");
    equal(MlxDevice.liveObjects(device).commandBuffers, baseline, "the rest are detached");
    for (const o of ran) o.enc.dispose();
  });
}

Deno.test("an encoder whose stream the device flushes and rejects is failed and leaves the open list", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const n = 8;
  using a = device.upload(new Float32Array(n).fill(1));
  using out = device.alloc(n * 4, DType.F32);
  const good = device.commandEncoder();
  ops.elementwiseAdd(good, registry, a, a, out);
  const bad = device.commandEncoder();
  // A record the native decoder refuses (a pipeline handle that does not exist), written raw.
  bad.dispatch({
    pipeline: Object.assign(Object.create(Object.getPrototypeOf(registry.get("gelu_f32"))), {
      ...registry.get("gelu_f32"),
      handle: 0x7fff_fff0,
    }),
    bindings: [a, out],
    grid: n,
    threadgroup: n,
    dispatchKind: "threads",
  });
  const tmp = device.alloc(16);
  // The device's flush before the free meets the rejected stream: the free still happens, and the
  // rejection is kept for the stream's own encoder, which reports it.
  tmp.dispose();
  equal(bad.state, "failed", "the rejected stream's encoder failed");
  throws(() => bad.commit(), (e: unknown) => e instanceof MlxError && /stream was rejected/.test(e.message));
  bad.dispose();
  tmp.dispose(); // the failed stream left the open list: this flush reaches only the good one
  good.commitAndWait();
  deepStrictEqual(Array.from(out.read() as Float32Array), new Array(n).fill(2));
  good.dispose();
});
