/**
 * A hostile review of the ops' cheaper write path (putBuffer / putRareBuffer, CommandEncoder.opBegin /
 * #opBeginRare, putWords, sessionMethod): the op path against the descriptor path (the same op given a
 * target that is not a CommandEncoder, which dispatches its descriptor) on views at and past 4 GiB,
 * refused ops, a writer filled to the exact word, captures started and finished between ops,
 * committed and disposed encoders, validation, automatic barriers and closed sessions. No run
 * compares results of dispatches with a hazard and no barrier (racy on the CPU backend): those passes
 * are compared as stream words and counts only, and never committed.
 * Then the review's findings, fixed: missing arguments and detached session methods give
 * InvalidArgument, and rope checks the option values it writes.
 */
import { deepStrictEqual, equal, ok, throws } from "node:assert/strict";
import {
  type CommandEncoder,
  DType,
  GraphExecutor,
  type MlxBuffer,
  MlxBuffer as MlxBufferClass,
  MlxError,
  ops,
} from "../mod.ts";
import { SESSION_OPS } from "../src/session_ops.ts";
import { putBuffer, writeDispatch } from "../src/dispatch_writer.ts";
import { type Pipeline, SLOT_BUFFER } from "../src/kernels.ts";
import type { DispatchTarget } from "../src/ops/common.ts";
import { type StreamWriter, TWO_32 } from "../src/native/stream.ts";
import { tapStreams } from "./fixtures/stream_tap.ts";
import { forwarding } from "./fixtures/write_path_ops.ts";
import { openDevice } from "./helpers.ts";

/** Every chunk of stream words the device's encoders hand to the native side, and the writers taken. */
function tapStreamsAndWriters(
  device: ReturnType<typeof openDevice>,
): { chunks: Uint32Array[]; writers: StreamWriter[] } {
  const writers: StreamWriter[] = [];
  return { chunks: tapStreams(device, writers), writers };
}

const words = (chunks: Uint32Array[]): number[] => chunks.flatMap((c) => [...c]);

/** What `f` throws, as code and message (a non-MlxError is returned as its class name and message). */
function thrown(f: () => void): string {
  try {
    f();
  } catch (e) {
    return e instanceof MlxError
      ? `${e.code}: ${e.message}`
      : `${(e as Error).constructor.name}: ${(e as Error).message}`;
  }
  return "nothing";
}

/** A view with the fields the writers read, that is an MlxBuffer for `instanceof`. */
function fakeView(rawHandle: number, byteOffset: number, byteLength: number, whole: boolean): MlxBuffer {
  return Object.create(MlxBufferClass.prototype, {
    rawHandle: { value: rawHandle },
    byteOffset: { value: byteOffset },
    byteLength: { value: byteLength },
    isWholeAllocation: { value: whole },
  }) as MlxBuffer;
}

Deno.test("putBuffer stores writeDispatch's binding record for views below, at and past 4 GiB, at every slot", () => {
  // An independent reference: the descriptor path's writer, given the same view at slot `slot` of a
  // three-buffer kernel whose pipeline is already set (so its first record is the binding's).
  const pipeline = {
    name: "fake",
    handle: 9,
    slotPlan: [SLOT_BUFFER, SLOT_BUFFER, SLOT_BUFFER],
    maxDispatchWords: 64,
  } as unknown as Pipeline;
  const near = [0, 1, 4, 8, 4096, TWO_32 - 4096, TWO_32 - 16, TWO_32 - 8, TWO_32 - 4, TWO_32, TWO_32 + 4];
  const offsets = [...near, 2 * TWO_32 - 8, 5 * TWO_32 + 12, 2 ** 52 - 16];
  const lengths = [4, 8, 16, 4096, TWO_32 - 8, TWO_32, TWO_32 + 8, 3 * TWO_32];
  let cases = 0, wide = 0;
  for (const whole of [false, true]) {
    for (const off of whole ? [0] : offsets) {
      for (const len of lengths) {
        for (const slot of [0, 2]) {
          const view = fakeView(0x1234 + slot, off, len, whole);
          const ref = { words: new Uint32Array(128), pos: 0, flush() {} } as unknown as StreamWriter;
          const bindings = [view, view, view];
          ok(writeDispatch(ref, { pipeline, bindings, grid: 1, threadgroup: 1, dispatchKind: "threads" }, 9, 0));
          // The reference's records: one binding record per slot, then DISPATCH (8 words).
          const perSlot = (ref.pos - 8) / 3;
          const expected = [...ref.words.subarray(slot * perSlot, (slot + 1) * perSlot)];
          const w = new Uint32Array(32).fill(0xdead);
          const end = putBuffer(w, 5, slot, view);
          equal(end, 5 + perSlot, `off ${off} len ${len} whole ${whole}`);
          deepStrictEqual([...w.subarray(5, end)], expected, `off ${off} len ${len} whole ${whole} slot ${slot}`);
          ok(w.subarray(0, 5).every((v) => v === 0xdead) && w.subarray(end).every((v) => v === 0xdead));
          if (perSlot === 6) wide++;
          cases++;
        }
      }
    }
  }
  ok(wide > 0 && wide < cases, `both record sizes were compared (${wide} of ${cases} wide)`);
});

