/** ConflictTracker rules (pure: no device, no permission). */
import { deepStrictEqual, equal } from "node:assert/strict";
import { ConflictTracker } from "../mod.ts";
import type { MemRange } from "../src/graph/ranges.ts";

const A = (s: number, e: number): MemRange => [1, s, e];
const B = (s: number, e: number): MemRange => [2, s, e];

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
