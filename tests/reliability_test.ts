/**
 * Reliability: a matrix of bad inputs across the API (each must be an MlxError with the right code
 * and an actionable message, after which the device still computes correctly and nothing leaked),
 * fault injection, a 10 000-session soak, and buffer lifetimes under garbage collection.
 */
import { deepStrictEqual, equal, ok } from "node:assert/strict";
import { DType, GraphExecutor, type MlxBuffer, MlxDevice, MlxError, type MlxErrorCode, ops } from "../mod.ts";
import { debugFault } from "../src/ops/elementwise.ts";
import { ABI_VERSION } from "../src/native/abi.ts";
import { loadLibrary } from "../src/native/loader.ts";
import { randomValues, runDeno, testContext } from "./helpers.ts";

type Ctx = ReturnType<typeof testContext>;
interface Case {
  name: string;
  code: MlxErrorCode;
  message: RegExp;
  run(c: Ctx, bufs: Record<string, MlxBuffer>): void;
}

/** The cases (each opens what it needs from the shared context). */
function matrix(fakeAbiLib: string, textFile: string, dir: string): Case[] {
  const enc = (c: Ctx) => c.device.commandEncoder();
  const withEnc =
    (f: (e: ReturnType<typeof enc>, c: Ctx, b: Record<string, MlxBuffer>) => void) =>
    (c: Ctx, b: Record<string, MlxBuffer>) => {
      using e = enc(c);
      f(e, c, b);
    };
  const norm = { rows: 1, dim: 16, eps: 1e-5 };
  const fav = { nHeads: 1, nKvHeads: 1, headDim: 64 as const, kvSeqLen: 1, kvCapacity: 1 };
  const add = (e: ReturnType<typeof enc>, c: Ctx, b: Record<string, MlxBuffer>) =>
    ops.elementwiseAdd(e, c.registry, b.f32!, b.f32!, b.out!);
  const desc = (c: Ctx, b: Record<string, MlxBuffer>) => ({
    pipeline: c.registry.get("elementwise_add_f32"),
    bindings: [b.f32, b.f32, b.out, [16]] as (MlxBuffer | number[])[],
    grid: 16,
    threadgroup: 16,
    dispatchKind: "threads" as const,
  });
  const IA: MlxErrorCode = "InvalidArgument";
  return [
    // dtypes, shapes, sizes
    {
      name: "add with mixed dtypes",
      code: IA,
      message: /b must be f32, got f16/,
      run: withEnc((e, c, b) => ops.elementwiseAdd(e, c.registry, b.f32!, b.f16!, b.out!)),
    },
    {
      name: "add with n past the buffers",
      code: IA,
      message: /holds 64 bytes, needs 400/,
      run: withEnc((e, c, b) => ops.elementwiseAdd(e, c.registry, b.f32!, b.f32!, b.out!, 100)),
    },
    {
      name: "rms_norm dim 0",
      code: IA,
      message: /dim must be an integer >= 1/,
      run: withEnc((e, c, b) => ops.rmsNorm(e, c.registry, b.f32!, b.f32!, b.out!, { ...norm, dim: 0 })),
    },
    {
      name: "rms_norm fractional rows",
      code: IA,
      message: /rows must be an integer/,
      run: withEnc((e, c, b) => ops.rmsNorm(e, c.registry, b.f32!, b.f32!, b.out!, { ...norm, rows: 1.5 })),
    },
    {
      name: "softmax negative cols",
      code: IA,
      message: /cols must be an integer >= 1/,
      run: withEnc((e, c, b) => ops.softmax(e, c.registry, b.f32!, b.out!, { rows: 1, cols: -4 })),
    },
    {
      name: "rope odd head dim",
      code: IA,
      message: /headDim must be even/,
      run: withEnc((e, c, b) => ops.rope(e, c.registry, b.f32!, b.out!, b.u32!, { theta: 1e4, headDim: 5, seqLen: 1 })),
    },
    {
      name: "rope_neox rope dim > head dim",
      code: IA,
      message: /ropeDim 32 exceeds headDim 16/,
      run: withEnc((e, c, b) =>
        ops.ropeNeox(e, c.registry, b.f32!, b.out!, b.u32!, {
          theta: 1e4,
          headDim: 16,
          ropeDim: 32,
          nHeads: 1,
          seqLen: 1,
        })
      ),
    },
    {
      name: "matmul with u8 weights",
      code: IA,
      message: /weights must be f32, bf16 or f16, got u8/,
      run: withEnc((e, c, b) => ops.matmul(e, c.registry, b.f32!, b.u8!, b.out!, { m: 1, n: 1, k: 4 })),
    },
    {
      name: "ggml k not a block multiple",
      code: IA,
      message: /multiple of 32 for q4_0/,
      run: withEnc((e, c, b) =>
        ops.quantizedMatmulGgml(e, c.registry, b.f32!, b.u8!, b.out!, { m: 1, n: 1, k: 40, format: "q4_0" })
      ),
    },
    {
      name: "ggml unknown format",
      code: IA,
      message: /unknown format q3_k/,
      run: withEnc((e, c, b) =>
        ops.quantizedMatmulGgml(e, c.registry, b.f32!, b.u8!, b.out!, { m: 1, n: 1, k: 32, format: "q3_k" as "q4_0" })
      ),
    },
    {
      name: "affine 7 bits",
      code: IA,
      message: /bits must be 2, 3, 4, 5, 6 or 8/,
      run: withEnc((e, c, b) =>
        ops.quantizedMatmul(e, c.registry, b.f32!, b.u8!, b.bf16!, b.bf16!, b.out!, {
          m: 1,
          n: 1,
          k: 32,
          bits: 7 as 4,
          groupSize: 32,
        })
      ),
    },
    {
      name: "affine group 48",
      code: IA,
      message: /groupSize must be 32, 64 or 128/,
      run: withEnc((e, c, b) =>
        ops.quantizedMatmul(e, c.registry, b.f32!, b.u8!, b.bf16!, b.bf16!, b.out!, {
          m: 1,
          n: 1,
          k: 48,
          bits: 4,
          groupSize: 48 as 32,
        })
      ),
    },
    {
      name: "sdpa kv heads not dividing heads",
      code: IA,
      message: /nKvHeads \(3\) must divide nHeads \(4\)/,
      run: withEnc((e, c, b) =>
        ops.sdpa(e, c.registry, b.f32!, b.f32!, b.f32!, b.out!, {
          nHeads: 4,
          nKvHeads: 3,
          headDim: 4,
          seqLen: 1,
          kvSeqLen: 1,
          kvCapacity: 1,
        })
      ),
    },
    {
      name: "sdpa seq longer than kv",
      code: IA,
      message: /seqLen \(2\) <= kvSeqLen \(1\)/,
      run: withEnc((e, c, b) =>
        ops.sdpa(e, c.registry, b.f32!, b.f32!, b.f32!, b.out!, {
          nHeads: 1,
          nKvHeads: 1,
          headDim: 4,
          seqLen: 2,
          kvSeqLen: 1,
          kvCapacity: 2,
        })
      ),
    },
    {
      name: "flash head dim 96",
      code: IA,
      message: /headDim must be 64, 128, 256 or 512, got 96/,
      run: withEnc((e, c, b) =>
        ops.flashAttnVec(e, c.registry, b.f32!, b.f32!, b.f32!, b.f32!, b.out!, { ...fav, headDim: 96 as 64 })
      ),
    },
    {
      name: "flash kv past capacity",
      code: IA,
      message: /kvSeqLen \(5\) exceeds kvCapacity \(4\)/,
      run: withEnc((e, c, b) =>
        ops.flashAttnVec(e, c.registry, b.f32!, b.f32!, b.f32!, b.f32!, b.out!, { ...fav, kvSeqLen: 5, kvCapacity: 4 })
      ),
    },
    {
      name: "flash unknown mask",
      code: IA,
      message: /mask must be none, causal or sliding/,
      run: withEnc((e, c, b) =>
        ops.flashAttnVec(e, c.registry, b.f32!, b.f32!, b.f32!, b.f32!, b.out!, { ...fav, mask: "bogus" as "none" })
      ),
    },
    {
      name: "strided copy stride < cols",
      code: IA,
      message: /dstStride must be an integer >= 8/,
      run: withEnc((e, c, b) => ops.stridedCopy(e, c.registry, b.f32!, b.out!, { rows: 2, cols: 8, dstStride: 4 })),
    },
    // NaN / Inf parameters
    {
      name: "rms_norm eps NaN",
      code: IA,
      message: /eps must be finite/,
      run: withEnc((e, c, b) => ops.rmsNorm(e, c.registry, b.f32!, b.f32!, b.out!, { ...norm, eps: NaN })),
    },
    {
      name: "softcap cap Infinity",
      code: IA,
      message: /cap must be finite/,
      run: withEnc((e, c, b) => ops.softcap(e, c.registry, b.f32!, b.out!, { cap: Infinity })),
    },
    {
      name: "axpby alpha NaN",
      code: IA,
      message: /alpha must be finite/,
      run: withEnc((e, c, b) => ops.axpby(e, c.registry, b.f32!, b.f32!, b.out!, { alpha: NaN, beta: 1 })),
    },
    {
      name: "rope theta negative",
      code: IA,
      message: /theta must be > 0/,
      run: withEnc((e, c, b) => ops.rope(e, c.registry, b.f32!, b.out!, b.u32!, { theta: -1, headDim: 4, seqLen: 1 })),
    },
    {
      name: "sdpa scale NaN",
      code: IA,
      message: /scale must be finite/,
      run: withEnc((e, c, b) =>
        ops.sdpa(e, c.registry, b.f32!, b.f32!, b.f32!, b.out!, {
          nHeads: 1,
          nKvHeads: 1,
          headDim: 4,
          seqLen: 1,
          kvSeqLen: 1,
          kvCapacity: 1,
          scale: NaN,
        })
      ),
    },
    {
      name: "flash softcap negative",
      code: IA,
      message: /softcap must be >= 0/,
      run: withEnc((e, c, b) =>
        ops.flashAttnVec(e, c.registry, b.f32!, b.f32!, b.f32!, b.f32!, b.out!, { ...fav, softcap: -1 })
      ),
    },
    // slices, sizes, allocation
    {
      name: "slice past the end",
      code: IA,
      message: /outside this 64-byte view/,
      run: (_c, b) => void b.f32!.slice(32, 64),
    },
    {
      name: "slice negative offset",
      code: IA,
      message: /outside this 64-byte view/,
      run: (_c, b) => void b.f32!.slice(-4, 4),
    },
    {
      name: "slice misaligned for its dtype",
      code: IA,
      message: /multiples of 4 bytes for f32/,
      run: (_c, b) => void b.f32!.slice(2, 8),
    },
    {
      name: "write past the end",
      code: IA,
      message: /does not fit this 64-byte view/,
      run: (_c, b) => b.f32!.write(new Float32Array(17)),
    },
    {
      name: "zero-length allocation",
      code: IA,
      message: /byteLength must be a positive integer/,
      run: (c) => void c.device.alloc(0),
    },
    {
      name: "fractional allocation",
      code: IA,
      message: /byteLength must be a positive integer/,
      run: (c) => void c.device.alloc(7.5),
    },
    { name: "empty upload", code: IA, message: /data is empty/, run: (c) => void c.device.upload(new Float32Array(0)) },
    {
      name: "shape larger than the bytes",
      code: IA,
      message: /shape \[4,4\] of f32 needs 64 bytes, more than 32/,
      run: (c) => void c.device.alloc(32, DType.F32, [4, 4]),
    },
    {
      name: "allocation larger than any device",
      code: "OutOfMemory",
      message: /larger than any device/,
      run: (c) => void c.device.alloc(2 ** 52),
    },
    // disposed objects
    {
      name: "read a disposed buffer",
      code: "Disposed",
      message: /was disposed: allocate a new one/,
      run: (c) => {
        const x = c.device.alloc(16);
        x.dispose();
        x.read();
      },
    },
    {
      name: "dispatch a disposed buffer",
      code: "Disposed",
      message: /slot 0 \(a\) binds a disposed buffer/,
      run: withEnc((e, c, b) => {
        const x = c.device.alloc(64, DType.F32);
        x.dispose();
        ops.elementwiseAdd(e, c.registry, x, b.f32!, b.out!);
      }),
    },
    {
      name: "slice a disposed buffer",
      code: "Disposed",
      message: /was disposed/,
      run: (c) => {
        const x = c.device.alloc(16);
        x.dispose();
        x.slice(0, 4);
      },
    },
    {
      name: "use a disposed encoder",
      code: "Disposed",
      message: /encoder was disposed; create a new one/,
      run: (c, b) => {
        const e = enc(c);
        e.dispose();
        add(e, c, b);
      },
    },
    {
      name: "alloc on a closed device",
      code: "Disposed",
      message: /device was closed: open a new one/,
      run: () => {
        const d = MlxDevice.open();
        d.close();
        d.alloc(4);
      },
    },
    // lifecycle
    {
      name: "dispatch after commit",
      code: "InvalidState",
      message: /already committed .*create a new encoder/,
      run: (c, b) => {
        using e = enc(c);
        e.commitAndWait();
        add(e, c, b);
      },
    },
    {
      name: "double commit",
      code: "InvalidState",
      message: /already committed/,
      run: (c) => {
        using e = enc(c);
        e.commit();
        e.commit();
      },
    },
    {
      name: "wait before commit",
      code: "InvalidState",
      message: /commit the command buffer first/,
      run: (c) => {
        using e = enc(c);
        e.waitUntilCompleted();
      },
    },
    {
      name: "session op after finish",
      code: "InvalidState",
      message: /already finished or disposed; begin a new one/,
      run: (c, b) => {
        const s = new GraphExecutor(c.device).begin();
        s.finish();
        s.elementwiseAdd(b.f32!, b.f32!, b.out!);
      },
    },
    {
      name: "commit while capturing",
      code: "InvalidState",
      message: /takeCapture\(\) first/,
      run: (c) => {
        using e = enc(c);
        e.startCapture();
        e.commit();
      },
    },
    // geometry and bindings of raw dispatches
    {
      name: "grid of 0",
      code: IA,
      message: /grid \[0, 1, 1\] needs positive integers/,
      run: withEnc((e, c, b) => e.dispatch({ ...desc(c, b), grid: 0 })),
    },
    {
      name: "threadgroup above the device limit",
      code: IA,
      message: /at most 1024 threads/,
      run: withEnc((e, c, b) => e.dispatch({ ...desc(c, b), threadgroup: [2048, 1, 1] })),
    },
    {
      name: "threadgroup memory above the limit",
      code: IA,
      message: /threadgroup memory 65536 must be an integer in 0\.\.32768/,
      run: withEnc((e, c, b) => e.dispatch({ ...desc(c, b), threadgroupMemory: 65536 })),
    },
    {
      name: "missing binding",
      code: IA,
      message: /slot 3 \(params\{n:u32\}\) needs inline constants .*got nothing/,
      run: withEnc((e, c, b) => e.dispatch({ ...desc(c, b), bindings: [b.f32, b.f32, b.out] })),
    },
    {
      name: "extra binding",
      code: IA,
      message: /5 bindings given, the kernel has 4 slots/,
      run: withEnc((e, c, b) => e.dispatch({ ...desc(c, b), bindings: [b.f32, b.f32, b.out, [16], b.f32] })),
    },
    {
      name: "mistyped binding",
      code: IA,
      message: /slot 2 \(out\) needs an MlxBuffer, got bytes/,
      run: withEnc((e, c, b) => e.dispatch({ ...desc(c, b), bindings: [b.f32, b.f32, [1], [16]] })),
    },
    {
      name: "inline word that is not a u32",
      code: IA,
      message: /word 0 is 0\.5, not a u32: encode floats with f32Bits/,
      run: withEnc((e, c, b) => e.dispatch({ ...desc(c, b), bindings: [b.f32, b.f32, b.out, [0.5]] })),
    },
    // kernels and libraries
    {
      name: "unknown kernel",
      code: "KernelNotFound",
      message: /kernel 'nope_f32' is not available on the [\w-]+ backend.*Known kernels/,
      run: (c) => void c.registry.get("nope_f32"),
    },
    {
      name: "library with another ABI version",
      code: "AbiMismatch",
      message: new RegExp(`speaks ABI version 999, this module needs ${ABI_VERSION}: rebuild`),
      run: () => void loadLibrary(fakeAbiLib),
    },
    {
      name: "missing library file",
      code: "LibraryNotFound",
      message: /does not exist: build it with `make native`/,
      run: () => void loadLibrary(`${dir}/absent.so`),
    },
    {
      name: "library path that is not a library",
      code: "LibraryLoadFailed",
      message: /exists but could not be loaded/,
      run: () => void loadLibrary(textFile),
    },
    {
      name: "library path that is a directory",
      code: "LibraryLoadFailed",
      message: /could not be loaded/,
      run: () => void loadLibrary(dir),
    },
  ];
}

