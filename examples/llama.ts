/**
 * A llama-style decoder with random weights (fixed seed), for the demo and the benchmarks: per layer
 * RMS_NORM → MUL(weight) (as llama.cpp's graph has them, so fusion can fire), the Q/K/V projection
 * (one weight of the three stacked: one wide product instead of three small ones), NeoX rope (K
 * rotated straight into the cache, V copied there), flash attention (split + reduce), output
 * projection + residual add, RMS_NORM → MUL, the gate/up projection (stacked likewise) + SwiGLU,
 * the down projection + residual add (for bf16 weights the add and SwiGLU are the products'
 * epilogues, one kernel each; for quantized ones separate kernels); then the final norm and a
 * dense bf16 lm-head. Stacking is how fast engines lay these weights
 * out: the bytes are the same, but one product of n rows streams them closer to the bandwidth limit
 * than several concurrent ones, and Q/K/V and gate/up are slices of one output. Weights: Q4_0, MLX 4-bit, or bf16 (dense; synthetic values made fast for large shapes).
 *
 * @module
 */
import {
  type ArgmaxOptions,
  type DecodeStep,
  DType,
  type EmbedGatherOptions,
  type FlashAttnVecOptions,
  type GraphSession,
  type MlxBuffer,
  type MlxDevice,
  MlxError,
  ops,
  quantizeAffine,
  quantizeGgml,
  type RopeNeoxOptions,
  type StridedCopyOptions,
} from "../mod.ts";

/** Shape and weight format of the model. */
export interface LlamaConfig {
  layers: number;
  hidden: number;
  heads: number;
  kvHeads: number;
  ffn: number;
  vocab: number;
  /** KV-cache positions. */
  ctx: number;
  quant: "q4_0" | "mlx4" | "bf16";
  seed: number;
}

/** How a token pass picks the next token on the device: greedy (argmax) or seeded sampling. */
export interface TokenSelection {
  /** Softmax temperature; 0 or omitted: argmax. */
  temperature?: number;
  /** Keep the k most likely tokens (0: all). */
  topK?: number;
  /** Nucleus share in (0, 1]. */
  topP?: number;
  /** Sampling seed (default 0). */
  seed?: number;
}

/** A model on a device: `step` encodes one decode step into a session. */
export interface Llama {
  readonly cfg: LlamaConfig;
  readonly headDim: number;
  /** The f32 embedding table on the host (rows are written into `x` per token). */
  readonly embedding: Float32Array;
  /**
   * Activations: `x` is the residual stream, `logits` the output, `pos` the position `step` reads
   * by default (u32, written by the host), `positions` the u32 table 0 … ctx − 1 (a token pass binds
   * its element, so the host writes nothing per token).
   */
  readonly act: Record<string, MlxBuffer>;
  /**
   * Encodes one decode step at `pos`; `barrier` is called wherever hand placement puts one. Rope
   * reads the position from `positions` (default `act.pos`). With `state` (word 0 of a step state),
   * the position is read on the device instead and the commands do not depend on `pos`.
   */
  step(s: GraphSession, pos: number, barrier: () => void, positions?: MlxBuffer, state?: MlxBuffer): void;
  /**
   * Encodes one whole token pass for a `DecodeLoop`: gathers `x` from the device embedding table at
   * the ids in `t.input`, runs `step` at `t.position`, and writes the chosen token into `t.output`
   * (argmax, or seeded sampling with counter = position). In a state-driven loop (`t.state`) the
   * position, ring slots and sampler counter come from the device step state: every pass is the same.
   */
  tokenStep(s: GraphSession, t: DecodeStep, barrier: () => void, select?: TokenSelection): void;
  /** Zeroes the KV caches. */
  resetCache(): void;
}

/** One layer's weights of a projection: one buffer (dense bf16, ggml blocks) or MLX affine's three. */
type Weights = MlxBuffer | AffineWeights;

