/**
 * The one description of every kernel: its slots (buffers with dtype and access, inline parameter
 * blocks with their field layout), the threadgroup memory it needs and how it is dispatched.
 * scripts/gen_kernels.ts derives from this the TypeScript contracts (src/kernels.gen.ts), the C
 * contract table and parameter layouts (native/contracts/*.gen.*) and each backend's kernel table
 * (kernels/cpu/table.gen.c, kernels/cuda/table.gen.cu). Each backend supplies one body per kernel,
 * named after the kernel (see the README, "Adding a kernel").
 *
 * @module
 */

/** Element type of a buffer slot (`blocks`: quantized blocks; `any`: set by a parameter field). */
export type SlotDType = "f32" | "f16" | "bf16" | "u32" | "blocks" | "any";

/** One 4-byte field of a parameter block. */
export type FieldType = "u32" | "f32";

/** A named parameter block: 4-byte fields in order, each at 4 × its index. */
export interface ParamLayout {
  /** C identifier of the layout (mlxn_params_<name>). */
  readonly name: string;
  /** Fields in order. */
  readonly fields: readonly (readonly [name: string, type: FieldType])[];
}

/** A buffer slot. */
export interface BufferSlot {
  /** Slot name, for messages. */
  readonly name: string;
  /** Element type the kernel reads or writes. */
  readonly dtype: SlotDType;
  /** How the kernel touches it. */
  readonly access: "read" | "write" | "readwrite";
  /** May be left unbound. */
  readonly optional?: boolean;
  /** A read the dispatch promises no earlier dispatch writes, when bits `mask` of word `word` of slot `slot` are set. */
  readonly constantIf?: { readonly slot: number; readonly word: number; readonly mask: number };
}

/** An inline parameter slot. */
export interface BytesSlot {
  /** Its layout. */
  readonly params: ParamLayout;
}

/**
 * How a dispatch maps threads to work:
 * `elements`: one thread per element over grid x; `rows`: one threadgroup per row, min(256, next_pow2(cols))
 * threads reducing through threadgroup memory; `custom`: the op computes it (documented at the op).
 */
export type Geometry = "elements" | "rows" | "custom";

/** The description of one kernel. */
export interface KernelSpec {
  /** Kernel name, identical in every backend. */
  readonly name: string;
  /** CapturedOpKind its dispatches carry. */
  readonly opKind:
    | "RmsNorm"
    | "ElemMul"
    | "ElemAdd"
    | "RmsNormMul"
    | "Sdpa"
    | "Softmax"
    | "Rope"
    | "MatMul"
    | "Activation"
    | "Other";
  /** Argument slots in order. */
  readonly slots: readonly (BufferSlot | BytesSlot)[];
  /** Threadgroup memory rule: at least this many f32 per thread at index 0 (0: none required). */
  readonly tgFloatsPerThread: number;
  /** Dispatch geometry. */
  readonly geometry: Geometry;
  /**
   * `generated`: the generator writes the validator (geometry "elements" only): the one parameter block
   * has a field `n`, the grid has at least n threads, every buffer holds n elements of its dtype at an
   * aligned offset, and each output is in place of or disjoint from each input. Otherwise the validator
   * is hand-written: mlxn_validate_<name> in native/contracts/<family>.c.
   */
  readonly validator?: "generated";
}

const layout = (name: string, ...fields: string[]): ParamLayout => ({
  name,
  fields: fields.map((f) => {
    const [n, t = "u32"] = f.split(":");
    return [n!, t as FieldType] as const;
  }),
});

const R = "read" as const, W = "write" as const;
const buf = (
  name: string,
  dtype: SlotDType,
  access: BufferSlot["access"],
  extra: Partial<BufferSlot> = {},
): BufferSlot => ({
  name,
  dtype,
  access,
  ...extra,
});
const FLOATS = ["f32", "f16", "bf16"] as const;

