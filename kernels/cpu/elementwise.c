/* Elementwise kernels: add, mul (f32/f16/bf16), gelu (tanh form), softcap, axpby, silu,
 * strided_copy. One thread per element;
 * a threadgroup covers tg[0] consecutive elements. Arithmetic is f32; 16-bit types round on store. */
#include <math.h>

#include "cpu_kernel.h"

/* Elements [first, last) handled by threadgroup gx of a 1-D dispatch limited to n elements. */
static inline void tg_span(const mlxn_kargs *a, uint32_t gx, uint64_t n, uint64_t *first,
                           uint64_t *last) {
  uint64_t lim = n < a->grid[0] ? n : a->grid[0];
  uint64_t f = (uint64_t)gx * a->tg[0];
  uint64_t l = f + a->tg[0];
  *first = f < lim ? f : lim;
  *last = l < lim ? l : lim;
}

/* ---- add / mul: 0 a, 1 b, 2 out, 3 {n: u32} ---------------------------------------------- */

static int binary_validate(const mlxn_kargs *a, mlxn_ftype t, char *err, size_t cap) {
  MLXN_NEED_BYTES(a, 3, 4, err, cap);
  uint32_t n = mlxn_arg_u32(a, 3, 0);
  if (mlxn_need_grid(a, 0, n, "element (n)", err, cap)) return 1;
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
  static int NAME##_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {   \
    (void)gy; (void)gz; (void)s;                                                                   \
    uint64_t i, end;                                                                               \
    tg_span(a, gx, mlxn_arg_u32(a, 3, 0), &i, &end);                                               \
    for (; i < end; i++) {                                                                         \
      float x = mlxn_load(a->ptr[0], i, T), y = mlxn_load(a->ptr[1], i, T);                        \
      mlxn_store(a->ptr[2], i, T, x OP y);                                                         \
    }                                                                                              \
    return 0;                                                                                      \
  }

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
  static int NAME##_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {   \
    (void)gy; (void)gz; (void)s;                                                                   \
    uint64_t i, end;                                                                               \
    tg_span(a, gx, mlxn_arg_u32(a, 3, 0), &i, &end);                                               \
    for (; i < end; i++) {                                                                         \
      float g = mlxn_round_to(mlxn_silu(mlxn_load(a->ptr[0], i, T)), T);                           \
      mlxn_store(a->ptr[2], i, T, g * mlxn_load(a->ptr[1], i, T));                                 \
    }                                                                                              \
    return 0;                                                                                      \
  }

SILU_MUL_KERNEL(silu_mul_f32, MLXN_T_F32)
SILU_MUL_KERNEL(silu_mul_f16, MLXN_T_F16)
SILU_MUL_KERNEL(silu_mul_bf16, MLXN_T_BF16)

/* ---- gelu (tanh approximation): 0 in, 1 out; n = grid[0] ---------------------------------- */

static float gelu_tanh(float x) {
  const float k = 0.7978845608028654f; /* sqrt(2/pi) */
  float inner = k * (x + 0.044715f * x * x * x);
  /* Clamp: tanh saturates long before ±15, and the clamp keeps GPU fast-math tanh finite. */
  if (inner > 15.0f) inner = 15.0f;
  if (inner < -15.0f) inner = -15.0f;
  return 0.5f * x * (1.0f + tanhf(inner));
}

/* One thread per element over grid[0] elements: 0 in, 1 out. */
#define UNARY_KERNEL(NAME, T, FN)                                                                  \
  static int NAME##_validate(const mlxn_kargs *a, char *err, size_t cap) {                       \
    uint64_t bytes = MLXN_SIZE(a->grid[0], mlxn_ftype_size(T));                                      \
    MLXN_NEED_BUF(a, 0, bytes, err, cap);                                                          \
    MLXN_NEED_BUF(a, 1, bytes, err, cap);                                                          \
    MLXN_NEED_ALIGN(a, MLXN_SLOTS2(0, 1), mlxn_ftype_size(T), err, cap);                           \
    return 0;                                                                                      \
  }                                                                                                \
  static int NAME##_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {   \
    (void)gy; (void)gz; (void)s;                                                                   \
    uint64_t i, end;                                                                               \
    tg_span(a, gx, a->grid[0], &i, &end);                                                          \
    for (; i < end; i++) mlxn_store(a->ptr[1], i, T, FN(mlxn_load(a->ptr[0], i, T)));              \
    return 0;                                                                                      \
  }

