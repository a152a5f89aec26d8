/**
 * A capture the caller takes as nodes (`startCapture` / `takeCapture`) binds the very views the
 * dispatches bound — shape, dtype and identity — while a recorded session's capture keeps no view per
 * binding and derives views of the same bytes only when it needs nodes.
 */
import { equal, ok, strictEqual } from "node:assert/strict";
import { DType, GraphExecutor, type MlxBuffer, ops } from "../mod.ts";
import { testContext } from "./helpers.ts";

Deno.test("takeCapture: nodes bind the caller's own views (slices, shapes, a reused bindings array)", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const wide = device.alloc(64 * 4, DType.F32);
  // A shaped whole-allocation view, an aligned slice with a 2-D shape and a slice at an odd element.
  const whole = device.alloc(16 * 4, DType.F32);
  const a = whole.slice(0, 16 * 4, { shape: [4, 4] });
  const b = wide.slice(16 * 4, 16 * 4, { shape: [2, 8] });
  const c = wide.slice(33 * 4, 16 * 4);
  using enc = device.commandEncoder();
  enc.startCapture();
  ops.elementwiseAdd(enc, registry, a, b, c);
  enc.memoryBarrier();
  // The same pipeline through one descriptor whose bindings array is then reused for other views.
  const pipeline = registry.get("elementwise_add_f32");
  const bindings: (MlxBuffer | number[])[] = [c, a, b, [16]];
  enc.dispatch({ pipeline, bindings, grid: 16, threadgroup: 16, dispatchKind: "threads" });
  bindings[0] = b;
  bindings[2] = c;
  const nodes = enc.takeCapture()!;
  equal(nodes.length, 3);
  const n0 = nodes[0]!, n2 = nodes[2]!;
  ok(n0.kind === "dispatch" && n2.kind === "dispatch");
  strictEqual(n0.bindings![0], a);
  strictEqual(n0.bindings![1], b);
  strictEqual(n0.bindings![2], c);
  strictEqual(n2.bindings![0], c);
  strictEqual(n2.bindings![1], a);
  strictEqual(n2.bindings![2], b);
  equal((n0.bindings![0] as MlxBuffer).shape.join("x"), "4x4");
  equal((n0.bindings![1] as MlxBuffer).shape.join("x"), "2x8");
  // The accesses are the views' byte ranges.
  equal(JSON.stringify(n0.reads), JSON.stringify([a.range(), b.range()]));
  equal(JSON.stringify(n0.writes), JSON.stringify([c.range()]));
  equal(JSON.stringify(n2.writes), JSON.stringify([b.range()]));
});

Deno.test("takeCapture: a user range merged into the last dispatch keeps the caller's views", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const x = device.alloc(16 * 4, DType.F32).slice(0, 16 * 4, { shape: [4, 4] });
  const y = device.alloc(16 * 4, DType.F32);
  const extra = device.alloc(16 * 4, DType.F32);
  using enc = device.commandEncoder();
  enc.startCapture();
  ops.elementwiseAdd(enc, registry, x, x, y);
  enc.trackDispatch([extra], []);
  const node = enc.takeCapture()![0]!;
  ok(node.kind === "dispatch");
  strictEqual(node.bindings![0], x);
  strictEqual(node.bindings![2], y);
  ok(node.reads.some((r) => r[0] === extra.allocId), "the user range is merged");
});

Deno.test("a recorded session's capture derives views of the same bytes (not the caller's objects)", () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device);
  const wide = device.alloc(64 * 4, DType.F32);
  const a = device.alloc(16 * 4, DType.F32).slice(0, 16 * 4, { shape: [4, 4] });
  const b = wide.slice(16 * 4, 16 * 4);
  using s = exec.beginRecorded();
  s.elementwiseAdd(a, a, b);
  const node = s.encoder.takeCapture()![0]!;
  ok(node.kind === "dispatch");
  const [v0, , v2] = node.bindings as MlxBuffer[];
  equal(JSON.stringify(v0!.range()), JSON.stringify(a.range()));
  equal(JSON.stringify(v2!.range()), JSON.stringify(b.range()));
  ok(v0 !== a, "derived from the stream words, not kept while recording");
});