Deno.test("bad-input matrix: every case is a clear MlxError and the device keeps working", async (t) => {
  const dir = Deno.makeTempDirSync();
  Deno.writeTextFileSync(`${dir}/v.c`, "unsigned mlxn_abi_version(void) { return 999; }\n");
  const cc = await new Deno.Command("cc", { args: ["-shared", "-fPIC", "-o", `${dir}/libv.so`, `${dir}/v.c`] })
    .output();
  ok(cc.success);
  Deno.writeTextFileSync(`${dir}/text.so`, "not a library");
  using ctx = testContext();
  const { device, registry } = ctx;
  const bufs = {
    f32: device.upload(Float32Array.from({ length: 16 }, (_, i) => i)),
    f16: device.alloc(32, DType.F16),
    bf16: device.alloc(32, DType.BF16),
    u8: device.alloc(64, DType.U8),
    u32: device.upload(new Uint32Array([0, 1, 2, 3])),
    out: device.alloc(64, DType.F32),
  };
  const baseline = MlxDevice.liveObjects(device);
  const list = matrix(`${dir}/libv.so`, `${dir}/text.so`, dir);
  ok(list.length >= 40, `only ${list.length} cases`);
  for (const c of list) {
    await t.step(c.name, () => {
      let caught: unknown;
      try {
        c.run(ctx, bufs);
      } catch (e) {
        caught = e;
      }
      ok(caught instanceof MlxError, `${c.name}: expected an MlxError, got ${caught}`);
      equal(caught.code, c.code, `${c.name}: ${caught.message}`);
      ok(c.message.test(caught.message), `${c.name}: message "${caught.message}" does not match ${c.message}`);
      // The device keeps working: the next dispatch is correct, and nothing leaked.
      bufs.out.write(new Float32Array(16));
      using e = device.commandEncoder();
      ops.elementwiseAdd(e, registry, bufs.f32, bufs.f32, bufs.out);
      e.commitAndWait();
      deepStrictEqual(Array.from(bufs.out.read()), Array.from({ length: 16 }, (_, i) => 2 * i));
      const now = MlxDevice.liveObjects(device);
      equal(now.commandBuffers, baseline.commandBuffers, "no command buffer leaked");
      equal(now.buffers, baseline.buffers, "no buffer leaked");
    });
  }
  for (const b of Object.values(bufs)) b.dispose();
  Deno.removeSync(dir, { recursive: true });
});

