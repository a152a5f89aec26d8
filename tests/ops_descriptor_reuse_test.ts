/**
 * Every op dispatcher builds its descriptor in place: the same descriptor object on every call (no
 * allocation per call), its buffer slots emptied once the target returns (no buffer kept alive),
 * its inline words kept for the next call, and the next call's values written in full.
 */
import { deepStrictEqual, equal, notEqual, ok, throws } from "node:assert/strict";
import { DType, f32Bits, MlxBuffer, MlxError, ops } from "../mod.ts";
import type { DispatchDescriptor } from "../src/encoder.ts";
import type { DispatchTarget } from "../src/ops/common.ts";
import { testContext } from "./helpers.ts";

/** What a target sees during one dispatch, copied before the op reuses its descriptor. */
interface Seen {
  descriptor: DispatchDescriptor;
  kernel: string;
  bindings: (string | number[] | undefined)[];
  grid: number | number[];
  threadgroup: number | number[];
}

/** A target that records each dispatch's contents and the descriptor object it was given. */
class RecordingTarget implements DispatchTarget {
  readonly seen: Seen[] = [];
  readonly names = new Map<MlxBuffer, string>();
  dispatch(d: DispatchDescriptor): void {
    this.seen.push({
      descriptor: d,
      kernel: d.pipeline.name,
      bindings: d.bindings.map((b) =>
        b instanceof MlxBuffer ? this.names.get(b) ?? "?" : Array.isArray(b) ? [...b] : undefined
      ),
      grid: typeof d.grid === "number" ? d.grid : [...d.grid],
      threadgroup: typeof d.threadgroup === "number" ? d.threadgroup : [...d.threadgroup],
    });
  }
  memoryBarrier(): void {}
}

/** Slots of `d` holding a buffer after the call (must be none). */
function heldBuffers(d: DispatchDescriptor): number[] {
  return d.bindings.flatMap((b, i) => (b instanceof MlxBuffer ? [i] : []));
}

Deno.test("rope, matmul, attention and token ops reuse one descriptor, hold no buffer and rewrite every value", () => {
  using ctx = testContext({ backend: "cpu" });
  const { device, registry } = ctx;
  const t = new RecordingTarget();
  const buf = (name: string, elements: number, dtype: DType = DType.F32) => {
    const b = device.alloc(
      elements * (dtype === DType.U8 ? 1 : dtype === DType.BF16 || dtype === DType.F16 ? 2 : 4),
      dtype,
    );
    t.names.set(b, name);
    return b;
  };
  const big = (tag: string) => buf(tag, 4096), ids = buf("ids", 64, DType.U32), cursor = buf("cursor", 1, DType.U32);
  const pos = buf("pos", 64, DType.U32), ff = buf("ff", 64);

  // Each op twice with different buffers and parameters: [call, expected view of the second call].
  const cases: [string, (i: number) => void, Omit<Seen, "descriptor">][] = [
    [
      "rope",
      (i) =>
        ops.rope(t, registry, big(`in${i}`), big(`out${i}`), pos, {
          theta: 1e4 + i,
          headDim: 8 + 8 * i,
          seqLen: 2 + i,
        }),
      {
        kernel: "rope_f32",
        bindings: ["in1", "out1", [f32Bits(10001), 16, 3], "pos"],
        grid: [8, 3, 1],
        threadgroup: [8, 1, 1],
      },
    ],
    ["ropeNeox", (i) =>
      ops.ropeNeox(t, registry, big(`in${i}`), big(`out${i}`), pos, {
        theta: 500 + i,
        headDim: 16,
        ropeDim: 8 + 4 * i,
        nHeads: 2,
        seqLen: 3,
        freqFactors: i === 1 ? ff : undefined,
      }), {
      kernel: "rope_neox_f32",
      bindings: ["in1", "out1", [f32Bits(501), 16, 12], "pos", [2, 1, 16, 32, 0, 0, 0], "ff", undefined],
      grid: [6, 6, 1],
      threadgroup: [6, 1, 1],
    }],
    ["matmul", (i) =>
      ops.matmul(t, registry, big(`x${i}`), big(`w${i}`), big(`y${i}`), {
        m: 1 + i,
        n: 8,
        k: 16,
        residual: i === 0 ? big("r") : undefined,
        constantWeights: i === 1,
      }), {
      kernel: "matmul_f32",
      bindings: ["x1", "w1", "y1", [2, 8, 16, 0x100], undefined],
      grid: [2, 2, 1],
      threadgroup: 128,
    }],
    ["sdpa", (i) =>
      ops.sdpa(t, registry, big(`q${i}`), big(`k${i}`), big(`v${i}`), big(`o${i}`), {
        nHeads: 2,
        nKvHeads: 1,
        headDim: 16,
        seqLen: 1 + i,
        kvSeqLen: 4,
        kvCapacity: 8,
        scale: 0.5,
      }), {
      kernel: "sdpa_f32",
      bindings: ["q1", "k1", "v1", "o1", [2, 1, 16, 2, 4, f32Bits(0.5), 8]],
      grid: [1, 2, 1],
      threadgroup: 32,
    }],
    [
      "argmax",
      (i) =>
        ops.argmax(t, registry, big(`l${i}`), ids, {
          vocab: 100 + i,
          rows: 1 + i,
          cursor: i === 0 ? cursor : undefined,
        }),
      {
        kernel: "argmax_f32",
        bindings: ["l1", "ids", [101, 2, 1, 0], undefined],
        grid: [2, 1, 1],
        threadgroup: [32, 1, 1],
      },
    ],
    [
      "sample",
      (i) =>
        ops.sample(t, registry, big(`l${i}`), ids, {
          vocab: 100,
          temperature: 1,
          seed: i === 0 ? 7n : 2 ** 40 + 5,
          counter: i,
        }),
      {
        kernel: "sample_f32",
        bindings: ["l1", "ids", [100, 1, 1, 0, f32Bits(Math.LOG2E), 0, 2 ** 31, 5, 256, 1], undefined],
        grid: [1, 1, 1],
        threadgroup: [32, 1, 1],
      },
    ],
    [
      "embedGather",
      (i) =>
        ops.embedGather(t, registry, big(`e${i}`), ids, big(`g${i}`), {
          dim: 8 + i,
          vocab: 4,
          cursor: i === 1 ? cursor : undefined,
        }),
      {
        kernel: "embed_gather_f32",
        bindings: ["e1", "ids", "g1", [1, 9, 4, 1, 1], "cursor"],
        grid: [9, 1, 1],
        threadgroup: [16, 1, 1],
      },
    ],
  ];
  for (const [name, call, expected] of cases) {
    t.seen.length = 0;
    call(0);
    call(1);
    equal(t.seen.length, 2, name);
    equal(t.seen[0]!.descriptor, t.seen[1]!.descriptor, `${name}: one descriptor object for both calls`);
    deepStrictEqual(heldBuffers(t.seen[1]!.descriptor), [], `${name}: no buffer held after the call`);
    const { descriptor: _, ...second } = t.seen[1]!;
    deepStrictEqual(second, expected, name);
  }
});