UNARY_KERNEL(gelu_f32, MLXN_T_F32, gelu_tanh)
UNARY_KERNEL(gelu_f16, MLXN_T_F16, gelu_tanh)
UNARY_KERNEL(gelu_bf16, MLXN_T_BF16, gelu_tanh)

/* ---- silu: 0 in, 1 out; out = x · sigmoid(x); n = grid[0] ------------------------------------- */

UNARY_KERNEL(silu_f32, MLXN_T_F32, mlxn_silu)
UNARY_KERNEL(silu_f16, MLXN_T_F16, mlxn_silu)
UNARY_KERNEL(silu_bf16, MLXN_T_BF16, mlxn_silu)

/* ---- strided_copy_f32: 0 src, 1 dst, 2 {rows, cols, src_stride, dst_stride} (elements):
 *      dst[r·dst_stride + c] = src[r·src_stride + c]; threads (cols, rows). Appends K/V rows into a
 *      cache laid out [kv_heads, capacity, head_dim]. */

static int strided_copy_f32_validate(const mlxn_kargs *a, char *err, size_t cap) {
  MLXN_NEED_BYTES(a, 2, 16, err, cap);
  uint32_t rows = mlxn_arg_u32(a, 2, 0), cols = mlxn_arg_u32(a, 2, 4);
  uint32_t ss = mlxn_arg_u32(a, 2, 8), ds = mlxn_arg_u32(a, 2, 12);
  if (!rows || !cols || ss < cols || ds < cols)
    return mlxn_kfail(err, cap, "need rows, cols > 0 and strides >= cols");
  if (mlxn_need_grid(a, 0, cols, "column", err, cap) || mlxn_need_grid(a, 1, rows, "row", err, cap)) return 1;
  MLXN_NEED_BUF(a, 0, MLXN_SIZE(mlxn_size_add(MLXN_SIZE(rows - 1, ss), cols), 4), err, cap);
  MLXN_NEED_BUF(a, 1, MLXN_SIZE(mlxn_size_add(MLXN_SIZE(rows - 1, ds), cols), 4), err, cap);
  MLXN_NEED_ALIGN(a, MLXN_SLOTS2(0, 1), 4, err, cap);
  MLXN_NO_OVERLAP(a, 1, a->len[1], 0, a->len[0], err, cap);
  return 0;
}

static int strided_copy_f32_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {
  (void)gz; (void)s;
  uint32_t rows = mlxn_arg_u32(a, 2, 0), cols = mlxn_arg_u32(a, 2, 4);
  uint32_t ss = mlxn_arg_u32(a, 2, 8), ds = mlxn_arg_u32(a, 2, 12);
  const float *src = (const float *)a->ptr[0];
  float *dst = (float *)a->ptr[1];
  for (uint32_t ty = 0; ty < a->tg[1]; ty++) {
    uint32_t r = gy * a->tg[1] + ty;
    if (r >= rows || r >= a->grid[1]) break;
    for (uint32_t tx = 0; tx < a->tg[0]; tx++) {
      uint32_t c = gx * a->tg[0] + tx;
      if (c >= cols || c >= a->grid[0]) break;
      dst[(uint64_t)r * ds + c] = src[(uint64_t)r * ss + c];
    }
  }
  return 0;
}

/* ---- debug_fault: 0 marker u32[1], 1 {fail: u32}. Fault injection for tests: with fail = 0 it
 *      writes 1 to the marker; otherwise the dispatch reports failure, which fails its command
 *      buffer at wait (the error is sticky; later groups of that command buffer do not run). */

static int debug_fault_validate(const mlxn_kargs *a, char *err, size_t cap) {
  MLXN_NEED_BUF(a, 0, 4, err, cap);
  MLXN_NEED_BYTES(a, 1, 4, err, cap);
  MLXN_NEED_ALIGN(a, 1u, 4, err, cap);
  return 0;
}

static int debug_fault_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {
  (void)gx; (void)gy; (void)gz; (void)s;
  if (mlxn_arg_u32(a, 1, 0)) return 1;
  uint32_t one = 1;
  __builtin_memcpy(a->ptr[0], &one, 4);
  return 0;
}

/* ---- softcap: 0 in, 1 out, 2 {cap: f32, n: u32}; out = tanh(x / cap) * cap ---------------- */

