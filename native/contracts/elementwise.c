/* Validators of the element-wise kernels (add, mul, gelu, silu, silu_mul, softcap, axpby, strided_copy, debug_fault): every dispatch on every backend passes through these before it runs.
 * The slot layouts and the semantics are documented with the bodies, kernels/cpu/elementwise.c. */
#include <math.h>

#include "contracts.h"

/* ---- add / mul: 0 a, 1 b, 2 out, 3 {n: u32} ---------------------------------------------- */

/* The binary kernels (add, mul, silu_mul) share one slot layout, the {n} block at slot 3. */
#define BINARY_PARAMS MLXN_SLOT_ELEMENTWISE_ADD_F32_N
MLXN_STATIC_ASSERT(MLXN_SLOT_ELEMENTWISE_ADD_F16_N == BINARY_PARAMS && MLXN_SLOT_ELEMENTWISE_ADD_BF16_N == BINARY_PARAMS,
                   "one slot layout");
MLXN_STATIC_ASSERT(MLXN_SLOT_ELEMENTWISE_MUL_F32_N == BINARY_PARAMS && MLXN_SLOT_ELEMENTWISE_MUL_F16_N == BINARY_PARAMS &&
                       MLXN_SLOT_ELEMENTWISE_MUL_BF16_N == BINARY_PARAMS,
                   "one slot layout");
MLXN_STATIC_ASSERT(MLXN_SLOT_SILU_MUL_F32_N == BINARY_PARAMS && MLXN_SLOT_SILU_MUL_F16_N == BINARY_PARAMS &&
                       MLXN_SLOT_SILU_MUL_BF16_N == BINARY_PARAMS,
                   "one slot layout");

static inline __attribute__((always_inline)) int binary_validate(const mlxn_kargs *a, mlxn_ftype t, char *err, size_t cap) {
  MLXN_NEED_BYTES(a, BINARY_PARAMS, MLXN_PARAMS_N_BYTES, err, cap);
  uint32_t n = mlxn_params_n_of(a, BINARY_PARAMS).n;
  if (mlxn_need_dims(a, 1, err, cap) || mlxn_need_grid(a, 0, n, "element (n)", err, cap)) return 1;
  uint64_t bytes = MLXN_SIZE(n, mlxn_ftype_size(t));
  MLXN_NEED_BUF(a, 0, bytes, err, cap);
  MLXN_NEED_BUF(a, 1, bytes, err, cap);
  MLXN_NEED_BUF(a, 2, bytes, err, cap);
  MLXN_NEED_ALIGN(a, MLXN_SLOTS3(0, 1, 2), mlxn_ftype_size(t), err, cap);
  MLXN_IN_PLACE_OR_DISJOINT(a, 2, 0, bytes, err, cap);
  MLXN_IN_PLACE_OR_DISJOINT(a, 2, 1, bytes, err, cap);
  return 0;
}

#define BINARY_KERNEL(NAME, T, OP)                                                                 \
  static int NAME##_validate(const mlxn_kargs *a, char *err, size_t cap) {                       \
    return binary_validate(a, T, err, cap);                                                        \
  }                                                                                                \

BINARY_KERNEL(add_f32, MLXN_T_F32, +)
BINARY_KERNEL(add_f16, MLXN_T_F16, +)
BINARY_KERNEL(add_bf16, MLXN_T_BF16, +)
BINARY_KERNEL(mul_f32, MLXN_T_F32, *)
BINARY_KERNEL(mul_f16, MLXN_T_F16, *)
BINARY_KERNEL(mul_bf16, MLXN_T_BF16, *)

/* ---- silu_mul (SwiGLU): 0 gate, 1 up, 2 out, 3 {n: u32}; out = silu(gate) · up ------------------ */
/* The silu result is rounded to the storage type first, so the fused kernel equals silu → mul. */

#define SILU_MUL_KERNEL(NAME, T)                                                                   \
  static int NAME##_validate(const mlxn_kargs *a, char *err, size_t cap) {                       \
    return binary_validate(a, T, err, cap);                                                        \
  }                                                                                                \

SILU_MUL_KERNEL(silu_mul_f32, MLXN_T_F32)
SILU_MUL_KERNEL(silu_mul_f16, MLXN_T_F16)
SILU_MUL_KERNEL(silu_mul_bf16, MLXN_T_BF16)

