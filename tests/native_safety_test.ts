/**
 * The native validation on its own, through the raw C ABI and raw `enc.dispatch`: parameters whose
 * sizes overflow 64 bits, outputs overlapping inputs, buffers of another device, stale handles after
 * many reuses of a slot, and NULL arguments to getters. Each is refused with a clear error; nothing
 * runs out of bounds.
 */
import { deepStrictEqual, equal, match, ok, throws } from "node:assert/strict";
import { type CommandEncoder, DType, type MlxBuffer, type MlxDevice, MlxError, ops } from "../mod.ts";
import { Live, Op, recordHeader, Status } from "../src/native/abi.ts";
import { lastErrorText } from "../src/native/status.ts";
import { testContext } from "./helpers.ts";

const U32 = 0x1_0000_0000;
const P31 = 2 ** 31;

/** One dispatch as raw stream words: buffers by slot, inline words by slot, a grid. */
interface RawDispatch {
  kernel: string;
  buffers: Record<number, MlxBuffer>;
  bytes: Record<number, number[]>;
  kind: "threads" | "groups";
  grid: [number, number, number];
  tg: [number, number, number];
  /** Threadgroup memory bytes (the row kernels need 4 per thread). */
  tgMemory?: number;
}

function streamOf(device: MlxDevice, d: RawDispatch): Uint8Array {
  const w: number[] = [];
  const rec = (op: number, slot: number, ...p: number[]) => w.push(recordHeader(op, 1 + p.length, slot), ...p);
  rec(Op.SET_PIPELINE, 0, device.kernels.get(d.kernel).handle);
  for (const [slot, b] of Object.entries(d.buffers)) {
    rec(Op.SET_BUFFER, Number(slot), b.handle, b.byteOffset, b.byteLength);
  }
  for (const [slot, v] of Object.entries(d.bytes)) rec(Op.SET_BYTES, Number(slot), v.length * 4, ...v);
  if (d.tgMemory) rec(Op.SET_TG_MEMORY, 0, d.tgMemory);
  rec(d.kind === "threads" ? Op.DISPATCH_THREADS : Op.DISPATCH_GROUPS, 0, ...d.grid, ...d.tg, 0);
  return new Uint8Array(Uint32Array.from(w.map((x) => x >>> 0)).buffer);
}

/** Encodes one dispatch into a fresh command buffer and frees it without running it. */
function encodeOnly(device: MlxDevice, d: RawDispatch): { rc: number; message: string } {
  const sym = device.sym;
  const cb = sym.mlxn_cmdbuf_new(device.devicePtr())!;
  const bytes = streamOf(device, d);
  const rc = sym.mlxn_cmdbuf_encode(cb, bytes, bytes.byteLength);
  const message = rc === Status.OK ? "" : lastErrorText(sym);
  sym.mlxn_cmdbuf_free(cb); // never committed: an accepted hostile dispatch does not run here
  return { rc, message };
}

const f32 = (x: number) => new Uint32Array(new Float32Array([x]).buffer)[0];

