/**
 * Token generation with a loaded model: the prompt runs one pass per token (logits read only after
 * the last), then a `DecodeLoop` decodes — each pass gathers its input embedding from the ring of
 * ids, picks the next id on the device (argmax or seeded sampling), passes overlap, and ids are read
 * back in batches.
 *
 * @module
 */

import { DecodeLoop } from "../decode_loop.ts";
import { MlxError } from "../errors.ts";
import type { GraphExecutor } from "../executor.ts";
import type { LlamaModel, TokenSelection } from "./llama.ts";

/** Options of {@link generate}. */
export interface GenerateOptions {
  /** Prompt token ids (at least one). */
  readonly promptIds: readonly number[];
  /** Tokens to generate (at least one). */
  readonly tokens: number;
  /** Greedy by default. */
  readonly select?: TokenSelection;
  /** The first this many generated tokens are not timed (default 0). */
  readonly warmup?: number;
  /** Passes in flight (default 2). */
  readonly depth?: number;
  /** Read ids back every this many tokens (default 16). */
  readonly readBatch?: number;
  /** Called with each batch of generated ids as it is read back. */
  readonly onTokens?: (ids: Uint32Array) => void;
}

/** What {@link generate} produced. */
export interface GenerateResult {
  /** The generated ids. */
  readonly tokens: number[];
  /** Logits of the last pass (the distribution the last generated id was chosen from). */
  readonly lastLogits: Float32Array;
  /** Host wall time of the prompt passes, ms. */
  readonly promptMs: number;
  /** Host wall time of the timed decode tokens, ms. */
  readonly decodeMs: number;
  /** Decode tokens timed (tokens − warmup). */
  readonly timedTokens: number;
  /** Timed decode tokens per second. */
  readonly tokensPerSecond: number;
}

/**
 * Checks every field of a selection, greedy included: a bad topK, topP or seed is a caller's bug even
 * where argmax does not read it (the sampling kernel's own checks cover the ranges it needs).
 */
function checkSelection(select: TokenSelection | undefined): void {
  if (select === undefined) return;
  const bad = (what: string): never => {
    throw new MlxError("InvalidArgument", `generate: select.${what}`);
  };
  if (select === null || typeof select !== "object") {
    throw new MlxError("InvalidArgument", "generate: select is not an object ({ temperature, topK, topP, seed })");
  }
  const { temperature: t, topK, topP, seed } = select;
  if (t !== undefined && !(typeof t === "number" && Number.isFinite(t) && t >= 0)) {
    bad(`temperature must be 0 (greedy) or a positive number, got ${t}`);
  }
  if (topK !== undefined && !(Number.isSafeInteger(topK) && topK >= 0)) {
    bad(`topK must be an integer ≥ 0 (0: all tokens), got ${topK}`);
  }
  if (topP !== undefined && !(typeof topP === "number" && topP > 0 && topP <= 1)) {
    bad(`topP must be in (0, 1], got ${topP}`);
  }
  if (seed !== undefined && !(Number.isSafeInteger(seed) && seed >= 0)) {
    bad(`seed must be a non-negative integer, got ${seed}`);
  }
}

/**
 * Runs the prompt and generates `tokens` ids after it, from position 0 (the KV cache is reset).
 * The generation must fit the model's KV cache.
 */
export function generate(model: LlamaModel, exec: GraphExecutor, o: GenerateOptions): GenerateResult {
  if (o === null || typeof o !== "object") {
    throw new MlxError("InvalidArgument", "generate: pass the options object ({ promptIds, tokens })");
  }
  const prompt = o.promptIds, n = o.tokens, warmup = o.warmup ?? 0;
  const vocab = model.config.vocabSize;
  if (!Array.isArray(prompt) || prompt.length === 0) {
    throw new MlxError("InvalidArgument", "generate: promptIds must be an array of at least one token id");
  }
  const bad = prompt.find((id) => !Number.isSafeInteger(id) || id < 0 || id >= vocab);
  if (bad !== undefined) {
    throw new MlxError("InvalidArgument", `generate: prompt id ${bad} is outside the vocabulary of ${vocab}`);
  }
  if (!Number.isSafeInteger(n) || n < 1) {
    throw new MlxError("InvalidArgument", `generate: tokens must be ≥ 1, got ${n}`);
  }
  if (!Number.isSafeInteger(warmup) || warmup < 0 || warmup >= n) {
    throw new MlxError("InvalidArgument", `generate: warmup must be in [0, tokens), got ${warmup}`);
  }
  checkSelection(o.select);
  // The last generated id is chosen at position prompt + n − 2 and never run itself.
  if (prompt.length + n - 1 > model.ctx) {
    throw new MlxError(
      "InvalidArgument",
      `generate: ${prompt.length} prompt + ${n} generated tokens need ${prompt.length + n - 1} KV positions, ` +
        `the model has ${model.ctx}: load it with a larger ctx`,
    );
  }
  model.resetCache();
  const t0 = performance.now();
  for (let i = 0; i < prompt.length - 1; i++) model.forward(exec, prompt[i]!, i);
  const promptMs = performance.now() - t0;

  using loop = new DecodeLoop(exec, {
    // More passes in flight or unread ids than the steps run change nothing; bounding both by `tokens`
    // keeps the id ring (depth + readBatch slots) proportional to the work asked for.
    depth: Math.min(o.depth ?? 2, n),
    readBatch: Math.min(o.readBatch ?? 16, n),
    recorded: true,
    stepState: true, // identical passes: encoded once per run, then committed again (frozen)
    frozen: true,
    session: { autoBarriers: false },
    finish: { fuse: true, reorder: true, dualBuffer: false },
    encodeStep: (s, step) => model.encodeTokenStep(s, step, o.select),
  });
  const tokens: number[] = [];
  const onTokens = (ids: Uint32Array) => {
    tokens.push(...ids);
    o.onTokens?.(ids);
  };
  let first = prompt[prompt.length - 1]!, start = prompt.length - 1;
  if (warmup > 0) {
    const r = loop.run({ first, steps: warmup, startPosition: start, onTokens });
    first = r.tokens[warmup - 1]!;
    start += warmup;
  }
  const rep = loop.run({ first, steps: n - warmup, startPosition: start, onTokens });
  const decodeMs = rep.wallNs / 1e6;
  return {
    tokens,
    lastLogits: model.logits.read() as Float32Array,
    promptMs,
    decodeMs,
    timedTokens: n - warmup,
    tokensPerSecond: (n - warmup) / (decodeMs / 1e3),
  };
}
