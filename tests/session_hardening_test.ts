/** Issue 15, the runtime half: recorded sessions, dropped sessions, barrier ranges, dual-buffer atomicity. */
import { deepStrictEqual, equal, ok, throws } from "node:assert/strict";
import { DType, GraphExecutor, MlxDevice, MlxError } from "../mod.ts";

const isCode = (code: string) => (e: unknown) => e instanceof MlxError && e.code === code;
import { runDeno, testContext } from "./helpers.ts";

Deno.test("recorded sessions copy inline constants at record time (mutating them before finish changes nothing)", () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  const exec = new GraphExecutor(device);
  const n = 8;
  using a = device.upload(new Float32Array(n).fill(1)), b = device.upload(new Float32Array(n).fill(2));
  using out = device.alloc(n * 4, DType.F32);
  const add = registry.get("elementwise_add_f32");
  for (const form of ["words", "u32", "bytes"] as const) {
    out.write(new Float32Array(n));
    const words = [4];
    const u32 = new Uint32Array([4]);
    const bytes = new Uint8Array(u32.buffer.slice(0));
    const constants = form === "words" ? words : form === "u32" ? u32 : bytes;
    using s = exec.beginRecorded();
    s.dispatch({ pipeline: add, bindings: [a, b, out, constants], grid: n, threadgroup: 1, dispatchKind: "threads" });
    words[0] = 8; // after the dispatch, before finish: must not change what runs
    u32[0] = 8;
    bytes[0] = 8;
    s.finish({ reorder: true });
    deepStrictEqual(Array.from(out.read() as Float32Array), [3, 3, 3, 3, 0, 0, 0, 0], form);
  }
});

Deno.test("sessions dropped without finish or dispose are collected and release their command buffers", async () => {
  const out = await runDeno([
    "run",
    "--allow-ffi",
    "--allow-read",
    "--allow-env",
    "--v8-flags=--expose-gc",
    new URL("./fixtures/session_gc_probe.ts", import.meta.url).pathname,
    "2000",
  ]);
  ok(out.success, out.stderr);
  const r = JSON.parse(out.stdout.trim().split("\n").pop()!);
  equal(r.liveBefore, 2000, "every dropped session held a command buffer before collection");
  ok(r.liveAfter < 100, `after collection ${r.liveAfter} of 2000 dropped sessions still hold a command buffer`);
  ok(r.untouched, "dropped work never ran");
});

Deno.test("user ranges in recorded sessions are merged with the contract's accesses, never replace them", () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device);
  const n = 64;
  using x = device.upload(new Float32Array(n).fill(1)), t = device.alloc(n * 4, DType.F32);
  using y = device.alloc(n * 4, DType.F32), unrelated = device.alloc(16, DType.F32);
  for (const how of ["barrierBetween", "trackDispatch"] as const) {
    t.write(new Float32Array(n));
    using s = exec.beginRecorded({ autoBarriers: false });
    s.elementwiseAdd(x, x, t); // t = 2
    s.barrier();
    // A wrong list (only an unrelated buffer) next to the dispatch that reads t.
    if (how === "barrierBetween") s.barrierBetween([unrelated], []);
    s.elementwiseAdd(t, x, y); // y = t + 1 = 3: needs the barrier after the first add
    if (how === "trackDispatch") s.trackDispatch([unrelated], []);
    const report = s.finish({ reorder: true });
    deepStrictEqual(report.barriers, [1], `${how}: the RAW on t keeps its barrier after reorder`);
    deepStrictEqual(Array.from(y.read() as Float32Array).slice(0, 4), [3, 3, 3, 3], how);
  }
  using enc = device.commandEncoder();
  enc.startCapture();
  enc.barrierBetween([unrelated], []);
  enc.dispatch({
    pipeline: device.kernels.get("elementwise_add_f32"),
    bindings: [t, x, y, [n]],
    grid: n,
    threadgroup: 1,
    dispatchKind: "threads",
  });
  const [node] = enc.takeCapture()!;
  ok(node!.kind === "dispatch");
  deepStrictEqual(node!.reads, [t.range(), x.range(), unrelated.range()]);
  deepStrictEqual(node!.writes, [y.range()]);
});

Deno.test("a dual-buffer finish that fails in its second chunk runs nothing (all or nothing)", () => {
  using ctx = testContext();
  const { device } = ctx;
  for (const validate of [false, true]) {
    const exec = new GraphExecutor(device, { validate });
    const count = 200, n = 4;
    using x = device.upload(new Float32Array(n).fill(1));
    using out = device.alloc(count * n * 4, DType.F32);
    const victim = device.upload(new Float32Array(n).fill(5));
    const s = exec.beginRecorded();
    for (let i = 0; i < count; i++) {
      // Dispatch 150 lands in the second command buffer (the first holds 64).
      s.elementwiseAdd(i === 150 ? victim : x, x, out.slice(i * n * 4, n * 4));
    }
    victim.dispose(); // the injected failure: the second chunk binds a disposed buffer
    throws(() => s.finish({ dualBuffer: true }), isCode("Disposed"));
    ok((out.read() as Float32Array).every((v) => v === 0), `validate=${validate}: nothing ran`);
    equal(MlxDevice.liveObjects(device).commandBuffers, 0, "both command buffers were released");
  }
});

Deno.test("ops that reuse their descriptors keep no buffer alive after the pass", async () => {
  const out = await runDeno([
    "run",
    "--allow-ffi",
    "--allow-read",
    "--allow-env",
    "--v8-flags=--expose-gc",
    new URL("./fixtures/op_retention_probe.ts", import.meta.url).pathname,
  ]);
  ok(out.success, out.stderr);
  deepStrictEqual(JSON.parse(out.stdout.trim().split("\n").pop()!), []);
});