Deno.test("fault injection: a failing dispatch fails its command buffer (sticky); later ones work", async () => {
  using ctx = testContext();
  const { device, registry } = ctx;
  using marker = device.alloc(4, DType.U32), after = device.alloc(64, DType.F32);
  using x = device.upload(new Float32Array(16).fill(1));
  const enc = device.commandEncoder();
  debugFault(enc, registry, marker, { fail: true });
  enc.memoryBarrier();
  ops.elementwiseAdd(enc, registry, x, x, after); // a later group: must not run
  enc.commit("faulty");
  let first: unknown;
  try {
    await enc.completed();
  } catch (e) {
    first = e;
  }
  ok(first instanceof MlxError && first.code === "CommandBufferError", String(first));
  ok(/'faulty' failed: dispatch 0 \(tag 0, kernel debug_fault\)/.test(first.message), first.message);
  let second: unknown;
  try {
    enc.waitUntilCompleted();
  } catch (e) {
    second = e;
  }
  equal(second, first, "the error is sticky");
  equal(enc.state, "failed");
  // (Whether later groups of the failed command buffer ran is backend-specific: the CPU backend
  // stops at the failed group, a GPU runs its whole graph. Only the reporting is guaranteed.)
  void after;
  enc.dispose();
  using ok2 = device.commandEncoder();
  debugFault(ok2, registry, marker, { fail: false });
  ok2.commitAndWait();
  equal(marker.read()[0], 1, "the next command buffer runs");
  equal(MlxDevice.liveObjects(device).commandBuffers, 0);
});