/** A pass over `t` in which the fourth op binds a view of a freed allocation (it must be refused). */
function passWithRefusal(
  device: ReturnType<typeof openDevice>,
  enc: CommandEncoder,
  t: DispatchTarget,
  b: { x: MlxBuffer; y: MlxBuffer; out: MlxBuffer; wide: MlxBuffer },
): string[] {
  const r = device.kernels, errors: string[] = [];
  const gone = device.alloc(1024, DType.F32), goneView = gone.slice(256, 256);
  gone.dispose();
  ops.elementwiseAdd(t, r, b.x, b.y, b.out);
  ops.rmsNorm(t, r, b.x, b.y, b.wide.slice(0, 256), { rows: 1, dim: 64, eps: 1e-5 });
  // Refused with a pipeline the stream does not have set yet (mul), at the last binding: its
  // SET_PIPELINE and first bindings were stored but must not be published.
  errors.push(thrown(() => ops.elementwiseMul(t, r, b.x, b.y, goneView)));
  // Refused after automatic barriers were switched on (an AUTO_BARRIERS record goes first either way).
  enc.autoBarriers = true;
  errors.push(thrown(() => ops.rmsNorm(t, r, goneView, b.y, b.out, { rows: 1, dim: 64, eps: 1e-5 })));
  enc.autoBarriers = false;
  // The stream's pipeline is still rms_norm: mul must set its own.
  ops.elementwiseMul(t, r, b.x, b.y, b.wide.slice(256, 256));
  ops.stridedCopy(t, r, b.x, b.wide.slice(512, 512), { rows: 2, cols: 32 });
  errors.push(thrown(() => ops.stridedCopy(t, r, goneView, b.out, { rows: 1, cols: 16 })));
  ops.stridedCopy(t, r, b.y, b.wide.slice(1024, 256), { rows: 1, cols: 64 });
  return errors;
}

Deno.test("a refused op publishes nothing and leaves the stream's pipeline as it was (op path = descriptor path)", () => {
  using device = openDevice();
  using x = device.upload(new Float32Array(64).fill(1)), y = device.upload(new Float32Array(64).fill(2));
  using out = device.alloc(64 * 4, DType.F32), wide = device.alloc(2048 * 4, DType.F32);
  const runs: { words: number[]; errors: string[]; dispatches: number }[] = [];
  for (const direct of [true, false]) {
    const { chunks } = tapStreamsAndWriters(device);
    const enc = device.commandEncoder();
    const errors = passWithRefusal(device, enc, direct ? enc : forwarding(enc), { x, y, out, wide });
    enc.flush();
    runs.push({ words: words(chunks), errors, dispatches: enc.dispatchCount });
    enc.dispose(); // never committed
  }
  const [op, desc] = runs as [typeof runs[0], typeof runs[0]];
  equal(op.dispatches, 5);
  deepStrictEqual(op.errors, desc.errors);
  for (const e of op.errors) ok(e.startsWith("Disposed: ") && e.includes("disposed buffer"), e);
  equal(op.words.length, desc.words.length);
  deepStrictEqual(op.words, desc.words);
});

