/**
 * What the demo's sync loop does around each pass, and whether it inflates the pass's encode: one
 * direct/hand decode step per token (examples/llama.ts at PyTorch's shapes, host positions), each
 * pass committed and waited for, in variants alternated round by round (3 rounds):
 *   plain      nothing between passes
 *   read       the logits read back and the next token picked on the host (as the demo does)
 *   write      the input embedding and the position written before the pass
 *   readwrite  both
 *   settle     a 1 ms busy wait after each pass (the host thread stays busy instead of waiting)
 *   readwrite_settle
 * Prints each variant's encode µs (begin to commit) p10 / p50 / p90 / mean, then the median of its
 * two parts: the model's JavaScript (begin to the step's last op) and the finish (the stream's native
 * decode or like-stream replay, and the commit).
 *
 *   deno run --allow-ffi --allow-read --allow-env bench/sync_loop_probe.ts   (BACKEND=cpu|cuda, TOKENS=n,
 *   VARIANTS=a,b; REUSE=1 begins the sessions with `reuse`; WAIT_SPIN_US=n opens the device with
 *   that `waitSpinUs`; RECORDED=1 encodes the demo's recorded/opt pass instead: position from the
 *   device step state, fused, reordered, two command buffers, a plan-cache hit from the second)
 */
import { GraphExecutor, MlxDevice } from "../mod.ts";
import type { BackendName } from "../mod.ts";
import { createLlama } from "../examples/llama.ts";

const cfg = { layers: 32, hidden: 2048, heads: 16, kvHeads: 4, ffn: 5632, vocab: 32000, ctx: 512 };
const device = MlxDevice.open({
  backend: (Deno.env.get("BACKEND") ?? "cuda") as BackendName,
  ...(Deno.env.get("WAIT_SPIN_US") !== undefined ? { waitSpinUs: Number(Deno.env.get("WAIT_SPIN_US")) } : {}),
});
const exec = new GraphExecutor(device);
const model = createLlama(device, { ...cfg, quant: "bf16", seed: 1 });
const { act, embedding } = model;
const logits = new Float32Array(cfg.vocab);
const variants = (Deno.env.get("VARIANTS") ?? "plain,read,write,readwrite,settle,readwrite_settle").split(",");
const tokens = Number(Deno.env.get("TOKENS") ?? 150);
const reuse = Deno.env.get("REUSE") === "1", recorded = Deno.env.get("RECORDED") === "1";
const state = act.state!, position = state.slice(0, 4);
const samples = new Map<string, number[]>(), jsSamples = new Map<string, number[]>();
let token = 1;
for (let round = 0; round < 3; round++) {
  for (const v of variants) {
    model.resetCache();
    if (recorded) state.write(Uint32Array.from([0, 1, 0, 0]));
    const xs = samples.get(v) ?? [], js = jsSamples.get(v) ?? [];
    samples.set(v, xs);
    jsSamples.set(v, js);
    for (let pos = 0; pos < tokens; pos++) {
      if (v.includes("write")) {
        act.x!.write(embedding.subarray(token * cfg.hidden, (token + 1) * cfg.hidden));
        act.pos!.write(new Uint32Array([pos]));
      }
      const t0 = performance.now();
      const s = recorded ? exec.beginRecorded() : exec.begin({ autoBarriers: false, reuse });
      if (recorded) {
        model.step(s, pos, () => s.barrier(), undefined, position);
        s.barrier();
        s.stepAdvance(state);
      } else model.step(s, pos, () => s.barrier());
      const jsUs = (performance.now() - t0) * 1e3;
      const rep = s.finish({
        label: `token ${pos}`,
        ...(recorded ? { fuse: true, reorder: true, dualBuffer: true } : {}),
      });
      if (pos >= 10) {
        xs.push(rep.encodingNs / 1e3);
        js.push(jsUs);
      }
      if (v.includes("read")) {
        act.logits!.readBytesInto(logits);
        let best = 0;
        for (let i = 1; i < logits.length; i++) if (logits[i]! > logits[best]!) best = i;
        token = best % 1000;
      }
      if (v.includes("settle")) {
        const until = performance.now() + 1;
        while (performance.now() < until);
      }
    }
  }
}
const median = (xs: number[]) => xs.slice().sort((a, b) => a - b)[xs.length >> 1]!;
for (const [v, xs] of samples) {
  const s = xs.slice().sort((a, b) => a - b), at = (q: number) => s[Math.floor(q * s.length)]!.toFixed(0);
  const mean = xs.reduce((a, b) => a + b, 0) / xs.length, js = jsSamples.get(v)!;
  const rest = xs.map((x, i) => x - js[i]!);
  console.log(
    `${v.padEnd(18)} encode µs p10 ${at(0.1)} p50 ${at(0.5)} p90 ${at(0.9)} mean ${mean.toFixed(0)}` +
      ` | p50 js ${median(js).toFixed(0)}, finish ${median(rest).toFixed(0)}`,
  );
}
device.close();
