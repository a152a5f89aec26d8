/* Validators of the row kernels (rms_norm and its fused forms, rms_norm_no_scale, softmax): every dispatch on every backend passes through these before it runs.
 * The slot layouts and the semantics are documented with the bodies, kernels/cpu/norm.c. */
#include <math.h>

#include "contracts.h"

/* Every dtype's kernel binds its f32 form's slots (the validators and bodies read them through the
 * f32 names). */
MLXN_STATIC_ASSERT(MLXN_SLOT_RMS_NORM_F16_NORM == MLXN_SLOT_RMS_NORM_F32_NORM &&
                       MLXN_SLOT_RMS_NORM_BF16_NORM == MLXN_SLOT_RMS_NORM_F32_NORM &&
                       MLXN_SLOT_RMS_NORM_MUL_F16_NORM == MLXN_SLOT_RMS_NORM_MUL_F32_NORM &&
                       MLXN_SLOT_RMS_NORM_MUL_BF16_NORM == MLXN_SLOT_RMS_NORM_MUL_F32_NORM &&
                       MLXN_SLOT_RMS_NORM_MUL_ADD_F16_NORM == MLXN_SLOT_RMS_NORM_MUL_ADD_F32_NORM &&
                       MLXN_SLOT_RMS_NORM_MUL_ADD_BF16_NORM == MLXN_SLOT_RMS_NORM_MUL_ADD_F32_NORM,
                   "one slot layout");

/* Checks eps/dim in inline slot `pslot` and that each listed buffer slot holds rows × dim. Inlined
 * into each kernel's validator, where the slot lists are constants. */
static inline __attribute__((always_inline)) int norm_validate(const mlxn_kargs *a, int pslot, const int *row_slots,
                                                                int nrow, int weight_slot, mlxn_ftype t, char *err,
                                                                size_t cap) {
  MLXN_NEED_BYTES(a, pslot, MLXN_PARAMS_NORM_BYTES, err, cap);
  mlxn_params_norm p = mlxn_params_norm_of(a, pslot);
  float eps = p.eps;
  uint32_t dim = p.dim;
  if (dim == 0) return mlxn_kfail(err, cap, "rms_norm: dim must be > 0");
  if (!(eps >= 0.0f) || isinf(eps)) return mlxn_kfail(err, cap, "rms_norm: eps must be finite and >= 0");
  uint64_t rows = MLXN_SIZE(a->groups[0], a->groups[1], a->groups[2]);
  uint64_t es = mlxn_ftype_size(t);
  uint64_t row_bytes = MLXN_SIZE(rows, dim, es);
  for (int i = 0; i < nrow; i++) MLXN_NEED_BUF(a, row_slots[i], row_bytes, err, cap);
  if (weight_slot >= 0) MLXN_NEED_BUF(a, weight_slot, MLXN_SIZE(dim, es), err, cap);
  uint32_t mask = weight_slot >= 0 ? 1u << weight_slot : 0;
  for (int i = 0; i < nrow; i++) mask |= 1u << row_slots[i];
  MLXN_NEED_ALIGN(a, mask, (uint32_t)es, err, cap);
  return mlxn_need_row_tg(a, "ops.rmsNorm and its fused forms (rowGeometry)", err, cap);
}

/* ---- rms_norm: 0 in, 1 weight, 2 out, 3 {eps: f32, dim: u32} ----------------------------- */
/* ---- rms_norm_mul: 0 in, 1 weight, 2 scale, 3 out, 4 {eps, dim}: out = norm(in)·w·scale ---- */

#define NORM_KERNELS(SUF, T)                                                                       \
  static int rms_norm_##SUF##_validate(const mlxn_kargs *a, char *err, size_t cap) {               \
    static const int rows[] = {0, 2};                                                              \
    return norm_validate(a, MLXN_SLOT_RMS_NORM_F32_NORM, rows, 2, 1, T, err, cap);                 \
  }                                                                                                \
  static int rms_norm_mul_##SUF##_validate(const mlxn_kargs *a, char *err, size_t cap) {           \
    static const int rows[] = {0, 2, 3};                                                           \
    return norm_validate(a, MLXN_SLOT_RMS_NORM_MUL_F32_NORM, rows, 3, 1, T, err, cap);             \
  }                                                                                                \

