/* Row kernels: rms_norm (f32/f16/bf16), the fused rms_norm_mul and rms_norm_mul_add,
 * rms_norm_no_scale_f32, softmax_f32.
 * One threadgroup per row (groups[0] = rows). Sums run in f32 in index order, so the fused kernel
 * and the unfused pair norm → mul produce the same bits. */
#include <math.h>

#include "cpu_kernel.h"

/* 1 / sqrt(mean(x²) + eps) over one row, accumulated in f32. */
static float row_inv_rms(const uint8_t *x, uint64_t base, uint32_t dim, mlxn_ftype t, float eps) {
  float sum = 0.0f;
  for (uint32_t i = 0; i < dim; i++) {
    float v = mlxn_load(x, base + i, t);
    sum += v * v;
  }
  return 1.0f / sqrtf(sum / (float)dim + eps);
}

static inline uint64_t row_of(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz) {
  return ((uint64_t)gz * a->groups[1] + gy) * a->groups[0] + gx;
}

/* Every dtype's kernel reads its f32 form's slots (asserted in native/contracts/norm.c). */

/* ---- rms_norm: 0 in, 1 weight, 2 out, 3 {eps: f32, dim: u32} ----------------------------- */
/* ---- rms_norm_mul: 0 in, 1 weight, 2 scale, 3 out, 4 {eps, dim}: out = norm(in)·w·scale ---- */

#define NORM_KERNELS(SUF, T)                                                                       \
  static int rms_norm_##SUF##_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz,      \
                                  void *s) {                                                       \
    (void)s;                                                                                       \
    const mlxn_params_norm p = mlxn_params_norm_of(a, MLXN_SLOT_RMS_NORM_F32_NORM);                \
    uint64_t base = row_of(a, gx, gy, gz) * p.dim;                                                 \
    float inv = row_inv_rms(a->ptr[0], base, p.dim, T, p.eps);                                     \
    for (uint32_t i = 0; i < p.dim; i++)                                                           \
      mlxn_store(a->ptr[2], base + i, T,                                                           \
                 (mlxn_load(a->ptr[0], base + i, T) * inv) * mlxn_load(a->ptr[1], i, T));          \
    return 0;                                                                                      \
  }                                                                                                \
  static int rms_norm_mul_##SUF##_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz,  \
                                      void *s) {                                                   \
    (void)s;                                                                                       \
    const mlxn_params_norm p = mlxn_params_norm_of(a, MLXN_SLOT_RMS_NORM_MUL_F32_NORM);            \
    uint64_t base = row_of(a, gx, gy, gz) * p.dim;                                                 \
    float inv = row_inv_rms(a->ptr[0], base, p.dim, T, p.eps);                                     \
    for (uint32_t i = 0; i < p.dim; i++) {                                                         \
      /* Round the normalised value through the storage type, exactly as the unfused pair does. */ \
      float n = mlxn_round_to((mlxn_load(a->ptr[0], base + i, T) * inv) * mlxn_load(a->ptr[1], i, T), T); \
      mlxn_store(a->ptr[3], base + i, T, n * mlxn_load(a->ptr[2], base + i, T));                   \
    }                                                                                              \
    return 0;                                                                                      \
  }

/* ---- rms_norm_mul_add: 0 in, 1 weight, 2 scale, 3 residual, 4 out, 5 {eps, dim}:
 *      out = (norm(in)·w·scale) + residual, rounding each intermediate through the dtype exactly as
 *      rms_norm → mul → add do, so the fused result is bit-identical. */

