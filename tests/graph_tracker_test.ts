/** ConflictTracker rules (pure: no device, no permission). */
import { deepStrictEqual, equal, throws } from "node:assert/strict";
import fc from "fast-check";
import { ConflictTracker, MlxError } from "../mod.ts";
import { ByteIntervals } from "../src/graph/tracker.ts";
import type { MemRange } from "../src/graph/ranges.ts";

const A = (s: number, e: number): MemRange => [1, s, e];
const B = (s: number, e: number): MemRange => [2, s, e];
const isInvalid = (msg: RegExp) => (e: unknown) =>
  e instanceof MlxError && e.code === "InvalidArgument" && msg.test(e.message);

Deno.test("read after read never conflicts", () => {
  const t = new ConflictTracker();
  t.add([A(0, 64)], []);
  equal(t.conflicts([A(0, 64)], []), false);
});

Deno.test("RAW, WAR and WAW conflict, with the right reason", () => {
  const t = new ConflictTracker();
  t.add([A(0, 64)], [B(0, 64)]);
  deepStrictEqual(t.conflictReason([B(32, 40)], []), { kind: "RAW", incoming: B(32, 40), existing: B(0, 64) });
  deepStrictEqual(t.conflictReason([], [A(60, 70)]), { kind: "WAR", incoming: A(60, 70), existing: A(0, 64) });
  deepStrictEqual(t.conflictReason([], [B(0, 1)]), { kind: "WAW", incoming: B(0, 1), existing: B(0, 64) });
});

Deno.test("different allocations never conflict; disjoint slices of one allocation do not either", () => {
  const t = new ConflictTracker();
  t.add([], [A(0, 64)]);
  equal(t.conflicts([B(0, 64)], [B(0, 64)]), false);
  // Exact ranges, strict overlap: [0,64) and [64,128) share no byte (the seed ran ranges to the end of
  // the allocation and serialised these).
  equal(t.conflicts([A(64, 128)], [A(64, 128)]), false);
  equal(t.conflicts([A(63, 64)], []), true);
});

Deno.test("reset clears the group", () => {
  const t = new ConflictTracker();
  t.add([], [A(0, 8)]);
  equal(t.size, 1);
  t.reset();
  equal(t.size, 0);
  equal(t.conflicts([A(0, 8)], [A(0, 8)]), false);
});

Deno.test("conflicts are symmetric between two dispatches", () => {
  const cases: [MemRange[], MemRange[], MemRange[], MemRange[]][] = [
    [[A(0, 8)], [], [], [A(4, 12)]], // WAR one way, RAW the other
    [[], [A(0, 8)], [], [A(4, 12)]], // WAW
    [[A(0, 8)], [], [A(0, 8)], []], // RAR: none
  ];
  for (const [r1, w1, r2, w2] of cases) {
    const t1 = new ConflictTracker(), t2 = new ConflictTracker();
    t1.add(r1, w1);
    t2.add(r2, w2);
    equal(t1.conflicts(r2, w2), t2.conflicts(r1, w1));
  }
});

Deno.test("a sequential chain needs one barrier per link", () => {
  const t = new ConflictTracker();
  let barriers = 0;
  // x0 → x1 → x2 → … each step reads the previous output.
  for (let i = 0; i < 10; i++) {
    const reads = i === 0 ? [] : [A((i - 1) * 64, i * 64)], writes = [A(i * 64, (i + 1) * 64)];
    if (t.conflicts(reads, writes)) {
      barriers++;
      t.reset();
    }
    t.add(reads, writes);
  }
  equal(barriers, 9);
});

Deno.test("the tracker grows past its initial capacity", () => {
  const t = new ConflictTracker();
  for (let i = 0; i < 1000; i++) t.add([A(i * 8, i * 8 + 8)], []);
  equal(t.size, 1000);
  equal(t.conflicts([], [A(7992, 8000)]), true);
  equal(t.conflicts([], [A(8000, 8008)]), false);
});

// ---- range validation ---------------------------------------------------------------------------

const BAD_RANGES: [string, MemRange][] = [
  ["NaN start", [1, NaN, 64]],
  ["NaN end", [1, 0, NaN]],
  ["reversed", [1, 64, 0]],
  ["negative start", [1, -8, 64]],
  ["fractional end", [1, 0, 63.5]],
  ["NaN allocation", [NaN, 0, 64]],
  ["infinite end", [1, 0, Infinity]],
  ["a pair, not a triple", [1, 0] as unknown as MemRange],
];