// ---- parameter layouts --------------------------------------------------------------------------
const N = layout("n", "n");
const SOFTCAP = layout("softcap", "cap:f32", "n");
const STRIDED_COPY = layout(
  "strided_copy",
  "rows",
  "cols",
  "src_stride",
  "dst_stride",
  "has_state",
  "dst_pos_stride",
  "max_pos",
);
const DEBUG_FAULT = layout("debug_fault", "fail");
const AXPBY = layout("axpby", "alpha:f32", "beta:f32", "n", "pad");
const SCALE = layout("scale", "alpha:f32", "n");
const NORM = layout("norm", "eps:f32", "dim");
const SOFTMAX = layout("softmax", "cols");
const ROPE = layout("rope", "theta:f32", "head_dim", "seq_len");
const ROPE_HEADS = layout("rope_heads", "theta:f32", "head_dim", "rope_dim");
const ROPE_LAYOUT = layout(
  "rope_layout",
  "n_heads",
  "has_freq_factors",
  "out_head_stride",
  "out_token_stride",
  "has_state",
  "out_pos_stride",
  "max_pos",
);
const DENSE = layout("dense", "m", "n", "k", "mode");
const AFFINE = layout("affine", "m", "n", "k", "bits", "group_size");
const AFFINE_GENERAL = layout("affine_general", "m", "n", "k", "bits", "group_size", "scale_type");
const AFFINE_GATHER = layout(
  "affine_gather",
  "rows",
  "n",
  "k",
  "top_k",
  "n_experts",
  "bits",
  "group_size",
  "scale_type",
);
const GGML = layout("ggml", "m", "n", "k");
const GGML_ID = layout("ggml_id", "rows", "n", "k", "top_k", "n_experts");
const SDPA = layout("sdpa", "heads", "kv_heads", "hd", "seq", "kv_len", "scale:f32", "kv_cap");
const FLASH = layout(
  "flash",
  "heads",
  "kv_heads",
  "hd",
  "kv_len",
  "kv_cap",
  "scale:f32",
  "mask",
  "window",
  "softcap:f32",
  "nwg",
  "has_state",
);
const FLASH_REDUCE = layout("flash_reduce", "n_heads", "head_dim", "nwg");
const ARGMAX = layout("argmax", "vocab", "rows", "ring", "has_cursor");
const SAMPLE = layout(
  "sample",
  "vocab",
  "rows",
  "ring",
  "has_cursor",
  "c:f32",
  "top_k",
  "top_p_q31",
  "seed_lo",
  "seed_hi",
  "counter",
);
const GATHER = layout("gather", "rows", "dim", "vocab", "ring", "has_cursor");
const STEP_ADVANCE = layout("step_advance", "count", "add");

/**
 * The optional step-state slot (u32, read on the device; layout in src/ops/sample.ts): word 0 is
 * the pass's token position. Bound, it replaces the per-token inline constants and binding offsets,
 * so consecutive token passes have identical command streams.
 */
const STATE = buf("state", "u32", R, { optional: true });

/**
 * Numbers the ops, the validators and every backend's bodies must agree on (work split, mode bits),
 * generated as TS constants, C/CUDA macros MLXN_<NAME> and MSL macros of the same name.
 */
