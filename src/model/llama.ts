/**
 * A llama-architecture model loaded from a GGUF file or an MLX checkpoint directory and run with the
 * graph executor, one token per pass: per layer RMS_NORM → MUL(weight), the Q/K/V projections
 * (stacked into one product where they share a format), rope (normal mode for GGUF, NeoX for MLX,
 * with the file's freq factors; K rotated straight into the KV cache, V copied there), decode
 * attention over the cache, the output projection + residual, RMS_NORM → MUL, gate/up + SwiGLU, the
 * down projection + residual; then the final norm and the lm-head (or the tied embedding). Each
 * projection's kernel follows its tensor type (src/model/linear.ts).
 *
 * @module
 */

import type { MlxBuffer } from "../buffer.ts";
import type { DecodeStep } from "../decode_loop.ts";
import type { MlxDevice } from "../device.ts";
import { MlxError } from "../errors.ts";
import type { GraphSession } from "../executor.ts";
import type { LlamaConfig } from "../io/model_config.ts";
import { type FlashAttnVecOptions, flashAttnVecScratchBytes } from "../ops/attention.ts";
import type { StridedCopyOptions } from "../ops/elementwise.ts";
import type { NormOptions } from "../ops/norm.ts";
import type { RopeNeoxOptions } from "../ops/rope.ts";
import type { EmbedGatherOptions } from "../ops/sample.ts";
import type { Linear } from "./linear.ts";
import { type EmbeddingTable, type LinearPart, openWeights, type RopeMode } from "./weights.ts";

/** How a pass picks the next token on the device: greedy (argmax) or seeded sampling. */
export interface TokenSelection {
  /** Softmax temperature; 0 or omitted: argmax. */
  readonly temperature?: number;
  /** Keep the k most likely tokens (0: all). */
  readonly topK?: number;
  /** Nucleus share in (0, 1]. */
  readonly topP?: number;
  /** Sampling seed (default 0). */
  readonly seed?: number;
}

/** Options of {@link loadLlama}. */
export interface LoadLlamaOptions {
  /** KV-cache positions (default: the model's context length, at most 4096). */
  readonly ctx?: number;
}

/** Head dimensions the decode attention kernel takes. */
const HEAD_DIMS = [64, 128, 256, 512];

interface Layer {
  attnNorm: MlxBuffer;
  ffnNorm: MlxBuffer;
  qkv: LinearPart[];
  /** Each qkv part's rows of the stacked output (views made once, not per pass). */
  qkvOut: MlxBuffer[];
  o: Linear;
  gateUp: LinearPart[];
  /** Each gate/up part's rows of the stacked output. */
  gateUpOut: MlxBuffer[];
  down: Linear;
  kCache: MlxBuffer;
  vCache: MlxBuffer;
  /** The caches' rows of each position (see `LlamaModel.#rows`), sliced on first use. */
  kRows: (MlxBuffer | undefined)[];
  vRows: (MlxBuffer | undefined)[];
}

/** The options of a pass's ops, built once per model (and per step state): the ops keep none. */
interface PassOptions {
  norm: NormOptions;
  ropeQ: RopeNeoxOptions;
  ropeK: RopeNeoxOptions;
  copyV: StridedCopyOptions;
  /** `kvSeqLen` is set per pass when the position comes from the host. */
  attn: FlashAttnVecOptions;
  gather: EmbedGatherOptions;
}

/** The per-token activation buffers of one model. */
type ActivationName =
  | "x"
  | "t"
  | "h"
  | "qkv"
  | "q"
  | "k"
  | "v"
  | "qr"
  | "attn"
  | "o"
  | "gu"
  | "ff"
  | "d"
  | "tmp"
  | "positions"
  | "ids";

