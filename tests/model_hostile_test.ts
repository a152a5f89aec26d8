/**
 * The model API as a hostile caller uses it: metadata of unexpected types, options of the wrong
 * type or out of range (greedy included), pipelining options far beyond the work asked for, the
 * example's flags and unwritable outputs, and a bounded run of the loader fuzzer
 * (tests/fuzz/model_load.ts runs many more). Each must end in an MlxError with a code and a message
 * that says what to do, or in the example's exit code and one line — never a TypeError, a stack
 * trace or an allocation the request did not need.
 */
import { deepStrictEqual, ok } from "node:assert/strict";
import { fuzzLoad } from "./fuzz/model_load.ts";
import { type TinyLlamaSpec, writeTinyLlamaGguf } from "./helpers/gguf_writer.ts";

const SPEC: TinyLlamaSpec = { layers: 1, hidden: 64, heads: 1, kvHeads: 1, ffn: 64, vocab: 16, seed: 9 };
const dir = Deno.makeTempDirSync({ prefix: "mlxn_model_hostile_" });
globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));
const modelPath = `${dir}/tiny.gguf`;
Deno.writeFileSync(modelPath, writeTinyLlamaGguf(SPEC));

Deno.test("mutated model files through loadLlama: loaded and run, or an MlxError; no oversized allocation (150 inputs)", () => {
  const scratch = `${dir}/fuzz`;
  Deno.mkdirSync(`${scratch}/mlx`, { recursive: true });
  const found: string[] = [];
  const r = fuzzLoad(scratch, 150, 20261123, (kind, _input, e) => found.push(`${kind}: ${(e as Error)?.stack ?? e}`));
  deepStrictEqual(found, []);
  ok(r.loaded > 0 && r.refused > 0, JSON.stringify(r));
});