Deno.test("the tracker rejects NaN, fractional, negative and reversed ranges instead of missing a race", () => {
  for (const [why, bad] of BAD_RANGES) {
    const t = new ConflictTracker();
    t.add([], [A(0, 64)]);
    // Each of these overlaps the recorded write if read as numbers, or is meaningless: never "no conflict".
    throws(() => t.conflicts([bad], []), isInvalid(/invalid byte range/), why);
    throws(() => t.conflicts([], [bad]), isInvalid(/invalid byte range/), why);
    throws(() => t.conflictReason([bad], []), isInvalid(/invalid byte range/), why);
    throws(() => t.add([bad], []), isInvalid(/invalid byte range/), why);
    throws(() => t.add([], [bad]), isInvalid(/invalid byte range/), why);
  }
  const t = new ConflictTracker();
  throws(() => t.conflicts([[1, 64, 0]], []), isInvalid(/reversed \(end < start\)/));
  throws(() => t.conflicts([[1, NaN, 8]], []), isInvalid(/start is NaN/));
  throws(() => t.add(undefined as unknown as MemRange[], []), isInvalid(/expected an array of byte ranges/));
  // An empty range is valid and touches nothing.
  t.add([], [A(0, 64)]);
  equal(t.conflicts([A(8, 8)], [A(16, 16)]), false);
});

// ---- against the quadratic definition -----------------------------------------------------------

