/* Rotary position embeddings, f32. Angles and trigonometry are f32, as on the GPU. */
#include <math.h>

#include "cpu_kernel.h"

static int rope_f32_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {
  (void)gz; (void)s;
  mlxn_params_rope p = mlxn_params_rope_of(a, MLXN_SLOT_ROPE_F32_ROPE);
  float theta = p.theta;
  uint32_t hd = p.head_dim, seq = p.seq_len;
  const float *in = (const float *)a->ptr[0];
  float *out = (float *)a->ptr[1];
  const uint32_t *pos = (const uint32_t *)a->ptr[3];
  for (uint32_t ty = 0; ty < a->tg[1]; ty++) {
    uint32_t t = gy * a->tg[1] + ty;
    if (t >= seq || t >= a->grid[1]) break;
    for (uint32_t tx = 0; tx < a->tg[0]; tx++) {
      uint32_t i = gx * a->tg[0] + tx;
      if (i >= hd / 2 || i >= a->grid[0]) break;
      float freq = powf(theta, -2.0f * (float)i / (float)hd);
      float ang = (float)pos[t] * freq;
      float c = cosf(ang), sn = sinf(ang);
      uint64_t j = (uint64_t)t * hd + 2 * i;
      float x0 = in[j], x1 = in[j + 1];
      out[j] = x0 * c - x1 * sn;
      out[j + 1] = x0 * sn + x1 * c;
    }
  }
  return 0;
}

/* Pair i of a row is (i, i + rope_dim/2) (NeoX) or (2i, 2i + 1) (adjacent: ggml's normal mode). */
static int rope_heads_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, int adjacent) {
  mlxn_params_rope_heads p = mlxn_params_rope_heads_of(a, MLXN_SLOT_ROPE_NEOX_F32_ROPE_HEADS);
  mlxn_params_rope_layout l = mlxn_params_rope_layout_of(a, MLXN_SLOT_ROPE_NEOX_F32_ROPE_LAYOUT);
  float theta = p.theta;
  uint32_t hd = p.head_dim, rd = p.rope_dim;
  uint32_t heads = l.n_heads, has_ff = l.has_freq_factors;
  uint32_t half = rd / 2;
  const float *in = (const float *)a->ptr[0];
  float *out = (float *)a->ptr[1];
  const uint32_t *pos = (const uint32_t *)a->ptr[3];
  const float *ff = (const float *)a->ptr[5];
  /* With a step state, token t sits at position state[0] + t and the rows move by state[0] rows of
   * the cache; a position the validator did not bound fails the dispatch before anything is written. */
  uint32_t base = l.has_state ? ((const uint32_t *)a->ptr[MLXN_SLOT_ROPE_NEOX_F32_STATE])[0] : 0;
  if (l.has_state && base >= l.max_pos) return 1;
  uint64_t obase = l.has_state ? (uint64_t)base * l.out_pos_stride : 0;
  for (uint32_t ty = 0; ty < a->tg[1]; ty++) {
    uint32_t r = gy * a->tg[1] + ty;
    if (r >= a->grid[1]) break;
    uint64_t row = (uint64_t)r * hd;
    uint64_t orow = obase + (uint64_t)(r / heads) * l.out_token_stride + (uint64_t)(r % heads) * l.out_head_stride;
    uint32_t tpos = l.has_state ? base + r / heads : pos[r / heads];
    for (uint32_t tx = 0; tx < a->tg[0]; tx++) {
      uint32_t i = gx * a->tg[0] + tx;
      if (i >= half || i >= a->grid[0]) break;
      float freq = powf(theta, -2.0f * (float)i / (float)rd);
      if (has_ff) freq = freq / ff[i];
      float ang = (float)tpos * freq;
      float c = cosf(ang), sn = sinf(ang);
      uint32_t i0 = adjacent ? 2 * i : i, i1 = adjacent ? 2 * i + 1 : i + half;
      float x0 = in[row + i0], x1 = in[row + i1];
      out[orow + i0] = x0 * c - x1 * sn;
      out[orow + i1] = x0 * sn + x1 * c;
      /* Thread i also copies the unrotated tail, striding by the number of pair threads. */
      for (uint32_t d = rd + i; d < hd; d += half) out[orow + d] = in[row + d];
    }
  }
  return 0;
}

static int rope_neox_f32_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {
  (void)gz; (void)s;
  return rope_heads_run(a, gx, gy, 0);
}

/* ---- rope_norm_f32: ggml's normal mode (llama-architecture GGUFs), the bindings and geometry of
 * rope_neox_f32 with adjacent pairs (2i, 2i+1), i < rope_dim/2. */
static int rope_norm_f32_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {
  (void)gz; (void)s;
  return rope_heads_run(a, gx, gy, 1);
}

MLXN_CPU_BODY(rope_f32, rope_f32_run)
MLXN_CPU_BODY(rope_neox_f32, rope_neox_f32_run)
MLXN_CPU_BODY(rope_norm_f32, rope_norm_f32_run)