/** A loaded llama model on a device. Dispose it (`using`) to free its buffers. */
export class LlamaModel {
  /** The hyperparameters. */
  readonly config: LlamaConfig;
  /** Rope pairing of this model's layout. */
  readonly ropeMode: RopeMode;
  /** KV-cache positions. */
  readonly ctx: number;
  /** The device the weights live on. */
  readonly device: MlxDevice;
  /** Where the weights came from. */
  readonly source: string;
  /** The logits of the last pass, f32 [vocab]. */
  readonly logits: MlxBuffer;
  /** Weight formats by projection role (for reports), e.g. `{ attn_q: "q4_k", output: "q6_k" }`. */
  readonly formats: Readonly<Record<string, string>>;
  /** Device bytes of the weights. */
  readonly weightBytes: number;

  readonly #layers: Layer[] = [];
  readonly #embedding: EmbeddingTable;
  readonly #lmHead: Linear;
  readonly #outNorm: MlxBuffer;
  readonly #ones: MlxBuffer;
  readonly #freqFactors: MlxBuffer | undefined;
  readonly #act: Record<ActivationName, MlxBuffer>;
  readonly #owned: { dispose(): void }[] = [];
  #byPosition: PassOptions | undefined;
  #byState: PassOptions & { state: NonNullable<DecodeStep["state"]> } | undefined;
  readonly #positionViews: (MlxBuffer | undefined)[] = [];
  #guHalves: readonly [MlxBuffer, MlxBuffer] | undefined;

