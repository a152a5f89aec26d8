/**
 * Review of the recorded-session hit path (capture as stream words, nodes and automatic barriers
 * derived on a plan-cache miss, the byte-compared plan-cache key): hostile cases against what a
 * session placing its barriers per dispatch gives.
 */
import { deepStrictEqual, equal } from "node:assert/strict";
import { DType, GraphExecutor } from "../mod.ts";
import { openDevice } from "./helpers.ts";

Deno.test("recorded session: automatic barriers follow the setting each dispatch was recorded under", () => {
  using device = openDevice({ backend: "cpu" });
  const E = 64;
  using x = device.upload(new Float32Array(E).fill(1)), y = device.upload(new Float32Array(E).fill(2));
  using a = device.alloc(E * 4, DType.F32), b = device.alloc(E * 4, DType.F32);
  using c = device.alloc(E * 4, DType.F32), d = device.alloc(E * 4, DType.F32);
  for (const planCache of [true, false]) {
    const exec = new GraphExecutor(device, { planCache });
    for (let pass = 0; pass < 3; pass++) {
      // Recorded with automatic barriers: a = x + y, then b = a + y (RAW on a: a barrier). Then
      // the setting goes off: c = b + y and d = c + y are the user's to separate (they are not).
      using s = exec.beginRecorded();
      s.elementwiseAdd(x, y, a);
      s.elementwiseAdd(a, y, b);
      s.encoder.autoBarriers = false;
      s.elementwiseAdd(x, y, c);
      s.elementwiseAdd(x, y, d);
      const r = s.finish();
      deepStrictEqual(r.barriers, [1], `cache ${planCache}, pass ${pass}: the barrier of the auto part`);
      equal(r.groups, 2);
      deepStrictEqual([...b.read() as Float32Array], new Array(E).fill(5));
    }
    // The other way round: hand-placed first, automatic after the switch; as a direct session places them.
    for (const recorded of [true, false]) {
      using s = recorded ? exec.beginRecorded({ autoBarriers: false }) : exec.begin({ autoBarriers: false });
      s.elementwiseAdd(x, y, a);
      s.elementwiseAdd(x, y, c); // independent: no barrier either way
      s.encoder.autoBarriers = true;
      s.elementwiseAdd(c, y, b);
      s.elementwiseAdd(b, y, d); // RAW on b: a barrier
      deepStrictEqual(s.finish().barriers, [1], `cache ${planCache}, recorded ${recorded}: the auto part's barrier`);
    }
  }
});
