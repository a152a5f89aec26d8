/**
 * Closing a device while command buffers are still referenced: close drains the queue and detaches
 * every live command buffer, so a later wait, timings query or free is safe. A committed command
 * buffer reports what really happened (it ran before close returned); one never committed reports
 * that the device was closed. Through the raw C ABI and every public wait path.
 */
import { equal, match, ok, rejects, throws } from "node:assert/strict";
import { DType, GraphExecutor, type MlxDevice, MlxError } from "../mod.ts";
import { CbStatus, Live, Status } from "../src/native/abi.ts";
import { lastErrorText, readText } from "../src/native/status.ts";
import { testContext } from "./helpers.ts";

const u32 = (...v: number[]) => new Uint8Array(new Uint32Array(v).buffer);

/** A committed encoder whose one dispatch succeeds (fail = 0) or fails (fail = 1) when it runs. */
function committedFault(device: MlxDevice, fail: number) {
  const marker = device.alloc(4, DType.U32);
  const enc = device.commandEncoder();
  enc.dispatch({
    pipeline: device.kernels.get("debug_fault"),
    bindings: [marker, u32(fail)],
    grid: 1,
    threadgroup: 1,
    dispatchKind: "threadgroups",
  });
  enc.commit();
  return enc;
}

function liveCmdbufs(device: MlxDevice): number {
  const out = new BigUint64Array(Live.COUNT);
  device.sym.mlxn_live_objects(new Uint8Array(out.buffer), Live.COUNT);
  return Number(out[Live.CMDBUFS]);
}

Deno.test("raw ABI: wait, status, timings, encode and free after mlxn_device_close", () => {
  const ctx = testContext();
  const { device } = ctx;
  const sym = device.sym, dev = device.devicePtr();
  const before = liveCmdbufs(device);
  const marker = sym.mlxn_buffer_alloc(dev, 4n);
  const pipe = device.kernels.get("debug_fault").handle;
  const words = [0x20001, pipe, 0x20009, marker, 0x30103, 4, 0, 0x80006, 1, 1, 1, 1, 1, 1, 7];
  const stream = new Uint8Array(Uint32Array.from(words).buffer);
  const committed = sym.mlxn_cmdbuf_new(dev)!;
  equal(sym.mlxn_cmdbuf_encode(committed, stream, stream.byteLength), Status.OK, lastErrorText(sym));
  equal(sym.mlxn_cmdbuf_commit(committed), Status.OK);
  const open = sym.mlxn_cmdbuf_new(dev)!;
  equal(sym.mlxn_cmdbuf_encode(open, stream, stream.byteLength), Status.OK);
  ctx[Symbol.dispose](); // closes the native device under both command buffers

  // The committed one ran before close returned: completed, with its timings and its one dispatch.
  equal(sym.mlxn_cmdbuf_wait(committed), Status.OK);
  equal(sym.mlxn_cmdbuf_status(committed), CbStatus.COMPLETED);
  const t = new BigUint64Array(2 + 3);
  equal(sym.mlxn_cmdbuf_timings(committed, new Uint8Array(t.buffer), t.length), 1);
  ok(t[0]! > 0n && t[1]! >= t[0]!, `timings ${t}`);
  equal(t[2], 7n, "the dispatch's tag");
  equal(sym.mlxn_cmdbuf_encode(committed, stream, stream.byteLength), Status.E_STATE);
  match(lastErrorText(sym), /device of this command buffer was closed/);

  // The uncommitted one never runs: it reports the closed device, and cannot be committed.
  equal(sym.mlxn_cmdbuf_status(open), CbStatus.ERROR);
  equal(sym.mlxn_cmdbuf_wait(open), Status.E_STATE);
  match(lastErrorText(sym), /device was closed before this command buffer was committed/);
  match(readText((b, cap) => sym.mlxn_cmdbuf_error(open, b, cap)), /device was closed/);
  equal(sym.mlxn_cmdbuf_commit(open), Status.E_STATE);
  equal(sym.mlxn_cmdbuf_timings(open, new Uint8Array(t.buffer), t.length), 0);

  equal(liveCmdbufs(device), before, "detached: no longer command buffers of a device");
  sym.mlxn_cmdbuf_free(committed); // the host still releases them (ASan checks the memory)
  sym.mlxn_cmdbuf_free(open);
  equal(liveCmdbufs(device), before);
});

Deno.test("commit, device.close(), then waitUntilCompleted(): the real outcome, no crash", () => {
  const ctx = testContext();
  const before = liveCmdbufs(ctx.device);
  const good = committedFault(ctx.device, 0);
  const bad = committedFault(ctx.device, 1);
  ctx.device.close();
  good.waitUntilCompleted(); // ran before close returned
  equal(good.state, "completed");
  ok(good.gpuNs >= 0 && good.gpuEndNs > 0, "its timings were read after close");
  throws(() => bad.waitUntilCompleted(), (e: unknown) => {
    ok(e instanceof MlxError && e.code === "CommandBufferError", String(e));
    match(e.message, /debug_fault\) failed while executing/);
    return true;
  });
  equal(bad.state, "failed");
  good.dispose();
  bad.dispose();
  equal(liveCmdbufs(ctx.device), before);
});

Deno.test("commit, device.close(), then completed(): resolves or rejects with the real outcome", async () => {
  const ctx = testContext();
  const before = liveCmdbufs(ctx.device);
  const good = committedFault(ctx.device, 0);
  const bad = committedFault(ctx.device, 1);
  ctx.device.close();
  await good.completed();
  equal(good.state, "completed");
  await rejects(bad.completed(), (e: unknown) => e instanceof MlxError && e.code === "CommandBufferError");
  // A wait already in flight when the device closes settles too.
  const ctx2 = testContext();
  const pending = committedFault(ctx2.device, 0);
  const waiting = pending.completed();
  ctx2.device.close();
  await waiting;
  equal(pending.state, "completed");
  equal(liveCmdbufs(ctx.device), before);
});

Deno.test("commit, device.close(), then a session's wait() and completed()", async () => {
  for (const how of ["wait", "completed"] as const) {
    const ctx = testContext();
    const { device } = ctx;
    const exec = new GraphExecutor(device);
    const a = device.upload(new Float32Array([1, 2, 3, 4]));
    const b = device.upload(new Float32Array([10, 20, 30, 40]));
    const out = device.alloc(16, DType.F32);
    const s = exec.begin();
    s.elementwiseAdd(a, b, out);
    const pass = s.commit();
    device.close();
    const report = how === "wait" ? pass.wait() : await pass.completed();
    equal(report.dispatches, 1, how);
    for (const e of pass.encoders) ok(e.gpuEndNs > 0, `${how}: the timings of a command buffer that ran`);
  }
});

Deno.test("an encoder left open at device.close() is disposed, and nothing leaks", () => {
  const ctx = testContext();
  const { device } = ctx;
  const before = liveCmdbufs(device);
  const enc = device.commandEncoder();
  const a = device.alloc(16, DType.F32);
  enc.dispatch({
    pipeline: device.kernels.get("gelu_f32"),
    bindings: [a, a],
    grid: 4,
    threadgroup: 4,
    dispatchKind: "threads",
  });
  device.close();
  equal(enc.state, "disposed");
  throws(() => enc.commit(), (e: unknown) => e instanceof MlxError && e.code === "Disposed");
  equal(liveCmdbufs(device), before);
});
