/**
 * The command stream the demo model and the op dispatchers encode, record by record, against a
 * golden copy written by the code before the host-path work on the ops (issue 16): making the ops
 * and the model's step cheaper must not change one byte of what they encode. Pipeline and buffer
 * handles are replaced by kernel names and by the order in which buffers first appear, so the golden
 * copy does not depend on allocation order. `MLXN_UPDATE_GOLDEN=1 deno test -A
 * tests/decode_stream_golden_test.ts` rewrites it (only for an intended change of the stream).
 */
import { deepStrictEqual, equal, ok } from "node:assert/strict";
import { DType, GraphExecutor, type GraphSession, type MlxDevice } from "../mod.ts";
import { allContracts } from "../src/kernels.ts";
import { createLlama, type LlamaConfig } from "../examples/llama.ts";
import { loadLlama } from "../src/model/mod.ts";
import { writeTinyLlamaGguf } from "./helpers/gguf_writer.ts";
import { openDevice } from "./helpers.ts";
import { readable, tapStreams } from "./fixtures/stream_tap.ts";

const GOLDEN = new URL("./fixtures/decode_stream_golden.json", import.meta.url);
const MODEL: Omit<LlamaConfig, "quant"> = {
  layers: 2,
  hidden: 128,
  heads: 2,
  kvHeads: 1,
  ffn: 256,
  vocab: 96,
  ctx: 8,
  seed: 11,
};

/** Encodes passes on a fresh CPU device and returns each one's stream as text, by case name. */
function encodeCases(): Record<string, string[]> {
  using device = openDevice({ backend: "cpu" });
  const chunks = tapStreams(device);
  const exec = new GraphExecutor(device);
  const reg = exec.registry;
  const kernels = new Map<number, string>();
  for (const c of allContracts()) if (reg.has(c.name)) kernels.set(reg.get(c.name).handle, c.name);
  const cases: Record<string, string[]> = {};
  const pass = (name: string, auto: boolean, body: (s: GraphSession) => void) => {
    chunks.length = 0;
    const s = exec.begin({ autoBarriers: auto });
    try {
      body(s);
      s.encoder.flush();
    } finally {
      s.dispose();
    }
    const buffers = new Map<number, number>();
    cases[name] = chunks.flatMap((c) => readable(c, kernels, buffers));
  };
  for (const quant of ["bf16", "q4_0", "mlx4"] as const) {
    const model = createLlama(device, { ...MODEL, quant });
    const act = model.act;
    const ids = device.alloc(8 * 4, DType.U32), state = act.state!;
    const views = { position: state.slice(0, 4), next: state.slice(4, 4), ring: ids, ringSlots: 8 };
    const token = (k: number, withState: boolean) => ({
      index: k,
      position: k,
      input: ids.slice((k % 8) * 4, 4),
      output: ids.slice(((k + 1) % 8) * 4, 4),
      ...(withState ? { state: views } : {}),
    });
    for (const pos of [0, 3]) {
      pass(`${quant} step pos ${pos}, hand barriers`, false, (s) => model.step(s, pos, () => s.barrier()));
      pass(`${quant} step pos ${pos}, auto barriers`, true, (s) => model.step(s, pos, () => {}));
    }
    // The same step twice in one pass: whatever a step caches must not leak into the next.
    pass(`${quant} steps at 5 then 2`, false, (s) => {
      model.step(s, 5, () => s.barrier());
      model.step(s, 2, () => s.barrier(), act.positions!.slice(8, 4));
    });
    pass(`${quant} step with a step state`, false, (s) => model.step(s, 0, () => s.barrier(), undefined, state));
    pass(`${quant} token pass, argmax`, false, (s) => model.tokenStep(s, token(4, false), () => s.barrier()));
    pass(
      `${quant} token pass, sampling`,
      false,
      (s) => model.tokenStep(s, token(6, false), () => s.barrier(), { temperature: 0.7, topK: 5, topP: 0.9, seed: 3 }),
    );
    pass(`${quant} token pass, step state`, false, (s) => model.tokenStep(s, token(1, true), () => s.barrier()));
  }
  pass("ops outside the model", false, (s) => opsOutsideModel(device, s));
  for (const [name, file] of loadedModels()) {
    using model = loadLlama(device, file, { ctx: 8 });
    const ids = device.alloc(8 * 4, DType.U32), state = device.alloc(16, DType.U32);
    const views = { position: state.slice(0, 4), next: state.slice(4, 4), ring: ids, ringSlots: 8 };
    const token = (k: number, withState: boolean) => ({
      index: k,
      position: k,
      input: ids.slice((k % 8) * 4, 4),
      output: ids.slice(((k + 1) % 8) * 4, 4),
      ...(withState ? { state: views } : {}),
    });
    pass(`${name}: token pass, argmax`, false, (s) => model.encodeTokenStep(s, token(3, false)));
    pass(
      `${name}: token pass, sampling`,
      false,
      (s) => model.encodeTokenStep(s, token(4, false), { temperature: 0.5, topK: 7, seed: 2 }),
    );
    pass(`${name}: token pass, step state`, false, (s) => model.encodeTokenStep(s, token(1, true)));
    pass(`${name}: forward at 5 then 2, auto barriers`, true, (s) => {
      model.encodeForward(s, ids.slice(0, 4), 5, () => {});
      model.encodeForward(s, ids.slice(4, 4), 2, () => {});
    });
  }
  return cases;
}