/** MLX affine-quantized weights: packed values, scales and biases. */
interface AffineWeights {
  readonly qw: MlxBuffer;
  readonly sc: MlxBuffer;
  readonly bi: MlxBuffer;
}

/**
 * The projections y = x · Wᵀ of one shape (W [n, k]) in the model's weight format, shared by every
 * layer: each call takes the layer's weights, so a layer holds nothing but buffers and a step walks
 * no per-layer projection objects.
 */
interface Linear {
  readonly n: number;
  readonly k: number;
  /** Uploads one layer's random weights of this shape. */
  weights(): Weights;
  run(s: GraphSession, x: MlxBuffer, w: Weights, y: MlxBuffer): void;
  /**
   * The residual connection y += x · Wᵀ: one kernel for dense weights (the product's residual
   * epilogue), else the product into `scratch`, a barrier and an add.
   */
  addInto(s: GraphSession, x: MlxBuffer, w: Weights, y: MlxBuffer, scratch: MlxBuffer, barrier: () => void): void;
  /**
   * SwiGLU of a stacked gate/up projection (n = 2 · ffn rows): y = silu(x · Wgᵀ) ⊙ (x · Wuᵀ). One
   * kernel for dense weights (the product's SwiGLU epilogue), else the product into `scratch`
   * (2 · ffn), a barrier and silu_mul of its halves.
   */
  gluInto(s: GraphSession, x: MlxBuffer, w: Weights, y: MlxBuffer, scratch: MlxBuffer, barrier: () => void): void;
}

/** The options of a step's rope, cache copy and attention calls. */
interface StepOptions {
  ropeQ: RopeNeoxOptions;
  ropeK: RopeNeoxOptions;
  copyV: StridedCopyOptions;
  attn: FlashAttnVecOptions;
}

