/**
 * Malformed byte ranges (NaN, fractional, negative, reversed) are rejected with InvalidArgument
 * wherever they enter the graph layer, instead of comparing as "no overlap" and hiding a race.
 */
import { equal, match, ok, throws } from "node:assert/strict";
import {
  BARRIER,
  CapturedOpKind as K,
  type DispatchNode,
  DType,
  findHazards,
  GraphExecutor,
  MlxError,
} from "../mod.ts";
import type { MemRange } from "../src/graph/ranges.ts";
import { testContext } from "./helpers.ts";

const invalid = (msg: RegExp) => (e: unknown) => {
  ok(e instanceof MlxError && e.code === "InvalidArgument", String(e));
  match((e as Error).message, msg);
  return true;
};

const node = (name: string, reads: MemRange[], writes: MemRange[]): DispatchNode => ({
  kind: "dispatch",
  pipeline: { name },
  opKind: K.Other,
  reads,
  writes,
});

Deno.test("findHazards rejects a malformed annotation and names the dispatch", () => {
  const producer = node("producer", [], [[1, 0, 128]]);
  // Read as numbers each of these would overlap the write and be a RAW race.
  for (const bad of [[1, NaN, 64], [1, 64, 0], [1, -64, 64], [1, 0.5, 64]] as MemRange[]) {
    throws(() => findHazards([producer, node("consumer", [bad], [])]), invalid(/dispatch 1 \(consumer\) reads/));
  }
  throws(() => findHazards([node("w", [], [[1, 8, 4]]), BARRIER]), invalid(/dispatch 0 \(w\) writes.*reversed/));
  equal(findHazards([producer, node("consumer", [[1, 64, 256]], [])]).length, 1); // a valid one is still found
});

Deno.test("barrierBetween and trackDispatch reject malformed ranges, direct and recorded", () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device);
  using x = device.upload(new Float32Array(64).fill(1));
  using a = device.alloc(256, DType.F32);
  for (const recorded of [false, true]) {
    using s = recorded ? exec.beginRecorded() : exec.begin({ autoBarriers: false });
    s.elementwiseAdd(x, x, a);
    const r = a.range();
    throws(() => s.barrierBetween([[r[0], NaN, 256]], []), invalid(/start is NaN/));
    throws(() => s.barrierBetween([], [[r[0], 256, 0]]), invalid(/reversed/));
    throws(() => s.trackDispatch([[r[0], -4, 16]], []), invalid(/start is negative/));
    throws(() => s.trackDispatch([], [[r[0], 0, 1.5]]), invalid(/end is not an integer/));
    s.barrierBetween([a], [x]); // a buffer view is always valid
  }
});
