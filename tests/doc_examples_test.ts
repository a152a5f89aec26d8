/** The JSDoc examples of the runtime modules type-check and run (`deno test --doc`). */
import { ok } from "node:assert/strict";
import { runDeno } from "./helpers.ts";

const FILES = [
  "src/buffer.ts",
  "src/counters.ts",
  "src/device.ts",
  "src/encoder.ts",
  "src/executor.ts",
  "src/graph/compute_graph.ts",
  "src/graph/plan_cache.ts",
  "src/kernels.ts",
  "src/profile.ts",
];

Deno.test("JSDoc examples of the runtime modules pass deno test --doc", async () => {
  const root = new URL("../", import.meta.url).pathname;
  const out = await runDeno([
    "test",
    "--doc",
    "--quiet",
    "--allow-ffi",
    "--allow-read",
    "--allow-env",
    `--config=${root}deno.json`,
    ...FILES.map((f) => root + f),
  ]);
  ok(out.success, out.stdout + out.stderr);
});
