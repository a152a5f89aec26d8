/**
 * Where a decode step's host encode goes, split at the flush: the model's ops writing the stream
 * (JS), the native decode of the stream (flush), and the commit (hand-off to the queue). Sync loop:
 * each pass is waited for before the next is encoded, so the parts are timed on a quiet host.
 * Run it on the GPU machine to compare its host with this one:
 *
 *   deno run --allow-ffi --allow-read --allow-env bench/encode_breakdown.ts [--backend cuda] [--small]
 *
 * Prints, per mode, min, median, p90 and p99 µs per token of each part and the dispatch count. Environment:
 * ROOT=<tree> measures that checkout's mod.ts and examples/llama.ts (default this one);
 * FIXED_POS=1 encodes position 5 every token, POS_STRIDE=n position n·t (default t); NO_RUN=1 flushes and drops each pass (nothing runs);
 * OVERLAP=1 keeps two passes in flight (each token waits for the one before it), as a pipelined loop
 * does (the model's state is then raced on: only the timings mean anything); SETTLE_MS=n busy-waits
 * n ms after each pass; LOOP=1 also times a pipelined DecodeLoop (encode per step, split into the
 * session's creation, the model's ops, their native decode and the rest: advance, commit, bookkeeping);
 * AB=<tree> [AB_ORDER=ba] alternates this tree's step with <tree>'s in one process (JS part only).
 */
import { parseArgs } from "node:util";
import type { BackendName, GraphExecutor as Executor, PendingPass } from "../mod.ts";

// ROOT=<tree> measures that checkout's library and example model (default this one): run it
// alternately with ROOT at two trees to compare them.
const root = (Deno.env.get("ROOT") ?? new URL("..", import.meta.url).pathname).replace(/\/$/, "");
const { DecodeLoop, GraphExecutor, MlxDevice }: typeof import("../mod.ts") = await import(`file://${root}/mod.ts`);
const { createLlama }: typeof import("../examples/llama.ts") = await import(`file://${root}/examples/llama.ts`);

const { values: a } = parseArgs({
  options: {
    backend: { type: "string" },
    small: { type: "boolean", default: false },
    tokens: { type: "string", default: "200" },
  },
});
const backend = a.backend as BackendName | undefined;
const cfg = a.small
  ? { layers: 32, hidden: 256, heads: 4, kvHeads: 2, ffn: 512, vocab: 512, ctx: 512 }
  : { layers: 32, hidden: 2048, heads: 16, kvHeads: 4, ffn: 5632, vocab: 32000, ctx: 512 };
const tokens = Number(a.tokens);
const overlap = Deno.env.get("OVERLAP") !== undefined;
const noRun = Deno.env.get("NO_RUN") !== undefined;
const settle = Number(Deno.env.get("SETTLE_MS") ?? 0);
const stride = Number(Deno.env.get("POS_STRIDE") ?? 1);
/** Token t's position: 5 with FIXED_POS, else t · POS_STRIDE (default 1) wrapped inside the cache. */
const positionOf = (t: number) => Deno.env.get("FIXED_POS") ? 5 : (t * stride) % (cfg.ctx - 1);

const stats = (xs: number[]) => {
  const s = xs.slice(20).sort((x, y) => x - y);
  const at = (q: number) => (s[Math.min(s.length - 1, Math.floor(q * s.length))]! / 1e3).toFixed(1).padStart(7);
  return `${at(0)} ${at(0.5)} ${at(0.9)} ${at(0.99)}`;
};
const now = () => performance.now() * 1e6;

// AB=<tree>: this tree's direct/hand step and <tree>'s (each its own library, device and model),
// alternated token by token in one process; only the JS part (nothing runs). The model built
// first is measured a few µs faster (where its objects lie), so AB_ORDER=ba builds <tree>'s
// first: run both orders.
const abTree = Deno.env.get("AB");
if (abTree !== undefined) {
  const trees = [root, abTree.replace(/\/$/, "")];
  if (Deno.env.get("AB_ORDER") === "ba") trees.reverse();
  const sides = [];
  for (const tree of trees) {
    const lib: typeof import("../mod.ts") = await import(`file://${tree}/mod.ts`);
    const llama: typeof import("../examples/llama.ts") = await import(`file://${tree}/examples/llama.ts`);
    const exec = new lib.GraphExecutor(lib.MlxDevice.open({ backend }));
    sides.push({
      tree,
      exec,
      model: llama.createLlama(exec.device, { ...cfg, quant: "bf16", seed: 1 }),
      js: [] as number[],
    });
  }
  for (let t = 0; t < tokens; t++) {
    for (const side of t % 2 === 0 ? sides : [...sides].reverse()) {
      const t0 = now();
      const s = side.exec.begin({ autoBarriers: false });
      side.model.step(s, positionOf(t), () => s.barrier());
      side.js.push(now() - t0);
      s.encoder.flush();
      s.dispose();
    }
  }
  for (const side of sides) console.log(`${side.tree}: direct/hand js µs min / median / p90 / p99 ${stats(side.js)}`);
  Deno.exit(0);
}

