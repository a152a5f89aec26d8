/**
 * Host cost of submitting work on the CUDA backend (run on the GPU machine; skipped without CUDA):
 *
 *   deno run --allow-ffi --allow-read --allow-env bench/gpu_bench.ts
 *
 * One command buffer of N small dispatches (a chain of adds with barriers, plus independent adds),
 * submitted as (a) plain in-order stream launches, (b) a fresh CUDA graph each time (the topology
 * changes, so the cache misses), (c) the cached graph with one argument updated in place. For each:
 * wall time per command buffer (encode + commit + wait), device time, and host µs per dispatch =
 * (wall − device) / N. Prints one JSON line per case.
 */
import { DType, MlxDevice, ops } from "../mod.ts";
import { openGpuOrSkip } from "./gpu_device.ts";

const N = 512, REPS = 200;

function measure(name: string, device: MlxDevice, vary: "none" | "topology" | "args") {
  const registry = device.kernels;
  const bufs = Array.from({ length: 33 }, () => device.alloc(8192 * 4, DType.F32));
  const run = (iter: number) => {
    const enc = device.commandEncoder();
    // 16 distinct grid sizes (256-thread groups) > 8 cache entries: every command buffer misses.
    const n = vary === "topology" ? 256 * (4 + (iter % 16)) : 1024;
    for (let i = 0; i < N; i++) {
      const chain = i % 2 === 0;
      const src = bufs[(i >> 1) % 32]!, dst = bufs[((i >> 1) + 1) % 32]!;
      if (chain) ops.axpby(enc, registry, src, src, dst, { alpha: vary === "args" ? 1 + (iter % 7) : 1, beta: 0.5, n });
      else ops.elementwiseAdd(enc, registry, bufs[32]!, bufs[32]!, bufs[32]!, n);
      if (chain) enc.memoryBarrier();
    }
    const t0 = performance.now();
    enc.commitAndWait();
    const submitAndWaitMs = performance.now() - t0;
    const gpuMs = enc.gpuNs / 1e6;
    enc.dispose();
    return { submitAndWaitMs, gpuMs };
  };
  for (let i = 0; i < 20; i++) run(i); // warm-up: JIT, cache
  const phases = () => {
    const info = device.queryInfo() as unknown as Record<string, number>;
    return [info.hostPackNs ?? 0, info.hostGraphNs ?? 0, info.hostLaunchNs ?? 0];
  };
  const before = phases();
  let wall = 0, gpu = 0, submit = 0;
  for (let i = 0; i < REPS; i++) {
    const t0 = performance.now();
    const r = run(i);
    wall += performance.now() - t0;
    gpu += r.gpuMs;
    submit += r.submitAndWaitMs;
  }
  const perCb = { wallMs: wall / REPS, gpuMs: gpu / REPS, submitAndWaitMs: submit / REPS };
  console.log(JSON.stringify({
    case: name,
    dispatches: N,
    wallMsPerCb: +perCb.wallMs.toFixed(3),
    gpuMsPerCb: +perCb.gpuMs.toFixed(3),
    hostUsPerDispatch: +(((perCb.wallMs - perCb.gpuMs) * 1000) / N).toFixed(3),
    nativeUsPerDispatch: +(((perCb.submitAndWaitMs - perCb.gpuMs) * 1000) / N).toFixed(3),
    encodeUsPerDispatch: +(((perCb.wallMs - perCb.submitAndWaitMs) * 1000) / N).toFixed(3),
    // The native part by phase (CUDA backend's queue thread): packing arguments, finding/building/
    // updating the graph, launching.
    nativePhasesUsPerDispatch: Object.fromEntries(
      ["pack", "graph", "launch"].map((k, i) => [k, +((phases()[i]! - before[i]!) / 1e3 / REPS / N).toFixed(3)]),
    ),
    counters: device.queryInfo(),
  }));
  for (const b of bufs) b.dispose();
}

const probe = openGpuOrSkip("gpu_bench", "cuda");
if (probe) {
  probe.close();
  {
    using d = MlxDevice.open({ backend: "cuda", cudaGraphs: false });
    measure("stream launches", d, "none");
  }
  {
    using d = MlxDevice.open({ backend: "cuda" });
    measure("fresh graph every command buffer", d, "topology");
  }
  {
    using d = MlxDevice.open({ backend: "cuda" });
    measure("cached graph, one argument updated", d, "args");
  }
}
