/* Attention. Scores, softmax and the weighted sum run in f32 with an online (running-max) softmax.
 *
 * sdpa_f32 / sdpa_bf16 (prefill or decode, any seq): 0 Q [batch, n_heads, seq, hd],
 *   1 K [batch, n_kv_heads, kv_capacity, hd], 2 V (as K), 3 O [batch, n_heads, seq, hd],
 *   4 {n_heads, n_kv_heads, head_dim, seq_len, kv_seq_len, scale: f32, kv_capacity}.
 *   Threadgroups (batch, n_heads, ceil(seq/32)), 32 threads: one query row per thread. Causal:
 *   query q sits at absolute position kv_seq_len − seq_len + q and sees keys 0..that position.
 *   GQA: head h reads kv head h / (n_heads / n_kv_heads).
 *
 * flash_attn_vec_f32 / _f16 (decode: one query per head), K/V f32 or f16, split over NWG
 *   workgroups per head: 0 Q [n_heads, hd] f32, 1 K [n_kv_heads, kv_capacity, hd], 2 V, 3 tmp
 *   [n_heads, NWG, hd + 2] f32 (partial outputs, then running max and sum), 4 {n_heads, n_kv_heads,
 *   head_dim, kv_seq_len, kv_capacity, scale: f32, mask (0 none, 1 causal, 2 sliding),
 *   sliding_window, softcap: f32 (0 = off), nwg}. Threadgroups (n_heads, nwg). Workgroup w takes
 *   the keys [w·c, (w+1)·c), c = ceil(kv_seq_len / nwg).
 * flash_attn_vec_reduce: 0 tmp, 1 O [n_heads, hd] f32, 2 {n_heads, head_dim, nwg}; threadgroups
 *   (n_heads): combines the partials. */
#include <math.h>

#include "cpu_kernel.h"

/* ---- sdpa ---------------------------------------------------------------------------------------- */

typedef mlxn_params_sdpa sdpa_params; /* generated layout (kernels/spec/kernels.ts) */

static sdpa_params read_sdpa(const mlxn_kargs *a) { return mlxn_params_sdpa_of(a, MLXN_SLOT_SDPA_F32_SDPA); }

static void sdpa_rows(const mlxn_kargs *a, mlxn_ftype t, uint32_t b, uint32_t h, uint32_t block) {
  sdpa_params p = read_sdpa(a);
  uint32_t kvh = h / (p.heads / p.kv_heads);
  uint64_t qbase = (((uint64_t)b * p.heads + h) * p.seq) * p.hd;
  uint64_t kbase = (((uint64_t)b * p.kv_heads + kvh) * p.kv_cap) * p.hd;
  float q[MLXN_MAX_HEAD_DIM], acc[MLXN_MAX_HEAD_DIM];
  for (uint32_t r = block * MLXN_SDPA_ROWS; r < p.seq && r < (block + 1) * MLXN_SDPA_ROWS; r++) {
    uint64_t qo = qbase + (uint64_t)r * p.hd;
    for (uint32_t d = 0; d < p.hd; d++) {
      q[d] = mlxn_load(a->ptr[0], qo + d, t);
      acc[d] = 0.0f;
    }
    uint32_t last = p.kv_len - p.seq + r; /* causal: keys 0..last */
    float m = -INFINITY, l = 0.0f;
    for (uint32_t k = 0; k <= last; k++) {
      uint64_t ko = kbase + (uint64_t)k * p.hd;
      float s = 0.0f;
      for (uint32_t d = 0; d < p.hd; d++) s += q[d] * mlxn_load(a->ptr[1], ko + d, t);
      s *= p.scale;
      float mn = fmaxf(m, s);
      float corr = expf(m - mn), w = expf(s - mn);
      l = l * corr + w;
      for (uint32_t d = 0; d < p.hd; d++) acc[d] = acc[d] * corr + w * mlxn_load(a->ptr[2], ko + d, t);
      m = mn;
    }
    for (uint32_t d = 0; d < p.hd; d++) mlxn_store(a->ptr[3], qo + d, t, acc[d] / l);
  }
}

#define SDPA_KERNEL(SUF, T)                                                                       \
  static int sdpa_##SUF##_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) { \
    (void)s;                                                                                       \
    if (gy < read_sdpa(a).heads) sdpa_rows(a, T, gx, gy, gz);                                      \
    return 0;                                                                                      \
  }

SDPA_KERNEL(f32, MLXN_T_F32)
SDPA_KERNEL(bf16, MLXN_T_BF16)

/* ---- flash_attn_vec ------------------------------------------------------------------------------ */

typedef mlxn_params_flash fav_params; /* generated layout (kernels/spec/kernels.ts) */

static fav_params read_fav(const mlxn_kargs *a) { return mlxn_params_flash_of(a, MLXN_SLOT_FLASH_ATTN_VEC_F32_FLASH); }