Deno.test("size checks that would overflow 64 bits are refused by the native validation", async (t) => {
  using ctx = testContext();
  const { device } = ctx;
  const small = () => device.alloc(256, DType.F32);
  using b0 = small(), b1 = small(), b2 = small(), b3 = small();
  // Each case's sizes are exact multiples of 2^64 (they wrap to 0 in unchecked arithmetic), so only
  // checked arithmetic tells them from a dispatch that fits the 256-byte buffers.
  const cases: Record<string, RawDispatch> = {
    // ((rows-1)·src_stride + cols)·4 = (2^31·2^31 + 4)·4 = 2^64 + 16
    strided_copy_f32: {
      kernel: "strided_copy_f32",
      buffers: { 0: b0, 1: b1 },
      bytes: { 2: [P31 + 1, 4, P31, P31, 0, 0, 0] },
      kind: "threads",
      grid: [4, P31 + 1, 1],
      tg: [4, 1, 1],
    },
    // rows·cols·4 = 2^31·2^31·4
    softmax_f32: {
      kernel: "softmax_f32",
      buffers: { 0: b0, 1: b1 },
      bytes: { 2: [P31] },
      kind: "groups",
      grid: [P31, 1, 1],
      tg: [1, 1, 1],
    },
    // rows·dim·4 = 2^30·2^30·4·4
    rms_norm_f32: {
      kernel: "rms_norm_f32",
      buffers: { 0: b0, 1: b1, 2: b2 },
      bytes: { 3: [f32(1e-5)!, 4] },
      kind: "groups",
      grid: [2 ** 30, 2 ** 30, 1],
      tg: [1, 1, 1],
    },
    // input rows·head_dim·4 = 2^31·2^31·4; output ((heads-1)·head_stride + head_dim)·4 = 2^64
    rope_neox_f32: {
      kernel: "rope_neox_f32",
      buffers: { 0: b0, 1: b1, 3: b3 },
      bytes: { 2: [f32(1e4)!, P31, 2], 4: [P31, 0, P31, 0, 0, 0, 0] },
      kind: "threads",
      grid: [1, P31, 1],
      tg: [1, 1, 1],
    },
    // batch·heads·seq·head_dim·4 = 2^31·1·2^31·1·4
    sdpa_f32: {
      kernel: "sdpa_f32",
      buffers: { 0: b0, 1: b1, 2: b2, 3: b3 },
      bytes: { 4: [1, 1, 1, P31, P31, f32(1)!, P31] },
      kind: "groups",
      grid: [P31, 1, 2 ** 26],
      tg: [1, 1, 32],
    },
    // M·K·4 = N·K·4 = M·N·4 = 2^31·2^31·4
    matmul_f32: {
      kernel: "matmul_f32",
      buffers: { 0: b0, 1: b1, 2: b2 },
      bytes: { 3: [P31, P31, P31, 0] },
      kind: "groups",
      grid: [2 ** 29, P31, 1],
      tg: [1, 1, 1],
    },
  };
  for (const [name, d] of Object.entries(cases)) {
    await t.step(name, () => {
      const { rc, message } = encodeOnly(device, d);
      equal(rc, Status.E_STREAM, `${name} was accepted: it would run out of bounds`);
      match(message, new RegExp(`kernel ${d.kernel}: slot \\d+: the size .* overflows 64 bits`));
      match(message, /pass the real shape/);
    });
  }

  await t.step("a grid whose threadgroup count overflows 64 bits", () => {
    using marker = device.alloc(4, DType.U32);
    const { rc, message } = encodeOnly(device, {
      kernel: "debug_fault",
      buffers: { 0: marker },
      bytes: { 1: [0] },
      kind: "groups",
      grid: [U32 - 1, U32 - 1, U32 - 1],
      tg: [1, 1, 1],
    });
    equal(rc, Status.E_STREAM);
    match(message, /threadgroups overflow 64 bits; dispatch a grid the size of the data/);
  });

  await t.step("through enc.dispatch: a StreamError, and the device keeps working", () => {
    const enc = device.commandEncoder();
    const err = (() => {
      try {
        enc.dispatch({
          pipeline: device.kernels.get("softmax_f32"),
          bindings: [b0, b1, new Uint8Array(new Uint32Array([P31]).buffer)],
          grid: [P31, 1, 1],
          threadgroup: 1,
          dispatchKind: "threadgroups",
        });
        enc.commitAndWait();
      } catch (e) {
        return e;
      } finally {
        enc.dispose();
      }
    })();
    ok(err instanceof MlxError, `expected an MlxError, got ${err}`);
    match(err.message, /overflows 64 bits/);
    // The same kernel with an honest shape still runs and gives softmax's values.
    using x = device.upload(new Float32Array([0, Math.log(3)]));
    using y = device.alloc(8, DType.F32);
    using ok2 = device.commandEncoder();
    ok2.dispatch({
      pipeline: device.kernels.get("softmax_f32"),
      bindings: [x, y, new Uint8Array(new Uint32Array([2]).buffer)],
      grid: 1,
      threadgroup: 1,
      threadgroupMemory: 4,
      dispatchKind: "threadgroups",
    });
    ok2.commitAndWait();
    const got = y.read() as Float32Array;
    ok(Math.abs(got[0]! - 0.25) < 1e-6 && Math.abs(got[1]! - 0.75) < 1e-6, `softmax gave ${got}`);
  });
});

