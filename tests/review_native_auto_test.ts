/**
 * Review of the automatic barriers placed by the native decoder for direct encoders: hostile
 * sequences (capture in the middle of a direct pass, plan records, many flushes) against the rule
 * that a dispatch conflicting with its concurrent group gets a barrier first.
 */
import { deepStrictEqual, equal } from "node:assert/strict";
import fc from "fast-check";
import { DType, GraphExecutor } from "../mod.ts";
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

type R = { a: number; s: number; e: number; w: boolean };

Deno.test("property: the native tracker's interval sets against a brute-force scan (hundreds of byte ranges in one group)", () => {
  using device = openDevice({ backend: "cpu" });
  const SIZE = 4096;
  const allocs = [device.alloc(SIZE, DType.U8), device.alloc(SIZE, DType.U8)];
  using x = device.alloc(64, DType.F32);
  const add = { pipeline: device.kernels.get("elementwise_add_f32"), grid: 16, threadgroup: 16 } as const;
  // Short ranges at any byte (touching, nested, overlapping, adjacent), now and then a long one.
  const range = fc.record({
    a: fc.nat(1),
    s: fc.nat(SIZE - 1),
    len: fc.oneof({ weight: 8, arbitrary: fc.integer({ min: 0, max: 12 }) }, { weight: 1, arbitrary: fc.nat(300) }),
    w: fc.boolean(),
  }).map(({ a, s, len, w }) => ({ a, s, e: Math.min(SIZE, s + len), w }));
  const op = fc.record({
    check: fc.nat(4).map((k) => k === 0),
    ranges: fc.array(range, { minLength: 1, maxLength: 3 }),
  });
  try {
    fc.assert(
      fc.property(fc.array(op, { minLength: 1, maxLength: 400, size: "max" }), (ops) => {
        using enc = device.commandEncoder({ autoBarriers: false, validate: false });
        enc.dispatch({ ...add, bindings: [x, x, x, [16]], dispatchKind: "threads" }); // barriers may go after it
        let group: R[] = [], barriers = 0;
        ops.forEach((o, i) => {
          const reads = o.ranges.filter((r) => !r.w), writes = o.ranges.filter((r) => r.w);
          const tuple = (r: R): [number, number, number] => [allocs[r.a]!.allocId, r.s, r.e];
          if (o.check) {
            const hit = o.ranges.some((r) =>
              r.s < r.e && group.some((g) => g.a === r.a && g.s < r.e && r.s < g.e && (r.w || g.w))
            );
            if (hit) {
              barriers++;
              group = [];
            }
            enc.barrierBetween(reads.map(tuple), writes.map(tuple));
          } else enc.trackDispatch(reads.map(tuple), writes.map(tuple));
          group.push(...o.ranges.filter((r) => r.s < r.e));
          if (i % 7 === 0 || i === ops.length - 1) equal(enc.barrierCount, barriers, `op ${i}`);
        });
      }),
      { numRuns: 200, seed: 1603 },
    );
  } finally {
    allocs.forEach((a) => a.dispose());
  }
});

Deno.test("setting autoBarriers to the value it already has keeps the group (no silent race)", () => {
  using device = openDevice({ backend: "cpu" });
  const add = { pipeline: device.kernels.get("elementwise_add_f32"), grid: 16, threadgroup: 16 } as const;
  using x = device.upload(new Float32Array(16).fill(1)), a = device.alloc(64, DType.F32);
  using b = device.alloc(64, DType.F32);
  for (const validate of [false, true]) {
    using enc = device.commandEncoder({ autoBarriers: true, validate });
    enc.dispatch({ ...add, bindings: [x, x, a, [16]], dispatchKind: "threads" }); // writes a
    enc.autoBarriers = true; // already on
    enc.dispatch({ ...add, bindings: [a, x, b, [16]], dispatchKind: "threads" }); // reads a: RAW
    equal(enc.barrierCount, 1, `validate ${validate}`);
    enc.commit({ wait: true });
    deepStrictEqual([...b.read() as Float32Array], new Array(16).fill(3));
  }
  const exec = new GraphExecutor(device);
  for (const recorded of [false, true]) {
    using s = recorded ? exec.beginRecorded() : exec.begin();
    s.elementwiseAdd(x, x, a);
    s.encoder.autoBarriers = true;
    s.elementwiseAdd(a, x, b);
    deepStrictEqual(s.finish().barriers, [1], `recorded ${recorded}`);
  }
});

Deno.test("switching autoBarriers off and on again keeps the group: a dispatch after it conflicts with one before", () => {
  using device = openDevice({ backend: "cpu" });
  const add = { pipeline: device.kernels.get("elementwise_add_f32"), grid: 16, threadgroup: 16 } as const;
  using x = device.upload(new Float32Array(16).fill(1)), a = device.alloc(64, DType.F32);
  using b = device.alloc(64, DType.F32), c = device.alloc(64, DType.F32);
  for (const validate of [false, true]) {
    using enc = device.commandEncoder({ autoBarriers: true, validate });
    enc.dispatch({ ...add, bindings: [x, x, a, [16]], dispatchKind: "threads" }); // writes a (tracked)
    enc.autoBarriers = false;
    enc.dispatch({ ...add, bindings: [x, x, c, [16]], dispatchKind: "threads" }); // by hand: independent
    enc.autoBarriers = true;
    enc.dispatch({ ...add, bindings: [a, x, b, [16]], dispatchKind: "threads" }); // reads a: RAW
    equal(enc.barrierCount, 1, `validate ${validate}`);
    enc.commit({ wait: true });
    deepStrictEqual([...b.read() as Float32Array], new Array(16).fill(3));
  }
  const exec = new GraphExecutor(device);
  for (const recorded of [false, true]) {
    using s = recorded ? exec.beginRecorded() : exec.begin();
    s.elementwiseAdd(x, x, a);
    s.encoder.autoBarriers = false;
    s.elementwiseAdd(x, x, c);
    s.encoder.autoBarriers = true;
    s.elementwiseAdd(a, x, b);
    deepStrictEqual(s.finish().barriers, [1], `recorded ${recorded}`);
  }
});
