/* Validators of the rotary-embedding kernels (rope, rope_neox, rope_norm): every dispatch on every backend passes through these before it runs.
 * The slot layouts and the semantics are documented with the bodies, kernels/cpu/rope.c. */
#include <math.h>

#include "contracts.h"

/* ---- rope_f32: adjacent pairs (2i, 2i+1) of one head laid out [seq, head_dim] -------------
 * 0 in, 1 out, 2 {theta: f32, head_dim: u32, seq_len: u32}, 3 positions u32[seq_len];
 * threads (head_dim/2, seq_len). */

static int rope_f32_validate(const mlxn_kargs *a, char *err, size_t cap) {
  MLXN_NEED_BYTES(a, MLXN_SLOT_ROPE_F32_ROPE, MLXN_PARAMS_ROPE_BYTES, err, cap);
  mlxn_params_rope p = mlxn_params_rope_of(a, MLXN_SLOT_ROPE_F32_ROPE);
  float theta = p.theta;
  uint32_t hd = p.head_dim, seq = p.seq_len;
  if (!(theta > 0.0f) || isinf(theta)) return mlxn_kfail(err, cap, "rope: theta must be finite and > 0");
  if (hd == 0 || hd % 2) return mlxn_kfail(err, cap, "rope: head_dim must be even and > 0, got %u", hd);
  if (mlxn_need_dims(a, 2, err, cap) || mlxn_need_grid(a, 0, hd / 2, "rotated pair (head_dim / 2)", err, cap) ||
      mlxn_need_grid(a, 1, seq, "position (seq_len)", err, cap))
    return 1;
  MLXN_NEED_BUF(a, 0, MLXN_SIZE(seq, hd, 4), err, cap);
  MLXN_NEED_BUF(a, 1, MLXN_SIZE(seq, hd, 4), err, cap);
  MLXN_NEED_BUF(a, 3, MLXN_SIZE(seq, 4), err, cap);
  MLXN_NEED_ALIGN(a, MLXN_SLOTS3(0, 1, 3), 4, err, cap);
  return 0;
}

/* ---- rope_neox_f32: pairs (i, i + rope_dim/2); dims [rope_dim, head_dim) pass through ------
 * 0 in [seq·heads, head_dim], 1 out, 2 {theta: f32, head_dim: u32, rope_dim: u32},
 * 3 positions u32[seq], 4 {n_heads, has_freq_factors, out_head_stride, out_token_stride: u32},
 * 5 freq_factors f32[rope_dim/2] (optional); threads (rope_dim/2, seq·heads). Row r belongs to
 * token t = r / n_heads, head h = r % n_heads; its output starts at element t·out_token_stride +
 * h·out_head_stride of `out` (dense: head_dim and n_heads·head_dim; a KV cache laid out [heads,
 * capacity, head_dim] at a position: capacity·head_dim and head_dim, so rope writes K in place);
 * then {has_state, out_pos_stride, max_pos: u32} and 6 state u32[1] (optional, bound exactly when
 * has_state is 1). With the state, token t's position is state[0] + t (positions is not read and may
 * be unbound) and every output row moves by state[0]·out_pos_stride elements: `out` binds the whole
 * cache once. The state is device data, so this validator bounds the worst case statically
 * (state[0] ≤ max_pos − 1) and the body fails the dispatch, writing nothing, when state[0] ≥ max_pos. */

MLXN_STATIC_ASSERT(MLXN_SLOT_ROPE_NORM_F32_ROPE_HEADS == MLXN_SLOT_ROPE_NEOX_F32_ROPE_HEADS &&
                       MLXN_SLOT_ROPE_NORM_F32_ROPE_LAYOUT == MLXN_SLOT_ROPE_NEOX_F32_ROPE_LAYOUT &&
                       MLXN_SLOT_ROPE_NORM_F32_POSITIONS == MLXN_SLOT_ROPE_NEOX_F32_POSITIONS &&
                       MLXN_SLOT_ROPE_NORM_F32_FREQ_FACTORS == MLXN_SLOT_ROPE_NEOX_F32_FREQ_FACTORS &&
                       MLXN_SLOT_ROPE_NORM_F32_STATE == MLXN_SLOT_ROPE_NEOX_F32_STATE,
                   "rope_norm_f32 shares rope_neox_f32's slot layout");

/* Shared by rope_neox_f32 and rope_norm_f32 (same bindings and geometry); `op` names the kernel in
 * refusals. */
