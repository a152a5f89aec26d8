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

#define MAX_HEAD_DIM 512
#define SDPA_ROWS 32

/* ---- sdpa ---------------------------------------------------------------------------------------- */

typedef struct sdpa_params {
  uint32_t heads, kv_heads, hd, seq, kv_len;
  float scale;
  uint32_t kv_cap;
} sdpa_params;

static sdpa_params read_sdpa(const mlxn_kargs *a) {
  sdpa_params p = {mlxn_arg_u32(a, 4, 0), mlxn_arg_u32(a, 4, 4),  mlxn_arg_u32(a, 4, 8),
                   mlxn_arg_u32(a, 4, 12), mlxn_arg_u32(a, 4, 16), mlxn_arg_f32(a, 4, 20),
                   mlxn_arg_u32(a, 4, 24)};
  return p;
}

static int sdpa_validate(const mlxn_kargs *a, mlxn_ftype t, char *err, size_t cap) {
  MLXN_NEED_BYTES(a, 4, 28, err, cap);
  sdpa_params p = read_sdpa(a);
  if (!p.heads || !p.kv_heads || p.heads % p.kv_heads)
    return mlxn_kfail(err, cap, "n_kv_heads (%u) must divide n_heads (%u)", p.kv_heads, p.heads);
  if (!p.hd || p.hd > MAX_HEAD_DIM) return mlxn_kfail(err, cap, "head_dim must be 1..%d, got %u", MAX_HEAD_DIM, p.hd);
  if (!p.seq || p.seq > p.kv_len || p.kv_len > p.kv_cap)
    return mlxn_kfail(err, cap, "need 0 < seq_len (%u) <= kv_seq_len (%u) <= kv_capacity (%u)", p.seq, p.kv_len, p.kv_cap);
  if (!isfinite(p.scale)) return mlxn_kfail(err, cap, "scale must be finite");
  if (a->groups[1] < p.heads || (uint64_t)a->groups[2] * SDPA_ROWS < p.seq)
    return mlxn_kfail(err, cap, "grid does not cover %u heads × %u query rows", p.heads, p.seq);
  uint64_t batch = a->groups[0], es = mlxn_ftype_size(t);
  MLXN_NEED_BUF(a, 0, MLXN_SIZE(batch, p.heads, p.seq, p.hd, es), err, cap);
  MLXN_NEED_BUF(a, 1, MLXN_SIZE(batch, p.kv_heads, p.kv_cap, p.hd, es), err, cap);
  MLXN_NEED_BUF(a, 2, MLXN_SIZE(batch, p.kv_heads, p.kv_cap, p.hd, es), err, cap);
  MLXN_NEED_BUF(a, 3, MLXN_SIZE(batch, p.heads, p.seq, p.hd, es), err, cap);
  MLXN_NEED_ALIGN(a, MLXN_SLOTS4(0, 1, 2, 3), (uint32_t)es, err, cap);
  return mlxn_need_tg(a, SDPA_ROWS, "one query row per thread, 32 rows per threadgroup; use ops.sdpa", err, cap);
}

static void sdpa_rows(const mlxn_kargs *a, mlxn_ftype t, uint32_t b, uint32_t h, uint32_t block) {
  sdpa_params p = read_sdpa(a);
  uint32_t kvh = h / (p.heads / p.kv_heads);
  uint64_t qbase = (((uint64_t)b * p.heads + h) * p.seq) * p.hd;
  uint64_t kbase = (((uint64_t)b * p.kv_heads + kvh) * p.kv_cap) * p.hd;
  float q[MAX_HEAD_DIM], acc[MAX_HEAD_DIM];
  for (uint32_t r = block * SDPA_ROWS; r < p.seq && r < (block + 1) * SDPA_ROWS; r++) {
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
  static int sdpa_##SUF##_validate(const mlxn_kargs *a, char *err, size_t cap) {                 \
    return sdpa_validate(a, T, err, cap);                                                          \
  }                                                                                                \
  static int sdpa_##SUF##_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) { \
    (void)s;                                                                                       \
    if (gy < read_sdpa(a).heads) sdpa_rows(a, T, gx, gy, gz);                                      \
    return 0;                                                                                      \
  }