export const constants: Readonly<Record<string, readonly [value: number, doc: string]>> = {
  MATMUL_OUTS: [4, "Outputs per threadgroup of the matrix products (one 32-lane simdgroup each)."],
  MATMUL_OUTS_FAST: [8, "Outputs per threadgroup of qmatmul_affine_fast."],
  MATMUL_OUTS_SWIGLU: [2, "Outputs per threadgroup of the dense products with the SwiGLU epilogue (two W rows each)."],
  MATMUL_EPILOGUE_MASK: [0xff, "The dense products' mode word (params word 3) holds the epilogue in these bits."],
  MATMUL_EPILOGUE_NONE: [0, "Dense epilogue: y = x · Wᵀ."],
  MATMUL_EPILOGUE_RESIDUAL: [1, "Dense epilogue: y = x · Wᵀ + residual (slot 4)."],
  MATMUL_EPILOGUE_SWIGLU: [2, "Dense epilogue: W holds 2N rows, gate then up; y = silu(x · gateᵀ) · x · upᵀ."],
  MATMUL_MODE_CONSTANT_WEIGHTS: [0x100, "Dense mode bit: no earlier dispatch of the command buffer writes W."],
  MAX_HEAD_DIM: [512, "Largest head_dim of the attention kernels (their bodies keep one row of this many f32)."],
  SDPA_ROWS: [32, "Query rows per sdpa threadgroup (one thread each)."],
  FLASH_MAX_NWG: [256, "Most workgroups flash_attn_vec splits a head's keys over (and its reduction combines)."],
  FLASH_REDUCE_MAX_THREADS: [
    256,
    "Most threads of a flash_attn_vec_reduce threadgroup (its CUDA body keeps 3 × 32 partials per thread in registers).",
  ],
  SAMPLE_TOP_P_OFF: [0x80000000, "top_p in Q31 at 1.0: sample_* keeps every token (no nucleus cut)."],
  TOKEN_MAX_THREADS: [
    1024,
    "Most threads of an argmax or sample threadgroup: 32 simdgroups, whose partial results one simdgroup combines.",
  ],
  STEP_ADVANCE_MAX_WORDS: [64, "Most state words one step_advance_u32 dispatch advances."],
};

// The dense kernels' mode bit that makes their weights slot a constant read (constantIf below).
const MODE_CONSTANT_WEIGHTS = constants.MATMUL_MODE_CONSTANT_WEIGHTS![0];

// ---- elementwise ---------------------------------------------------------------------------------
const binary = (name: string, t: string, opKind: KernelSpec["opKind"]): KernelSpec => ({
  name,
  opKind,
  slots: [buf("a", t as SlotDType, R), buf("b", t as SlotDType, R), buf("out", t as SlotDType, W), { params: N }],
  tgFloatsPerThread: 0,
  geometry: "elements",
});
const unary = (name: string, t: string): KernelSpec => ({
  name,
  opKind: "Activation",
  slots: [buf("in", t as SlotDType, R), buf("out", t as SlotDType, W)],
  tgFloatsPerThread: 0,
  geometry: "elements",
});

const elementwise: KernelSpec[] = [
  ...FLOATS.map((t) => binary(`elementwise_add_${t}`, t, "ElemAdd")),
  ...FLOATS.map((t) => binary(`elementwise_mul_${t}`, t, "ElemMul")),
  ...FLOATS.map((t) => unary(`gelu_${t}`, t)),
  {
    name: "softcap_f32",
    opKind: "Activation",
    slots: [buf("in", "f32", R), buf("out", "f32", W), { params: SOFTCAP }],
    tgFloatsPerThread: 0,
    geometry: "elements",
  },
  {
    name: "axpby_f32",
    opKind: "ElemAdd",
    slots: [buf("a", "f32", R), buf("b", "f32", R), buf("out", "f32", W), { params: AXPBY }],
    tgFloatsPerThread: 0,
    geometry: "elements",
  },
  ...FLOATS.map((t) => unary(`silu_${t}`, t)),
  // silu_mul is not an ElemMul: the fusion pass must never take it for the MUL of RMSNorm→MUL.
  ...FLOATS.map((t) => binary(`silu_mul_${t}`, t, "Activation")),
  {
    name: "strided_copy_f32",
    opKind: "Other",
    slots: [buf("src", "f32", R), buf("dst", "f32", W), { params: STRIDED_COPY }, STATE],
    tgFloatsPerThread: 0,
    geometry: "custom",
  },
  {
    name: "debug_fault",
    opKind: "Other",
    slots: [buf("marker", "u32", W), { params: DEBUG_FAULT }],
    tgFloatsPerThread: 0,
    geometry: "custom",
  },
  {
    name: "scale_f32", // out = alpha · x
    opKind: "Other",
    slots: [buf("x", "f32", R), buf("out", "f32", W), { params: SCALE }],
    tgFloatsPerThread: 0,
    geometry: "elements",
    validator: "generated",
  },
];