static inline __attribute__((always_inline)) int rope_heads_validate(const mlxn_kargs *a, const char *op, char *err,
                                                                      size_t cap) {
  MLXN_NEED_BYTES(a, MLXN_SLOT_ROPE_NEOX_F32_ROPE_HEADS, MLXN_PARAMS_ROPE_HEADS_BYTES, err, cap);
  MLXN_NEED_BYTES(a, MLXN_SLOT_ROPE_NEOX_F32_ROPE_LAYOUT, MLXN_PARAMS_ROPE_LAYOUT_BYTES, err, cap);
  mlxn_params_rope_heads p = mlxn_params_rope_heads_of(a, MLXN_SLOT_ROPE_NEOX_F32_ROPE_HEADS);
  mlxn_params_rope_layout l = mlxn_params_rope_layout_of(a, MLXN_SLOT_ROPE_NEOX_F32_ROPE_LAYOUT);
  float theta = p.theta;
  uint32_t hd = p.head_dim, rd = p.rope_dim;
  uint32_t heads = l.n_heads, has_ff = l.has_freq_factors, has_state = l.has_state;
  if (!(theta > 0.0f) || isinf(theta)) return mlxn_kfail(err, cap, "%s: theta must be finite and > 0", op);
  if (has_state > 1) return mlxn_kfail(err, cap, "%s: has_state must be 0 or 1, got %u", op, has_state);
  if (has_state != (a->ptr[MLXN_SLOT_ROPE_NEOX_F32_STATE] != NULL))
    return mlxn_kfail(err, cap, has_state ? "%s: has_state is 1 but the state slot is not bound"
                                          : "%s: state slot bound but has_state is 0", op);
  if (has_state && l.max_pos == 0) return mlxn_kfail(err, cap, "%s: max_pos must be > 0 with a state", op);
  if (rd == 0 || rd % 2 || rd > hd)
    return mlxn_kfail(err, cap, "%s: rope_dim must be even, > 0 and <= head_dim (%u), got %u", op, hd, rd);
  if (heads == 0) return mlxn_kfail(err, cap, "%s: n_heads must be > 0", op);
  /* Each pair thread also copies every (rope_dim/2)-th pass-through dimension: all must run. */
  if (mlxn_need_dims(a, 2, err, cap) || mlxn_need_grid(a, 0, rd / 2, "rotated pair (rope_dim / 2)", err, cap))
    return 1;
  uint64_t rows = a->grid[1]; /* >= 1: the decoder refuses an empty grid */
  /* The last row's token and head, in 32 bits (rows fits: it is a grid dimension): one division. */
  uint64_t t_last = (uint32_t)(rows - 1) / heads, h_last = (uint32_t)(rows - 1) % heads;
  uint64_t tokens = t_last + 1;
  MLXN_NEED_BUF(a, 0, MLXN_SIZE(rows, hd, 4), err, cap);
  /* The furthest output row: the last token's last head, or (when the rows end inside a token) the
   * token before's last head. */
  uint64_t hs = l.out_head_stride, ts = l.out_token_stride;
  uint64_t end = mlxn_size_add(MLXN_SIZE(t_last, ts), MLXN_SIZE(h_last, hs));
  if (t_last > 0) {
    uint64_t prev = mlxn_size_add(MLXN_SIZE(t_last - 1, ts), MLXN_SIZE(heads - 1, hs));
    if (prev > end) end = prev;
  }
  /* With a state, the furthest row moves by the largest position the body accepts. */
  if (has_state) end = mlxn_size_add(end, MLXN_SIZE((uint64_t)l.max_pos - 1, l.out_pos_stride));
  MLXN_NEED_BUF(a, 1, MLXN_SIZE(mlxn_size_add(end, hd), 4), err, cap);
  if (has_state) MLXN_NEED_BUF(a, MLXN_SLOT_ROPE_NEOX_F32_STATE, 4, err, cap);
  else MLXN_NEED_BUF(a, 3, MLXN_SIZE(tokens, 4), err, cap);
  if (has_ff) MLXN_NEED_BUF(a, 5, MLXN_SIZE(rd / 2, 4), err, cap);
  MLXN_NEED_ALIGN(a, MLXN_SLOTS4(0, 1, 3, 5) | (1u << MLXN_SLOT_ROPE_NEOX_F32_STATE), 4, err, cap);
  /* The state is read by every thread while others write rows: it must not lie in the output. */
  MLXN_NO_OVERLAP(a, 1, a->len[1], MLXN_SLOT_ROPE_NEOX_F32_STATE, a->len[MLXN_SLOT_ROPE_NEOX_F32_STATE], err, cap);
  return 0;
}

static int rope_neox_f32_validate(const mlxn_kargs *a, char *err, size_t cap) {
  return rope_heads_validate(a, "rope_neox", err, cap);
}

static int rope_norm_f32_validate(const mlxn_kargs *a, char *err, size_t cap) {
  return rope_heads_validate(a, "rope_norm", err, cap);
}

MLXN_VALIDATOR(rope_f32, rope_f32_validate)
MLXN_VALIDATOR(rope_neox_f32, rope_neox_f32_validate)
MLXN_VALIDATOR(rope_norm_f32, rope_norm_f32_validate)