SDPA_KERNEL(f32, MLXN_T_F32)
SDPA_KERNEL(bf16, MLXN_T_BF16)

/* ---- flash_attn_vec ------------------------------------------------------------------------------ */

typedef struct fav_params {
  uint32_t heads, kv_heads, hd, kv_len, kv_cap;
  float scale;
  uint32_t mask, window;
  float softcap;
  uint32_t nwg;
} fav_params;

static fav_params read_fav(const mlxn_kargs *a) {
  fav_params p = {mlxn_arg_u32(a, 4, 0),  mlxn_arg_u32(a, 4, 4),  mlxn_arg_u32(a, 4, 8),
                  mlxn_arg_u32(a, 4, 12), mlxn_arg_u32(a, 4, 16), mlxn_arg_f32(a, 4, 20),
                  mlxn_arg_u32(a, 4, 24), mlxn_arg_u32(a, 4, 28), mlxn_arg_f32(a, 4, 32),
                  mlxn_arg_u32(a, 4, 36)};
  return p;
}

static int fav_validate(const mlxn_kargs *a, mlxn_ftype t, char *err, size_t cap) {
  MLXN_NEED_BYTES(a, 4, 40, err, cap);
  fav_params p = read_fav(a);
  if (!p.heads || !p.kv_heads || p.heads % p.kv_heads)
    return mlxn_kfail(err, cap, "n_kv_heads (%u) must divide n_heads (%u)", p.kv_heads, p.heads);
  if (p.hd != 64 && p.hd != 128 && p.hd != 256 && p.hd != 512)
    return mlxn_kfail(err, cap, "head_dim must be 64, 128, 256 or 512, got %u", p.hd);
  if (!p.kv_len || p.kv_len > p.kv_cap)
    return mlxn_kfail(err, cap, "need 0 < kv_seq_len (%u) <= kv_capacity (%u)", p.kv_len, p.kv_cap);
  if (p.mask > 2) return mlxn_kfail(err, cap, "mask must be 0 (none), 1 (causal) or 2 (sliding), got %u", p.mask);
  if (p.mask == 2 && !p.window) return mlxn_kfail(err, cap, "a sliding window must be > 0");
  if (!isfinite(p.scale) || !(p.softcap >= 0.0f) || isinf(p.softcap))
    return mlxn_kfail(err, cap, "scale must be finite and softcap finite and >= 0");
  if (!p.nwg || p.nwg > 256) return mlxn_kfail(err, cap, "nwg must be 1..256, got %u", p.nwg);
  if (a->groups[0] < p.heads || a->groups[1] < p.nwg) return mlxn_kfail(err, cap, "grid must be (n_heads, nwg)");
  uint64_t es = mlxn_ftype_size(t);
  MLXN_NEED_BUF(a, 0, MLXN_SIZE(p.heads, p.hd, 4), err, cap);
  MLXN_NEED_BUF(a, 1, MLXN_SIZE(p.kv_heads, p.kv_cap, p.hd, es), err, cap);
  MLXN_NEED_BUF(a, 2, MLXN_SIZE(p.kv_heads, p.kv_cap, p.hd, es), err, cap);
  MLXN_NEED_BUF(a, 3, MLXN_SIZE(p.heads, p.nwg, (uint64_t)p.hd + 2, 4), err, cap);
  MLXN_NEED_ALIGN(a, MLXN_SLOTS2(0, 3), 4, err, cap);
  MLXN_NEED_ALIGN(a, MLXN_SLOTS2(1, 2), (uint32_t)es, err, cap);
  return mlxn_need_tg(a, 32,
                      "one 32-lane simdgroup per (head, workgroup), each lane owning head_dim/32 dimensions; "
                      "use ops.flashAttnVec",
                      err, cap);
}