Deno.test("soak: 10 000 sessions — finished, abandoned, async — leave no native objects and bounded RSS", async () => {
  using ctx = testContext();
  const { device } = ctx;
  const exec = new GraphExecutor(device);
  using a = device.upload(randomValues(256, 1)), b = device.upload(randomValues(256, 2));
  using out = device.alloc(1024, DType.F32);
  const before = MlxDevice.liveObjects(device);
  const rss0 = Deno.memoryUsage().rss;
  const pending: Promise<unknown>[] = [];
  let finished = 0, abandoned = 0, asynchronous = 0;
  for (let i = 0; i < 10_000; i++) {
    const kind = i % 3;
    const s = i % 2 ? exec.begin({ autoBarriers: true }) : exec.beginRecorded();
    s.elementwiseAdd(a, b, out);
    s.gelu(out, out);
    if (kind === 0) {
      s.finish({ fuse: true, reorder: true });
      finished++;
    } else if (kind === 1) {
      s.dispose(); // abandoned
      abandoned++;
    } else {
      pending.push(s.commit().completed());
      asynchronous++;
      if (pending.length >= 64) await Promise.all(pending.splice(0));
    }
  }
  await Promise.all(pending);
  // The plan cache keeps the decoded records (one command buffer each) of the plans it replays
  // unchanged, at most two per plan: bounded, and gone with the cache.
  const cached = MlxDevice.liveObjects(device).commandBuffers - before.commandBuffers;
  ok(cached <= 2 * exec.planCache!.stats().size, `${cached} command buffers held by the plan cache`);
  exec.planCache!.clear();
  const after = MlxDevice.liveObjects(device);
  const growthMb = (Deno.memoryUsage().rss - rss0) / 2 ** 20;
  console.log(
    `soak: ${finished} finished, ${abandoned} abandoned, ${asynchronous} async; live command buffers ` +
      `${before.commandBuffers} → ${after.commandBuffers}, buffers ${before.buffers} → ${after.buffers}; RSS +${
        growthMb.toFixed(1)
      } MiB`,
  );
  deepStrictEqual(after, before);
  // Under ASan freed memory waits in a quarantine of up to 256 MiB, so RSS says nothing about leaks
  // there (it swung by ±110 MiB with the order of the test files); the live-object counts above still do.
  const asan = (Deno.env.get("LD_PRELOAD") ?? "").includes("asan");
  if (!asan) ok(growthMb < 64, `RSS grew by ${growthMb.toFixed(1)} MiB`);
});

