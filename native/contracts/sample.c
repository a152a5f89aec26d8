/* Validators of the token kernels (argmax, sample, embed_gather): every dispatch on every backend passes through these before it runs.
 * The slot layouts and the semantics are documented with the bodies, kernels/cpu/sample.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "contracts.h"
#include "sample.h"

/* Each dtype's (or table format's) kernel binds its f32 form's slots (the validators and bodies read
 * them through the f32 names). */
MLXN_STATIC_ASSERT(MLXN_SLOT_ARGMAX_BF16_ARGMAX == MLXN_SLOT_ARGMAX_F32_ARGMAX &&
                       MLXN_SLOT_ARGMAX_BF16_CURSOR == MLXN_SLOT_ARGMAX_F32_CURSOR,
                   "one slot layout");
MLXN_STATIC_ASSERT(MLXN_SLOT_SAMPLE_BF16_SAMPLE == MLXN_SLOT_SAMPLE_F32_SAMPLE &&
                       MLXN_SLOT_SAMPLE_BF16_CURSOR == MLXN_SLOT_SAMPLE_F32_CURSOR,
                   "one slot layout");
MLXN_STATIC_ASSERT(MLXN_SLOT_EMBED_GATHER_BF16_GATHER == MLXN_SLOT_EMBED_GATHER_F32_GATHER &&
                       MLXN_SLOT_EMBED_GATHER_Q8_0_GATHER == MLXN_SLOT_EMBED_GATHER_F32_GATHER &&
                       MLXN_SLOT_EMBED_GATHER_Q4_0_GATHER == MLXN_SLOT_EMBED_GATHER_F32_GATHER &&
                       MLXN_SLOT_EMBED_GATHER_BF16_CURSOR == MLXN_SLOT_EMBED_GATHER_F32_CURSOR &&
                       MLXN_SLOT_EMBED_GATHER_Q8_0_CURSOR == MLXN_SLOT_EMBED_GATHER_F32_CURSOR &&
                       MLXN_SLOT_EMBED_GATHER_Q4_0_CURSOR == MLXN_SLOT_EMBED_GATHER_F32_CURSOR,
                   "one slot layout");

/* a·b·c bytes, or 0 with *ok cleared when the product does not fit in 64 bits. */
static uint64_t checked_bytes(uint64_t a, uint64_t b, uint64_t c, int *ok) {
  uint64_t ab, abc;
  if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc)) {
    *ok = 0;
    return 0;
  }
  return abc;
}

/* Checks the token-ring addressing: `ring` slots of `rows` u32 ids in buffer slot `ids`, and the
 * optional cursor buffer bound exactly when has_cursor says so. */
static int ring_validate(const mlxn_kargs *a, int ids, int cursor, uint32_t rows, uint32_t ring,
                         uint32_t has_cursor, char *err, size_t cap) {
  if (rows == 0) return mlxn_kfail(err, cap, "rows must be > 0");
  if (ring == 0) return mlxn_kfail(err, cap, "ring must be > 0 (slots of the token-id ring)");
  if (has_cursor > 1) return mlxn_kfail(err, cap, "has_cursor must be 0 or 1, got %u", has_cursor);
  if (has_cursor != (a->ptr[cursor] != NULL))
    return mlxn_kfail(err, cap, has_cursor ? "has_cursor is 1 but the cursor slot %d is not bound"
                                           : "cursor slot %d bound but has_cursor is 0", cursor);
  int ok = 1;
  uint64_t need = checked_bytes(ring, rows, 4, &ok);
  if (!ok) return mlxn_kfail(err, cap, "ring × rows × 4 bytes overflows");
  MLXN_NEED_BUF(a, ids, need, err, cap);
  if (has_cursor) MLXN_NEED_BUF(a, cursor, 4, err, cap);
  MLXN_NEED_ALIGN(a, MLXN_SLOTS2(ids, cursor), 4, err, cap); /* u32 token ids and cursor */
  return 0;
}

/* Checks logits [rows, vocab] of element type t in slot 0, one threadgroup per row. */
static int logits_validate(const mlxn_kargs *a, uint32_t rows, uint32_t vocab, mlxn_ftype t, char *err,
                           size_t cap) {
  if (vocab == 0 || vocab > (1u << 30)) return mlxn_kfail(err, cap, "vocab must be in [1, 2^30], got %u", vocab);
  /* The GPU kernels reduce over whole warps / simdgroups of a one-dimensional threadgroup. */
  uint32_t tg = a->tg[0];
  if (tg < 32 || tg > MLXN_TOKEN_MAX_THREADS || (tg & (tg - 1)) || a->tg[1] != 1 || a->tg[2] != 1)
    return mlxn_kfail(err, cap, "threadgroup must be (2^k, 1, 1) with 32 <= 2^k <= %u, got (%u, %u, %u)",
                      MLXN_TOKEN_MAX_THREADS, a->tg[0], a->tg[1], a->tg[2]);
  if ((uint64_t)a->groups[0] * a->groups[1] * a->groups[2] < rows)
    return mlxn_kfail(err, cap, "%u threadgroups do not cover %u rows (one per row)",
                      a->groups[0] * a->groups[1] * a->groups[2], rows);
  int ok = 1;
  uint64_t need = checked_bytes(rows, vocab, mlxn_ftype_size(t), &ok);
  if (!ok) return mlxn_kfail(err, cap, "rows × vocab × element size overflows");
  MLXN_NEED_BUF(a, 0, need, err, cap);
  MLXN_NEED_ALIGN(a, 1u, mlxn_ftype_size(t), err, cap);
  return 0;
}