Deno.test("flashAttnVec reuses both descriptors and places its barrier between them", () => {
  using ctx = testContext({ backend: "cpu" });
  const { device, registry } = ctx;
  const events: (DispatchDescriptor | "barrier")[] = [];
  const t: DispatchTarget = { dispatch: (d) => void events.push(d), memoryBarrier: () => void events.push("barrier") };
  const q = device.alloc(2 * 64 * 4, DType.F32), k = device.alloc(8 * 64 * 4, DType.F32);
  const v = device.alloc(8 * 64 * 4, DType.F32), out = device.alloc(2 * 64 * 4, DType.F32);
  const o = { nHeads: 2, nKvHeads: 1, headDim: 64 as const, kvSeqLen: 3, kvCapacity: 8, nwg: 4 };
  const tmp = device.alloc(ops.flashAttnVecScratchBytes(o), DType.F32);
  ops.flashAttnVec(t, registry, q, k, v, tmp, out, o);
  ops.flashAttnVec(t, registry, q, k, v, tmp, out, { ...o, nwg: 2 });
  equal(events.length, 6);
  equal(events[1], "barrier");
  equal(events[0], events[3]);
  equal(events[2], events[5]);
  notEqual(events[0], events[2]);
  const reduce = events[5] as DispatchDescriptor;
  deepStrictEqual(reduce.bindings[2], [2, 64, 2]);
  ok(heldBuffers(reduce).length === 0 && heldBuffers(events[3] as DispatchDescriptor).length === 0);
});

Deno.test("the inlined argument checks still reject bad input with the op's message and dispatch nothing", () => {
  using ctx = testContext({ backend: "cpu" });
  const { device, registry } = ctx;
  const t = new RecordingTarget();
  const a = device.alloc(64, DType.F32), short = device.alloc(32, DType.F32), half = device.alloc(32, DType.F16);
  const ids = device.alloc(4, DType.U32), pos = device.upload(new Uint32Array(4));
  const bad = (f: () => void, message: RegExp) =>
    throws(f, (e: unknown) => e instanceof MlxError && e.code === "InvalidArgument" && message.test(e.message));
  bad(() => ops.elementwiseAdd(t, registry, a, half, a), /elementwise_add: b must be f32, got f16/);
  bad(() => ops.elementwiseAdd(t, registry, a, a, short, 16), /elementwise_add: out holds 32 bytes, needs 64/);
  bad(() => ops.elementwiseAdd(t, registry, a, a, a, 0), /elementwise_add: n must be an integer >= 1, got 0/);
  bad(() => ops.siluMul(t, registry, a, a, a, 2.5), /silu_mul: n must be an integer >= 1, got 2.5/);
  bad(() => ops.elementwiseAdd(t, registry, ids, ids, ids), /elementwise_add: dtype u32 is not supported/);
  bad(() => ops.gelu(t, registry, a, half), /gelu: output must be f32, got f16/);
  bad(() => ops.axpby(t, registry, a, a, a, { alpha: NaN, beta: 1 }), /axpby: alpha must be finite, got NaN/);
  bad(() => ops.axpby(t, registry, a, a, a, { alpha: 1, beta: 1, n: 2 ** 32 }), /axpby: n must be an integer >= 1/);
  bad(() => ops.softcap(t, registry, a, a, { cap: -0 }), /softcap: cap must be > 0, got 0/);
  bad(() => ops.softcap(t, registry, a, a, { cap: Infinity }), /softcap: cap must be finite, got Infinity/);
  bad(() => ops.rope(t, registry, a, a, pos, { theta: 0, headDim: 4, seqLen: 1 }), /rope: theta must be > 0/);
  bad(
    () => ops.rmsNorm(t, registry, a, a, a, { rows: 1, dim: 16, eps: -1e-6 }),
    /rms_norm: eps must be >= 0, got -0.000001/,
  );
  bad(() => ops.sample(t, registry, a, ids, { vocab: 16, temperature: 1, seed: -1 }), /seed must be an integer/);
  bad(() => ops.sample(t, registry, a, ids, { vocab: 16, temperature: 1, seed: 2n ** 64n }), /seed must be an integer/);
  bad(() => ops.sample(t, registry, a, ids, { vocab: 16, temperature: 1, seed: 0.5 }), /seed must be an integer/);
  equal(t.seen.length, 0);
});
