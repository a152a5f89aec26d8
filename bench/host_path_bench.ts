/**
 * Host cost of one pass of 800 dispatches (64-element kernels, CPU backend) through each path users
 * call, against the raw descriptor path: nothing runs except where "finish" is named, and there
 * only the host part (begin to commit) is timed. Read the ratios, not the absolute numbers.
 *
 *   deno bench --allow-ffi --allow-read --allow-env bench/host_path_bench.ts
 */
import { DType, f32Bits, GraphExecutor, MlxDevice, ops } from "../mod.ts";

const N = 800, ELEMS = 64;
const device = MlxDevice.open({ backend: "cpu" });
const registry = device.kernels;
const exec = new GraphExecutor(device);
const noCacheExec = new GraphExecutor(device, { planCache: false });
const x = device.upload(new Float32Array(ELEMS).fill(1)), y = device.upload(new Float32Array(ELEMS).fill(2));
const out = device.alloc(ELEMS * 4, DType.F32);
const wide = device.alloc(N * ELEMS * 4, DType.F32);
const slices = Array.from({ length: N }, (_, i) => wide.slice(i * ELEMS * 4, ELEMS * 4));
const axpbyDescriptor = {
  pipeline: registry.get("axpby_f32"),
  bindings: [x, y, out, [f32Bits(0.5), f32Bits(2), ELEMS, 0]],
  grid: ELEMS,
  threadgroup: ELEMS,
  dispatchKind: "threads" as const,
};

Deno.bench("enc.dispatch(prebuilt axpby descriptor)", { group: "host path", baseline: true }, () => {
  const enc = device.commandEncoder();
  for (let i = 0; i < N; i++) enc.dispatch(axpbyDescriptor);
  enc.flush();
  enc.dispose();
});

Deno.bench("ops.axpby(enc, registry, …)", { group: "host path" }, () => {
  const enc = device.commandEncoder();
  for (let i = 0; i < N; i++) ops.axpby(enc, registry, x, y, out, { alpha: 0.5, beta: 2 });
  enc.flush();
  enc.dispose();
});

Deno.bench("session op: begin({ autoBarriers: false }) + s.elementwiseAdd", { group: "host path" }, () => {
  const s = exec.begin({ autoBarriers: false });
  for (let i = 0; i < N; i++) s.elementwiseAdd(x, y, out);
  s.encoder.flush();
  s.dispose();
});

Deno.bench("session, auto barriers, a hazard on every dispatch", { group: "host path" }, () => {
  const s = exec.begin({ autoBarriers: true });
  for (let i = 0; i < N; i++) s.elementwiseAdd(out, y, out); // reads and writes out: RAW/WAW each time
  s.encoder.flush();
  s.dispose();
});

Deno.bench("session, auto barriers, none needed (800 slices of one buffer)", { group: "host path" }, () => {
  const s = exec.begin({ autoBarriers: true });
  for (let i = 0; i < N; i++) s.elementwiseAdd(x, y, slices[i]!);
  s.encoder.flush();
  s.dispose();
});

// Tracker cost per dispatch against the width of the concurrent group: dispatch i writes slice
// i % width of one buffer, so the pass is groups of `width` disjoint slices with a barrier between
// (each group's first write overwrites the previous group's). Flat across widths is the target.
for (const width of [1, 8, 64, 800]) {
  Deno.bench(`session, auto barriers, groups of ${width} slice writes of one buffer`, { group: "host path" }, () => {
    const s = exec.begin({ autoBarriers: true });
    for (let i = 0; i < N; i++) s.elementwiseAdd(x, y, slices[i % width]!);
    s.encoder.flush();
    s.dispose();
  });
}

