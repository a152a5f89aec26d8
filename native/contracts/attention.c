/* Validators of the attention kernels (sdpa, flash_attn_vec and its reduction): every dispatch on every backend passes through these before it runs.
 * The slot layouts and the semantics are documented with the bodies, kernels/cpu/attention.c. */
#include <math.h>

#include "contracts.h"

/* ---- sdpa ---------------------------------------------------------------------------------------- */

/* Each dtype's kernel binds its f32 form's slots (the bodies read them through the f32 names). */
MLXN_STATIC_ASSERT(MLXN_SLOT_SDPA_BF16_SDPA == MLXN_SLOT_SDPA_F32_SDPA, "one slot layout");
MLXN_STATIC_ASSERT(MLXN_SLOT_FLASH_ATTN_VEC_F16_FLASH == MLXN_SLOT_FLASH_ATTN_VEC_F32_FLASH &&
                       MLXN_SLOT_FLASH_ATTN_VEC_F16_STATE == MLXN_SLOT_FLASH_ATTN_VEC_F32_STATE,
                   "one slot layout");

typedef mlxn_params_sdpa sdpa_params; /* generated layout (kernels/spec/kernels.ts) */

static sdpa_params read_sdpa(const mlxn_kargs *a) { return mlxn_params_sdpa_of(a, MLXN_SLOT_SDPA_F32_SDPA); }

static inline __attribute__((always_inline)) int sdpa_validate(const mlxn_kargs *a, mlxn_ftype t, char *err, size_t cap) {
  MLXN_NEED_BYTES(a, MLXN_SLOT_SDPA_F32_SDPA, MLXN_PARAMS_SDPA_BYTES, err, cap);
  sdpa_params p = read_sdpa(a);
  if (!p.heads || !p.kv_heads || p.heads % p.kv_heads)
    return mlxn_kfail(err, cap, "n_kv_heads (%u) must divide n_heads (%u)", p.kv_heads, p.heads);
  if (!p.hd || p.hd > MLXN_MAX_HEAD_DIM)
    return mlxn_kfail(err, cap, "head_dim must be 1..%u, got %u", MLXN_MAX_HEAD_DIM, p.hd);
  if (!p.seq || p.seq > p.kv_len || p.kv_len > p.kv_cap)
    return mlxn_kfail(err, cap, "need 0 < seq_len (%u) <= kv_seq_len (%u) <= kv_capacity (%u)", p.seq, p.kv_len, p.kv_cap);
  if (!isfinite(p.scale)) return mlxn_kfail(err, cap, "scale must be finite");
  if (a->groups[1] < p.heads || (uint64_t)a->groups[2] * MLXN_SDPA_ROWS < p.seq)
    return mlxn_kfail(err, cap, "grid does not cover %u heads × %u query rows", p.heads, p.seq);
  uint64_t batch = a->groups[0], es = mlxn_ftype_size(t);
  MLXN_NEED_BUF(a, 0, MLXN_SIZE(batch, p.heads, p.seq, p.hd, es), err, cap);
  MLXN_NEED_BUF(a, 1, MLXN_SIZE(batch, p.kv_heads, p.kv_cap, p.hd, es), err, cap);
  MLXN_NEED_BUF(a, 2, MLXN_SIZE(batch, p.kv_heads, p.kv_cap, p.hd, es), err, cap);
  MLXN_NEED_BUF(a, 3, MLXN_SIZE(batch, p.heads, p.seq, p.hd, es), err, cap);
  MLXN_NEED_ALIGN(a, MLXN_SLOTS4(0, 1, 2, 3), (uint32_t)es, err, cap);
  return mlxn_need_tg(a, MLXN_SDPA_ROWS, "one query row per thread, 32 rows per threadgroup; use ops.sdpa", err, cap);
}

