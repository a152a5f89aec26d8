/**
 * A bounded run of the model-file fuzzer (tests/fuzz/model_files.ts runs millions): mutated GGUF
 * and safetensors files only ever fail with an MlxError.
 */
import { deepStrictEqual, equal } from "node:assert/strict";
import { fuzz, runOne, seeds } from "./fuzz/model_files.ts";

Deno.test("the fuzz seeds are valid files: the mutations start from accepted input", () => {
  const s = seeds();
  for (const kind of ["gguf", "safetensors"] as const) for (const f of s[kind]) equal(runOne(kind, f), undefined);
});

Deno.test("mutated GGUF and safetensors files fail only with MlxError (4,000 inputs)", () => {
  const found: string[] = [];
  fuzz(4000, 20261122, (_input, kind, e) => found.push(`${kind}: ${(e as Error)?.stack ?? e}`));
  deepStrictEqual(found, []);
});
