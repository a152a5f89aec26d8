/**
 * Review of the automatic barriers placed by the native decoder for direct encoders: hostile
 * sequences (capture in the middle of a direct pass, plan records, many flushes) against the rule
 * that a dispatch conflicting with its concurrent group gets a barrier first.
 */
import { deepStrictEqual, equal } from "node:assert/strict";
import { DType } from "../mod.ts";
import { openDevice } from "./helpers.ts";

Deno.test("a capture in the middle of a direct pass does not make the direct encoder forget its group", () => {
  using device = openDevice({ backend: "cpu" });
  const add = { pipeline: device.kernels.get("elementwise_add_f32"), grid: 16, threadgroup: 16 } as const;
  using x = device.upload(new Float32Array(16).fill(1)), a = device.alloc(64, DType.F32);
  using b = device.alloc(64, DType.F32), c = device.alloc(64, DType.F32);
  for (const validate of [false, true]) {
    for (const touchNative of [false, true]) {
      using enc = device.commandEncoder({ autoBarriers: true, validate });
      if (touchNative) enc.trackDispatch([c], []); // the native tracker has seen a TRACK record
      enc.dispatch({ ...add, bindings: [x, x, a, [16]], dispatchKind: "threads" }); // writes a
      enc.startCapture();
      enc.dispatch({ ...add, bindings: [x, x, b, [16]], dispatchKind: "threads" }); // recorded only
      equal(enc.takeCapture()!.length, 1);
      enc.dispatch({ ...add, bindings: [a, x, b, [16]], dispatchKind: "threads" }); // reads a: RAW
      equal(enc.barrierCount, 1, `validate ${validate}, TRACK first ${touchNative}: the RAW on a`);
      deepStrictEqual(enc.groupStats().histogram, [0, 2]);
      enc.commit({ wait: true });
      deepStrictEqual([...b.read() as Float32Array], new Array(16).fill(3));
    }
  }
});