/* With a step state the keys are state[0] + 1 (the query's own position included); kv_seq_len is
 * then their bound, and a position at or past it fails the dispatch (nothing is read or written). */
static int fav_partial(const mlxn_kargs *a, mlxn_ftype t, uint32_t h, uint32_t w) {
  fav_params p = read_fav(a);
  if (p.has_state) {
    uint32_t pos = ((const uint32_t *)a->ptr[MLXN_SLOT_FLASH_ATTN_VEC_F32_STATE])[0];
    if (pos >= p.kv_len) return 1;
    p.kv_len = pos + 1;
  }
  uint32_t kvh = h / (p.heads / p.kv_heads);
  const float *q = (const float *)a->ptr[0] + (uint64_t)h * p.hd;
  uint64_t kbase = (uint64_t)kvh * p.kv_cap * p.hd;
  float *out = (float *)a->ptr[3] + ((uint64_t)h * p.nwg + w) * (p.hd + 2);
  uint32_t chunk = (p.kv_len + p.nwg - 1) / p.nwg;
  uint32_t k0 = w * chunk, k1 = k0 + chunk < p.kv_len ? k0 + chunk : p.kv_len;
  uint32_t pos = p.kv_len - 1; /* the query's absolute position */
  if (p.mask == 2 && pos + 1 > p.window && k0 < pos + 1 - p.window) k0 = pos + 1 - p.window;
  float acc[MLXN_MAX_HEAD_DIM];
  for (uint32_t d = 0; d < p.hd; d++) acc[d] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (uint32_t k = k0; k < k1; k++) { /* causal: every cached key is at or before the query */
    uint64_t ko = kbase + (uint64_t)k * p.hd;
    float s = 0.0f;
    for (uint32_t d = 0; d < p.hd; d++) s += q[d] * mlxn_load(a->ptr[1], ko + d, t);
    s *= p.scale;
    if (p.softcap > 0.0f) s = p.softcap * tanhf(s / p.softcap);
    float mn = fmaxf(m, s);
    float corr = expf(m - mn), e = expf(s - mn);
    l = l * corr + e;
    for (uint32_t d = 0; d < p.hd; d++) acc[d] = acc[d] * corr + e * mlxn_load(a->ptr[2], ko + d, t);
    m = mn;
  }
  for (uint32_t d = 0; d < p.hd; d++) out[d] = acc[d];
  out[p.hd] = m; /* -inf for an empty chunk */
  out[p.hd + 1] = l;
  return 0;
}

#define FAV_KERNEL(SUF, T)                                                                        \
  static int flash_attn_vec_##SUF##_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, \
                                        void *s) {                                                 \
    (void)gz; (void)s;                                                                             \
    fav_params p = read_fav(a);                                                                    \
    return gx < p.heads && gy < p.nwg ? fav_partial(a, T, gx, gy) : 0;                             \
  }

FAV_KERNEL(f32, MLXN_T_F32)
FAV_KERNEL(f16, MLXN_T_F16)

static int fav_reduce_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {
  (void)s;
  mlxn_params_flash_reduce p = mlxn_params_flash_reduce_of(a, MLXN_SLOT_FLASH_ATTN_VEC_REDUCE_FLASH_REDUCE);
  uint32_t heads = p.n_heads, hd = p.head_dim, nwg = p.nwg;
  /* One group per head: the output row is accumulated in place, so extra groups along y or z (which
   * the workers may run at the same time) must not touch it. */
  if (gx >= heads || gy != 0 || gz != 0) return 0;
  const float *tmp = (const float *)a->ptr[0] + (uint64_t)gx * nwg * (hd + 2);
  float *out = (float *)a->ptr[1] + (uint64_t)gx * hd;
  float m = -INFINITY;
  for (uint32_t w = 0; w < nwg; w++) m = fmaxf(m, tmp[w * (hd + 2) + hd]);
  float l = 0.0f;
  for (uint32_t d = 0; d < hd; d++) out[d] = 0.0f;
  for (uint32_t w = 0; w < nwg; w++) {
    const float *part = tmp + w * (hd + 2);
    if (part[hd + 1] == 0.0f) continue; /* an empty chunk */
    float c = expf(part[hd] - m);
    l += part[hd + 1] * c;
    for (uint32_t d = 0; d < hd; d++) out[d] += part[d] * c;
  }
  for (uint32_t d = 0; d < hd; d++) out[d] /= l;
  return 0;
}

MLXN_CPU_BODY(sdpa_f32, sdpa_f32_run)
MLXN_CPU_BODY(sdpa_bf16, sdpa_bf16_run)
MLXN_CPU_BODY(flash_attn_vec_f32, flash_attn_vec_f32_run)
MLXN_CPU_BODY(flash_attn_vec_f16, flash_attn_vec_f16_run)
MLXN_CPU_BODY(flash_attn_vec_reduce, fav_reduce_run)
