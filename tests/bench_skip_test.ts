/**
 * The GPU benches on a machine without a GPU backend: `deno bench` must report them skipped and
 * pass, not fail opening CUDA nor run GPU-sized work on the CPU. The subprocess may load only the
 * CPU library, so this holds on a GPU machine too.
 */
import { equal, match, ok } from "node:assert/strict";
import { defaultLibraryPath } from "../src/native/loader.ts";
import { runDeno } from "./helpers.ts";

const bench = (name: string) => new URL(`../bench/${name}`, import.meta.url).pathname;

Deno.test("GPU benches are skipped, not failed, when only the CPU backend is available", async () => {
  const cpuLib = defaultLibraryPath("cpu")!;
  const r = await runDeno([
    "bench",
    "--no-prompt",
    "--no-check", // make check type-checks the benches
    `--allow-ffi=${cpuLib}`,
    "--allow-read",
    bench("gpu_bench.ts"),
    bench("gpu_kernels_bench.ts"),
  ]);
  equal(r.code, 0, r.stderr + r.stdout);
  match(r.stderr, /gpu_bench: skipped, it needs a GPU backend \(.*libmlxn_cuda/);
  match(r.stderr, /gpu_kernels_bench: skipped, it needs a GPU backend \(the best available backend is the CPU\)/);
  ok(!/GB\/s|wallMsPerCb/.test(r.stdout), `a GPU bench ran on the CPU:\n${r.stdout}`);
});
