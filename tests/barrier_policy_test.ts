/** BarrierPolicy's binding walk against the reference: accessesOf + ConflictTracker. */
import { deepStrictEqual, equal, throws } from "node:assert/strict";
import fc from "fast-check";
import { CapturedOpKind, ConflictTracker, DType, MlxError } from "../mod.ts";
import { BarrierPolicy } from "../src/barrier_policy.ts";
import { accessesOf, type MemRange } from "../src/graph/ranges.ts";
import type { KernelContract, SlotSpec } from "../src/kernels.ts";
import { openDevice } from "./helpers.ts";

const slotArb: fc.Arbitrary<SlotSpec> = fc.oneof(
  fc.constantFrom("read", "write", "readwrite", undefined).map((access) =>
    access === undefined
      ? { name: "b", kind: "buffer" as const }
      : { name: "b", kind: "buffer" as const, access: access as "read" | "write" | "readwrite" }
  ),
  fc.constant({ name: "c", kind: "bytes" as const }),
);

Deno.test("property: the policy's binding walk decides exactly as accessesOf + ConflictTracker", () => {
  using device = openDevice();
  const allocs = [device.alloc(64, DType.U8), device.alloc(64, DType.U8), device.alloc(64, DType.U8)];
  // Whole allocations, slices that overlap, touch and nest, an empty slice, and non-buffer bindings
  // that report a range (or not).
  const pool: unknown[] = [...allocs];
  for (const a of allocs) {
    for (const [o, n] of [[0, 16], [16, 16], [8, 24], [60, 4], [32, 0]] as [number, number][]) {
      pool.push(a.slice(o, n));
    }
  }
  const foreign = 1e6;
  pool.push({ range: (): MemRange => [foreign, 0, 8] }, { range: (): MemRange => [foreign, 4, 12] });
  pool.push(undefined, [1, 2], new Uint32Array(1));
  const dispatchArb = fc.record({
    slots: fc.array(slotArb, { minLength: 1, maxLength: 5 }),
    picks: fc.array(fc.nat(pool.length - 1), { maxLength: 6 }),
    resetOnConflict: fc.boolean(),
    barrier: fc.nat(15),
  });
  fc.assert(
    fc.property(fc.array(dispatchArb, { minLength: 1, maxLength: 60 }), (dispatches) => {
      const policy = new BarrierPolicy(true), reference = new ConflictTracker();
      for (const d of dispatches) {
        const contract: KernelContract = { name: "k", slots: d.slots, opKind: CapturedOpKind.Other };
        const bindings = d.picks.map((k) => pool[k]);
        const acc = accessesOf(contract, bindings);
        const expected = reference.conflicts(acc.reads, acc.writes);
        equal(policy.stageDispatch(contract, bindings), expected);
        equal(policy.conflicts(acc.reads, acc.writes), expected);
        if ((expected && d.resetOnConflict) || d.barrier === 0) {
          policy.forget();
          reference.reset();
        }
        if (d.barrier === 1) policy.track(acc.reads, acc.writes); // the list form records the same
        else policy.trackStaged();
        reference.add(acc.reads, acc.writes);
      }
    }),
    { numRuns: 300, seed: 16 },
  );
});

Deno.test("a binding whose range() is malformed is refused, not treated as touching nothing", () => {
  const contract: KernelContract = {
    name: "k",
    slots: [{ name: "x", kind: "buffer", access: "read" }],
    opKind: CapturedOpKind.Other,
  };
  const policy = new BarrierPolicy(true);
  policy.track([], [[1, 0, 8]]);
  const bad = { range: () => [1, Number.NaN, 8] as unknown as MemRange };
  const isInvalid = (e: unknown) =>
    e instanceof MlxError && e.code === "InvalidArgument" && /k: slot 0 \(x\) range\(\).*NaN/.test(e.message);
  throws(() => policy.stageDispatch(contract, [bad]), isInvalid);
});

Deno.test("group statistics: counts and the histogram, wide groups and the open group included", () => {
  const sizes = [1, 3, 64, 1, 200, 63, 3]; // the last group stays open
  const policy = new BarrierPolicy(false);
  sizes.forEach((size, i) => {
    if (i > 0) policy.endGroup();
    for (let k = 0; k < size; k++) policy.dispatched();
  });
  const dispatches = sizes.reduce((a, b) => a + b, 0);
  const stats = policy.stats(dispatches);
  const expected = new Array(201).fill(0);
  for (const size of sizes) expected[size]++;
  deepStrictEqual(
    { dispatches: stats.dispatches, groups: stats.groups, mean: stats.meanGroupSize, histogram: stats.histogram },
    { dispatches, groups: sizes.length, mean: dispatches / sizes.length, histogram: expected },
  );
  policy.endGroup();
  for (let k = 0; k < 5; k++) policy.dispatched();
  deepStrictEqual(stats.histogram, expected, "a snapshot: later groups do not change it");
  equal(policy.stats(dispatches + 5).groups, sizes.length + 1);
  deepStrictEqual(new BarrierPolicy(true).stats(0), { dispatches: 0, groups: 0, meanGroupSize: 0, histogram: [] });
});