/* One thread per element over grid[0] elements: 0 in, 1 out. */
#define UNARY_KERNEL(NAME, T, FN)                                                                  \
  static int NAME##_validate(const mlxn_kargs *a, char *err, size_t cap) {                       \
    if (mlxn_need_dims(a, 1, err, cap)) return 1;                                                       \
    uint64_t bytes = MLXN_SIZE(a->grid[0], mlxn_ftype_size(T));                                      \
    MLXN_NEED_BUF(a, 0, bytes, err, cap);                                                          \
    MLXN_NEED_BUF(a, 1, bytes, err, cap);                                                          \
    MLXN_NEED_ALIGN(a, MLXN_SLOTS2(0, 1), mlxn_ftype_size(T), err, cap);                           \
    return 0;                                                                                      \
  }                                                                                                \

UNARY_KERNEL(gelu_f32, MLXN_T_F32, gelu_tanh)
UNARY_KERNEL(gelu_f16, MLXN_T_F16, gelu_tanh)
UNARY_KERNEL(gelu_bf16, MLXN_T_BF16, gelu_tanh)

/* ---- silu: 0 in, 1 out; out = x · sigmoid(x); n = grid[0] ------------------------------------- */

UNARY_KERNEL(silu_f32, MLXN_T_F32, mlxn_silu)
UNARY_KERNEL(silu_f16, MLXN_T_F16, mlxn_silu)
UNARY_KERNEL(silu_bf16, MLXN_T_BF16, mlxn_silu)

/* ---- strided_copy_f32: 0 src, 1 dst, 2 {rows, cols, src_stride, dst_stride, has_state,
 *      dst_pos_stride, max_pos} (elements), 3 state u32[1] (optional, bound exactly when has_state
 *      is 1): dst[o + r·dst_stride + c] = src[r·src_stride + c], o = state[0]·dst_pos_stride with a
 *      state, else 0; threads (cols, rows). Appends K/V rows into a cache laid out [kv_heads,
 *      capacity, head_dim]. The state is device data: this bounds the worst case (state[0] =
 *      max_pos − 1) and the body fails the dispatch, writing nothing, when state[0] ≥ max_pos. */

static int strided_copy_f32_validate(const mlxn_kargs *a, char *err, size_t cap) {
  MLXN_NEED_BYTES(a, MLXN_SLOT_STRIDED_COPY_F32_STRIDED_COPY, MLXN_PARAMS_STRIDED_COPY_BYTES, err, cap);
  mlxn_params_strided_copy p = mlxn_params_strided_copy_of(a, MLXN_SLOT_STRIDED_COPY_F32_STRIDED_COPY);
  uint32_t rows = p.rows, cols = p.cols, ss = p.src_stride, ds = p.dst_stride, has_state = p.has_state;
  if (!rows || !cols || ss < cols || ds < cols)
    return mlxn_kfail(err, cap, "need rows, cols > 0 and strides >= cols");
  if (has_state > 1) return mlxn_kfail(err, cap, "has_state must be 0 or 1, got %u", has_state);
  if (has_state != (a->ptr[MLXN_SLOT_STRIDED_COPY_F32_STATE] != NULL))
    return mlxn_kfail(err, cap, has_state ? "has_state is 1 but the state slot is not bound"
                                          : "state slot bound but has_state is 0");
  if (has_state && p.max_pos == 0) return mlxn_kfail(err, cap, "max_pos must be > 0 with a state");
  if (mlxn_need_grid(a, 0, cols, "column", err, cap) || mlxn_need_grid(a, 1, rows, "row", err, cap)) return 1;
  uint64_t dst_end = mlxn_size_add(MLXN_SIZE(rows - 1, ds), cols);
  if (has_state) dst_end = mlxn_size_add(dst_end, MLXN_SIZE((uint64_t)p.max_pos - 1, p.dst_pos_stride));
  MLXN_NEED_BUF(a, 0, MLXN_SIZE(mlxn_size_add(MLXN_SIZE(rows - 1, ss), cols), 4), err, cap);
  MLXN_NEED_BUF(a, 1, MLXN_SIZE(dst_end, 4), err, cap);
  if (has_state) MLXN_NEED_BUF(a, MLXN_SLOT_STRIDED_COPY_F32_STATE, 4, err, cap);
  MLXN_NEED_ALIGN(a, MLXN_SLOTS3(0, 1, MLXN_SLOT_STRIDED_COPY_F32_STATE), 4, err, cap);
  MLXN_NO_OVERLAP(a, 1, a->len[1], 0, a->len[0], err, cap);
  MLXN_NO_OVERLAP(a, 1, a->len[1], MLXN_SLOT_STRIDED_COPY_F32_STATE, a->len[MLXN_SLOT_STRIDED_COPY_F32_STATE], err, cap);
  return 0;
}