/** The seed's definition: scan every recorded range (a read conflicts with writes, a write with all). */
class QuadraticTracker {
  #ranges: { r: MemRange; write: boolean }[] = [];
  reset() {
    this.#ranges = [];
  }
  add(reads: MemRange[], writes: MemRange[]) {
    for (const r of reads) this.#ranges.push({ r, write: false });
    for (const r of writes) this.#ranges.push({ r, write: true });
  }
  /** The first conflict: reads before writes, each against the recorded ranges in order. */
  reason(reads: MemRange[], writes: MemRange[]) {
    // Shares a byte: same allocation, strict overlap, neither empty.
    const hits = (x: MemRange, y: MemRange) =>
      x[0] === y[0] && x[1] < y[2] && y[1] < x[2] && x[1] < x[2] && y[1] < y[2];
    for (const r of reads) {
      for (const e of this.#ranges) if (e.write && hits(r, e.r)) return { kind: "RAW", incoming: r, existing: e.r };
    }
    for (const w of writes) {
      for (const e of this.#ranges) {
        if (hits(w, e.r)) return { kind: e.write ? "WAW" : "WAR", incoming: w, existing: e.r };
      }
    }
    return null;
  }
}

// Few allocations and a small address space, so slices overlap, touch, nest and repeat often.
const rangeArb: fc.Arbitrary<MemRange> = fc.tuple(
  fc.integer({ min: 1, max: 3 }),
  fc.integer({ min: 0, max: 40 }),
  fc.integer({ min: 0, max: 12 }),
).map(([a, s, len]) => [a, s * 4, (s + len) * 4]);
const opArb = fc.oneof(
  {
    weight: 12,
    arbitrary: fc.record({ reads: fc.array(rangeArb, { maxLength: 3 }), writes: fc.array(rangeArb, { maxLength: 2 }) }),
  },
  { weight: 1, arbitrary: fc.constant("reset" as const) },
);

Deno.test("property: the interval tracker answers exactly as the quadratic scan, on every step", () => {
  fc.assert(
    fc.property(fc.array(opArb, { minLength: 1, maxLength: 200 }), (ops) => {
      const fast = new ConflictTracker(), slow = new QuadraticTracker();
      for (const op of ops) {
        if (op === "reset") {
          fast.reset();
          slow.reset();
          continue;
        }
        const expected = slow.reason(op.reads, op.writes);
        equal(fast.conflicts(op.reads, op.writes), expected !== null);
        deepStrictEqual(fast.conflictReason(op.reads, op.writes), expected);
        // Like the barrier pass: a conflict starts a new group half the time, else the group grows.
        if (expected && op.reads.length % 2 === 0) {
          fast.reset();
          slow.reset();
        }
        fast.add(op.reads, op.writes);
        slow.add(op.reads, op.writes);
      }
    }),
    { numRuns: 400, seed: 16 },
  );
});

Deno.test("property: hundreds of disjoint slices of one allocation, in any order, conflict only where they overlap", () => {
  fc.assert(
    fc.property(
      fc.shuffledSubarray(Array.from({ length: 300 }, (_, i) => i), { minLength: 1 }),
      fc.nat(1200),
      (slots, probe) => {
        const t = new ConflictTracker();
        for (const k of slots) t.add([], [A(k * 4, k * 4 + 4)]);
        const taken = new Set(slots);
        const p = A(probe, probe + 6); // spans 2 or 3 slots
        let expected = false;
        for (let k = Math.floor(probe / 4); k <= Math.floor((probe + 5) / 4); k++) expected ||= taken.has(k);
        equal(t.conflicts([p], []), expected);
        equal(t.conflicts([], [p]), expected);
      },
    ),
    { numRuns: 300, seed: 8 },
  );
});

Deno.test("property: ByteIntervals holds exactly the union of the added ranges (blocks of 2, 3 and 64)", () => {
  // Short spans and now and then a long one, in any order: with small blocks, inserts split blocks
  // and merges span several of them. Once at 0 and once at the top of the safe integers (the last
  // byte is 2^53 - 2, so ends and the searches' end + 1 stay exact).
  const span = fc.oneof(
    { weight: 12, arbitrary: fc.tuple(fc.nat(250), fc.nat(6)) },
    { weight: 1, arbitrary: fc.tuple(fc.nat(250), fc.nat(90)) },
  ).map(([s, len]) => [s, Math.min(256, s + len)] as const);
  const runsOf = (bytes: Uint8Array) => {
    let runs = 0;
    for (let b = 0; b < bytes.length; b++) if (bytes[b] && (b === 0 || !bytes[b - 1])) runs++;
    return runs;
  };
  for (const base of [0, Number.MAX_SAFE_INTEGER - 256]) {
    for (const blockSize of [2, 3, 64]) {
      fc.assert(
        fc.property(
          fc.array(span, { maxLength: 160 }),
          fc.array(span, { minLength: 1, maxLength: 20 }),
          (adds, probes) => {
            const set = new ByteIntervals(blockSize), bytes = new Uint8Array(256);
            adds.forEach(([s, e], k) => {
              set.add(base + s, base + e);
              bytes.fill(1, s, e);
              if (k % 16 !== 15 && k !== adds.length - 1) return;
              equal(set.intervalCount, runsOf(bytes), "touching and overlapping ranges merge");
              for (let b = 0; b < bytes.length; b++) {
                equal(set.intersects(base + b, base + b + 1), bytes[b] === 1, `byte ${b}`);
              }
            });
            for (const [s, e] of probes) equal(set.intersects(base + s, base + e), bytes.subarray(s, e).includes(1));
            set.clear(); // reused after a clear, as a tracker's sets are after a barrier
            equal(set.intervalCount, 0);
            equal(set.intersects(base, base + 256), false);
            set.add(base + 5, base + 9);
            equal(set.intersects(base + 8, base + 12), true);
            equal(set.intersects(base + 9, base + 12), false);
          },
        ),
        { numRuns: 400, seed: 21 + blockSize },
      );
    }
  }
  throws(() => new ByteIntervals(1), RangeError);
});

Deno.test("property: groups over many allocations with split intervals answer as the quadratic scan, across resets", () => {
  // Up to 12 allocations and sparse slices, so an allocation's bytes split into several intervals,
  // with the same tracker reused after each reset.
  const wideRange: fc.Arbitrary<MemRange> = fc.tuple(
    fc.integer({ min: 1, max: 12 }),
    fc.integer({ min: 0, max: 20 }),
    fc.integer({ min: 0, max: 3 }),
  ).map(([a, s, len]) => [a, s * 16, (s + len) * 16]);
  const wideOp = fc.oneof(
    {
      weight: 20,
      arbitrary: fc.record({
        reads: fc.array(wideRange, { maxLength: 3 }),
        writes: fc.array(wideRange, { maxLength: 2 }),
      }),
    },
    { weight: 1, arbitrary: fc.constant("reset" as const) },
  );
  fc.assert(
    fc.property(fc.array(wideOp, { minLength: 1, maxLength: 300 }), (ops) => {
      const fast = new ConflictTracker(), slow = new QuadraticTracker();
      for (const op of ops) {
        if (op === "reset") {
          fast.reset();
          slow.reset();
          continue;
        }
        const expected = slow.reason(op.reads, op.writes);
        equal(fast.conflicts(op.reads, op.writes), expected !== null);
        if (expected && op.writes.length === 0) { // start a new group on some conflicts only
          fast.reset();
          slow.reset();
        }
        fast.add(op.reads, op.writes);
        slow.add(op.reads, op.writes);
      }
    }),
    { numRuns: 400, seed: 1616 },
  );
});
