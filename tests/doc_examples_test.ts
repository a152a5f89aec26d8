/**
 * The JSDoc examples of mod.ts, the entry and every runtime module that has them, and the README's
 * TypeScript blocks, type-check and run (`deno test --doc`). Examples import the
 * package by its name, "@mlxn/mlx-native", which resolves to this checkout through deno.json.
 */
import { equal, match } from "node:assert/strict";

const root = new URL("../", import.meta.url).pathname;
const DOCUMENTED = [
  "mod.ts",
  "build.ts",
  "src/config.ts",
  "src/errors.ts",
  "src/dtype.ts",
  "src/native/abi.ts",
  "src/native/ffi.ts",
  "src/native/loader.ts",
  "src/native/sources.ts",
  "src/native/status.ts",
  "src/buffer.ts",
  "src/counters.ts",
  "src/device.ts",
  "src/encoder.ts",
  "src/executor.ts",
  "src/graph/compute_graph.ts",
  "src/plan_cache.ts",
  "src/graph/tracker.ts",
  "src/kernels.ts",
  "src/profile.ts",
  "README.md",
];

Deno.test("JSDoc and README examples type-check and run", async () => {
  const env = Object.fromEntries(Object.entries(Deno.env.toObject()).filter(([k]) => !k.startsWith("MLXN_")));
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["test", "-P", "--no-prompt", "--doc", ...DOCUMENTED],
    cwd: root,
    env: { ...env, NO_COLOR: "1" },
    clearEnv: true,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
  equal(out.code, 0, text);
  for (const file of ["mod.ts", "src/errors.ts", "README.md"]) {
    match(text, new RegExp(`${file}#\\d+-\\d+\\.ts \\.\\.\\. ok`));
  }
});
