/**
 * BarrierPolicy's staged walk (one table probe per range, kept from the check to the add) and its
 * pooled tracking structures, against a brute-force scan of every access of the group.
 */
import { equal } from "node:assert/strict";
import fc from "fast-check";
import { CapturedOpKind, DType, GraphExecutor } from "../mod.ts";
import { BarrierPolicy } from "../src/barrier_policy.ts";
import type { MemRange } from "../src/graph/ranges.ts";
import type { KernelContract } from "../src/kernels.ts";
import { openDevice } from "./helpers.ts";

/** Every access of the group, scanned in full: the rule without any structure. */
class BruteForceGroup {
  readonly #accesses: { range: MemRange; write: boolean }[] = [];

  reset(): void {
    this.#accesses.length = 0;
  }

  conflicts(range: MemRange, write: boolean): boolean {
    const [a, s, e] = range;
    if (s >= e) return false;
    return this.#accesses.some((x) =>
      (write || x.write) && x.range[0] === a && x.range[1] < e && s < x.range[2] && x.range[1] < x.range[2]
    );
  }

  add(range: MemRange, write: boolean): void {
    this.#accesses.push({ range, write });
  }
}

type Access = "read" | "write" | "readwrite";

function contractOf(accesses: readonly Access[]): KernelContract {
  return {
    name: "k",
    slots: accesses.map((access, i) => ({ name: `s${i}`, kind: "buffer" as const, access })),
    opKind: CapturedOpKind.Other,
  };
}

const ranged = (r: MemRange) => ({ range: (): MemRange => r });

// Up to 90 allocations (the table grows while a dispatch is staged) and a small address space per
// allocation, so ranges overlap partially, touch, nest, repeat and are empty.
const rangeArb: fc.Arbitrary<MemRange> = fc.tuple(
  fc.integer({ min: 1, max: 90 }),
  fc.integer({ min: 0, max: 24 }),
  fc.integer({ min: 0, max: 6 }),
).map(([a, s, len]) => [a, s * 8, (s + len) * 8]);
const accessArb = fc.constantFrom<Access>("read", "write", "readwrite");

const opArb = fc.oneof(
  {
    weight: 16,
    arbitrary: fc.record({
      kind: fc.constant("dispatch" as const),
      policy: fc.nat(2),
      accesses: fc.array(fc.tuple(accessArb, rangeArb), { minLength: 1, maxLength: 5 }),
      barrierOnConflict: fc.boolean(),
      // Extra accesses tracked through the list form between the check and the add (the table may
      // grow or its slots move in between).
      between: fc.option(fc.array(rangeArb, { minLength: 1, maxLength: 40 }), { freq: 6 }),
    }),
  },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("forget" as const), policy: fc.nat(2) }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("release" as const), policy: fc.nat(2) }) },
);

Deno.test("property: staged checks and adds answer as a brute-force scan, for interleaved policies sharing the pool", () => {
  fc.assert(
    fc.property(fc.array(opArb, { minLength: 1, maxLength: 250 }), (ops) => {
      const policies = [new BarrierPolicy(true), new BarrierPolicy(true), new BarrierPolicy(true)];
      const groups = [new BruteForceGroup(), new BruteForceGroup(), new BruteForceGroup()];
      for (const op of ops) {
        const policy = policies[op.policy]!, group = groups[op.policy]!;
        if (op.kind !== "dispatch") {
          if (op.kind === "forget") policy.forget();
          else policy.release(); // its group is forgotten; the structures go to the pool
          group.reset();
          continue;
        }
        const contract = contractOf(op.accesses.map(([access]) => access));
        const bindings = op.accesses.map(([, r]) => ranged(r));
        const expected = op.accesses.some(([access, r]) => group.conflicts(r, access !== "read"));
        equal(policy.stageDispatch(contract, bindings), expected);
        if (expected && op.barrierOnConflict) {
          policy.forget();
          group.reset();
        }
        if (op.between !== null) {
          policy.track([], op.between);
          for (const r of op.between) group.add(r, true);
        }
        policy.trackStaged();
        for (const [access, r] of op.accesses) group.add(r, access !== "read");
      }
    }),
    { numRuns: 300, seed: 1616 },
  );
});

Deno.test("property: 800 slices of one buffer in any order stay one group; any write across them conflicts", () => {
  using device = openDevice();
  using wide = device.alloc(800 * 16, DType.U8);
  const slices = Array.from({ length: 800 }, (_, i) => wide.slice(i * 16, 16));
  const write = contractOf(["write"]), read = contractOf(["read"]);
  fc.assert(
    fc.property(
      fc.constantFrom("forward", "reversed", "shuffled"),
      fc.integer({ min: 0, max: 2 ** 31 - 1 }),
      fc.nat(800 * 16 - 1),
      fc.integer({ min: 0, max: 40 }),
      (order, seed, probeStart, probeLength) => {
        const indices = Array.from({ length: 800 }, (_, i) => i);
        if (order === "reversed") indices.reverse();
        if (order === "shuffled") {
          let x = seed || 1;
          for (let i = indices.length - 1; i > 0; i--) {
            x = (Math.imul(x, 1103515245) + 12345) >>> 0;
            const j = x % (i + 1);
            [indices[i], indices[j]] = [indices[j]!, indices[i]!];
          }
        }
        const policy = new BarrierPolicy(true);
        let conflicts = 0;
        for (const i of indices) {
          if (policy.stageDispatch(write, [slices[i]])) conflicts++;
          policy.trackStaged();
        }
        equal(conflicts, 0, "disjoint slices never conflict");
        const end = Math.min(probeStart + probeLength, 800 * 16);
        const probe = { range: (): MemRange => [wide.allocId, probeStart, end] };
        equal(policy.stageDispatch(read, [probe]), end > probeStart, "every byte was written");
        policy.release();
      },
    ),
    { numRuns: 40, seed: 800 },
  );
});

Deno.test("sessions reusing the pooled tracker place the same barriers as a fresh one", () => {
  using device = openDevice();
  const exec = new GraphExecutor(device);
  const n = 300, elems = 16;
  const x = device.upload(new Float32Array(elems).fill(1));
  const outs = Array.from({ length: n }, () => device.alloc(elems * 4, DType.F32));
  // Independent writes into 300 allocations: one group. Then a chain through them: a barrier per link.
  for (let pass = 0; pass < 3; pass++) {
    const independent = exec.begin({ autoBarriers: true });
    for (const out of outs) independent.elementwiseAdd(x, x, out);
    equal(independent.finish().barriers[0], 0, `pass ${pass}: independent writes need no barrier`);
    const chain = exec.begin({ autoBarriers: true });
    for (let i = 1; i < n; i++) chain.elementwiseAdd(outs[i - 1]!, x, outs[i]!);
    equal(chain.finish().barriers[0], n - 2, `pass ${pass}: each link after the first needs one`);
  }
  equal(outs[n - 1]!.read()[0], 2 + (n - 1), "the chain ran in order (outs[0] = 1 + 1)");
  for (const b of [x, ...outs]) b.dispose();
});
