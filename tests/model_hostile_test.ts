/**
 * The model API as a hostile caller uses it: metadata of unexpected types, options of the wrong
 * type or out of range (greedy included), pipelining options far beyond the work asked for, the
 * example's flags and unwritable outputs, and a bounded run of the loader fuzzer
 * (tests/fuzz/model_load.ts runs many more). Each must end in an MlxError with a code and a message
 * that says what to do, or in the example's exit code and one line — never a TypeError, a stack
 * trace or an allocation the request did not need.
 */
import { deepStrictEqual, equal, match, ok, throws } from "node:assert/strict";
import { generate, GgufValueType, GraphExecutor, loadLlama, MlxError } from "../mod.ts";
import { fuzzLoad } from "./fuzz/model_load.ts";
import { openDevice, runDeno } from "./helpers.ts";
import { type TinyLlamaSpec, writeTinyLlamaGguf } from "./helpers/gguf_writer.ts";

const SPEC: TinyLlamaSpec = { layers: 1, hidden: 64, heads: 1, kvHeads: 1, ffn: 64, vocab: 16, seed: 9 };
const dir = Deno.makeTempDirSync({ prefix: "mlxn_model_hostile_" });
globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));
const modelPath = `${dir}/tiny.gguf`;
Deno.writeFileSync(modelPath, writeTinyLlamaGguf(SPEC));

/** Asserts that `f` throws an MlxError of `code` whose message matches `re`. */
function throwsMlx(f: () => unknown, code: string, re: RegExp) {
  throws(f, (e) => {
    ok(e instanceof MlxError, `not an MlxError: ${(e as Error)?.stack ?? e}`);
    equal(e.code, code, e.message);
    match(e.message, re);
    return true;
  });
}

Deno.test("a GGUF whose rope scaling type is a 64-bit integer (or an array of them) is refused with an MlxError", () => {
  using device = openDevice();
  for (
    const kv of [
      { key: "llama.rope.scaling.type", type: GgufValueType.UINT64, value: 2n },
      { key: "llama.rope.scaling.type", type: GgufValueType.ARRAY, elementType: GgufValueType.INT64, value: [1n] },
    ]
  ) {
    const path = `${dir}/scaling.gguf`;
    Deno.writeFileSync(path, writeTinyLlamaGguf({ ...SPEC, extraKvs: [kv] }));
    throwsMlx(() => loadLlama(device, path), "Unsupported", /rope scaling .*2|1.* is not supported/);
  }
});