  /** @internal Use {@link loadLlama}. */
  constructor(device: MlxDevice, path: string, options: LoadLlamaOptions = {}) {
    this.device = device;
    this.source = path;
    const w = openWeights(path);
    try {
      const c = this.config = w.config;
      this.ropeMode = w.ropeMode;
      if (!HEAD_DIMS.includes(c.headDim)) {
        throw new MlxError(
          "Unsupported",
          `${path}: head dimension ${c.headDim} is not supported (decode attention takes ${HEAD_DIMS.join(", ")})`,
        );
      }
      const ctx = this.ctx = options.ctx ?? Math.min(c.contextLength, 4096);
      if (!Number.isSafeInteger(ctx) || ctx < 1) {
        throw new MlxError("InvalidArgument", `ctx must be a positive integer, got ${ctx}`);
      }
      const own = <T extends { dispose(): void }>(x: T): T => {
        this.#owned.push(x);
        return x;
      };
      const f32 = (n: number) => own(device.alloc(n * 4, "f32"));
      const upload = (v: Float32Array) => own(device.upload(v, "f32"));
      const formats: Record<string, string> = {};
      const note = (role: string, parts: readonly { linear: Linear }[]) => {
        const f = parts.map((p) => p.linear.format).join("+");
        formats[role] = formats[role] && formats[role] !== f ? `${formats[role]}|${f}` : f;
      };
      const kvElems = c.kvHeads * ctx * c.headDim;
      for (let i = 0; i < c.layers; i++) {
        const qkv = w.projections(device, i, ["q", "k", "v"]);
        qkv.forEach((p) => own(p.linear));
        const [o] = w.projections(device, i, ["o"]);
        own(o!.linear);
        const gateUp = w.projections(device, i, ["gate", "up"]);
        gateUp.forEach((p) => own(p.linear));
        const [down] = w.projections(device, i, ["down"]);
        own(down!.linear);
        note("qkv", qkv);
        note("attn_output", [o!]);
        note("gate_up", gateUp);
        note("down", [down!]);
        this.#layers.push({
          attnNorm: upload(w.layerVector(device, i, "attn_norm")),
          ffnNorm: upload(w.layerVector(device, i, "ffn_norm")),
          qkv,
          qkvOut: [],
          o: o!.linear,
          gateUp,
          gateUpOut: [],
          down: down!.linear,
          kCache: f32(kvElems),
          vCache: f32(kvElems),
          kRows: new Array(ctx),
          vRows: new Array(ctx),
        });
      }
      this.#embedding = w.embedding(device);
      own(this.#embedding.table);
      this.#lmHead = own(w.lmHead(device));
      formats.embedding = this.#embedding.format;
      formats.output = this.#lmHead.format;
      this.formats = Object.freeze(formats);
      this.#outNorm = upload(w.outputNorm(device));
      const ff = w.freqFactors();
      this.#freqFactors = ff ? upload(ff) : undefined;
      this.#ones = upload(new Float32Array(c.hiddenSize).fill(1));
      const qRows = c.heads * c.headDim, kvRows = c.kvHeads * c.headDim;
      const qkvBuf = f32(qRows + 2 * kvRows);
      this.#act = {
        x: f32(c.hiddenSize),
        t: f32(c.hiddenSize),
        h: f32(c.hiddenSize),
        qkv: qkvBuf,
        q: qkvBuf.slice(0, qRows * 4),
        k: qkvBuf.slice(qRows * 4, kvRows * 4),
        v: qkvBuf.slice((qRows + kvRows) * 4, kvRows * 4),
        qr: f32(qRows),
        attn: f32(qRows),
        o: f32(c.hiddenSize),
        gu: f32(2 * c.intermediateSize),
        ff: f32(c.intermediateSize),
        d: f32(c.hiddenSize),
        tmp: own(device.alloc(flashAttnVecScratchBytes({ nHeads: c.heads, headDim: c.headDim as 64 }), "f32")),
        positions: own(device.upload(Uint32Array.from({ length: ctx }, (_, i) => i), "u32")),
        ids: own(device.alloc(4, "u32")),
      };
      for (const L of this.#layers) {
        L.qkvOut = L.qkv.map((p) => qkvBuf.slice(p.row * 4, p.linear.n * 4));
        L.gateUpOut = L.gateUp.map((p) => this.#act.gu.slice(p.row * 4, p.linear.n * 4));
      }
      this.logits = f32(c.vocabSize);
      this.weightBytes = this.#layers.reduce(
        (t, L) => t + [...L.qkv, ...L.gateUp].reduce((a, p) => a + p.linear.bytes, 0) + L.o.bytes + L.down.bytes,
        this.#embedding.table.byteLength + this.#lmHead.bytes,
      );
    } catch (e) {
      this.dispose();
      throw e;
    } finally {
      w.close();
    }
  }

  /**
   * Encodes one token's pass: the embedding row of the id in `ids` (u32, on the device) at
   * `position`, every layer, and the logits. `barrier` is called between dependent steps. With
   * `state` (a state-driven DecodeLoop's step), the position is read on the device instead: `ids` is
   * the whole ring, the caches are bound whole, and the commands do not depend on `position`.
   */
  encodeForward(
    s: GraphSession,
    ids: MlxBuffer,
    position: number,
    barrier: () => void,
    state?: DecodeStep["state"],
  ): void {
    const a = this.#act, ffn = this.config.intermediateSize;
    if (!Number.isSafeInteger(position) || position < 0 || position >= this.ctx) {
      throw new MlxError(
        "InvalidArgument",
        `token position ${position} is outside the KV cache of ${this.ctx} positions: load the model with a larger ctx`,
      );
    }
    const st = state?.position;
    const o = state ? this.#stateOptions(state) : (this.#byPosition ??= this.#passOptions(undefined));
    if (!state) o.attn.kvSeqLen = position + 1;
    const positions = st ? undefined : (this.#positionViews[position] ??= a.positions.slice(position * 4, 4));
    const norm = o.norm, neox = this.ropeMode !== "norm";
    s.embedGather(this.#embedding.table, state ? state.ring : ids, a.x, o.gather);
    // With a state: rope and the V copy write at the position's rows of the whole caches, and
    // attention reads its keys from it (the KV capacity bounds it statically).
    for (let l = 0; l < this.#layers.length; l++) {
      const L = this.#layers[l]!;
      barrier();
      s.rmsNorm(a.x, this.#ones, a.t, norm); // RMS_NORM then MUL(weight): the pattern the fuse pass merges
      barrier();
      s.elementwiseMul(a.t, L.attnNorm, a.h);
      barrier();
      for (let i = 0; i < L.qkv.length; i++) L.qkv[i]!.linear.run(s, a.h, L.qkvOut[i]!);
      barrier();
      // The token's rows of the [kvHeads, ctx, headDim] caches: rope writes K there directly.
      const kRows = st ? L.kCache : this.#rows(L.kRows, L.kCache, position);
      if (neox) {
        s.ropeNeox(a.q, a.qr, positions, o.ropeQ);
        s.ropeNeox(a.k, kRows, positions, o.ropeK);
      } else {
        s.ropeNorm(a.q, a.qr, positions, o.ropeQ);
        s.ropeNorm(a.k, kRows, positions, o.ropeK);
      }
      s.stridedCopy(a.v, st ? L.vCache : this.#rows(L.vRows, L.vCache, position), o.copyV);
      barrier();
      s.flashAttnVec(a.qr, L.kCache, L.vCache, a.tmp, a.attn, o.attn);
      barrier();
      L.o.addInto(s, a.attn, a.x, a.o, barrier);
      barrier();
      s.rmsNorm(a.x, this.#ones, a.t, norm);
      barrier();
      s.elementwiseMul(a.t, L.ffnNorm, a.h);
      barrier();
      if (L.gateUp.length === 1) L.gateUp[0]!.linear.gluInto(s, a.h, a.ff, a.gu, barrier);
      else {
        for (let i = 0; i < L.gateUp.length; i++) L.gateUp[i]!.linear.run(s, a.h, L.gateUpOut[i]!);
        barrier();
        const [gate, up] = this.#guHalves ??= [a.gu.slice(0, ffn * 4), a.gu.slice(ffn * 4, ffn * 4)];
        s.siluMul(gate, up, a.ff);
      }
      barrier();
      L.down.addInto(s, a.ff, a.x, a.d, barrier);
    }
    barrier();
    s.rmsNorm(a.x, this.#ones, a.t, norm);
    barrier();
    s.elementwiseMul(a.t, this.#outNorm, a.h);
    barrier();
    this.#lmHead.run(s, a.h, this.logits);
  }

  /** A cache's rows of `position` in every KV head ([kvHeads, ctx, headDim] laid out), sliced once. */
  #rows(table: (MlxBuffer | undefined)[], cache: MlxBuffer, position: number): MlxBuffer {
    const headDim = this.config.headDim;
    return table[position] ??= cache.slice(
      position * headDim * 4,
      ((this.config.kvHeads - 1) * this.ctx + 1) * headDim * 4,
    );
  }

  /** The pass options for a step state, rebuilt only when a different state comes. */
  #stateOptions(state: NonNullable<DecodeStep["state"]>): PassOptions {
    if (this.#byState === undefined || this.#byState.state !== state) {
      this.#byState = { ...this.#passOptions(state), state };
    }
    return this.#byState;
  }

  /** Every op option of a pass: position-driven without `state`, else read on the device from it. */
  #passOptions(state: DecodeStep["state"]): PassOptions {
    const c = this.config, ctx = this.ctx, { hiddenSize: hidden, headDim, heads, kvHeads } = c;
    const st = state?.position;
    const rope = { theta: c.ropeTheta, headDim, ropeDim: c.ropeDim, seqLen: 1, freqFactors: this.#freqFactors };
    const atState = st ? { state: st, maxPositions: ctx } : {};
    return {
      norm: { rows: 1, dim: hidden, eps: c.rmsEps },
      ropeQ: { ...rope, nHeads: heads, ...atState },
      ropeK: {
        ...rope,
        nHeads: kvHeads,
        outHeadStride: ctx * headDim,
        ...(st ? { outPosStride: headDim } : {}),
        ...atState,
      },
      copyV: {
        rows: kvHeads,
        cols: headDim,
        dstStride: ctx * headDim,
        ...(st ? { dstPosStride: headDim } : {}),
        ...atState,
      },
      attn: {
        nHeads: heads,
        nKvHeads: kvHeads,
        headDim: headDim as 64,
        kvSeqLen: ctx,
        kvCapacity: ctx,
        ...(st ? { state: st } : {}),
      },
      gather: {
        dim: hidden,
        vocab: c.vocabSize,
        format: this.#embedding.format,
        ...(state ? { cursor: state.position, ring: state.ringSlots } : {}),
      },
    };
  }

  /**
   * One pass of a `DecodeLoop`: the input id from `step.input`, the forward pass at `step.position`,
   * and the chosen id into `step.output` (argmax, or seeded sampling with counter = position). In a
   * state-driven loop (`step.state`) the same happens with the position read on the device, so every
   * step encodes the same commands.
   */
  encodeTokenStep(s: GraphSession, step: DecodeStep, select: TokenSelection = {}): void {
    const barrier = () => s.barrier(), state = step.state;
    this.encodeForward(s, step.input, step.position, barrier, state);
    barrier();
    const vocab = this.config.vocabSize, temperature = select.temperature ?? 0;
    // The output slot: the host's choice, or the state's next position's slot (word 1 as cursor).
    const out = state ? state.ring : step.output;
    const ring = state ? { cursor: state.next, ring: state.ringSlots } : {};
    if (temperature === 0) s.argmax(this.logits, out, { vocab, ...ring });
    else {
      s.sample(this.logits, out, {
        vocab,
        temperature,
        ...(select.topK === undefined ? {} : { topK: select.topK }),
        ...(select.topP === undefined ? {} : { topP: select.topP }),
        seed: select.seed ?? 0,
        // The cursor (position + 1) is added on the device: a base of −1 (mod 2³²) gives counter = position.
        counter: state ? 0xffffffff : step.position,
        ...ring,
      });
    }
  }

  /**
   * Runs token `id` at `position` in a session of `exec` (waiting for it) and returns a copy of the
   * logits: the plain path for prompts and checks.
   */
  forward(exec: { begin(): GraphSession }, id: number, position: number): Float32Array {
    if (!Number.isSafeInteger(id) || id < 0 || id >= this.config.vocabSize) {
      throw new MlxError("InvalidArgument", `token id ${id} is outside the vocabulary of ${this.config.vocabSize}`);
    }
    this.#act.ids.write(new Uint32Array([id]));
    const s = exec.begin();
    try {
      this.encodeForward(s, this.#act.ids, position, () => s.barrier());
    } catch (e) {
      s.dispose();
      throw e;
    }
    s.finish({ label: `token ${position}` });
    return this.logits.read() as Float32Array;
  }

  /** Zeroes the KV caches (a new sequence). */
  resetCache(): void {
    const zeros = new Float32Array(this.config.kvHeads * this.ctx * this.config.headDim);
    for (const L of this.#layers) {
      L.kCache.write(zeros);
      L.vCache.write(zeros);
    }
  }

  /** Frees every buffer. Disposing twice is harmless. */
  dispose(): void {
    for (const x of this.#owned.splice(0)) x.dispose();
  }

  /** Same as {@link LlamaModel.dispose}. */
  [Symbol.dispose](): void {
    this.dispose();
  }
}

/**
 * Loads a llama-architecture model: `path` is a GGUF file or an MLX checkpoint directory
 * (config.json + *.safetensors). Needs --allow-read. Unsupported architectures, tensor types or
 * shapes, missing tensors and truncated or corrupt files throw an MlxError that says what to do.
 */
export function loadLlama(device: MlxDevice, path: string, options: LoadLlamaOptions = {}): LlamaModel {
  if (typeof path !== "string" || path === "") {
    throw new MlxError(
      "InvalidArgument",
      `loadLlama: pass the model's path (a .gguf file or an MLX directory), got ${
        typeof path === "string" ? "an empty string" : typeof path
      }`,
    );
  }
  if (options === null || typeof options !== "object") {
    throw new MlxError("InvalidArgument", `loadLlama: options must be an object ({ ctx }), got ${options}`);
  }
  return new LlamaModel(device, path, options);
}