/** Two small GGUF files: k-quant layers with freq factors, and dense f32 weights. */
function loadedModels(): [string, string][] {
  const dir = Deno.makeTempDirSync({ prefix: "mlxn-golden-" });
  const spec = { layers: 2, hidden: 256, heads: 4, kvHeads: 2, ffn: 512, vocab: 300, seed: 9 };
  const write = (name: string, bytes: Uint8Array): [string, string] => {
    Deno.writeFileSync(`${dir}/${name}.gguf`, bytes);
    return [name, `${dir}/${name}.gguf`];
  };
  return [
    write(
      "gguf k-quants",
      writeTinyLlamaGguf({
        ...spec,
        freqFactors: new Float32Array(32).fill(1.5),
        typeOf: (role: string) => (role === "output" ? "q6_k" : role === "token_embd" ? "q8_0" : "q4_k"),
      }),
    ),
    write("gguf f32", writeTinyLlamaGguf(spec)),
  ];
}

/** One call of each op the demo model does not make, with non-default options. */
function opsOutsideModel(device: MlxDevice, s: GraphSession): void {
  const f32 = (n: number) => device.alloc(n * 4, DType.F32);
  const x = f32(256), y = f32(256), z = f32(256), w = f32(64 * 64), u = device.alloc(64 * 4, DType.U32);
  const h16 = device.alloc(256 * 2, DType.F16), g16 = device.alloc(256 * 2, DType.F16);
  s.axpby(x, y, z, { alpha: 0.5, beta: -2, n: 200 });
  s.gelu(x, y);
  s.silu(h16, g16, 100);
  s.softcap(x, y, { cap: 30 });
  s.softmax(x, y, { rows: 2, cols: 128 });
  s.rmsNormMul(x, w, y, z, { rows: 2, dim: 128, eps: 1e-6 });
  s.rmsNormMulAdd(x, w, y, z, x.slice(0, 1024), { rows: 2, dim: 128, eps: 1e-6 });
  s.rmsNormNoScale(x, y, { rows: 4, dim: 64, eps: 0 });
  s.rope(x, y, u, { theta: 1e4, headDim: 64, seqLen: 4 });
  s.ropeNeox(x, z, u, { theta: 5e5, headDim: 64, ropeDim: 32, nHeads: 2, seqLen: 2, freqFactors: w });
  s.sdpa(x, w, w, y, { nHeads: 2, nKvHeads: 1, headDim: 64, seqLen: 2, kvSeqLen: 4, kvCapacity: 8 });
  s.matmul(x, w, y, { m: 2, n: 32, k: 64 });
  s.matmul(x, w, y, { m: 1, n: 16, k: 64, swiglu: true });
  s.flashAttnVec(x, w, w, f32(2 * 8 * 66), y, {
    nHeads: 2,
    nKvHeads: 1,
    headDim: 64,
    kvSeqLen: 5,
    kvCapacity: 8,
    mask: "sliding",
    slidingWindow: 3,
    softcap: 20,
    nwg: 8,
  });
  s.quantizedMatmulGgml(x, w, y, { m: 2, n: 8, k: 64, format: "q8_0", variant: "mm" });
  s.quantizedMatmul(x, w, h16, g16, y, { m: 1, n: 8, k: 64, bits: 6, groupSize: 32 });
  s.stridedCopy(x, y, { rows: 3, cols: 16, srcStride: 20, dstStride: 32 });
  s.embedGather(w, u, y, { dim: 64, vocab: 16, rows: 2, ring: 4, cursor: u.slice(200, 4) });
}

Deno.test("the demo model's step and the ops encode the golden command stream, byte for byte", () => {
  const cases = encodeCases();
  if (Deno.env.get("MLXN_UPDATE_GOLDEN") === "1") {
    Deno.writeTextFileSync(GOLDEN, JSON.stringify(cases, null, 1) + "\n");
  }
  const golden: Record<string, string[]> = JSON.parse(Deno.readTextFileSync(GOLDEN));
  deepStrictEqual(Object.keys(cases), Object.keys(golden));
  for (const [name, records] of Object.entries(golden)) {
    const got = cases[name]!;
    const at = records.findIndex((r, i) => got[i] !== r);
    if (at >= 0) throw new Error(`${name}: record ${at} is '${got[at]}', expected '${records[at]}'`);
    equal(got.length, records.length, `${name}: records`);
  }
  // The step really depends on its position (the comparison can fail).
  ok(
    JSON.stringify(golden["bf16 step pos 0, hand barriers"]) !==
      JSON.stringify(golden["bf16 step pos 3, hand barriers"]),
  );
});