/** Host reference: y[m, n] = Σ_k x[m, k] · w[n, k]. */
function matmulRef(x: Float32Array, w: Float32Array, m: number, n: number, k: number): Float64Array {
  const y = new Float64Array(m * n);
  for (let i = 0; i < m; i++) {
    for (let j = 0; j < n; j++) {
      let acc = 0;
      for (let q = 0; q < k; q++) acc += x[i * k + q]! * w[j * k + q]!;
      y[i * n + j] = acc;
    }
  }
  return y;
}

Deno.test("matrix products refuse an output that overlaps an input", async (t) => {
  using ctx = testContext();
  const { device } = ctx;
  const M = 2, N = 4, K = 4;
  const params = (mode = 0) => new Uint8Array(new Uint32Array([M, N, K, mode]).buffer);
  const dispatch = (name: string, bindings: (MlxBuffer | Uint8Array)[]) => {
    using enc = device.commandEncoder();
    enc.dispatch({
      pipeline: device.kernels.get(name),
      bindings,
      grid: [Math.ceil(N / 4), M, 1],
      threadgroup: 128, // the products' geometry: a GPU kernel gives each output a 32-lane simdgroup
      dispatchKind: "threadgroups",
    });
    enc.commitAndWait();
  };
  const xs = Float32Array.from({ length: 64 }, (_, i) => ((i * 7) % 11) - 5);
  const refused = (fn: () => void) =>
    throws(fn, (e: unknown) => {
      ok(e instanceof MlxError, String(e));
      match(e.message, /slot \d+ \(output\) overlaps slot \d+ \(input\).*write the result to a separate buffer/);
      return true;
    });

  await t.step("dense f32: y is x itself, y overlaps W, and disjoint slices of one buffer", () => {
    using big = device.upload(xs); // 256 bytes
    const x = big.slice(0, M * K * 4), w = big.slice(64, N * K * 4);
    refused(() => dispatch("matmul_f32", [x, w, big.slice(0, M * N * 4), params()]));
    refused(() => dispatch("matmul_f32", [x, w, big.slice(96, M * N * 4), params()])); // inside W
    refused(() => dispatch("matmul_f32", [x, w, big.slice(60, M * N * 4), params()])); // straddles x/W
    // Disjoint: accepted, and the numbers are the product's.
    dispatch("matmul_f32", [x, w, big.slice(128, M * N * 4), params()]);
    const got = new Float32Array(big.read().buffer.slice(128, 128 + M * N * 4));
    const want = matmulRef(xs.subarray(0, M * K), xs.subarray(16, 16 + N * K), M, N, K);
    for (let i = 0; i < M * N; i++) equal(got[i], want[i], `y[${i}]`);
  });

  await t.step("ggml q8_0 (mv and mm): y aliasing x", () => {
    const Kq = 32;
    using x = device.upload(new Float32Array(M * Kq).fill(1));
    using w = device.alloc(N * 34, DType.U8);
    const p = new Uint8Array(new Uint32Array([M, N, Kq]).buffer);
    for (const name of ["qmatmul_q8_0_mv", "qmatmul_q8_0_mm"]) {
      refused(() => dispatch(name, [x, w, x.slice(0, M * N * 4), p]));
    }
  });

  await t.step("affine: y aliasing the scales", () => {
    const Ka = 32;
    using x = device.upload(new Float32Array(M * Ka).fill(1));
    using w = device.alloc(N * Ka / 2), s = device.alloc(64), bias = device.alloc(N * 2);
    const p = new Uint8Array(new Uint32Array([M, N, Ka, 4, 32]).buffer);
    refused(() => dispatch("qmatmul_affine", [x, w, s, bias, s.slice(0, M * N * 4), p]));
  });

  await t.step("MoE: y aliasing the expert ids", () => {
    const Kq = 32, topK = 1;
    using x = device.upload(new Float32Array(M * Kq).fill(1));
    using w = device.alloc(2 * N * 34, DType.U8);
    using ids = device.alloc(64, DType.U32);
    const p = new Uint8Array(new Uint32Array([M, N, Kq, topK, 2]).buffer);
    refused(() => dispatch("qmatmul_id_q8_0", [x, w, ids, ids.slice(0, M * N * 4), p]));
  });
});

