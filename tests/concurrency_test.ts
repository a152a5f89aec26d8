/**
 * Concurrent-encoder semantics, observed through per-dispatch timings (CPU workers; CUDA graph nodes): two
 * independent dispatches of one group overlap in time; a barrier (or serial mode) separates them.
 */
import { equal, ok } from "node:assert/strict";
import { DType, type MlxDevice, ops } from "../mod.ts";
import type { DispatchTiming } from "../src/encoder.ts";
import { KernelRegistry } from "../src/kernels.ts";
import { openDevice } from "./helpers.ts";

const DIM = 1 << 22; // one threadgroup (one row) of 4 Mi elements: several ms of work

function twoNorms(device: MlxDevice, barrier: boolean): readonly DispatchTiming[] {
  const registry = new KernelRegistry(device);
  using x = device.alloc(DIM * 4, DType.F32), w = device.alloc(DIM * 4, DType.F32);
  using y1 = device.alloc(DIM * 4, DType.F32), y2 = device.alloc(DIM * 4, DType.F32);
  x.write(new Float32Array(DIM).fill(0.5));
  w.write(new Float32Array(DIM).fill(1));
  using enc = device.commandEncoder();
  ops.rmsNorm(enc, registry, x, w, y1, { rows: 1, dim: DIM, eps: 1e-6 });
  if (barrier) enc.memoryBarrier();
  ops.rmsNorm(enc, registry, x, w, y2, { rows: 1, dim: DIM, eps: 1e-6 });
  enc.commitAndWait();
  const t = enc.dispatchTimings!;
  equal(t.length, 2);
  ok(t.every((d) => d.endNs > d.startNs && d.kernel === "rms_norm_f32"), JSON.stringify(t));
  ok(enc.gpuStartNs <= t[0]!.startNs && t[1]!.endNs <= enc.gpuEndNs, "dispatches lie inside the command buffer");
  return t;
}

/** Whether the backend under test reports per-dispatch timings (CPU always; CUDA while profiling). */
const timed = (() => {
  using d = openDevice();
  return d.info.perDispatchTiming;
})();

const overlaps = (t: readonly DispatchTiming[]) =>
  Math.max(t[0]!.startNs, t[1]!.startNs) < Math.min(t[0]!.endNs, t[1]!.endNs);

Deno.test({ name: "two independent dispatches of one concurrent group overlap in time", ignore: !timed }, () => {
  using device = openDevice({ threads: 2, profileDispatches: true });
  // The OS may delay the second worker once; three tries make the check robust, not lenient:
  // a backend that never overlaps fails all of them.
  let seen = false;
  for (let i = 0; i < 3 && !seen; i++) seen = overlaps(twoNorms(device, false));
  ok(seen, "no overlap in 3 runs: concurrent groups are not running in parallel");
});

Deno.test(
  { name: "a barrier separates the dispatches: the second starts after the first ends", ignore: !timed },
  () => {
    using device = openDevice({ threads: 2, profileDispatches: true });
    for (let i = 0; i < 3; i++) {
      const t = twoNorms(device, true);
      ok(
        t[1]!.startNs >= t[0]!.endNs,
        `run ${i}: second started ${t[0]!.endNs - t[1]!.startNs} ns before the first ended`,
      );
    }
  },
);

Deno.test({ name: "serial mode (concurrency off) never overlaps dispatches", ignore: !timed }, () => {
  using device = openDevice({ threads: 2, profileDispatches: true, concurrency: false });
  equal(device.info.serial, true);
  for (let i = 0; i < 2; i++) {
    const t = twoNorms(device, false);
    ok(t[1]!.startNs >= t[0]!.endNs, "serial dispatches overlapped");
  }
});

Deno.test("a dispatch of many threadgroups is split across workers and computes every row", () => {
  using device = openDevice({ threads: 2 });
  const registry = new KernelRegistry(device);
  const rows = 257, dim = 1000;
  const xv = new Float32Array(rows * dim);
  for (let r = 0; r < rows; r++) xv.fill(r + 1, r * dim, (r + 1) * dim);
  using x = device.upload(xv), w = device.upload(new Float32Array(dim).fill(3));
  using y = device.alloc(rows * dim * 4, DType.F32);
  using enc = device.commandEncoder();
  ops.rmsNorm(enc, registry, x, w, y, { rows, dim, eps: 0 });
  enc.commitAndWait();
  // Each row is constant c, so c / rms(c) · 3 = 3 in every row, whichever worker ran it (up to the
  // f32 sum of dim squares: relative error ≤ dim · 2⁻²⁴). An unwritten row would read 0.
  const bad = y.read().findIndex((v) => Math.abs(v - 3) > 3 * (dim + 8) * 2 ** -24);
  equal(bad, -1, `row ${Math.floor(bad / dim)} not normalised`);
});