Deno.test("loadLlama: a path that is not a string and options that are not an object are InvalidArgument", () => {
  using device = openDevice();
  throwsMlx(() => loadLlama(device, 5 as unknown as string), "InvalidArgument", /pass the model's path/);
  throwsMlx(() => loadLlama(device, ""), "InvalidArgument", /empty string/);
  throwsMlx(() => loadLlama(device, modelPath, null as never), "InvalidArgument", /options must be an object/);
  throwsMlx(() => loadLlama(device, modelPath, 4 as never), "InvalidArgument", /options must be an object/);
  for (const ctx of [0, -1, 1.5, NaN, Infinity, 2 ** 53]) {
    throwsMlx(() => loadLlama(device, modelPath, { ctx }), "InvalidArgument", /ctx must be a positive integer/);
  }
  using model = loadLlama(device, modelPath, { ctx: 3 });
  equal(model.ctx, 3);
});

Deno.test("generate: options, prompt ids and every selection field are checked, greedy included", () => {
  using device = openDevice();
  const exec = new GraphExecutor(device);
  using model = loadLlama(device, modelPath, { ctx: 8 });
  const run = (o: unknown) => () => generate(model, exec, o as never);
  throwsMlx(run(null), "InvalidArgument", /pass the options object/);
  throwsMlx(run({ promptIds: 3, tokens: 2 }), "InvalidArgument", /promptIds must be an array/);
  throwsMlx(run({ tokens: 2 }), "InvalidArgument", /promptIds must be an array/);
  throwsMlx(run({ promptIds: [16], tokens: 2 }), "InvalidArgument", /prompt id 16 is outside the vocabulary of 16/);
  throwsMlx(run({ promptIds: [1], tokens: 9 }), "InvalidArgument", /need 9 KV positions, the model has 8/);
  const bad: [Record<string, unknown>, RegExp][] = [
    [{ topK: -5 }, /select\.topK must be an integer ≥ 0/],
    [{ topK: 1.5, temperature: 1 }, /select\.topK/],
    [{ topP: NaN }, /select\.topP must be in \(0, 1\]/],
    [{ topP: 0 }, /select\.topP/],
    [{ seed: -1 }, /select\.seed must be a non-negative integer/],
    [{ seed: 0.5 }, /select\.seed/],
    [{ temperature: NaN }, /select\.temperature/],
    [{ temperature: -1 }, /select\.temperature/],
    [{ temperature: "1" }, /select\.temperature/],
  ];
  for (const [select, re] of bad) throwsMlx(run({ promptIds: [1], tokens: 2, select }), "InvalidArgument", re);
  throwsMlx(run({ promptIds: [1], tokens: 2, select: null }), "InvalidArgument", /select is not an object/);
  // Valid fields still decode; greedy ignores the sampling fields it checked.
  const greedy = generate(model, exec, { promptIds: [1], tokens: 3 }).tokens;
  deepStrictEqual(
    generate(model, exec, { promptIds: [1], tokens: 3, select: { topK: 4, topP: 0.5, seed: 7 } }).tokens,
    greedy,
  );
});

Deno.test("generate: depth and readBatch far beyond the tokens asked for allocate only what the run needs", () => {
  using device = openDevice();
  const exec = new GraphExecutor(device);
  using model = loadLlama(device, modelPath, { ctx: 8 });
  const expected = generate(model, exec, { promptIds: [2, 3], tokens: 4 }).tokens;
  const alloc = device.alloc.bind(device);
  let largest = 0;
  device.alloc = (bytes, dtype, shape) => {
    largest = Math.max(largest, bytes);
    // A ring sized by the options instead of the run (1e9 slots here) fails at once, not after minutes.
    if (bytes > 1 << 20) throw new Error(`an allocation of ${bytes} bytes for a 4-token run`);
    return alloc(bytes, dtype, shape);
  };
  for (const o of [{ depth: 1e9 }, { readBatch: 1e8 }, { depth: 2 ** 31, readBatch: 2 ** 31 }]) {
    deepStrictEqual(generate(model, exec, { promptIds: [2, 3], tokens: 4, ...o }).tokens, expected, JSON.stringify(o));
  }
  ok(largest > 0 && largest <= 64, `the id ring took ${largest} bytes`);
  // Invalid values are still refused by the loop, bounded or not.
  throwsMlx(() => generate(model, exec, { promptIds: [1], tokens: 2, depth: NaN }), "InvalidArgument", /depth/);
  throwsMlx(() => generate(model, exec, { promptIds: [1], tokens: 2, readBatch: 0 }), "InvalidArgument", /readBatch/);
});

Deno.test("examples/generate.ts: non-decimal numbers are usage errors, an unwritable output exits 1 with one line", async () => {
  const script = new URL("../examples/generate.ts", import.meta.url).pathname;
  const flags = ["run", "--no-prompt", "--allow-ffi", "--allow-read", "--allow-env", `--allow-write=${dir}`, script];
  for (const args of [["--tokens", "0x10"], ["--ctx", "1e3"], ["--seed", ""], ["--prompt-ids", "1,-2"]]) {
    const r = await runDeno([...flags, "--model", modelPath, ...args]);
    equal(r.code, 2, `${args}: ${r.stderr}`);
    match(r.stderr, /^generate: --\S+ must be an integer ≥ \d, got /);
  }
  const beyond = await runDeno([...flags, "--model", modelPath, "--prompt-ids", "3,16", "--tokens", "2"]);
  equal(beyond.code, 1, beyond.stderr);
  match(
    beyond.stderr,
    /^generate: generation failed \(InvalidArgument\): .*prompt id 16 is outside the vocabulary of 16/,
  );
  const tiny = ["--layers", "1", "--hidden", "64", "--heads", "1", "--kv-heads", "1", "--ffn", "64", "--vocab", "8"];
  for (const out of [`${dir}/missing/dir/r.gguf`, "/r.gguf"]) {
    const r = await runDeno([...flags, "--random-gguf", out, ...tiny]);
    equal(r.code, 1, r.stderr);
    match(r.stderr, new RegExp(`^generate: cannot write ${out}: .+--allow-write`));
    ok(!/^\s+at /m.test(r.stderr), r.stderr);
  }
  const logits = await runDeno([...flags, "--model", modelPath, "--tokens", "2", "--logits", "/x.f32"]);
  equal(logits.code, 1, logits.stderr);
  match(logits.stderr, /^generate: cannot write \/x\.f32: /);
});

Deno.test("mutated model files through loadLlama: loaded and run, or an MlxError; no oversized allocation (150 inputs)", () => {
  const scratch = `${dir}/fuzz`;
  Deno.mkdirSync(`${scratch}/mlx`, { recursive: true });
  const found: string[] = [];
  const r = fuzzLoad(scratch, 150, 20261123, (kind, _input, e) => found.push(`${kind}: ${(e as Error)?.stack ?? e}`));
  deepStrictEqual(found, []);
  ok(r.loaded > 0 && r.refused > 0, JSON.stringify(r));
});