#define NORM_MUL_ADD_KERNEL(SUF, T)                                                                \
  static int rms_norm_mul_add_##SUF##_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy,           \
                                          uint32_t gz, void *s) {                                  \
    (void)s;                                                                                       \
    const mlxn_params_norm p = mlxn_params_norm_of(a, MLXN_SLOT_RMS_NORM_MUL_ADD_F32_NORM);        \
    uint64_t base = row_of(a, gx, gy, gz) * p.dim;                                                 \
    float inv = row_inv_rms(a->ptr[0], base, p.dim, T, p.eps);                                     \
    for (uint32_t i = 0; i < p.dim; i++) {                                                         \
      float n = mlxn_round_to((mlxn_load(a->ptr[0], base + i, T) * inv) * mlxn_load(a->ptr[1], i, T), T); \
      float m = mlxn_round_to(n * mlxn_load(a->ptr[2], base + i, T), T);                           \
      mlxn_store(a->ptr[4], base + i, T, m + mlxn_load(a->ptr[3], base + i, T));                   \
    }                                                                                              \
    return 0;                                                                                      \
  }

NORM_MUL_ADD_KERNEL(f32, MLXN_T_F32)
NORM_MUL_ADD_KERNEL(f16, MLXN_T_F16)
NORM_MUL_ADD_KERNEL(bf16, MLXN_T_BF16)

NORM_KERNELS(f32, MLXN_T_F32)
NORM_KERNELS(f16, MLXN_T_F16)
NORM_KERNELS(bf16, MLXN_T_BF16)

static int rms_norm_no_scale_f32_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz,
                                     void *s) {
  (void)s;
  const mlxn_params_norm p = mlxn_params_norm_of(a, MLXN_SLOT_RMS_NORM_NO_SCALE_F32_NORM);
  uint64_t base = row_of(a, gx, gy, gz) * p.dim;
  float inv = row_inv_rms(a->ptr[0], base, p.dim, MLXN_T_F32, p.eps);
  for (uint32_t i = 0; i < p.dim; i++)
    mlxn_store(a->ptr[1], base + i, MLXN_T_F32, mlxn_load(a->ptr[0], base + i, MLXN_T_F32) * inv);
  return 0;
}

static int softmax_f32_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {
  (void)s;
  uint32_t cols = mlxn_params_softmax_of(a, MLXN_SLOT_SOFTMAX_F32_SOFTMAX).cols;
  uint64_t base = row_of(a, gx, gy, gz) * cols;
  float m = -INFINITY;
  for (uint32_t i = 0; i < cols; i++) m = fmaxf(m, mlxn_load(a->ptr[0], base + i, MLXN_T_F32));
  float sum = 0.0f;
  for (uint32_t i = 0; i < cols; i++) {
    float e = expf(mlxn_load(a->ptr[0], base + i, MLXN_T_F32) - m);
    mlxn_store(a->ptr[1], base + i, MLXN_T_F32, e);
    sum += e;
  }
  float inv = 1.0f / sum;
  for (uint32_t i = 0; i < cols; i++)
    mlxn_store(a->ptr[1], base + i, MLXN_T_F32, mlxn_load(a->ptr[1], base + i, MLXN_T_F32) * inv);
  return 0;
}

MLXN_CPU_BODY(rms_norm_f32, rms_norm_f32_run)
MLXN_CPU_BODY(rms_norm_f16, rms_norm_f16_run)
MLXN_CPU_BODY(rms_norm_bf16, rms_norm_bf16_run)
MLXN_CPU_BODY(rms_norm_mul_f32, rms_norm_mul_f32_run)
MLXN_CPU_BODY(rms_norm_mul_f16, rms_norm_mul_f16_run)
MLXN_CPU_BODY(rms_norm_mul_bf16, rms_norm_mul_bf16_run)
MLXN_CPU_BODY(rms_norm_mul_add_f32, rms_norm_mul_add_f32_run)
MLXN_CPU_BODY(rms_norm_mul_add_f16, rms_norm_mul_add_f16_run)
MLXN_CPU_BODY(rms_norm_mul_add_bf16, rms_norm_mul_add_bf16_run)
MLXN_CPU_BODY(rms_norm_no_scale_f32, rms_norm_no_scale_f32_run)
MLXN_CPU_BODY(softmax_f32, softmax_f32_run)