// The same at widths up to 10,000, the harder case: each group's slices are written in shuffled order
// with a slice's room left free after each, so that no two touch and the tracker keeps every one as
// an interval of its own. Every iteration is 10,000 dispatches (10,000 / width groups): the times
// compare per dispatch across widths. An interval structure per allocation keeps this near flat; a
// sorted array with insertion by moving grew linearly (~12× at 10,000).
const WIDE_PASS = 10_000;
const gapped = device.alloc(2 * WIDE_PASS * ELEMS * 4, DType.F32);
const gappedSlices = Array.from({ length: WIDE_PASS }, (_, i) => gapped.slice(2 * i * ELEMS * 4, ELEMS * 4));
for (const width of [100, 1_000, 10_000]) {
  let seed = 7; // one fixed shuffle per group of `width` (a linear congruential generator)
  const order = Array.from({ length: WIDE_PASS }, (_, i) => i);
  for (let g = 0; g < WIDE_PASS; g += width) {
    for (let i = width - 1; i > 0; i--) {
      seed = (seed * 1103515245 + 12345) % 2147483648;
      const j = seed % (i + 1), t = order[g + i]!;
      order[g + i] = order[g + j]!;
      order[g + j] = t;
    }
  }
  const pass = order.map((i) => gappedSlices[i % width]!);
  Deno.bench(`session, auto barriers, ${WIDE_PASS} dispatches in groups of ${width} shuffled, gapped slices`, {
    group: "tracker width",
    baseline: width === 100,
  }, () => {
    const s = exec.begin({ autoBarriers: true });
    for (let i = 0; i < WIDE_PASS; i++) s.elementwiseAdd(x, y, pass[i]!);
    s.encoder.flush();
    s.dispose();
  });
}

const outs = Array.from({ length: N }, () => device.alloc(ELEMS * 4, DType.F32));
Deno.bench("session, auto barriers, none needed (800 separate allocations)", { group: "host path" }, () => {
  const s = exec.begin({ autoBarriers: true });
  for (let i = 0; i < N; i++) s.elementwiseAdd(x, y, outs[i]!);
  s.encoder.flush();
  s.dispose();
});

// The pass below needs no barrier; auto barriers are off in these three so that the comparison is
// the plan cache against direct encoding, not the conflict tracker (measured above).
Deno.bench("direct session + finish, host part (axpby into 800 slices)", { group: "host path" }, (b) => {
  b.start();
  const s = exec.begin({ autoBarriers: false });
  for (let i = 0; i < N; i++) s.axpby(x, y, slices[i]!, { alpha: 1, beta: 1 });
  const pass = s.commit();
  b.end();
  pass.wait();
});

// Warm the plan cache so every timed iteration is a hit.
const recordedPass = (alpha: number) => {
  const s = exec.beginRecorded({ autoBarriers: false });
  for (let i = 0; i < N; i++) s.axpby(x, y, slices[i]!, { alpha, beta: 1 });
  return s;
};
recordedPass(1).finish({ fuse: true, reorder: true });
let step = 0;

Deno.bench("recorded pass, plan cache hit: capture + finish({ fuse, reorder }), host part", {
  group: "host path",
}, (b) => {
  b.start();
  const s = recordedPass(++step % 7);
  const pass = s.commit({ fuse: true, reorder: true });
  b.end();
  pass.wait();
});

// The same hits split over two command buffers: each buffer takes its cached records by copying.
recordedPass(1).finish({ fuse: true, reorder: true, dualBuffer: true });
Deno.bench("recorded pass, plan cache hit, dual buffer: capture + finish, host part", { group: "host path" }, (b) => {
  b.start();
  const s = recordedPass(++step % 7);
  const pass = s.commit({ fuse: true, reorder: true, dualBuffer: true });
  b.end();
  pass.wait();
});

// The same pass frozen once: each commit copies its optimised stream, with no capture or key.
const frozen = recordedPass(1).freeze({ fuse: true, reorder: true });
Deno.bench("frozen pass (GraphSession.freeze): commit, host part", { group: "host path" }, (b) => {
  b.start();
  const pass = frozen.commit();
  b.end();
  pass.wait();
});

Deno.bench("recorded pass, plan cache off: capture + finish({ fuse, reorder }), host part", {
  group: "host path",
}, (b) => {
  b.start();
  const s = noCacheExec.beginRecorded({ autoBarriers: false });
  for (let i = 0; i < N; i++) s.axpby(x, y, slices[i]!, { alpha: 1, beta: 1 });
  const pass = s.commit({ fuse: true, reorder: true });
  b.end();
  pass.wait();
});

// A recorded pass whose topology changes every time (one write moves by a slice, as a K/V-cache
// append moves by a row per token): every pass misses. With plan recording skipped for a new
// topology of a known shape, this costs what the cache-off pass costs.
let moving = 0;
Deno.bench("recorded pass, a new topology every pass (plan cache misses): capture + finish, host part", {
  group: "host path",
}, (b) => {
  moving = (moving + 1) % N;
  b.start();
  const s = exec.beginRecorded({ autoBarriers: false });
  for (let i = 0; i < N; i++) s.axpby(x, y, slices[i === 0 ? moving : i]!, { alpha: 1, beta: 1 });
  const pass = s.commit({ fuse: true, reorder: true });
  b.end();
  pass.wait();
});