#define SDPA_KERNEL(SUF, T)                                                                       \
  static int sdpa_##SUF##_validate(const mlxn_kargs *a, char *err, size_t cap) {                 \
    return sdpa_validate(a, T, err, cap);                                                          \
  }                                                                                                \

SDPA_KERNEL(f32, MLXN_T_F32)
SDPA_KERNEL(bf16, MLXN_T_BF16)

/* ---- flash_attn_vec ------------------------------------------------------------------------------ */

typedef mlxn_params_flash fav_params; /* generated layout (kernels/spec/kernels.ts) */

static fav_params read_fav(const mlxn_kargs *a) { return mlxn_params_flash_of(a, MLXN_SLOT_FLASH_ATTN_VEC_F32_FLASH); }

static inline __attribute__((always_inline)) int fav_validate(const mlxn_kargs *a, mlxn_ftype t, char *err, size_t cap) {
  MLXN_NEED_BYTES(a, MLXN_SLOT_FLASH_ATTN_VEC_F32_FLASH, MLXN_PARAMS_FLASH_BYTES, err, cap);
  fav_params p = read_fav(a);
  if (!p.heads || !p.kv_heads || p.heads % p.kv_heads)
    return mlxn_kfail(err, cap, "n_kv_heads (%u) must divide n_heads (%u)", p.kv_heads, p.heads);
  /* Each of a simdgroup's 32 lanes owns head_dim/32 dimensions: 2, 4, 8 or 16. */
  if (p.hd < 64 || p.hd > MLXN_MAX_HEAD_DIM || (p.hd & (p.hd - 1)))
    return mlxn_kfail(err, cap, "head_dim must be a power of two in 64..%u, got %u", MLXN_MAX_HEAD_DIM, p.hd);
  if (!p.kv_len || p.kv_len > p.kv_cap)
    return mlxn_kfail(err, cap, "need 0 < kv_seq_len (%u) <= kv_capacity (%u)", p.kv_len, p.kv_cap);
  /* With a state (slot 5), the keys are state[0] + 1, device data: kv_seq_len is their static bound
   * (checked above against the capacity) and the body fails the dispatch when state[0] ≥ kv_seq_len. */
  if (p.has_state > 1) return mlxn_kfail(err, cap, "has_state must be 0 or 1, got %u", p.has_state);
  if (p.has_state != (a->ptr[MLXN_SLOT_FLASH_ATTN_VEC_F32_STATE] != NULL))
    return mlxn_kfail(err, cap, p.has_state ? "has_state is 1 but the state slot is not bound"
                                            : "state slot bound but has_state is 0");
  if (p.mask > 2) return mlxn_kfail(err, cap, "mask must be 0 (none), 1 (causal) or 2 (sliding), got %u", p.mask);
  if (p.mask == 2 && !p.window) return mlxn_kfail(err, cap, "a sliding window must be > 0");
  if (!isfinite(p.scale) || !(p.softcap >= 0.0f) || isinf(p.softcap))
    return mlxn_kfail(err, cap, "scale must be finite and softcap finite and >= 0");
  if (!p.nwg || p.nwg > MLXN_FLASH_MAX_NWG)
    return mlxn_kfail(err, cap, "nwg must be 1..%u, got %u", MLXN_FLASH_MAX_NWG, p.nwg);
  if (a->groups[0] < p.heads || a->groups[1] < p.nwg) return mlxn_kfail(err, cap, "grid must be (n_heads, nwg)");
  uint64_t es = mlxn_ftype_size(t);
  MLXN_NEED_BUF(a, 0, MLXN_SIZE(p.heads, p.hd, 4), err, cap);
  MLXN_NEED_BUF(a, 1, MLXN_SIZE(p.kv_heads, p.kv_cap, p.hd, es), err, cap);
  MLXN_NEED_BUF(a, 2, MLXN_SIZE(p.kv_heads, p.kv_cap, p.hd, es), err, cap);
  MLXN_NEED_BUF(a, 3, MLXN_SIZE(p.heads, p.nwg, (uint64_t)p.hd + 2, 4), err, cap);
  if (p.has_state) MLXN_NEED_BUF(a, MLXN_SLOT_FLASH_ATTN_VEC_F32_STATE, 4, err, cap);
  MLXN_NEED_ALIGN(a, MLXN_SLOTS3(0, 3, MLXN_SLOT_FLASH_ATTN_VEC_F32_STATE), 4, err, cap);
  MLXN_NEED_ALIGN(a, MLXN_SLOTS2(1, 2), (uint32_t)es, err, cap);
  MLXN_NO_OVERLAP(a, 3, a->len[3], MLXN_SLOT_FLASH_ATTN_VEC_F32_STATE, a->len[MLXN_SLOT_FLASH_ATTN_VEC_F32_STATE], err, cap);
  return mlxn_need_tg(a, 32,
                      "one 32-lane simdgroup per (head, workgroup), each lane owning head_dim/32 dimensions; "
                      "use ops.flashAttnVec",
                      err, cap);
}

