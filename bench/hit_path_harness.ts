/**
 * Interleaved host-cost harness for recorded passes and the plan cache: every case runs in one
 * process, round after round, so that load from other work on the machine hits all cases alike
 * (`deno bench` ranges were unusable on a shared 2-core VM). Each case times the host part only
 * (begin to commit) and waits outside the timing. Prints min and median µs per case as JSON.
 *
 *   deno run -A bench/hit_path_harness.ts [path/to/mod.ts] [rounds] [passes|demo]
 *
 * "passes" (the default): 800 axpby dispatches into 800 slices of one buffer, 64 elements each, CPU
 * backend; the hit cases change alpha on every pass (800 constant words), or alpha and beta (1,600),
 * or nothing. "demo": one token step of examples/decode.ts's model (4 layers, hidden 256, q4_0) in its
 * sync-loop modes: direct/hand, direct/auto and recorded/opt (state-driven, fused, reordered, two
 * command buffers: a plan-cache hit every pass). The module path lets one run compare two
 * checkouts: run it once per tree, alternating.
 *
 * @module
 */

const modPath = Deno.args[0] ?? new URL("../mod.ts", import.meta.url).href;
const rounds = Number(Deno.args[1] ?? 300);
const suite = Deno.args[2] ?? "passes";
const modUrl = modPath.startsWith("file:") ? modPath : new URL(modPath, `file://${Deno.cwd()}/`).href;
const mod = await import(modUrl);
const { DType, GraphExecutor, MlxDevice } = mod;

const N = 800, ELEMS = 64;
const device = MlxDevice.open({ backend: "cpu" });
const exec = new GraphExecutor(device);
const noCache = new GraphExecutor(device, { planCache: false });
// Their own plan caches: the other hit cases change the constants of the plan they share.
const steady = new GraphExecutor(device);
const twoWords = new GraphExecutor(device);
const x = device.upload(new Float32Array(ELEMS).fill(1)), y = device.upload(new Float32Array(ELEMS).fill(2));
const wide = device.alloc(N * ELEMS * 4, DType.F32);
const slices = Array.from({ length: N }, (_, i) => wide.slice(i * ELEMS * 4, ELEMS * 4));

// deno-lint-ignore no-explicit-any
type Session = any;
// `moved` > 0 moves the outputs of dispatches 0 and 1 (a new topology for each value below N²).
const emit = (s: Session, alpha: number, moved = 0, beta = 1) => {
  for (let i = 0; i < N; i++) {
    const out = moved === 0 || i > 1 ? i : i === 0 ? moved % N : Math.floor(moved / N) % N;
    s.axpby(x, y, slices[out]!, { alpha, beta });
  }
  return s;
};
const rec = (alpha: number, autoBarriers = false, on: typeof exec = exec) =>
  emit(on.beginRecorded({ autoBarriers }), alpha);
const OPT = { fuse: true, reorder: true };
const OPT_DUAL = { fuse: true, reorder: true, dualBuffer: true };
rec(1).finish(OPT);
rec(1).finish(OPT_DUAL);
rec(1, true).finish(OPT);
rec(1, false, steady).finish(OPT);
emit(twoWords.beginRecorded({ autoBarriers: false }), 1).finish(OPT);
const frozen = rec(1).freeze(OPT);
let step = 0, moving = 2 * N; // from 2N on, dispatch 1 never writes slice 1: never the unmoved pass

const timed = (body: () => { wait(): unknown } | null): number => {
  const t = performance.now();
  const pass = body();
  const d = performance.now() - t;
  pass?.wait();
  return d;
};
const passCases: Record<string, () => number> = {
  "direct session + commit": () => timed(() => emit(exec.begin({ autoBarriers: false }), 1).commit()),
  "direct session + commit, auto barriers": () => timed(() => emit(exec.begin({ autoBarriers: true }), 1).commit()),
  "direct session, encode alone (then dispose)": () => {
    const t = performance.now();
    const s = emit(exec.begin({ autoBarriers: false }), 1);
    const d = performance.now() - t;
    s.dispose();
    return d;
  },
  "capture alone (then dispose)": () => {
    const t = performance.now();
    const s = rec(++step % 7);
    const d = performance.now() - t;
    s.dispose();
    return d;
  },
  "hit, one buffer": () => timed(() => rec(++step % 7).commit(OPT)),
  "hit, one buffer, same constants every pass": () => timed(() => rec(1, false, steady).commit(OPT)),
  "hit, one buffer, alpha and beta change": () =>
    timed(() => emit(twoWords.beginRecorded({ autoBarriers: false }), ++step % 7, 0, 1 + step % 5).commit(OPT)),
  "hit, dual buffer": () => timed(() => rec(++step % 7).commit(OPT_DUAL)),
  "hit, one buffer, auto barriers": () => timed(() => rec(++step % 7, true).commit(OPT)),
  "frozen commit": () => timed(() => frozen.commit()),
  "plan cache off": () => timed(() => emit(noCache.beginRecorded({ autoBarriers: false }), 1).commit(OPT)),
  "miss, new topology every pass": () => {
    moving++;
    return timed(() => emit(exec.beginRecorded({ autoBarriers: false }), 1, moving).commit(OPT));
  },
};

/** One token step of the demo's model in each sync-loop mode (host part). */
async function demoCases(): Promise<Record<string, () => number>> {
  const { createLlama } = await import(new URL("examples/llama.ts", modUrl).href);
  const { stepAdvance } = await import(new URL("src/ops/sample.ts", modUrl).href);
  const model = createLlama(device, {
    layers: 4,
    hidden: 256,
    heads: 4,
    kvHeads: 2,
    ffn: 704,
    vocab: 1024,
    ctx: 64,
    quant: "q4_0",
    seed: 1234,
  });
  const state = model.act.state!, position = state.slice(0, 4);
  state.write(Uint32Array.from([0, 1, 0, 0]));
  let pos = 0;
  const next = () => (pos = (pos + 1) % 32);
  return {
    "demo direct/hand": () =>
      timed(() => {
        const s = exec.begin({ autoBarriers: false });
        model.step(s, next(), () => s.barrier());
        return s.commit();
      }),
    "demo direct/auto": () =>
      timed(() => {
        const s = exec.begin({ autoBarriers: true });
        model.step(s, next(), () => {});
        return s.commit();
      }),
    "demo recorded/opt (hit)": () => {
      state.write(Uint32Array.from([next(), 1, 0, 0]));
      return timed(() => {
        const s = exec.beginRecorded();
        model.step(s, pos, () => s.barrier(), undefined, position);
        s.barrier();
        stepAdvance(s, exec.registry, state);
        return s.commit({ fuse: true, reorder: true, dualBuffer: true });
      });
    },
  };
}

const cases = suite === "demo" ? await demoCases() : passCases;
const times: Record<string, number[]> = {};
const warm = Math.min(30, rounds >> 2);
for (let r = 0; r < rounds; r++) {
  for (const [name, run] of Object.entries(cases)) {
    for (let k = 0; k < 3; k++) {
      const d = run();
      if (r >= warm) (times[name] ??= []).push(d * 1000);
    }
  }
}
const out: Record<string, { min: number; median: number }> = {};
for (const [name, v] of Object.entries(times)) {
  v.sort((a, b) => a - b);
  out[name] = { min: +v[0]!.toFixed(1), median: +v[v.length >> 1]!.toFixed(1) };
}
console.log(JSON.stringify(out));
device.close();