/* ---- debug_fault: 0 marker u32[1], 1 {fail: u32}. Fault injection for tests: with fail = 0 it
 *      writes 1 to the marker; otherwise the dispatch reports failure, which fails its command
 *      buffer at wait (the error is sticky; later groups of that command buffer do not run). */

static int debug_fault_validate(const mlxn_kargs *a, char *err, size_t cap) {
  MLXN_NEED_BUF(a, 0, 4, err, cap);
  MLXN_NEED_BYTES(a, MLXN_SLOT_DEBUG_FAULT_DEBUG_FAULT, MLXN_PARAMS_DEBUG_FAULT_BYTES, err, cap);
  MLXN_NEED_ALIGN(a, 1u, 4, err, cap);
  return 0;
}

/* ---- softcap: 0 in, 1 out, 2 {cap: f32, n: u32}; out = tanh(x / cap) * cap ---------------- */

static int softcap_f32_validate(const mlxn_kargs *a, char *err, size_t cap) {
  MLXN_NEED_BYTES(a, MLXN_SLOT_SOFTCAP_F32_SOFTCAP, MLXN_PARAMS_SOFTCAP_BYTES, err, cap);
  mlxn_params_softcap p = mlxn_params_softcap_of(a, MLXN_SLOT_SOFTCAP_F32_SOFTCAP);
  float c = p.cap;
  if (!(c > 0.0f) || isinf(c)) return mlxn_kfail(err, cap, "softcap: cap must be finite and > 0");
  uint32_t n = p.n;
  if (mlxn_need_dims(a, 1, err, cap) || mlxn_need_grid(a, 0, n, "element (n)", err, cap)) return 1;
  uint64_t bytes = MLXN_SIZE(n, 4);
  MLXN_NEED_BUF(a, 0, bytes, err, cap);
  MLXN_NEED_BUF(a, 1, bytes, err, cap);
  MLXN_NEED_ALIGN(a, MLXN_SLOTS2(0, 1), 4, err, cap);
  return 0;
}

/* ---- axpby: 0 a, 1 b, 2 out, 3 {alpha: f32, beta: f32, n: u32, pad: u32}; out = αa + βb ------ */

static int axpby_f32_validate(const mlxn_kargs *a, char *err, size_t cap) {
  MLXN_NEED_BYTES(a, MLXN_SLOT_AXPBY_F32_AXPBY, MLXN_PARAMS_AXPBY_BYTES, err, cap);
  uint32_t n = mlxn_params_axpby_of(a, MLXN_SLOT_AXPBY_F32_AXPBY).n;
  if (mlxn_need_dims(a, 1, err, cap) || mlxn_need_grid(a, 0, n, "element (n)", err, cap)) return 1;
  uint64_t bytes = MLXN_SIZE(n, 4);
  MLXN_NEED_BUF(a, 0, bytes, err, cap);
  MLXN_NEED_BUF(a, 1, bytes, err, cap);
  MLXN_NEED_BUF(a, 2, bytes, err, cap);
  MLXN_NEED_ALIGN(a, MLXN_SLOTS3(0, 1, 2), 4, err, cap);
  return 0;
}

MLXN_VALIDATOR(elementwise_add_f32, add_f32_validate)
MLXN_VALIDATOR(elementwise_add_f16, add_f16_validate)
MLXN_VALIDATOR(elementwise_add_bf16, add_bf16_validate)
MLXN_VALIDATOR(elementwise_mul_f32, mul_f32_validate)
MLXN_VALIDATOR(elementwise_mul_f16, mul_f16_validate)
MLXN_VALIDATOR(elementwise_mul_bf16, mul_bf16_validate)
MLXN_VALIDATOR(gelu_f32, gelu_f32_validate)
MLXN_VALIDATOR(gelu_f16, gelu_f16_validate)
MLXN_VALIDATOR(gelu_bf16, gelu_bf16_validate)
MLXN_VALIDATOR(softcap_f32, softcap_f32_validate)
MLXN_VALIDATOR(axpby_f32, axpby_f32_validate)
MLXN_VALIDATOR(silu_f32, silu_f32_validate)
MLXN_VALIDATOR(silu_f16, silu_f16_validate)
MLXN_VALIDATOR(silu_bf16, silu_bf16_validate)
MLXN_VALIDATOR(silu_mul_f32, silu_mul_f32_validate)
MLXN_VALIDATOR(silu_mul_f16, silu_mul_f16_validate)
MLXN_VALIDATOR(silu_mul_bf16, silu_mul_bf16_validate)
MLXN_VALIDATOR(strided_copy_f32, strided_copy_f32_validate)
MLXN_VALIDATOR(debug_fault, debug_fault_validate)