#define FAV_KERNEL(SUF, T)                                                                        \
  static int flash_attn_vec_##SUF##_validate(const mlxn_kargs *a, char *err, size_t cap) {       \
    return fav_validate(a, T, err, cap);                                                           \
  }                                                                                                \

FAV_KERNEL(f32, MLXN_T_F32)
FAV_KERNEL(f16, MLXN_T_F16)

static int fav_reduce_validate(const mlxn_kargs *a, char *err, size_t cap) {
  MLXN_NEED_BYTES(a, MLXN_SLOT_FLASH_ATTN_VEC_REDUCE_FLASH_REDUCE, MLXN_PARAMS_FLASH_REDUCE_BYTES, err, cap);
  mlxn_params_flash_reduce p = mlxn_params_flash_reduce_of(a, MLXN_SLOT_FLASH_ATTN_VEC_REDUCE_FLASH_REDUCE);
  uint32_t heads = p.n_heads, hd = p.head_dim, nwg = p.nwg;
  if (!heads || !hd || hd > MLXN_MAX_HEAD_DIM || !nwg || nwg > MLXN_FLASH_MAX_NWG)
    return mlxn_kfail(err, cap, "need n_heads > 0, head_dim 1..%u and nwg 1..%u", MLXN_MAX_HEAD_DIM,
                      MLXN_FLASH_MAX_NWG);
  if (a->groups[0] < heads) return mlxn_kfail(err, cap, "grid must cover n_heads");
  /* The CUDA kernel keeps 3 x 32 partials per thread in registers: a larger block fails to launch
   * there (out of registers). */
  if ((uint64_t)a->tg[0] * a->tg[1] * a->tg[2] > MLXN_FLASH_REDUCE_MAX_THREADS)
    return mlxn_kfail(err, cap, "threadgroup must have at most %u threads, got (%u, %u, %u); use ops.flashAttnVec",
                      MLXN_FLASH_REDUCE_MAX_THREADS, a->tg[0], a->tg[1], a->tg[2]);
  MLXN_NEED_BUF(a, 0, MLXN_SIZE(heads, nwg, (uint64_t)hd + 2, 4), err, cap);
  MLXN_NEED_BUF(a, 1, MLXN_SIZE(heads, hd, 4), err, cap);
  MLXN_NEED_ALIGN(a, MLXN_SLOTS2(0, 1), 4, err, cap);
  return 0;
}

MLXN_VALIDATOR(sdpa_f32, sdpa_f32_validate)
MLXN_VALIDATOR(sdpa_bf16, sdpa_bf16_validate)
MLXN_VALIDATOR(flash_attn_vec_f32, flash_attn_vec_f32_validate)
MLXN_VALIDATOR(flash_attn_vec_f16, flash_attn_vec_f16_validate)
MLXN_VALIDATOR(flash_attn_vec_reduce, fav_reduce_validate)