const device = MlxDevice.open({ backend });
const exec = new GraphExecutor(device);
const model = createLlama(device, { ...cfg, quant: "bf16", seed: 1 });

for (
  const auto of Deno.env.get("MODES") === "hand"
    ? [false]
    : Deno.env.get("MODES") === "auto"
    ? [true]
    : Deno.env.get("MODES") === "none"
    ? []
    : [false, true]
) {
  const js: number[] = [], flush: number[] = [], commit: number[] = [];
  let dispatches = 0;
  let previous: PendingPass | null = null;
  for (let t = 0; t < tokens; t++) {
    const pos = positionOf(t);
    const t0 = now();
    const s = exec.begin({ autoBarriers: auto });
    model.step(s, pos, auto ? () => {} : () => s.barrier());
    const t1 = now();
    s.encoder.flush();
    const t2 = now();
    if (noRun) {
      s.dispose();
      js.push(t1 - t0);
      flush.push(t2 - t1);
      commit.push(0);
      continue;
    }
    const pass = s.commit();
    const t3 = now();
    if (overlap) { // two passes in flight, as a pipelined loop keeps them: wait for the previous one
      if (previous !== null) dispatches = previous.wait().dispatches;
      previous = pass;
    } else dispatches = pass.wait().dispatches;
    if (settle > 0) {
      const until = performance.now() + settle;
      while (performance.now() < until);
    }
    js.push(t1 - t0);
    flush.push(t2 - t1);
    commit.push(t3 - t2);
  }
  previous?.wait();
  console.log(
    `${auto ? "direct/auto" : "direct/hand"} (${dispatches} dispatches): µs min / median / p90 / p99 — js ${
      stats(js)
    } | flush ${stats(flush)} | commit ${stats(commit)}`,
  );
}

// The pipelined DecodeLoop (depth 2, step state, ids read every 16 steps): its encode per step
// split into the session's creation (begin), the model's ops (the encodeStep callback, JS), their
// native decode (a flush at the end of the callback) and the rest (the step state's advance, the
// commit with its flush of that advance, the loop's own bookkeeping).
if (Deno.env.get("LOOP") !== undefined) {
  for (const auto of [false, true]) {
    const beginNs: number[] = [], modelNs: number[] = [], flushNs: number[] = [];
    // The loop's executor with begin() timed (the loop calls nothing else on it per step).
    const timed = Object.create(exec) as Executor;
    timed.begin = (o) => {
      const t0 = now();
      const s = exec.begin(o);
      beginNs.push(now() - t0);
      return s;
    };
    const loop = new DecodeLoop(timed, {
      depth: 2,
      readBatch: 16,
      stepState: true,
      session: { autoBarriers: auto },
      encodeStep: (s, t) => {
        const t0 = now();
        model.tokenStep(s, t, auto ? () => {} : () => s.barrier());
        const t1 = now();
        s.encoder.flush();
        modelNs.push(t1 - t0);
        flushNs.push(now() - t1);
      },
    });
    model.resetCache();
    loop.run({ first: 1, steps: 20 });
    for (const xs of [beginNs, modelNs, flushNs]) xs.length = 0;
    const steps = Math.min(tokens, cfg.ctx - 21);
    const rep = loop.run({ first: 1, steps, startPosition: 20 });
    const encode = rep.timings.map((t) => t.committedNs - t.encodeStartNs);
    const rest = encode.map((e, i) => e - beginNs[i]! - modelNs[i]! - flushNs[i]!);
    console.log(
      `DecodeLoop ${auto ? "direct/auto" : "direct/hand"}: encode µs min / median / p90 / p99 ${stats(encode)} (mean ${
        (rep.encodeNs / steps / 1e3).toFixed(1)
      }) = begin ${stats(beginNs)} | js ${stats(modelNs)} | flush ${stats(flushNs)} | rest ${stats(rest)}; ` +
        `wall ${(rep.wallNs / steps / 1e3).toFixed(0)} µs, device ${
          (rep.deviceNs / steps / 1e3).toFixed(0)
        } µs per step`,
    );
    loop.dispose();
  }
}