// ---- row kernels ---------------------------------------------------------------------------------
const row = (name: string, opKind: KernelSpec["opKind"], slots: KernelSpec["slots"]): KernelSpec => ({
  name,
  opKind,
  slots,
  tgFloatsPerThread: 1,
  geometry: "rows",
});
const norm: KernelSpec[] = [
  ...FLOATS.map((t) =>
    row(`rms_norm_${t}`, "RmsNorm", [buf("input", t, R), buf("weight", t, R), buf("output", t, W), { params: NORM }])
  ),
  ...FLOATS.map((t) =>
    row(`rms_norm_mul_${t}`, "RmsNormMul", [
      buf("input", t, R),
      buf("weight", t, R),
      buf("scale", t, R),
      buf("output", t, W),
      { params: NORM },
    ])
  ),
  ...FLOATS.map((t) =>
    row(`rms_norm_mul_add_${t}`, "RmsNormMul", [
      buf("input", t, R),
      buf("weight", t, R),
      buf("scale", t, R),
      buf("residual", t, R),
      buf("output", t, W),
      { params: NORM },
    ])
  ),
  row("rms_norm_no_scale_f32", "Other", [buf("input", "f32", R), buf("output", "f32", W), { params: NORM }]),
  row("softmax_f32", "Softmax", [buf("input", "f32", R), buf("output", "f32", W), { params: SOFTMAX }]),
];

// ---- rope ----------------------------------------------------------------------------------------
const rope: KernelSpec[] = [
  {
    name: "rope_f32",
    opKind: "Rope",
    slots: [buf("input", "f32", R), buf("output", "f32", W), { params: ROPE }, buf("positions", "u32", R)],
    tgFloatsPerThread: 0,
    geometry: "custom",
  },
  ...["rope_neox_f32", "rope_norm_f32"].map((name): KernelSpec => ({
    name,
    opKind: "Rope",
    slots: [
      buf("input", "f32", R),
      buf("output", "f32", W),
      { params: ROPE_HEADS },
      buf("positions", "u32", R, { optional: true }),
      { params: ROPE_LAYOUT },
      buf("freq_factors", "f32", R, { optional: true }),
      STATE,
    ],
    tgFloatsPerThread: 0,
    geometry: "custom",
  })),
];

// ---- matrix products -----------------------------------------------------------------------------
const product = (name: string, slots: KernelSpec["slots"]): KernelSpec => ({
  name,
  opKind: "MatMul",
  slots,
  tgFloatsPerThread: 0,
  geometry: "custom",
});
/** The ggml block-format products of `formats`: each format's mv and mm kernels, then each one's MoE form. */
const ggml = (formats: readonly string[]): KernelSpec[] => [
  ...formats.flatMap((f) =>
    ["mv", "mm"].map((v) =>
      product(`qmatmul_${f}_${v}`, [buf("x", "f32", R), buf("w", "blocks", R), buf("y", "f32", W), { params: GGML }])
    )
  ),
  ...formats.map((f) =>
    product(`qmatmul_id_${f}`, [
      buf("x", "f32", R),
      buf("w", "blocks", R),
      buf("ids", "u32", R),
      buf("y", "f32", W),
      { params: GGML_ID },
    ])
  ),
];
const matmul: KernelSpec[] = [
  ...(["f32", "bf16", "f16"] as const).map((t) =>
    product(`matmul_${t}`, [
      buf("x", t, R),
      buf("w", t, R, { constantIf: { slot: 3, word: 3, mask: MODE_CONSTANT_WEIGHTS } }),
      buf("y", t, W),
      { params: DENSE },
      buf("residual", t, R, { optional: true }),
    ])
  ),
  ...["qmatmul_affine", "qmatmul_affine_fast"].map((name) =>
    product(name, [
      buf("x", "f32", R),
      buf("w", "u32", R),
      buf("scales", "bf16", R),
      buf("biases", "bf16", R),
      buf("y", "f32", W),
      { params: AFFINE },
    ])
  ),
  product("qmatmul_affine_general", [
    buf("x", "f32", R),
    buf("w", "u32", R),
    buf("scales", "any", R),
    buf("biases", "any", R),
    buf("y", "f32", W),
    { params: AFFINE_GENERAL },
  ]),
  product("qmatmul_affine_gather", [
    buf("x", "f32", R),
    buf("w", "u32", R),
    buf("scales", "any", R),
    buf("biases", "any", R),
    buf("ids", "u32", R),
    buf("y", "f32", W),
    { params: AFFINE_GATHER },
  ]),
  // Two batches of formats (the order fixes the pipeline handles the fuzz corpus encodes).
  ...ggml(["q4_0", "q8_0", "q6_k"]),
  ...ggml(["q4_1", "q5_0", "q5_1", "q4_k", "q5_k"]),
];

