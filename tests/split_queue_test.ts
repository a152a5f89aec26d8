/**
 * The native queue's launch/complete mode (the CUDA backend's pipelined path), checked on any machine:
 * a scripted C backend drives the core through the public ABI (tests/native/queue_pipeline_test.c),
 * and the CPU backend runs through the same path (MLXN_CPU_PIPELINED=1) under the lifecycle,
 * concurrency and decode-loop suites.
 */
import { equal, ok } from "node:assert/strict";
import { hostCompiler, runDeno } from "./helpers.ts";

const root = new URL("../", import.meta.url);
const path = (p: string) => new URL(p, root).pathname;

Deno.test("the queue launches command buffer k+1 while k runs, completes in order, and close drains", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const exe = `${dir}/queue_pipeline_test`;
    const kernels = [...Deno.readDirSync(path("native/contracts/"))]
      .filter((e) => e.isFile && e.name.endsWith(".c"))
      .map((e) => path(`native/contracts/${e.name}`));
    const build = await new Deno.Command(hostCompiler(), {
      args: [
        "-std=c11",
        "-O1",
        "-pthread",
        "-D_POSIX_C_SOURCE=200809L",
        "-o",
        exe,
        path("tests/native/queue_pipeline_test.c"),
        path("native/core/device.c"),
        path("native/core/queue.c"),
        path("native/core/stream.c"),
        ...kernels,
        "-ldl",
        "-lm",
      ],
      stdout: "piped",
      stderr: "piped",
    }).output();
    ok(build.success, new TextDecoder().decode(build.stderr));
    const run = await new Deno.Command(exe, { stdout: "piped", stderr: "piped" }).output();
    const out = new TextDecoder().decode(run.stdout) + new TextDecoder().decode(run.stderr);
    ok(run.success, out);
    equal(out.trim(), "queue pipeline: ok");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("the CPU backend through the launch/complete path passes the lifecycle, concurrency and decode-loop tests", async () => {
  const r = await runDeno(
    [
      "test",
      "--allow-ffi",
      "--allow-read",
      "--allow-env",
      "--allow-run",
      "--allow-write",
      path("tests/native_lifecycle_test.ts"),
      path("tests/concurrency_test.ts"),
      path("tests/decode_loop_test.ts"),
      path("tests/stream_test.ts"),
    ],
    { MLXN_CPU_PIPELINED: "1" },
  );
  ok(r.success, r.stdout.slice(-4000) + r.stderr.slice(-4000));
  ok(/ok \| \d+ passed/.test(r.stdout), r.stdout.slice(-2000));
});
