/**
 * Interleaved harness for the "host path" group of bench/host_path_bench.ts: every case runs in one
 * process, alternating round by round, so that the load of a shared machine hits all of them alike
 * (`deno bench`'s averages are noise on a busy 2-core VM). Each round times every case `REPEAT`
 * times and keeps the best; the first fifth of the rounds is dropped as warm-up. Prints, per case,
 * the minimum and median ns per dispatch and their ratios to the descriptor path, then one JSON line.
 *
 *   ROOT=<tree> deno run -A bench/host_path_harness.ts [rounds] [case-filter-regexp]
 *
 * ROOT is the checkout whose mod.ts (and build/libmlxn_cpu.so) is measured, default this one: run
 * it alternately with ROOT pointing at two trees to compare them. 800 dispatches of 64-element
 * kernels on the CPU backend; nothing runs (each pass is flushed to the native decoder and disposed).
 */
const root = Deno.env.get("ROOT") ?? new URL("..", import.meta.url).pathname;
const mlxn = await import(`file://${root.replace(/\/$/, "")}/mod.ts`);
const { DType, f32Bits, GraphExecutor, MlxDevice } = mlxn;

const ROUNDS = Number(Deno.args[0] ?? 200), REPEAT = 5;
const only = Deno.args[1] ? new RegExp(Deno.args[1]) : null;
const N = 800, ELEMS = 64;
const device = MlxDevice.open({ backend: "cpu" });
const exec = new GraphExecutor(device);
const x = device.upload(new Float32Array(ELEMS).fill(1)), y = device.upload(new Float32Array(ELEMS).fill(2));
const out = device.alloc(ELEMS * 4, DType.F32);
const wide = device.alloc(N * ELEMS * 4, DType.F32);
const slices = Array.from({ length: N }, (_, i) => wide.slice(i * ELEMS * 4, ELEMS * 4));
const reversed = slices.slice().reverse();
let seed = 7;
const shuffled = slices.slice().sort(() => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648 - 0.5);
const outs = Array.from({ length: N }, () => device.alloc(ELEMS * 4, DType.F32));
const descriptor = {
  pipeline: device.kernels.get("axpby_f32"),
  bindings: [x, y, out, [f32Bits(0.5), f32Bits(2), ELEMS, 0]],
  grid: ELEMS,
  threadgroup: ELEMS,
  dispatchKind: "threads" as const,
};

// deno-lint-ignore no-explicit-any
type Session = any;
const beginAuto = (): Session => exec.begin({ autoBarriers: true });
const end = (s: Session) => {
  s.encoder.flush();
  s.dispose();
};

// Every case writes its own loop: a loop shared by several cases (calling a per-case body) would
// make its call site megamorphic, so each dispatch would pay a call that user code does not
// (5–6 ns per dispatch here), and only in those cases.
const cases: [string, () => void][] = [
  ["descriptor: enc.dispatch(prebuilt axpby)", () => {
    const enc = device.commandEncoder();
    for (let i = 0; i < N; i++) enc.dispatch(descriptor);
    enc.flush();
    enc.dispose();
  }],
  ["session op, auto barriers off", () => {
    const s = exec.begin({ autoBarriers: false });
    for (let i = 0; i < N; i++) s.elementwiseAdd(x, y, out);
    end(s);
  }],
  ["session op, auto barriers off, 800 slices", () => {
    const s = exec.begin({ autoBarriers: false });
    for (let i = 0; i < N; i++) s.elementwiseAdd(x, y, slices[i]);
    end(s);
  }],
  ["auto, a hazard on every dispatch", () => {
    const s = beginAuto();
    for (let i = 0; i < N; i++) s.elementwiseAdd(out, y, out);
    end(s);
  }],
  ["auto, none needed: 800 slices", () => {
    const s = beginAuto();
    for (let i = 0; i < N; i++) s.elementwiseAdd(x, y, slices[i]);
    end(s);
  }],
  ["auto, none needed: 800 slices reversed", () => {
    const s = beginAuto();
    for (let i = 0; i < N; i++) s.elementwiseAdd(x, y, reversed[i]);
    end(s);
  }],
  ["auto, none needed: 800 slices shuffled", () => {
    const s = beginAuto();
    for (let i = 0; i < N; i++) s.elementwiseAdd(x, y, shuffled[i]);
    end(s);
  }],
  ["auto, none needed: 800 allocations", () => {
    const s = beginAuto();
    for (let i = 0; i < N; i++) s.elementwiseAdd(x, y, outs[i]);
    end(s);
  }],
  ["auto, groups of 1 slice writes", () => {
    const s = beginAuto();
    for (let i = 0; i < N; i++) s.elementwiseAdd(x, y, slices[0]);
    end(s);
  }],
  ["auto, groups of 8 slice writes", () => {
    const s = beginAuto();
    for (let i = 0; i < N; i++) s.elementwiseAdd(x, y, slices[i & 7]);
    end(s);
  }],
  ["auto, groups of 64 slice writes", () => {
    const s = beginAuto();
    for (let i = 0; i < N; i++) s.elementwiseAdd(x, y, slices[i & 63]);
    end(s);
  }],
  ["auto, groups of 800 slice writes", () => {
    const s = beginAuto();
    for (let i = 0; i < N; i++) s.elementwiseAdd(x, y, slices[i]);
    end(s);
  }],
];
const chosen = cases.filter(([name], i) => i === 0 || only === null || only.test(name));

const samples: number[][] = chosen.map(() => []);
for (let round = 0; round < ROUNDS; round++) {
  for (let c = 0; c < chosen.length; c++) {
    const body = chosen[c]![1];
    let best = Infinity;
    for (let r = 0; r < REPEAT; r++) {
      const t0 = performance.now();
      body();
      const t = performance.now() - t0;
      if (t < best) best = t;
    }
    if (round >= ROUNDS / 5) samples[c]!.push(best * 1e6 / N);
  }
}

const stat = (v: number[]) => {
  const s = v.slice().sort((a, b) => a - b);
  return { min: s[0]!, median: s[s.length >> 1]! };
};
const base = stat(samples[0]!);
const rows = chosen.map(([name], c) => {
  const { min, median } = stat(samples[c]!);
  return { name, min, median, minRatio: min / base.min, medianRatio: median / base.median };
});
for (const r of rows) {
  console.log(
    `${r.name.padEnd(44)} ${r.min.toFixed(1).padStart(7)} / ${r.median.toFixed(1).padStart(7)} ns` +
      `   ${r.minRatio.toFixed(2)} / ${r.medianRatio.toFixed(2)}`,
  );
}
console.log(JSON.stringify({ root, rounds: ROUNDS, rows }));
device.close();