/* ---- rms_norm_mul_add: 0 in, 1 weight, 2 scale, 3 residual, 4 out, 5 {eps, dim}:
 *      out = (norm(in)·w·scale) + residual, rounding each intermediate through the dtype exactly as
 *      rms_norm → mul → add do, so the fused result is bit-identical. */

#define NORM_MUL_ADD_KERNEL(SUF, T)                                                                \
  static int rms_norm_mul_add_##SUF##_validate(const mlxn_kargs *a, char *err, size_t cap) {       \
    static const int rows[] = {0, 2, 3, 4};                                                        \
    return norm_validate(a, MLXN_SLOT_RMS_NORM_MUL_ADD_F32_NORM, rows, 4, 1, T, err, cap);         \
  }                                                                                                \

NORM_MUL_ADD_KERNEL(f32, MLXN_T_F32)
NORM_MUL_ADD_KERNEL(f16, MLXN_T_F16)
NORM_MUL_ADD_KERNEL(bf16, MLXN_T_BF16)

NORM_KERNELS(f32, MLXN_T_F32)
NORM_KERNELS(f16, MLXN_T_F16)
NORM_KERNELS(bf16, MLXN_T_BF16)

/* ---- rms_norm_no_scale_f32: 0 in, 1 out, 2 {eps, dim} ------------------------------------- */

static int rms_norm_no_scale_f32_validate(const mlxn_kargs *a, char *err, size_t cap) {
  static const int rows[] = {0, 1};
  return norm_validate(a, MLXN_SLOT_RMS_NORM_NO_SCALE_F32_NORM, rows, 2, -1, MLXN_T_F32, err, cap);
}

/* ---- softmax_f32: 0 in, 1 out, 2 {cols: u32}; max-subtracted, f32 accumulation ------------ */

static int softmax_f32_validate(const mlxn_kargs *a, char *err, size_t cap) {
  MLXN_NEED_BYTES(a, MLXN_SLOT_SOFTMAX_F32_SOFTMAX, MLXN_PARAMS_SOFTMAX_BYTES, err, cap);
  uint32_t cols = mlxn_params_softmax_of(a, MLXN_SLOT_SOFTMAX_F32_SOFTMAX).cols;
  if (cols == 0) return mlxn_kfail(err, cap, "softmax: cols must be > 0");
  uint64_t bytes = MLXN_SIZE(a->groups[0], a->groups[1], a->groups[2], cols, 4);
  MLXN_NEED_BUF(a, 0, bytes, err, cap);
  MLXN_NEED_BUF(a, 1, bytes, err, cap);
  MLXN_NEED_ALIGN(a, MLXN_SLOTS2(0, 1), 4, err, cap);
  MLXN_IN_PLACE_OR_DISJOINT(a, 1, 0, bytes, err, cap);
  return mlxn_need_row_tg(a, "ops.softmax (rowGeometry)", err, cap);
}

MLXN_VALIDATOR(rms_norm_f32, rms_norm_f32_validate)
MLXN_VALIDATOR(rms_norm_f16, rms_norm_f16_validate)
MLXN_VALIDATOR(rms_norm_bf16, rms_norm_bf16_validate)
MLXN_VALIDATOR(rms_norm_mul_f32, rms_norm_mul_f32_validate)
MLXN_VALIDATOR(rms_norm_mul_f16, rms_norm_mul_f16_validate)
MLXN_VALIDATOR(rms_norm_mul_bf16, rms_norm_mul_bf16_validate)
MLXN_VALIDATOR(rms_norm_mul_add_f32, rms_norm_mul_add_f32_validate)
MLXN_VALIDATOR(rms_norm_mul_add_f16, rms_norm_mul_add_f16_validate)
MLXN_VALIDATOR(rms_norm_mul_add_bf16, rms_norm_mul_add_bf16_validate)
MLXN_VALIDATOR(rms_norm_no_scale_f32, rms_norm_no_scale_f32_validate)
MLXN_VALIDATOR(softmax_f32, softmax_f32_validate)
