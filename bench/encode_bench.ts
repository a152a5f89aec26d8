/**
 * Encode cost per dispatch: 800 dispatches of 3 buffers + 16 B of inline constants, written into the
 * command stream and handed to the native decoder (one FFI call per flush). Execution is excluded:
 * the command buffer is dropped without commit. Divide the time per iteration by 800.
 *
 *   make bench            (or: deno bench --allow-ffi --allow-read --allow-env bench/)
 */
import { DType, KernelRegistry, MlxDevice, ops } from "../mod.ts";
import { f32Bits } from "../src/ops/common.ts";

const N = 800;
const device = MlxDevice.open();
const registry = new KernelRegistry(device);
const a = device.alloc(4096 * 4, DType.F32), b = device.alloc(4096 * 4, DType.F32);
const c = device.alloc(4096 * 4, DType.F32);
const axpby = registry.get("axpby_f32");
const params = [f32Bits(0.5), f32Bits(2), 4096, 0];
const descriptor = {
  pipeline: axpby,
  bindings: [a, b, c, params],
  grid: 4096,
  threadgroup: 256,
  dispatchKind: "threads" as const,
};

Deno.bench("create + drop an empty command buffer", { group: "encode" }, () => {
  const enc = device.commandEncoder();
  enc.dispose();
});

Deno.bench(`${N} dispatches, prebuilt descriptor (3 buffers + 16 B)`, { group: "encode", baseline: true }, () => {
  const enc = device.commandEncoder();
  for (let i = 0; i < N; i++) enc.dispatch(descriptor);
  enc.flush();
  enc.dispose();
});

Deno.bench(`${N} dispatches through ops.axpby (params packed per call)`, { group: "encode" }, () => {
  const enc = device.commandEncoder();
  for (let i = 0; i < N; i++) ops.axpby(enc, registry, a, b, c, { alpha: 0.5, beta: 2, n: 4096 });
  enc.flush();
  enc.dispose();
});

Deno.bench(`${N} dispatches + ${N} barriers`, { group: "barriers" }, () => {
  const enc = device.commandEncoder();
  for (let i = 0; i < N; i++) {
    enc.dispatch(descriptor);
    enc.memoryBarrier();
  }
  enc.flush();
  enc.dispose();
});

Deno.bench(`${N} dispatches, no barriers`, { group: "barriers", baseline: true }, () => {
  const enc = device.commandEncoder();
  for (let i = 0; i < N; i++) enc.dispatch(descriptor);
  enc.flush();
  enc.dispose();
});

Deno.bench("empty command buffer: commit + wait", { group: "sync" }, () => {
  const enc = device.commandEncoder();
  enc.commitAndWait();
  enc.dispose();
});

Deno.bench("one small dispatch: commit + wait", { group: "sync" }, () => {
  const enc = device.commandEncoder();
  enc.dispatch(descriptor);
  enc.commitAndWait();
  enc.dispose();
});