/* ---- argmax_{f32,bf16}: 0 logits [rows, vocab], 1 ids u32 ring, 2 {vocab, rows, ring,
 *      has_cursor}, 3 cursor u32 (optional); threadgroups (rows). A row holding NaN fails the
 *      dispatch (its id is still written: NaN ranks below −inf). */

static int argmax_validate_t(const mlxn_kargs *a, mlxn_ftype t, char *err, size_t cap) {
  MLXN_NEED_BYTES(a, MLXN_SLOT_ARGMAX_F32_ARGMAX, MLXN_PARAMS_ARGMAX_BYTES, err, cap);
  mlxn_params_argmax p = mlxn_params_argmax_of(a, MLXN_SLOT_ARGMAX_F32_ARGMAX);
  const int cursor = MLXN_SLOT_ARGMAX_F32_CURSOR;
  if (ring_validate(a, 1, cursor, p.rows, p.ring, p.has_cursor, err, cap)) return 1;
  if (logits_validate(a, p.rows, p.vocab, t, err, cap)) return 1;
  MLXN_NO_OVERLAP(a, 1, a->len[1], 0, a->len[0], err, cap); /* ids written, logits read */
  MLXN_NO_OVERLAP(a, 1, a->len[1], cursor, a->len[cursor], err, cap); /* ids written, cursor read */
  return 0;
}

/* ---- sample_{f32,bf16}: 0 logits [rows, vocab], 1 ids u32 ring, 2 {vocab, rows, ring,
 *      has_cursor, c: f32 = log2(e)/T (0: greedy), top_k (0: all), top_p: Q31 (2³¹: off),
 *      seed_lo, seed_hi, counter}, 3 cursor u32 (optional; also added to the counter);
 *      threadgroups (rows). A row holding NaN, or only −inf, fails the dispatch and gets the argmax. */

static int sample_validate_t(const mlxn_kargs *a, mlxn_ftype t, char *err, size_t cap) {
  MLXN_NEED_BYTES(a, MLXN_SLOT_SAMPLE_F32_SAMPLE, MLXN_PARAMS_SAMPLE_BYTES, err, cap);
  mlxn_params_sample p = mlxn_params_sample_of(a, MLXN_SLOT_SAMPLE_F32_SAMPLE);
  const int cursor = MLXN_SLOT_SAMPLE_F32_CURSOR;
  if (!(p.c >= 0.0f) || isinf(p.c)) return mlxn_kfail(err, cap, "c = log2(e)/temperature must be finite and >= 0");
  if (p.top_p_q31 == 0 || p.top_p_q31 > MLXN_SAMPLE_TOP_P_OFF)
    return mlxn_kfail(err, cap, "top_p (Q31) must be in [1, 2^31], got %u", p.top_p_q31);
  if (ring_validate(a, 1, cursor, p.rows, p.ring, p.has_cursor, err, cap)) return 1;
  if (logits_validate(a, p.rows, p.vocab, t, err, cap)) return 1;
  MLXN_NO_OVERLAP(a, 1, a->len[1], 0, a->len[0], err, cap); /* ids written, logits read */
  MLXN_NO_OVERLAP(a, 1, a->len[1], cursor, a->len[cursor], err, cap); /* ids written, cursor read */
  return 0;
}

/* ---- embed_gather_{f32,bf16,q8_0,q4_0}: 0 table [vocab rows], 1 ids u32 ring, 2 out f32 [rows,
 *      dim], 3 {rows, dim, vocab, ring, has_cursor}, 4 cursor u32 (optional); threads (dim, rows).
 *      An id ≥ vocab fails the dispatch and its row is written as zeros (nothing is read out of
 *      bounds). q8_0/q4_0 rows are ggml blocks of 32 values: f16 scale then 32 int8 (34 B) or 16
 *      bytes of nibbles, value j low, j + 16 high, minus 8 (18 B). */