Deno.test("a writer filled to every word around one op's room: the op path writes the descriptor path's words", () => {
  using device = openDevice();
  const r = device.kernels;
  using x = device.upload(new Float32Array(256).fill(1)), y = device.upload(new Float32Array(256).fill(2));
  using wide = device.alloc(4096 * 4, DType.F32);
  const room = r.get("rms_norm_f32").maxDispatchWords;
  // For each gap between the writer's position and its end, from too small to just enough.
  for (let gap = room - 3; gap <= room + 3; gap++) {
    const runs: number[][] = [];
    for (const direct of [true, false]) {
      const { chunks, writers } = tapStreamsAndWriters(device);
      const enc = device.commandEncoder();
      const t = direct ? enc : forwarding(enc);
      ops.elementwiseAdd(t, r, x, y, wide.slice(0, 1024));
      const w = writers.at(-1)!;
      // Barrier records are one word each: pad the writer to `gap` words before its end.
      while (w.pos < w.words.length - gap) enc.memoryBarrier();
      equal(w.pos, w.words.length - gap);
      ops.rmsNorm(t, r, x, y, wide.slice(1024, 1024), { rows: 1, dim: 256, eps: 1e-5 });
      ops.rmsNorm(t, r, x, y, wide.slice(2048, 1024), { rows: 1, dim: 256, eps: 1e-5 });
      enc.flush();
      runs.push(words(chunks));
      enc.dispose(); // never committed
    }
    equal(runs[0]!.length, runs[1]!.length, `gap ${gap}`);
    ok(runs[0]!.every((v, i) => v === runs[1]![i]), `gap ${gap}: the op path's words differ`);
  }
});

Deno.test("a capture started and finished between ops: the stream's words and pipeline state stay the descriptor path's", () => {
  using device = openDevice();
  const r = device.kernels;
  using x = device.upload(new Float32Array(64).fill(1)), y = device.upload(new Float32Array(64).fill(2));
  using wide = device.alloc(4096 * 4, DType.F32);
  const runs: { words: number[]; dispatches: number; recorded: number }[] = [];
  for (const direct of [true, false]) {
    const { chunks } = tapStreamsAndWriters(device);
    const enc = device.commandEncoder();
    const t = direct ? enc : forwarding(enc);
    ops.elementwiseAdd(t, r, x, y, wide.slice(0, 256));
    enc.memoryBarrier();
    enc.startCompactCapture();
    // Recorded, not encoded: the stream's pipeline stays elementwise_add.
    ops.elementwiseAdd(t, r, x, y, wide.slice(256, 256)); // the probe (descriptor)
    ops.elementwiseMul(t, r, x, y, wide.slice(512, 256));
    ops.rmsNorm(t, r, x, y, wide.slice(768, 256), { rows: 1, dim: 64, eps: 1e-5 });
    const capture = enc.takeCompactCapture()!;
    const recorded = capture.nodeCount;
    capture.release();
    // rms_norm was the capture's last pipeline, not the stream's: it must be set here.
    ops.rmsNorm(t, r, x, y, wide.slice(1024, 256), { rows: 1, dim: 64, eps: 1e-5 });
    ops.elementwiseMul(t, r, x, y, wide.slice(1280, 256));
    enc.flush();
    runs.push({ words: words(chunks), dispatches: enc.dispatchCount, recorded });
    enc.dispose();
  }
  deepStrictEqual(runs[0]!.dispatches, 3);
  equal(runs[0]!.recorded, 3);
  equal(runs[1]!.recorded, 3);
  equal(runs[0]!.dispatches, runs[1]!.dispatches);
  deepStrictEqual(runs[0]!.words, runs[1]!.words);
});

Deno.test("committed, failed and disposed encoders: an op throws the descriptor path's MlxError and writes nothing", () => {
  using device = openDevice();
  const r = device.kernels;
  using x = device.upload(new Float32Array(64).fill(1)), y = device.upload(new Float32Array(64).fill(2));
  using out = device.alloc(64 * 4, DType.F32);
  const run = (t: DispatchTarget) => [
    thrown(() => ops.elementwiseAdd(t, r, x, y, out)),
    thrown(() => ops.rmsNorm(t, r, x, y, out, { rows: 1, dim: 64, eps: 1e-5 })),
    thrown(() => ops.stridedCopy(t, r, x, out, { rows: 1, cols: 64 })),
  ];
  for (const end of ["commit", "dispose", "commitAuto"] as const) {
    const errors: string[][] = [];
    for (const direct of [true, false]) {
      const enc = device.commandEncoder({ autoBarriers: end === "commitAuto" });
      ops.elementwiseAdd(direct ? enc : forwarding(enc), r, x, y, out);
      if (end === "dispose") enc.dispose();
      else enc.commit({ wait: true });
      if (end === "commitAuto") enc.autoBarriers = false; // an AUTO_BARRIERS record would be due
      errors.push(run(direct ? enc : forwarding(enc)));
      equal(enc.dispatchCount, 1);
      enc.dispose();
    }
    deepStrictEqual(errors[0], errors[1], end);
    for (const e of errors[0]!) ok(/^(InvalidState|Disposed): dispatch: /.test(e), `${end}: ${e}`);
  }
});

