/**
 * Where the decode step's device time goes (run on the GPU machine): the step of examples/llama.ts
 * at PyTorch's shapes (bf16), encoded with some ops left out, and the device time per token of each
 * variant. The differences bound each part's share, including the dependency levels it adds:
 *
 *   deno run --allow-ffi --allow-read --allow-env bench/decode_ablation.ts [--backend cuda] [--small]
 *
 * Variants: the full step; the products only (with the step's barriers, and without any, which is
 * the products' pure streaming time); no attention; no products; no norm/mul/rope/copy. Outputs are
 * meaningless once ops are left out: only the timings matter. `--small` runs a 2-layer model (a
 * quick check of the script on the CPU backend).
 */
import { parseArgs } from "node:util";
import { type BackendName, GraphExecutor, type GraphSession, MlxDevice } from "../mod.ts";
import { createLlama } from "../examples/llama.ts";

const { values: a } = parseArgs({
  options: { backend: { type: "string" }, small: { type: "boolean", default: false }, tokens: { type: "string" } },
});
const device = MlxDevice.open({ backend: a.backend as BackendName | undefined });
const exec = new GraphExecutor(device);
const cfg = a.small
  ? { layers: 2, hidden: 512, heads: 8, kvHeads: 2, ffn: 1408, vocab: 2048, ctx: 64 }
  : { layers: 32, hidden: 2048, heads: 16, kvHeads: 4, ffn: 5632, vocab: 32000, ctx: 512 };
const model = createLlama(device, { ...cfg, quant: "bf16", seed: 1 });
const tokens = Number(a.tokens ?? 32), warmup = 8;

const PRODUCTS = ["matmul"];
const SMALL = ["rmsNorm", "elementwiseMul", "ropeNeox", "stridedCopy"];
const ATTENTION = ["flashAttnVec"];
const variants: { name: string; drop: string[]; barriers: boolean }[] = [
  { name: "full step", drop: [], barriers: true },
  { name: "products only", drop: [...SMALL, ...ATTENTION], barriers: true },
  { name: "products only, no barriers", drop: [...SMALL, ...ATTENTION], barriers: false },
  { name: "no attention", drop: ATTENTION, barriers: true },
  { name: "no products", drop: PRODUCTS, barriers: true },
  { name: "no norm/mul/rope/copy", drop: SMALL, barriers: true },
];

/** A session whose listed methods do nothing. */
function without(s: GraphSession, drop: string[]): GraphSession {
  return new Proxy(s, {
    get(target, key) {
      if (typeof key === "string" && drop.includes(key)) return () => {};
      const v = Reflect.get(target, key, target);
      return typeof v === "function" ? v.bind(target) : v;
    },
  });
}

console.log(`device: ${device.info.name} — ${device.backend}; ${cfg.layers} layers, ${tokens} tokens per variant`);
for (const v of variants) {
  let gpuNs = 0, dispatches = 0;
  for (let pos = 0; pos < warmup + tokens; pos++) {
    model.act.pos!.write(new Uint32Array([pos]));
    const s = exec.begin({});
    model.step(without(s, v.drop), pos, v.barriers ? () => s.barrier() : () => {});
    const rep = s.finish({});
    if (pos >= warmup) gpuNs += rep.gpuNs;
    dispatches = rep.dispatches;
  }
  console.log(
    `${v.name.padEnd(28)} ${(gpuNs / tokens / 1e6).toFixed(3)} ms/token device, ${dispatches} dispatches/token`,
  );
}