static int gather_validate_t(const mlxn_kargs *a, int fmt, char *err, size_t cap) {
  MLXN_NEED_BYTES(a, MLXN_SLOT_EMBED_GATHER_F32_GATHER, MLXN_PARAMS_GATHER_BYTES, err, cap);
  mlxn_params_gather p = mlxn_params_gather_of(a, MLXN_SLOT_EMBED_GATHER_F32_GATHER);
  uint32_t rows = p.rows, dim = p.dim, vocab = p.vocab;
  if (dim == 0 || vocab == 0) return mlxn_kfail(err, cap, "dim and vocab must be > 0");
  uint32_t block = fmt == G_Q8_0 ? ggml_block_values(GGML_Q8_0) : fmt == G_Q4_0 ? ggml_block_values(GGML_Q4_0) : 1;
  if (dim % block)
    return mlxn_kfail(err, cap, "dim=%u must be a multiple of %u for a block-quantized table", dim, block);
  if (ring_validate(a, 1, MLXN_SLOT_EMBED_GATHER_F32_CURSOR, rows, p.ring, p.has_cursor, err, cap)) return 1;
  int ok = 1;
  uint64_t table = checked_bytes(vocab, gather_row_bytes(fmt, dim), 1, &ok);
  uint64_t out = checked_bytes(rows, dim, 4, &ok);
  if (!ok) return mlxn_kfail(err, cap, "table or output size overflows 64 bits");
  if ((uint64_t)a->grid[0] < dim || (uint64_t)a->grid[1] < rows)
    return mlxn_kfail(err, cap, "grid %ux%u threads does not cover dim=%u × rows=%u", a->grid[0], a->grid[1], dim, rows);
  MLXN_NEED_BUF(a, 0, table, err, cap);
  MLXN_NEED_BUF(a, 2, out, err, cap);
  MLXN_NEED_ALIGN(a, 1u << 2, 4, err, cap);
  if (fmt == G_F32 || fmt == G_BF16) MLXN_NEED_ALIGN(a, 1u, fmt == G_F32 ? 4 : 2, err, cap); /* blocks: bytes */
  return 0;
}

/* ---- step_advance_u32: 0 state u32[words] (read and written), 1 {words, add}: state[i] += add
 *      (mod 2³²) for i < words; one thread does it (grid >= 1). Ends a token pass so the host never
 *      writes the step state inside a token loop. */

static int step_advance_validate(const mlxn_kargs *a, char *err, size_t cap) {
  MLXN_NEED_BYTES(a, MLXN_SLOT_STEP_ADVANCE_U32_STEP_ADVANCE, MLXN_PARAMS_STEP_ADVANCE_BYTES, err, cap);
  mlxn_params_step_advance p = mlxn_params_step_advance_of(a, MLXN_SLOT_STEP_ADVANCE_U32_STEP_ADVANCE);
  if (p.count == 0 || p.count > MLXN_STEP_ADVANCE_MAX_WORDS)
    return mlxn_kfail(err, cap, "count (words advanced) must be in [1, %u], got %u", MLXN_STEP_ADVANCE_MAX_WORDS,
                      p.count);
  if (mlxn_need_grid(a, 0, 1, "state (one thread)", err, cap)) return 1;
  MLXN_NEED_BUF(a, MLXN_SLOT_STEP_ADVANCE_U32_STATE, MLXN_SIZE(p.count, 4), err, cap);
  MLXN_NEED_ALIGN(a, 1u << MLXN_SLOT_STEP_ADVANCE_U32_STATE, 4, err, cap);
  return 0;
}

#define TOKEN_KERNELS(SUF, T)                                                                     \
  static int argmax_##SUF##_validate(const mlxn_kargs *a, char *err, size_t cap) {               \
    return argmax_validate_t(a, T, err, cap);                                                      \
  }                                                                                                \
  static int sample_##SUF##_validate(const mlxn_kargs *a, char *err, size_t cap) {               \
    return sample_validate_t(a, T, err, cap);                                                      \
  }
TOKEN_KERNELS(f32, MLXN_T_F32)
TOKEN_KERNELS(bf16, MLXN_T_BF16)

#define GATHER_KERNEL(SUF, F)                                                                     \
  static int embed_gather_##SUF##_validate(const mlxn_kargs *a, char *err, size_t cap) {         \
    return gather_validate_t(a, F, err, cap);                                                      \
  }
GATHER_KERNEL(f32, G_F32)
GATHER_KERNEL(bf16, G_BF16)
GATHER_KERNEL(q8_0, G_Q8_0)
GATHER_KERNEL(q4_0, G_Q4_0)

MLXN_VALIDATOR(step_advance_u32, step_advance_validate)
MLXN_VALIDATOR(argmax_f32, argmax_f32_validate)
MLXN_VALIDATOR(argmax_bf16, argmax_bf16_validate)
MLXN_VALIDATOR(sample_f32, sample_f32_validate)
MLXN_VALIDATOR(sample_bf16, sample_bf16_validate)
MLXN_VALIDATOR(embed_gather_f32, embed_gather_f32_validate)
MLXN_VALIDATOR(embed_gather_bf16, embed_gather_bf16_validate)
MLXN_VALIDATOR(embed_gather_q8_0, embed_gather_q8_0_validate)
MLXN_VALIDATOR(embed_gather_q4_0, embed_gather_q4_0_validate)