Deno.test("validation: ops given a validating encoder are logged (a missing barrier is found, a placed one is not)", () => {
  using device = openDevice();
  const r = device.kernels;
  using x = device.upload(new Float32Array(64).fill(1)), y = device.upload(new Float32Array(64).fill(2));
  using mid = device.alloc(64 * 4, DType.F32), out = device.alloc(64 * 4, DType.F32);
  for (const barrier of [false, true]) {
    for (const direct of [true, false]) {
      const enc = device.commandEncoder({ validate: true });
      const t = direct ? enc : forwarding(enc);
      ops.elementwiseAdd(t, r, x, y, mid);
      if (barrier) enc.memoryBarrier();
      ops.rmsNorm(t, r, mid, y, out, { rows: 1, dim: 64, eps: 1e-5 }); // reads what the add wrote
      equal(enc.dispatchCount, 2);
      const e = thrown(() => enc.checkHazards());
      if (barrier) equal(e, "nothing", `direct ${direct}`);
      else ok(e.startsWith("HazardError: 1 missing barrier"), `direct ${direct}: ${e}`);
      enc.dispose(); // never committed
    }
  }
});

Deno.test("profiling: ops given a profiling encoder keep their per-dispatch kernel and op kind", () => {
  using device = openDevice({ profileDispatches: true });
  const r = device.kernels;
  using x = device.upload(new Float32Array(64).fill(1)), y = device.upload(new Float32Array(64).fill(2));
  using buf = device.alloc(4 * 256, DType.F32);
  const runs: string[][] = [];
  for (const direct of [true, false]) {
    const enc = device.commandEncoder();
    const t = direct ? enc : forwarding(enc);
    ops.elementwiseAdd(t, r, x, y, buf.slice(0, 256));
    ops.rmsNorm(t, r, x, y, buf.slice(256, 256), { rows: 1, dim: 64, eps: 1e-5 });
    ops.stridedCopy(t, r, x, buf.slice(512, 256), { rows: 1, cols: 64 });
    enc.commit({ wait: true }); // three independent dispatches
    runs.push((enc.dispatchTimings ?? []).map((d) => `${d.index} ${d.kernel} ${d.opKind}`));
    enc.dispose();
  }
  deepStrictEqual(runs[0], runs[1]);
  deepStrictEqual(runs[0]!.map((k) => k.split(" ")[1]), ["elementwise_add_f32", "rms_norm_f32", "strided_copy_f32"]);
});

Deno.test("automatic barriers switched between ops: the op path places the descriptor path's barriers", () => {
  using device = openDevice();
  const r = device.kernels;
  using x = device.upload(new Float32Array(64).fill(1)), y = device.upload(new Float32Array(64).fill(2));
  using buf = device.alloc(8 * 256, DType.F32);
  const runs: { barriers: number; words: number[] }[] = [];
  for (const direct of [true, false]) {
    const { chunks } = tapStreamsAndWriters(device);
    const enc = device.commandEncoder({ autoBarriers: true });
    const t = direct ? enc : forwarding(enc);
    const s = (i: number) => buf.slice(i * 256, 256);
    ops.elementwiseAdd(t, r, x, y, s(0));
    ops.elementwiseMul(t, r, s(0), y, s(1)); // reads s0: barrier 1
    ops.elementwiseAdd(t, r, x, y, s(2)); // independent: same group
    enc.autoBarriers = false;
    enc.memoryBarrier(); // by hand: barrier 2
    ops.elementwiseAdd(t, r, s(1), y, s(3)); // after the barrier, no hazard left
    enc.autoBarriers = true;
    ops.elementwiseAdd(t, r, x, y, s(4)); // independent: same group
    ops.elementwiseMul(t, r, s(4), y, s(7)); // reads s4, written in this group: barrier 3
    enc.autoBarriers = false;
    enc.autoBarriers = true; // switched back before any op: no record needed
    ops.rmsNorm(t, r, x, y, s(5), { rows: 1, dim: 64, eps: 1e-5 }); // independent
    ops.stridedCopy(t, r, s(5), s(6), { rows: 1, cols: 64 }); // reads s5: barrier 4
    runs.push({ barriers: enc.barrierCount, words: [] });
    enc.flush();
    runs.at(-1)!.words = words(chunks);
    equal(enc.dispatchCount, 8);
    enc.commit({ wait: true }); // every hazard above is behind a barrier
    enc.dispose();
  }
  equal(runs[0]!.barriers, 4);
  equal(runs[1]!.barriers, 4);
  deepStrictEqual(runs[0]!.words, runs[1]!.words);
});

