/**
 * DecodeLoop's pass labels: every pass is labelled `token <position>`, or `finish.label` when one is
 * given, in direct and recorded loops, and the caller's finish options are left as given.
 */
import { deepStrictEqual } from "node:assert/strict";
import { type CommandEncoder, DecodeLoop, GraphExecutor, ops } from "../mod.ts";
import { testContext } from "./helpers.ts";

Deno.test("DecodeLoop: each pass is labelled token <position>, or finish.label on every pass", () => {
  using ctx = testContext();
  const exec = new GraphExecutor(ctx.device, { autoBarriers: false });
  using logits = ctx.device.upload(new Float32Array([0, 3, 1]));
  for (const finish of [undefined, { label: "fixed" }, { label: "x", fuse: true }]) {
    for (const recorded of [false, true]) {
      const encoders: CommandEncoder[] = [];
      using loop = new DecodeLoop(exec, {
        recorded,
        finish,
        encodeStep(s, t) {
          encoders.push(s.encoder);
          ops.argmax(s, exec.registry, logits, t.output, { vocab: 3 });
        },
      });
      const r = loop.run({ first: 0, steps: 3, startPosition: 5 });
      deepStrictEqual([...r.tokens], [1, 1, 1]);
      const labels = encoders.map((e) => e.label);
      deepStrictEqual(labels, finish ? Array(3).fill(finish.label) : ["token 5", "token 6", "token 7"]);
      if (finish) deepStrictEqual(Object.keys(finish).sort(), finish.fuse ? ["fuse", "label"] : ["label"]);
    }
  }
});
