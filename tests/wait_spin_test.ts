/**
 * DeviceOptions.waitSpinUs: a blocking wait polls its command buffer before it sleeps. The option is
 * checked at open; a poll shorter than the pass still ends in a complete wait, a poll longer than it
 * ends at completion, and a failing command buffer reports its error either way.
 */
import { deepStrictEqual, equal, ok, throws } from "node:assert/strict";
import { DType, GraphExecutor, MlxDevice, MlxError, ops } from "../mod.ts";
import { debugFault } from "../src/ops/elementwise.ts";
import { randomValues } from "./helpers.ts";

/** y = x · Wᵀ at a size the CPU backend takes milliseconds over, and a chain of adds after it. */
function runPass(device: MlxDevice, how: "commit" | "session"): Float32Array {
  const m = 64, n = 512, k = 512;
  using x = device.upload(randomValues(m * k, 1)), w = device.upload(randomValues(n * k, 2));
  using y = device.alloc(m * n * 4, DType.F32), z = device.alloc(m * n * 4, DType.F32);
  if (how === "commit") {
    const enc = device.commandEncoder();
    ops.matmul(enc, device.kernels, x, w, y, { m, n, k });
    enc.memoryBarrier();
    ops.elementwiseAdd(enc, device.kernels, y, y, z);
    enc.commit({ wait: true });
    enc.dispose();
  } else {
    const s = new GraphExecutor(device).begin();
    s.matmul(x, w, y, { m, n, k });
    s.elementwiseAdd(y, y, z);
    s.finish();
  }
  return z.read() as Float32Array;
}

Deno.test("waitSpinUs: refused at open unless a number of microseconds in 0..1,000,000", () => {
  for (const bad of [-1, Number.NaN, Infinity, 1_000_001, "5" as unknown as number]) {
    throws(() => MlxDevice.open({ backend: "cpu", waitSpinUs: bad }), (e: unknown) => {
      ok(e instanceof MlxError && e.code === "InvalidArgument", String(e));
      ok(/waitSpinUs must be a number of microseconds in 0\.\.1000000/.test(e.message), e.message);
      return true;
    });
  }
  using plain = MlxDevice.open({ backend: "cpu" });
  equal(plain.waitSpinUs, 0);
  using spinning = MlxDevice.open({ backend: "cpu", waitSpinUs: 250.5 });
  equal(spinning.waitSpinUs, 250.5);
});

/** Counts the device's calls of mlxn_cmdbuf_status (the poll) while `f` runs. */
function countPolls<T>(device: MlxDevice, f: () => T): { result: T; polls: number } {
  const sym = device.sym as unknown as Record<string, (...a: unknown[]) => number>;
  const status = sym.mlxn_cmdbuf_status!;
  let polls = 0;
  sym.mlxn_cmdbuf_status = (...a: unknown[]) => {
    polls++;
    return status(...a);
  };
  try {
    return { result: f(), polls };
  } finally {
    sym.mlxn_cmdbuf_status = status;
  }
}

Deno.test("waitSpinUs: polls shorter and longer than the pass give the complete results of a plain wait", () => {
  using plain = MlxDevice.open({ backend: "cpu" });
  const want = {
    commit: countPolls(plain, () => runPass(plain, "commit")),
    session: countPolls(plain, () => runPass(plain, "session")),
  };
  ok(want.commit.result.some((v) => v !== 0));
  // 1 µs: the poll ends long before the pass does, and the wait must still block until it completed;
  // 1 s: the poll sees the pass complete.
  for (const spin of [1, 1_000_000]) {
    using device = MlxDevice.open({ backend: "cpu", waitSpinUs: spin });
    for (const how of ["commit", "session"] as const) {
      const got = countPolls(device, () => runPass(device, how));
      deepStrictEqual(got.result, want[how].result, `${how}, waitSpinUs ${spin}`);
      ok(got.polls > want[how].polls, `${how}, waitSpinUs ${spin}: ${got.polls} polls, ${want[how].polls} without`);
    }
  }
});

Deno.test("waitSpinUs: a failing command buffer reports its error after the poll", () => {
  using device = MlxDevice.open({ backend: "cpu", waitSpinUs: 100_000 });
  using marker = device.alloc(4, DType.U32);
  const enc = device.commandEncoder();
  debugFault(enc, device.kernels, marker, { fail: true });
  throws(() => enc.commit({ wait: true, label: "faulty" }), (e: unknown) => {
    ok(e instanceof MlxError && e.code === "CommandBufferError", String(e));
    ok(/'faulty' failed/.test(e.message), e.message);
    return true;
  });
  enc.dispose();
});