Deno.test("native getters accept NULL output pointers", () => {
  using ctx = testContext();
  const sym = ctx.device.sym;
  equal(sym.mlxn_live_objects(null, Live.COUNT), 0);
  equal(sym.mlxn_live_objects(null, 0), 0);
  const out = new BigUint64Array(Live.COUNT);
  equal(sym.mlxn_live_objects(new Uint8Array(out.buffer), Live.COUNT), Live.COUNT);
  ok(out[Live.DEVICES]! >= 1n);
  // The others report a length or 0 and write nothing.
  const dev = ctx.device.devicePtr();
  ok(sym.mlxn_device_info(dev, null, 0) > 0);
  ok(sym.mlxn_last_error(null, 0) >= 0);
  equal(sym.mlxn_cmdbuf_timings(null, null, 0), 0);
  equal(sym.mlxn_cmdbuf_error(null, null, 0), 0);
  equal(sym.mlxn_device_info(null, null, 0), 0);
  const cb = sym.mlxn_cmdbuf_new(dev)!;
  equal(sym.mlxn_cmdbuf_timings(cb, null, 8), 0);
  equal(sym.mlxn_cmdbuf_encode(cb, null, 8), Status.E_INVALID_ARGUMENT);
  sym.mlxn_cmdbuf_free(cb);
  equal(sym.mlxn_pipeline_get(dev, null), 0);
  equal(sym.mlxn_buffer_write(dev, 1, 0n, null, 4n), Status.E_INVALID_ARGUMENT);
});

Deno.test("buffer bindings at offsets that are not a multiple of the element size are refused", async (t) => {
  using ctx = testContext();
  const { device } = ctx;
  using raw = device.alloc(4096, DType.U8); // u8: slices may start anywhere
  const at = (off: number, len: number) => raw.slice(off, len);
  const cases: { name: string; d: RawDispatch; align: number }[] = [
    {
      name: "matmul_f32 output at byte 2",
      d: {
        kernel: "matmul_f32",
        buffers: { 0: at(0, 128), 1: at(256, 512), 2: at(1026, 64) },
        bytes: { 3: [2, 8, 16, 0] },
        kind: "groups",
        grid: [2, 2, 1],
        tg: [128, 1, 1],
      },
      align: 4,
    },
    {
      name: "strided_copy_f32 source at byte 1",
      d: {
        kernel: "strided_copy_f32",
        buffers: { 0: at(1, 64), 1: at(256, 64) },
        bytes: { 2: [1, 4, 4, 4, 0, 0, 0] },
        kind: "threads",
        grid: [4, 1, 1],
        tg: [4, 1, 1],
      },
      align: 4,
    },
    {
      name: "rms_norm_f16 input at byte 1",
      d: {
        kernel: "rms_norm_f16",
        buffers: { 0: at(1, 64), 1: at(256, 64), 2: at(512, 64) },
        bytes: { 3: [f32(1e-5)!, 8] },
        kind: "groups",
        grid: [1, 1, 1],
        tg: [8, 1, 1],
        tgMemory: 32,
      },
      align: 2,
    },
    {
      name: "qmatmul_id_q8_0 expert ids at byte 2",
      d: {
        kernel: "qmatmul_id_q8_0",
        buffers: { 0: at(0, 256), 1: at(256, 544), 2: at(1026, 8), 3: at(2048, 64) },
        bytes: { 4: [2, 8, 32, 1, 2] },
        kind: "groups",
        grid: [2, 2, 1],
        tg: [128, 1, 1],
      },
      align: 4,
    },
  ];
  for (const { name, d, align } of cases) {
    await t.step(name, () => {
      const { rc, message } = encodeOnly(device, d);
      equal(rc, Status.E_STREAM, `${name} was accepted`);
      match(message, new RegExp(`not a multiple of ${align} bytes .* bind it at an aligned offset`));
    });
  }
  await t.step("the same dispatches at aligned offsets are accepted", () => {
    const fixed = (b: MlxBuffer) => raw.slice(b.byteOffset & ~3, b.byteLength);
    for (const { name, d } of cases) {
      const buffers = Object.fromEntries(Object.entries(d.buffers).map(([s, b]) => [s, fixed(b)]));
      const { rc, message } = encodeOnly(device, { ...d, buffers });
      equal(rc, Status.OK, `${name}: ${message}`);
    }
  });
});