Deno.test("garbage-collected buffers are never freed while a command buffer uses them", async () => {
  const probe = new URL("./fixtures/gc_probe.ts", import.meta.url).pathname;
  const r = await runDeno([
    "run",
    "--no-prompt",
    "--quiet",
    "--allow-ffi",
    "--allow-env",
    "--v8-flags=--expose-gc",
    probe,
  ]);
  ok(r.success, r.stderr);
  const out = JSON.parse(r.stdout.trim());
  equal(out.correct, true, "the kernel read live memory after its inputs were collected");
  equal(out.liveDuring > out.liveAfter, true, "collected buffers were freed after completion");
  equal(out.liveAfter, out.baseline + 1, "only the output buffer remains");
});

Deno.test("a script that ends with a device open and work in flight exits cleanly", async () => {
  const probe = new URL("./fixtures/exit_probe.ts", import.meta.url).pathname;
  // The crash this guards against was intermittent, so each ending is tried several times.
  for (const ending of ["normal", "throw"]) {
    for (let i = 0; i < 6; i++) {
      const r = await runDeno(["run", "--no-prompt", "--quiet", "--allow-ffi", "--allow-env", probe, ending]);
      equal(r.code, ending === "normal" ? 0 : 1, `${ending} ending, run ${i}: exit ${r.code}\n${r.stderr}`);
    }
  }
});
