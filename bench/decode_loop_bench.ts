/**
 * The token loop of examples/decode.ts (its default model: 4 layers, hidden 512, Q4_0, vocab 2048),
 * 8 tokens per iteration, three ways: the classic loop (the host writes the embedding, waits, reads
 * the logits and takes their argmax), a DecodeLoop that waits for every pass (depth 1), and the
 * pipelined DecodeLoop (depth 2: token n+1 is encoded while token n runs). All passes are recorded,
 * fused and reordered, one command buffer per token.
 *
 *   deno bench --allow-ffi --allow-read --allow-env bench/decode_loop_bench.ts
 */
import { DecodeLoop, GraphExecutor, MlxDevice } from "../mod.ts";
import { createLlama } from "../examples/llama.ts";

const TOKENS = 8;
const device = MlxDevice.open();
const exec = new GraphExecutor(device);
const model = createLlama(device, {
  layers: 4,
  hidden: 512,
  heads: 8,
  kvHeads: 2,
  ffn: 1408,
  vocab: 2048,
  ctx: TOKENS,
  quant: "q4_0",
  seed: 1234,
});
const finish = { fuse: true, reorder: true };
const loop = (depth: number) =>
  new DecodeLoop(exec, {
    depth,
    readBatch: TOKENS,
    recorded: true,
    session: { autoBarriers: false },
    finish,
    encodeStep: (s, t) => model.tokenStep(s, t, () => s.barrier()),
  });
const serial = loop(1), pipelined = loop(2);
const group = "token loop", n = 20, warmup = 3;

Deno.bench(`classic: host argmax of read logits, ${TOKENS} tokens`, { group, baseline: true, n, warmup }, () => {
  const { act, embedding } = model, hidden = model.cfg.hidden;
  let token = 1;
  for (let pos = 0; pos < TOKENS; pos++) {
    act.x!.write(embedding.subarray(token * hidden, (token + 1) * hidden));
    act.pos!.write(new Uint32Array([pos]));
    const s = exec.beginRecorded({ autoBarriers: false });
    model.step(s, pos, () => s.barrier());
    s.finish(finish);
    const logits = act.logits!.read() as Float32Array;
    token = logits.reduce((best, v, i) => v > logits[best]! ? i : best, 0);
  }
});

Deno.bench(`DecodeLoop depth 1 (device argmax, wait each pass), ${TOKENS} tokens`, { group, n, warmup }, () => {
  serial.run({ first: 1, steps: TOKENS });
});

Deno.bench(`DecodeLoop depth 2 (pipelined), ${TOKENS} tokens`, { group, n, warmup }, () => {
  pipelined.run({ first: 1, steps: TOKENS });
});