Deno.test("the flash-attention reduce refuses blocks larger than its CUDA kernel can launch", () => {
  using ctx = testContext();
  const { device } = ctx;
  const heads = 2, hd = 64, nwg = 4;
  using tmp = device.alloc(heads * nwg * (hd + 2) * 4, DType.F32), out = device.alloc(heads * hd * 4, DType.F32);
  const d = (tg: number): RawDispatch => ({
    kernel: "flash_attn_vec_reduce",
    buffers: { 0: tmp, 1: out },
    bytes: { 2: [heads, hd, nwg] },
    kind: "groups",
    grid: [heads, 1, 1],
    tg: [tg, 1, 1],
  });
  equal(encodeOnly(device, d(256)).rc, Status.OK);
  const refused = encodeOnly(device, d(1024));
  ok(refused.rc !== Status.OK, "1024 threads accepted");
  match(refused.message, /at most 256 threads.*ops\.flashAttnVec/);
});

Deno.test("kernels refuse an output that partly overlaps an input (exact in place stays allowed)", () => {
  using ctx = testContext();
  const { device } = ctx;
  const K = device.kernels;
  const run = (encode: (enc: CommandEncoder) => void) => {
    using enc = device.commandEncoder();
    encode(enc);
    enc.commitAndWait();
  };
  const refused = (encode: (enc: CommandEncoder) => void) =>
    throws(() => run(encode), (e: unknown) => {
      ok(e instanceof MlxError, String(e));
      match(e.message, /overlaps slot \d+ \(input\)/);
      return true;
    });
  using buf = device.upload(new Float32Array([0, 0, 0, 1e-30, 1, 0.5, 0.9, 0.2, 0, 0]));
  const f32 = (off: number, len: number) => buf.slice(off, len, { dtype: DType.F32 });
  // argmax: the ids ring inside the logits it reads.
  refused((e) => ops.argmax(e, K, f32(0, 32), buf.slice(16, 8, { dtype: DType.U32 }), { vocab: 4, rows: 2 }));
  // softmax: output shifted by two values into its input; in place exactly is computed right.
  refused((e) => ops.softmax(e, K, f32(0, 32), f32(8, 32), { rows: 2, cols: 4 }));
  using row = device.upload(new Float32Array([1, 1, 1, 1]));
  run((e) => ops.softmax(e, K, row, row, { rows: 1, cols: 4 }));
  deepStrictEqual(Array.from(row.read() as Float32Array), [0.25, 0.25, 0.25, 0.25]);
  // strided copy onto an overlapping destination.
  refused((e) => ops.stridedCopy(e, K, f32(0, 24), f32(8, 24), { rows: 3, cols: 2 }));
  // element-wise add: shifted output refused, in place accepted.
  refused((e) => ops.elementwiseAdd(e, K, f32(0, 16), f32(16, 16), f32(4, 16)));
  using v = device.upload(new Float32Array([1, 2, 3, 4]));
  run((e) => ops.elementwiseAdd(e, K, v, v, v));
  deepStrictEqual(Array.from(v.read() as Float32Array), [2, 4, 6, 8]);
});