Deno.test("closed sessions: every op method throws InvalidState naming itself before reading its arguments", () => {
  using device = openDevice();
  const exec = new GraphExecutor(device);
  using x = device.upload(new Float32Array(64).fill(1)), y = device.upload(new Float32Array(64).fill(2));
  using out = device.alloc(64 * 4, DType.F32);
  const ends = [
    () => {
      const s = exec.begin();
      s.elementwiseAdd(x, y, out);
      s.finish();
      return s;
    },
    () => {
      const s = exec.beginRecorded();
      s.elementwiseAdd(x, y, out);
      s.finish();
      return s;
    },
    () => {
      const s = exec.begin();
      s.dispose();
      return s;
    },
    () => {
      const s = exec.beginRecorded();
      s.elementwiseAdd(x, y, out);
      s.dispose();
      return s;
    },
  ];
  for (const end of ends) {
    const s = end() as unknown as Record<string, (...a: unknown[]) => void>;
    for (const name of Object.keys(SESSION_OPS)) {
      // No arguments at all: a method that reached its op would fail reading them (a TypeError).
      throws(() => s[name]!(), (e: unknown) => {
        ok(e instanceof MlxError, `${name}: ${e}`);
        equal(e.code, "InvalidState");
        ok(e.message.startsWith(`${name}: `), e.message);
        return true;
      });
    }
  }
});

Deno.test({
  name: "a session method called with too few arguments throws InvalidArgument, not a TypeError",
  fn() {
    using device = openDevice();
    using x = device.upload(new Float32Array(64).fill(1)), y = device.upload(new Float32Array(64).fill(2));
    const s = new GraphExecutor(device).begin() as unknown as Record<string, (...a: unknown[]) => void>;
    const calls: [string, () => void][] = [
      ["s.rmsNorm(x, y, out) without options", () => s.rmsNorm!(x, y, y)],
      ["s.elementwiseAdd(x, y) without out", () => s.elementwiseAdd!(x, y)],
      ["s.matmul(x, y) without y and options", () => s.matmul!(x, y)],
    ];
    const wrong: string[] = [];
    for (const [what, f] of calls) {
      const e = thrown(f);
      if (!e.startsWith("InvalidArgument: ")) wrong.push(`${what}: ${e}`);
    }
    (s as unknown as { dispose(): void }).dispose();
    deepStrictEqual(wrong, []);
  },
});

Deno.test({
  name: "rope reads each option once: an options getter cannot pass the checks and then publish a zero grid",
  fn() {
    using device = openDevice();
    const r = device.kernels;
    using x = device.upload(new Float32Array(64).fill(1)), y = device.upload(new Float32Array(64).fill(2));
    using out = device.alloc(64 * 4, DType.F32), rot = device.alloc(8 * 4, DType.F32);
    using input = device.upload(new Float32Array(8).fill(1)), positions = device.upload(new Uint32Array([3]));
    // seqLen is 1 for its first `honest` reads, then 0: whatever read the checks make, the op must
    // refuse a zero row count as the descriptor path does, and keep the encoder usable.
    const outcomes: string[] = [];
    for (let honest = 0; honest <= 10; honest++) {
      const seen: string[] = [];
      for (const direct of [true, false]) {
        let reads = 0;
        const o = {
          theta: 10000,
          headDim: 8,
          get seqLen() {
            return ++reads <= honest ? 1 : 0;
          },
        };
        const enc = device.commandEncoder();
        const t = direct ? enc : forwarding(enc);
        ops.elementwiseAdd(t, r, x, y, out);
        const e = thrown(() => {
          ops.rope(t, r, input, rot, positions, o);
          enc.flush();
        });
        seen.push(`${e.split(":")[0]} state ${enc.state} dispatches ${enc.dispatchCount}`);
        enc.dispose(); // never committed
      }
      if (seen[0] !== seen[1]) outcomes.push(`honest ${honest}: op path ${seen[0]}; descriptor path ${seen[1]}`);
    }
    deepStrictEqual(outcomes, []);
  },
});

Deno.test({
  name: "a session method called detached from its session throws InvalidArgument, not a TypeError",
  fn() {
    using device = openDevice();
    using x = device.upload(new Float32Array(64).fill(1)), y = device.upload(new Float32Array(64).fill(2));
    using out = device.alloc(64 * 4, DType.F32);
    const s = new GraphExecutor(device).begin();
    const { elementwiseAdd } = s; // e.g. destructured
    const e = thrown(() => (elementwiseAdd as (...a: unknown[]) => void)(x, y, out));
    s.dispose();
    ok(e.startsWith("InvalidArgument: elementwiseAdd: called without its session"), e);
  },
});