static void fav_partial(const mlxn_kargs *a, mlxn_ftype t, uint32_t h, uint32_t w) {
  fav_params p = read_fav(a);
  uint32_t kvh = h / (p.heads / p.kv_heads);
  const float *q = (const float *)a->ptr[0] + (uint64_t)h * p.hd;
  uint64_t kbase = (uint64_t)kvh * p.kv_cap * p.hd;
  float *out = (float *)a->ptr[3] + ((uint64_t)h * p.nwg + w) * (p.hd + 2);
  uint32_t chunk = (p.kv_len + p.nwg - 1) / p.nwg;
  uint32_t k0 = w * chunk, k1 = k0 + chunk < p.kv_len ? k0 + chunk : p.kv_len;
  uint32_t pos = p.kv_len - 1; /* the query's absolute position */
  if (p.mask == 2 && pos + 1 > p.window && k0 < pos + 1 - p.window) k0 = pos + 1 - p.window;
  float acc[MAX_HEAD_DIM];
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
}

#define FAV_KERNEL(SUF, T)                                                                        \
  static int flash_attn_vec_##SUF##_validate(const mlxn_kargs *a, char *err, size_t cap) {       \
    return fav_validate(a, T, err, cap);                                                           \
  }                                                                                                \
  static int flash_attn_vec_##SUF##_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, \
                                        void *s) {                                                 \
    (void)gz; (void)s;                                                                             \
    fav_params p = read_fav(a);                                                                    \
    if (gx < p.heads && gy < p.nwg) fav_partial(a, T, gx, gy);                                     \
    return 0;                                                                                      \
  }

FAV_KERNEL(f32, MLXN_T_F32)
FAV_KERNEL(f16, MLXN_T_F16)

static int fav_reduce_validate(const mlxn_kargs *a, char *err, size_t cap) {
  MLXN_NEED_BYTES(a, 2, 12, err, cap);
  uint32_t heads = mlxn_arg_u32(a, 2, 0), hd = mlxn_arg_u32(a, 2, 4), nwg = mlxn_arg_u32(a, 2, 8);
  if (!heads || !hd || hd > MAX_HEAD_DIM || !nwg || nwg > 256)
    return mlxn_kfail(err, cap, "need n_heads > 0, head_dim 1..%d and nwg 1..256", MAX_HEAD_DIM);
  if (a->groups[0] < heads) return mlxn_kfail(err, cap, "grid must cover n_heads");
  /* The CUDA kernel keeps 3 x 32 partials per thread in registers: a block of more than 256 threads
   * fails to launch there (out of registers). */
  if ((uint64_t)a->tg[0] * a->tg[1] * a->tg[2] > 256)
    return mlxn_kfail(err, cap, "threadgroup must have at most 256 threads, got (%u, %u, %u); use ops.flashAttnVec",
                      a->tg[0], a->tg[1], a->tg[2]);
  MLXN_NEED_BUF(a, 0, MLXN_SIZE(heads, nwg, (uint64_t)hd + 2, 4), err, cap);
  MLXN_NEED_BUF(a, 1, MLXN_SIZE(heads, hd, 4), err, cap);
  MLXN_NEED_ALIGN(a, MLXN_SLOTS2(0, 1), 4, err, cap);
  return 0;
}

static int fav_reduce_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {
  (void)gy; (void)gz; (void)s;
  uint32_t heads = mlxn_arg_u32(a, 2, 0), hd = mlxn_arg_u32(a, 2, 4), nwg = mlxn_arg_u32(a, 2, 8);
  if (gx >= heads) return 0;
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

const mlxn_cpu_kernel mlxn_cpu_attention_kernels[] = {
    {"sdpa_f32", "bbbbc", sdpa_f32_validate, sdpa_f32_run},
    {"sdpa_bf16", "bbbbc", sdpa_bf16_validate, sdpa_bf16_run},
    {"flash_attn_vec_f32", "bbbbc", flash_attn_vec_f32_validate, flash_attn_vec_f32_run},
    {"flash_attn_vec_f16", "bbbbc", flash_attn_vec_f16_validate, flash_attn_vec_f16_run},
    {"flash_attn_vec_reduce", "bbc", fav_reduce_validate, fav_reduce_run},
    {0, 0, 0, 0},
};