/** Builds the model's weights and activations on `device`. */
export function createLlama(device: MlxDevice, cfg: LlamaConfig): Llama {
  const { hidden, heads, kvHeads, ffn, vocab, ctx, quant } = cfg;
  const headDim = hidden / heads;
  let seed = cfg.seed >>> 0;
  const rand = (n: number, scale: number) =>
    Float32Array.from(
      { length: n },
      () => ((seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0) / 2 ** 32 * 2 - 1) * scale,
    );

  /** Projections without fused epilogues: product, barrier, then add or silu_mul. */
  const unfused = (n: number, k: number, weights: () => Weights, run: Linear["run"]): Linear => {
    // The halves of the SwiGLU scratch, sliced once per scratch buffer rather than per step.
    let halvesOf: MlxBuffer | undefined, gate: MlxBuffer | undefined, up: MlxBuffer | undefined;
    return {
      n,
      k,
      weights,
      run,
      addInto(s, x, w, y, scratch, barrier) {
        run(s, x, w, scratch);
        barrier();
        s.elementwiseAdd(y, scratch, y);
      },
      gluInto(s, x, w, y, scratch, barrier) {
        run(s, x, w, scratch);
        barrier();
        if (halvesOf !== scratch) {
          const half = (n / 2) * 4;
          [halvesOf, gate, up] = [scratch, scratch.slice(0, half), scratch.slice(half, half)];
        }
        s.siluMul(gate!, up!, y);
      },
    };
  };
  /** Random bf16 values of scale ~1/√k, generated as bits (fast enough for billions of weights). */
  function randomBf16(count: number, k: number): Uint16Array {
    const table = new Uint16Array(new Float32Array(rand(4096, 1 / Math.sqrt(k))).buffer.slice(0)).filter((_, i) =>
      i % 2 === 1
    );
    const out = new Uint16Array(count);
    for (let i = 0; i < count; i++) out[i] = table[(Math.imul(i, 2654435761) >>> 20) & 2047]!;
    return out;
  }

  // Each shape's options are built once: the ops read them and keep nothing.
  function linear(n: number, k: number): Linear {
    if (quant === "bf16") {
      const plain = { m: 1, n, k, constantWeights: true };
      const glu = { m: 1, n: n / 2, k, swiglu: true, constantWeights: true };
      const residual = { m: 1, n, k, residual: undefined as MlxBuffer | undefined, constantWeights: true };
      return {
        n,
        k,
        weights: () => device.upload(randomBf16(n * k, k), DType.BF16),
        run: (s, x, w, y) => s.matmul(x, w as MlxBuffer, y, plain),
        addInto: (s, x, w, y) => {
          residual.residual = y; // the model's own activation: holding it keeps nothing extra alive
          s.matmul(x, w as MlxBuffer, y, residual);
        },
        gluInto: (s, x, w, y) => s.matmul(x, w as MlxBuffer, y, glu),
      };
    }
    const random = () => rand(n * k, 1 / Math.sqrt(k));
    if (quant === "q4_0") {
      const shape = { m: 1, n, k, format: "q4_0" } as const;
      return unfused(
        n,
        k,
        () => device.upload(quantizeGgml(random(), n, k, "q4_0")),
        (s, x, w, y) => s.quantizedMatmulGgml(x, w as MlxBuffer, y, shape),
      );
    }
    const shape = { m: 1, n, k, bits: 4, groupSize: 64 } as const;
    return unfused(n, k, () => {
      const q = quantizeAffine(random(), n, k, 4, 64);
      return {
        qw: device.upload(q.weights),
        sc: device.upload(q.scales, DType.BF16),
        bi: device.upload(q.biases, DType.BF16),
      };
    }, (s, x, w, y) => {
      const a = w as AffineWeights;
      s.quantizedMatmul(x, a.qw, a.sc, a.bi, y, shape);
    });
  }
  const qkvProj = linear((heads + 2 * kvHeads) * headDim, hidden); // rows: Q, then K, then V
  const oProj = linear(hidden, heads * headDim);
  const guProj = linear(2 * ffn, hidden); // rows: gate, then up
  const downProj = linear(hidden, ffn);

  const f32 = (n: number) => device.alloc(n * 4, DType.F32);
  /** A cache's rows of position `pos` in every KV head, [kvHeads, ctx, headDim] laid out: rope writes K there. */
  const rowView = (cache: MlxBuffer, pos: number) =>
    cache.slice(pos * headDim * 4, ((kvHeads - 1) * ctx + 1) * headDim * 4);
  const kvCache = () => f32(kvHeads * ctx * headDim);
  const layers = Array.from({ length: cfg.layers }, () => ({
    attnNorm: device.upload(rand(hidden, 0.2).map((v) => 1 + v)),
    ffnNorm: device.upload(rand(hidden, 0.2).map((v) => 1 + v)),
    wqkv: qkvProj.weights(),
    wo: oProj.weights(),
    wgu: guProj.weights(),
    wd: downProj.weights(),
    k: kvCache(),
    v: kvCache(),
  }));
  /**
   * The caches' rows of every position as views, made with the model so that a step slices nothing
   * (a slice costs about what a dispatch's host encode does): `rowsAt[pos]` holds layer i's K rows
   * at 2i and V rows at 2i + 1. Position-major, so that one step's views sit together in memory
   * (cache-major, each step touched views far apart, and read them from memory). Past 65,536 views
   * per model (2 · layers · ctx) a step slices its rows instead.
   */
  const rowsAt: MlxBuffer[][] = 2 * cfg.layers * ctx <= 1 << 16
    ? Array.from({ length: ctx }, (_, pos) => layers.flatMap((L) => [rowView(L.k, pos), rowView(L.v, pos)]))
    : [];
  const embedding = rand(vocab * hidden, 1);
  const outNorm = device.upload(rand(hidden, 0.2).map((v) => 1 + v));
  const lmHead = device.upload(randomBf16(vocab * hidden, hidden), DType.BF16);
  const lmHeadShape = { m: 1, n: vocab, k: hidden, constantWeights: true };
  const ones = device.upload(new Float32Array(hidden).fill(1));
  const qkv = f32((heads + 2 * kvHeads) * headDim), gu = f32(2 * ffn);
  const qBytes = heads * headDim * 4, kvBytes = kvHeads * headDim * 4;
  const act = {
    x: f32(hidden),
    t: f32(hidden),
    h: f32(hidden),
    qkv,
    q: qkv.slice(0, qBytes),
    k: qkv.slice(qBytes, kvBytes),
    v: qkv.slice(qBytes + kvBytes, kvBytes),
    qr: f32(heads * headDim),
    attn: f32(heads * headDim),
    o: f32(hidden),
    gu,
    ff: f32(ffn),
    d: f32(hidden),
    logits: f32(vocab),
    tmp: device.alloc(ops.flashAttnVecScratchBytes({ nHeads: heads, headDim: headDim as 64 }), DType.F32),
    pos: device.alloc(4, DType.U32),
    /** A step state (u32 × 4; word 0 the position) for passes driven from the device. */
    state: device.alloc(16, DType.U32),
    positions: device.upload(Uint32Array.from({ length: ctx }, (_, i) => i), DType.U32),
  };
  let embeddingTable: MlxBuffer | undefined; // uploaded on the first token pass

  // ---- one token ----------------------------------------------------------------------------------

  // The step's op options, built once (the ops read them and keep nothing): a step then allocates
  // nothing but the cache-row views of a position it has not seen.
  const norm = { rows: 1, dim: hidden, eps: 1e-5 };
  const rope = { theta: 10000, headDim, ropeDim: headDim, seqLen: 1 };
  /** Options of the position-driven step; `attn.kvSeqLen` is set per step. */
  const byPosition: StepOptions = {
    ropeQ: { ...rope, nHeads: heads },
    ropeK: { ...rope, nHeads: kvHeads, outHeadStride: ctx * headDim },
    copyV: { rows: kvHeads, cols: headDim, dstStride: ctx * headDim },
    attn: { nHeads: heads, nKvHeads: kvHeads, headDim: headDim as 64, kvSeqLen: 1, kvCapacity: ctx },
  };
  /** Options of the state-driven step, for the last state buffer used. */
  let byState: StepOptions & { state: MlxBuffer } | undefined;
  function stateOptions(state: MlxBuffer): StepOptions {
    if (byState === undefined || byState.state !== state) {
      // Rows at the state's position of the whole caches, attention's keys from it (ctx bounds it).
      const atState = { state, maxPositions: ctx };
      byState = {
        state,
        ropeQ: { ...byPosition.ropeQ, ...atState },
        ropeK: { ...byPosition.ropeK, outPosStride: headDim, ...atState },
        copyV: { ...byPosition.copyV, dstPosStride: headDim, ...atState },
        attn: { ...byPosition.attn, kvSeqLen: ctx, state },
      };
    }
    return byState;
  }

  /** Encodes one decode step at `pos`; `barrier` is called wherever hand placement puts one. */
  function step(s: GraphSession, pos: number, barrier: () => void, positions = act.pos, state?: MlxBuffer): void {
    const o = state ? stateOptions(state) : byPosition;
    if (!state) o.attn.kvSeqLen = pos + 1;
    const ropePositions = state ? undefined : positions;
    const { x, t, h, q, k, v, qr, tmp, attn } = act;
    const rows = state ? undefined : rowsAt[pos];
    for (let i = 0; i < layers.length; i++) {
      const L = layers[i]!;
      // No view (a large model, or a position outside the cache): slicing makes one or says what is wrong.
      const kRows = state ? L.k : rows?.[2 * i] ?? rowView(L.k, pos);
      const vRows = state ? L.v : rows?.[2 * i + 1] ?? rowView(L.v, pos);
      barrier();
      s.rmsNorm(x, ones, t, norm); // RMS_NORM …
      barrier();
      s.elementwiseMul(t, L.attnNorm, h); // … then MUL(weight): the fusion pattern
      barrier();
      qkvProj.run(s, h, L.wqkv, act.qkv);
      barrier();
      s.ropeNeox(q, qr, ropePositions, o.ropeQ);
      s.ropeNeox(k, kRows, ropePositions, o.ropeK);
      s.stridedCopy(v, vRows, o.copyV);
      barrier();
      s.flashAttnVec(qr, L.k, L.v, tmp, attn, o.attn);
      barrier();
      oProj.addInto(s, attn, L.wo, x, act.o, barrier); // x += attn · Woᵀ
      barrier();
      s.rmsNorm(x, ones, t, norm);
      barrier();
      s.elementwiseMul(t, L.ffnNorm, h);
      barrier();
      guProj.gluInto(s, h, L.wgu, act.ff, act.gu, barrier); // ff = silu(h · Wgᵀ) ⊙ (h · Wuᵀ)
      barrier();
      downProj.addInto(s, act.ff, L.wd, x, act.d, barrier); // x += ff · Wdᵀ
    }
    barrier();
    s.rmsNorm(x, ones, t, norm);
    barrier();
    s.elementwiseMul(t, outNorm, h);
    barrier();
    s.matmul(h, lmHead, act.logits, lmHeadShape);
  }

  /** A token pass's gather and argmax options (built once; per ring for state-driven passes). */
  interface TokenOptions {
    gather: EmbedGatherOptions;
    argmax: ArgmaxOptions;
  }
  const plainTokenOptions: TokenOptions = { gather: { dim: hidden, vocab }, argmax: { vocab } };
  let byRing: TokenOptions & { st: NonNullable<DecodeStep["state"]> } | undefined;
  function ringOptions(st: NonNullable<DecodeStep["state"]>): TokenOptions {
    if (byRing === undefined || byRing.st !== st) {
      byRing = {
        st,
        gather: { dim: hidden, vocab, cursor: st.position, ring: st.ringSlots },
        argmax: { vocab, cursor: st.next, ring: st.ringSlots },
      };
    }
    return byRing;
  }
  /** The position table's element of each position, sliced once. */
  const positionViews: MlxBuffer[] = [];

  /** One token pass: embedding gather → step → argmax or seeded sampling into the id ring. */
  function tokenStep(s: GraphSession, t: DecodeStep, barrier: () => void, select: TokenSelection = {}): void {
    const pos = t.position;
    if (pos >= ctx) {
      throw new MlxError(
        "InvalidArgument",
        `token position ${pos} is past the KV cache: create the model with ctx > ${pos}`,
      );
    }
    embeddingTable ??= device.upload(embedding);
    const st = t.state, o = st ? ringOptions(st) : plainTokenOptions;
    // State-driven: the whole ring, read at the position's slot and written at the next one's.
    s.embedGather(embeddingTable, st ? st.ring : t.input, act.x, o.gather);
    step(s, pos, barrier, st ? undefined : positionViews[pos] ??= act.positions.slice(pos * 4, 4), st?.position);
    barrier();
    const out = st ? st.ring : t.output, temperature = select.temperature ?? 0;
    if (temperature === 0) s.argmax(act.logits, out, o.argmax);
    else {
      const outRing = st ? { cursor: st.next, ring: st.ringSlots } : {};
      s.sample(act.logits, out, {
        vocab,
        temperature,
        ...(select.topK === undefined ? {} : { topK: select.topK }),
        ...(select.topP === undefined ? {} : { topP: select.topP }),
        seed: select.seed ?? 0,
        // The cursor (position + 1) is added on the device: a base of −1 (mod 2³²) gives counter = position.
        counter: st ? 0xffffffff : pos,
        ...outRing,
      });
    }
  }

  return {
    cfg,
    headDim,
    embedding,
    act,
    step,
    tokenStep,
    resetCache() {
      for (const L of layers) {
        L.k.write(new Float32Array(kvHeads * ctx * headDim));
        L.v.write(new Float32Array(kvHeads * ctx * headDim));
      }
    },
  };
}