static int softcap_f32_validate(const mlxn_kargs *a, char *err, size_t cap) {
  MLXN_NEED_BYTES(a, 2, 8, err, cap);
  float c = mlxn_arg_f32(a, 2, 0);
  if (!(c > 0.0f) || isinf(c)) return mlxn_kfail(err, cap, "softcap: cap must be finite and > 0");
  uint32_t n = mlxn_arg_u32(a, 2, 4);
  if (mlxn_need_grid(a, 0, n, "element (n)", err, cap)) return 1;
  uint64_t bytes = MLXN_SIZE(n, 4);
  MLXN_NEED_BUF(a, 0, bytes, err, cap);
  MLXN_NEED_BUF(a, 1, bytes, err, cap);
  MLXN_NEED_ALIGN(a, MLXN_SLOTS2(0, 1), 4, err, cap);
  return 0;
}

static int softcap_f32_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {
  (void)gy; (void)gz; (void)s;
  float c = mlxn_arg_f32(a, 2, 0);
  uint64_t i, end;
  tg_span(a, gx, mlxn_arg_u32(a, 2, 4), &i, &end);
  for (; i < end; i++) mlxn_store(a->ptr[1], i, MLXN_T_F32, tanhf(mlxn_load(a->ptr[0], i, MLXN_T_F32) / c) * c);
  return 0;
}

/* ---- axpby: 0 a, 1 b, 2 out, 3 {alpha: f32, beta: f32, n: u32, pad: u32}; out = αa + βb ------ */

static int axpby_f32_validate(const mlxn_kargs *a, char *err, size_t cap) {
  MLXN_NEED_BYTES(a, 3, 16, err, cap);
  uint32_t n = mlxn_arg_u32(a, 3, 8);
  if (mlxn_need_grid(a, 0, n, "element (n)", err, cap)) return 1;
  uint64_t bytes = MLXN_SIZE(n, 4);
  MLXN_NEED_BUF(a, 0, bytes, err, cap);
  MLXN_NEED_BUF(a, 1, bytes, err, cap);
  MLXN_NEED_BUF(a, 2, bytes, err, cap);
  MLXN_NEED_ALIGN(a, MLXN_SLOTS3(0, 1, 2), 4, err, cap);
  return 0;
}

static int axpby_f32_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {
  (void)gy; (void)gz; (void)s;
  float alpha = mlxn_arg_f32(a, 3, 0), beta = mlxn_arg_f32(a, 3, 4);
  uint64_t i, end;
  tg_span(a, gx, mlxn_arg_u32(a, 3, 8), &i, &end);
  for (; i < end; i++) {
    float x = mlxn_load(a->ptr[0], i, MLXN_T_F32), y = mlxn_load(a->ptr[1], i, MLXN_T_F32);
    mlxn_store(a->ptr[2], i, MLXN_T_F32, alpha * x + beta * y);
  }
  return 0;
}

const mlxn_cpu_kernel mlxn_cpu_elementwise_kernels[] = {
    {"elementwise_add_f32", "bbbc", add_f32_validate, add_f32_run},
    {"elementwise_add_f16", "bbbc", add_f16_validate, add_f16_run},
    {"elementwise_add_bf16", "bbbc", add_bf16_validate, add_bf16_run},
    {"elementwise_mul_f32", "bbbc", mul_f32_validate, mul_f32_run},
    {"elementwise_mul_f16", "bbbc", mul_f16_validate, mul_f16_run},
    {"elementwise_mul_bf16", "bbbc", mul_bf16_validate, mul_bf16_run},
    {"gelu_f32", "bb", gelu_f32_validate, gelu_f32_run},
    {"gelu_f16", "bb", gelu_f16_validate, gelu_f16_run},
    {"gelu_bf16", "bb", gelu_bf16_validate, gelu_bf16_run},
    {"softcap_f32", "bbc", softcap_f32_validate, softcap_f32_run},
    {"axpby_f32", "bbbc", axpby_f32_validate, axpby_f32_run},
    {"silu_f32", "bb", silu_f32_validate, silu_f32_run},
    {"silu_f16", "bb", silu_f16_validate, silu_f16_run},
    {"silu_bf16", "bb", silu_bf16_validate, silu_bf16_run},
    {"silu_mul_f32", "bbbc", silu_mul_f32_validate, silu_mul_f32_run},
    {"silu_mul_f16", "bbbc", silu_mul_f16_validate, silu_mul_f16_run},
    {"silu_mul_bf16", "bbbc", silu_mul_bf16_validate, silu_mul_bf16_run},
    {"strided_copy_f32", "bbc", strided_copy_f32_validate, strided_copy_f32_run},
    {"debug_fault", "bc", debug_fault_validate, debug_fault_run},
    {0, 0, 0, 0},
};