// ---- attention -----------------------------------------------------------------------------------
const qkvo = (t: SlotDType, params: ParamLayout, out: SlotDType = "f32"): KernelSpec["slots"] => [
  buf("q", "f32", R),
  buf("k", t, R),
  buf("v", t, R),
  buf("out", out, W),
  { params },
];
const attention: KernelSpec[] = [
  ...(["f32", "bf16"] as const).map((t): KernelSpec => ({
    name: `sdpa_${t}`,
    opKind: "Sdpa",
    slots: qkvo(t, SDPA),
    tgFloatsPerThread: 0,
    geometry: "custom",
  })),
  ...(["f32", "f16"] as const).map((t): KernelSpec => ({
    name: `flash_attn_vec_${t}`,
    opKind: "Sdpa",
    slots: [...qkvo(t, FLASH), STATE],
    tgFloatsPerThread: 0,
    geometry: "custom",
  })),
  {
    name: "flash_attn_vec_reduce",
    opKind: "Sdpa",
    slots: [buf("tmp", "f32", R), buf("out", "f32", W), { params: FLASH_REDUCE }],
    tgFloatsPerThread: 0,
    geometry: "custom",
  },
];

// ---- sampling ------------------------------------------------------------------------------------
const CURSOR = buf("cursor", "u32", R, { optional: true });
const sample: KernelSpec[] = [
  ...(["f32", "bf16"] as const).map((t): KernelSpec => ({
    name: `argmax_${t}`,
    opKind: "Other",
    slots: [buf("logits", t, R), buf("ids", "u32", W), { params: ARGMAX }, CURSOR],
    tgFloatsPerThread: 0,
    geometry: "custom",
  })),
  ...(["f32", "bf16"] as const).map((t): KernelSpec => ({
    name: `sample_${t}`,
    opKind: "Other",
    slots: [buf("logits", t, R), buf("ids", "u32", W), { params: SAMPLE }, CURSOR],
    tgFloatsPerThread: 0,
    geometry: "custom",
  })),
  ...(["f32", "bf16", "q8_0", "q4_0"] as const).map((f): KernelSpec => ({
    name: `embed_gather_${f}`,
    opKind: "Other",
    slots: [
      buf("table", f === "f32" || f === "bf16" ? f : "blocks", R),
      buf("ids", "u32", R),
      buf("output", "f32", W),
      { params: GATHER },
      CURSOR,
    ],
    tgFloatsPerThread: 0,
    geometry: "custom",
  })),
  {
    name: "step_advance_u32", // state[i] += add for i < words: ends a token pass (one thread)
    opKind: "Other",
    slots: [buf("state", "u32", "readwrite"), { params: STEP_ADVANCE }],
    tgFloatsPerThread: 0,
    geometry: "custom",
  },
];

/**
 * Every kernel, by family. The order is free: kernel ids (and the native pipeline handles, which the
 * fuzz corpus encodes) follow kernels/spec/ids.gen.txt, where the generator appends new kernels.
 */
export const families: Readonly<Record<string, readonly KernelSpec[]>> = {
  elementwise,
  norm,
  rope,
  matmul,
  attention,
  sample,
};
