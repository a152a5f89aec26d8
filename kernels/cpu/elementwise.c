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

/* The binary kernels (add, mul, silu_mul) share one slot layout (asserted by their validators). */
#define BINARY_PARAMS MLXN_SLOT_ELEMENTWISE_ADD_F32_N

#define BINARY_KERNEL(NAME, T, OP)                                                                 \
  static int NAME##_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {   \
    (void)gy; (void)gz; (void)s;                                                                   \
    uint64_t i, end;                                                                               \
    tg_span(a, gx, mlxn_params_n_of(a, BINARY_PARAMS).n, &i, &end);                               \
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
  static int NAME##_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {   \
    (void)gy; (void)gz; (void)s;                                                                   \
    uint64_t i, end;                                                                               \
    tg_span(a, gx, mlxn_params_n_of(a, BINARY_PARAMS).n, &i, &end);                               \
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

static int strided_copy_f32_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {
  (void)gz; (void)s;
  mlxn_params_strided_copy p = mlxn_params_strided_copy_of(a, MLXN_SLOT_STRIDED_COPY_F32_STRIDED_COPY);
  uint32_t rows = p.rows, cols = p.cols, ss = p.src_stride, ds = p.dst_stride;
  const float *src = (const float *)a->ptr[0];
  float *dst = (float *)a->ptr[1];
  if (p.has_state) { /* the destination moves by state[0] rows; an unbounded position writes nothing */
    uint32_t pos = ((const uint32_t *)a->ptr[MLXN_SLOT_STRIDED_COPY_F32_STATE])[0];
    if (pos >= p.max_pos) return 1;
    dst += (uint64_t)pos * p.dst_pos_stride;
  }
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

static int debug_fault_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {
  (void)gx; (void)gy; (void)gz; (void)s;
  if (mlxn_params_debug_fault_of(a, MLXN_SLOT_DEBUG_FAULT_DEBUG_FAULT).fail) return 1;
  uint32_t one = 1;
  __builtin_memcpy(a->ptr[0], &one, 4);
  return 0;
}

static int softcap_f32_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {
  (void)gy; (void)gz; (void)s;
  mlxn_params_softcap p = mlxn_params_softcap_of(a, MLXN_SLOT_SOFTCAP_F32_SOFTCAP);
  uint64_t i, end;
  tg_span(a, gx, p.n, &i, &end);
  for (; i < end; i++) mlxn_store(a->ptr[1], i, MLXN_T_F32, tanhf(mlxn_load(a->ptr[0], i, MLXN_T_F32) / p.cap) * p.cap);
  return 0;
}

static int axpby_f32_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {
  (void)gy; (void)gz; (void)s;
  mlxn_params_axpby p = mlxn_params_axpby_of(a, MLXN_SLOT_AXPBY_F32_AXPBY);
  float alpha = p.alpha, beta = p.beta;
  uint64_t i, end;
  tg_span(a, gx, p.n, &i, &end);
  for (; i < end; i++) {
    float x = mlxn_load(a->ptr[0], i, MLXN_T_F32), y = mlxn_load(a->ptr[1], i, MLXN_T_F32);
    mlxn_store(a->ptr[2], i, MLXN_T_F32, alpha * x + beta * y);
  }
  return 0;
}

MLXN_CPU_BODY(elementwise_add_f32, add_f32_run)
MLXN_CPU_BODY(elementwise_add_f16, add_f16_run)
MLXN_CPU_BODY(elementwise_add_bf16, add_bf16_run)
MLXN_CPU_BODY(elementwise_mul_f32, mul_f32_run)
MLXN_CPU_BODY(elementwise_mul_f16, mul_f16_run)
MLXN_CPU_BODY(elementwise_mul_bf16, mul_bf16_run)
MLXN_CPU_BODY(gelu_f32, gelu_f32_run)
MLXN_CPU_BODY(gelu_f16, gelu_f16_run)
MLXN_CPU_BODY(gelu_bf16, gelu_bf16_run)
MLXN_CPU_BODY(softcap_f32, softcap_f32_run)
MLXN_CPU_BODY(axpby_f32, axpby_f32_run)
MLXN_CPU_BODY(silu_f32, silu_f32_run)
MLXN_CPU_BODY(silu_f16, silu_f16_run)
MLXN_CPU_BODY(silu_bf16, silu_bf16_run)
MLXN_CPU_BODY(silu_mul_f32, silu_mul_f32_run)
MLXN_CPU_BODY(silu_mul_f16, silu_mul_f16_run)
MLXN_CPU_BODY(silu_mul_bf16, silu_mul_bf16_run)
MLXN_CPU_BODY(strided_copy_f32, strided_copy_f32_run)
MLXN_CPU_BODY(debug_fault, debug_fault_run)

/* ---- scale_f32: 0 x, 1 out, 2 {alpha: f32, n: u32}; out = alpha · x (validator generated) ---- */

MLXN_CPU_KERNEL(scale_f32) {
  (void)gy; (void)gz; (void)tg_scratch;
  mlxn_params_scale p = mlxn_params_scale_of(a, MLXN_SLOT_SCALE_F32_SCALE);
  const uint8_t *x = a->ptr[MLXN_SLOT_SCALE_F32_X];
  uint8_t *out = a->ptr[MLXN_SLOT_SCALE_F32_OUT];
  uint64_t i, end;
  tg_span(a, gx, p.n, &i, &end);
  for (; i < end; i++) mlxn_store(out, i, MLXN_T_F32, p.alpha * mlxn_load(x, i, MLXN_T_F32));
  return 0;
}
