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
 * Runs the prompt and generates `tokens` ids after it, from position 0 (the KV cache is reset).
 * The generation must fit the model's KV cache.
 */
export function generate(model: LlamaModel, exec: GraphExecutor, o: GenerateOptions): GenerateResult {
  const prompt = o.promptIds, n = o.tokens, warmup = o.warmup ?? 0;
  const vocab = model.config.vocabSize;
  if (prompt.length === 0) throw new MlxError("InvalidArgument", "generate: pass at least one prompt token id");
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
    depth: o.depth ?? 2,
    readBatch: o.readBatch ?? 16,
    recorded: true,
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
