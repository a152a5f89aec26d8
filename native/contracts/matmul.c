/* Validators of the matrix products (dense, MLX affine, ggml block formats and their MoE forms): every dispatch on every backend passes through these before it runs.
 * The slot layouts and the semantics are documented with the bodies, kernels/cpu/matmul.c. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "contracts.h"

#define OUTS 4      /* outputs per threadgroup, scalar kernels */
#define OUTS_FAST 8 /* outputs per threadgroup, the fast affine kernel */

/* ---- common parameter block: {M, N, K, ...} ------------------------------------------------- */

typedef struct mm_params {
  uint32_t m, n, k;
} mm_params;

static mm_params read_mm(const mlxn_kargs *a, int slot) {
  mm_params p = {mlxn_arg_u32(a, slot, 0), mlxn_arg_u32(a, slot, 4), mlxn_arg_u32(a, slot, 8)};
  return p;
}

/* The GPU kernels give each output one 32-lane simdgroup (lanes split K, then a simd_sum): a
 * threadgroup of `threads` holds threads/32 of them, the outputs of one group. `op` dispatches it. */
static int need_mm_tg(const mlxn_kargs *a, uint32_t threads, const char *op, char *err, size_t cap) {
  if (a->tg[0] == threads && a->tg[1] == 1 && a->tg[2] == 1) return 0;
  char why[160]; /* formatted only for the refusal */
  snprintf(why, sizeof why, "one 32-lane simdgroup per output, %u outputs per threadgroup; use %s", threads / 32, op);
  return mlxn_need_tg(a, threads, why, err, cap);
}

static int check_mm(const mlxn_kargs *a, mm_params p, uint32_t outs, char *err, size_t cap) {
  if (p.m == 0 || p.n == 0 || p.k == 0) return mlxn_kfail(err, cap, "M, N and K must be > 0");
  if ((uint64_t)a->groups[0] * outs < p.n || a->groups[1] < p.m)
    return mlxn_kfail(err, cap, "grid %ux%u threadgroups does not cover N=%u (x%u per group) and M=%u",
                      a->groups[0], a->groups[1], p.n, outs, p.m);
  return 0;
}

/* ---- dense: 0 x, 1 W, 2 y, 3 {M, N, K, mode}, 4 residual (optional) --------------------------
 * mode = epilogue | constant_weights << 8. constant_weights: W is written by no dispatch of this
 * command buffer, so a GPU may start reading it before the dispatch's producers finish (the CPU
 * backend has nothing to gain from it).
 * epilogue 0: y = x · Wᵀ.
 * epilogue 1 (residual): y = x · Wᵀ + residual [M, N] (slot 4; y may be the residual itself,
 *   y += x · Wᵀ, but must not partly overlap it).
 * epilogue 2 (SwiGLU): W holds 2N rows, gate rows then up rows; y[j] = silu(x · W[j]) · x · W[N + j].
 * Each equals the unfused sequence (matmul, then add or silu_mul) bit for bit. */

enum { EPI_NONE = 0, EPI_RESIDUAL = 1, EPI_SWIGLU = 2 };
#define OUTS_SWIGLU 2 /* outputs per threadgroup with the SwiGLU epilogue (each takes two rows) */

#define MODE_CONSTANT_WEIGHTS 0x100u

static int check_epilogue(const mlxn_kargs *a, mm_params p, uint32_t mode, char *err, size_t cap) {
  uint32_t epi = mode & 0xffu;
  if (mode & ~(0xffu | MODE_CONSTANT_WEIGHTS))
    return mlxn_kfail(err, cap, "mode 0x%x has unknown bits (epilogue in bits 0-7, constant weights bit 8)", mode);
  if (epi > EPI_SWIGLU) return mlxn_kfail(err, cap, "epilogue must be 0 (none), 1 (residual) or 2 (SwiGLU), got %u", epi);
  if ((epi == EPI_RESIDUAL) != (a->ptr[4] != NULL))
    return mlxn_kfail(err, cap, epi == EPI_RESIDUAL ? "residual epilogue but slot 4 is not bound"
                                                    : "slot 4 (residual) bound without the residual epilogue");
  if (epi != EPI_RESIDUAL) return 0;
  uint64_t bytes = MLXN_SIZE(p.m, p.n, 4);
  MLXN_NEED_BUF(a, 4, bytes, err, cap);
  const uint8_t *y = a->ptr[2], *r = a->ptr[4];
  if (y != r && y < r + bytes && r < y + bytes)
    return mlxn_kfail(err, cap, "the residual must be y itself or not overlap it");
  return 0;
}

#define DENSE_KERNEL(SUF, T)                                                                      \
  static int matmul_##SUF##_validate(const mlxn_kargs *a, char *err, size_t cap) {               \
    MLXN_NEED_BYTES(a, 3, 16, err, cap);                                                           \
    mm_params p = read_mm(a, 3);                                                                   \
    uint32_t mode = mlxn_arg_u32(a, 3, 12), rows = (mode & 0xffu) == EPI_SWIGLU ? 2 : 1;           \
    if (check_mm(a, p, rows == 2 ? OUTS_SWIGLU : OUTS, err, cap)) return 1;                        \
    uint64_t x_bytes = MLXN_SIZE(p.m, p.k, 4), y_bytes = MLXN_SIZE(p.m, p.n, 4);                   \
    uint64_t w_bytes = MLXN_SIZE(rows, p.n, p.k, mlxn_ftype_size(T));                              \
    MLXN_NEED_BUF(a, 0, x_bytes, err, cap);                                                        \
    MLXN_NEED_BUF(a, 1, w_bytes, err, cap);                                                        \
    MLXN_NEED_BUF(a, 2, y_bytes, err, cap);                                                        \
    MLXN_NO_OVERLAP(a, 2, y_bytes, 0, x_bytes, err, cap);                                          \
    MLXN_NO_OVERLAP(a, 2, y_bytes, 1, w_bytes, err, cap);                                          \
    MLXN_NEED_ALIGN(a, MLXN_SLOTS3(0, 2, 4), 4, err, cap);                                         \
    MLXN_NEED_ALIGN(a, 1u << 1, mlxn_ftype_size(T), err, cap);                                     \
    if (check_epilogue(a, p, mode, err, cap)) return 1;                                            \
    return need_mm_tg(a, 128, "ops.matmul (the SwiGLU epilogue uses 2 of the 4)", err, cap);       \
  }                                                                                                \

DENSE_KERNEL(f32, MLXN_T_F32)
DENSE_KERNEL(bf16, MLXN_T_BF16)
DENSE_KERNEL(f16, MLXN_T_F16)

static int affine_validate_common(const mlxn_kargs *a, uint32_t outs, char *err, size_t cap) {
  MLXN_NEED_BYTES(a, 5, 20, err, cap);
  mm_params p = read_mm(a, 5);
  uint32_t bits = mlxn_arg_u32(a, 5, 12), gs = mlxn_arg_u32(a, 5, 16);
  if (check_mm(a, p, outs, err, cap)) return 1;
  if (bits != 4 && bits != 6 && bits != 8) return mlxn_kfail(err, cap, "bits must be 4, 6 or 8, got %u", bits);
  if (gs != 32 && gs != 64 && gs != 128) return mlxn_kfail(err, cap, "group size must be 32, 64 or 128, got %u", gs);
  if (p.k % gs) return mlxn_kfail(err, cap, "K=%u must be a multiple of the group size %u", p.k, gs);
  uint64_t x_bytes = MLXN_SIZE(p.m, p.k, 4), w_bytes = MLXN_SIZE(p.n, (uint64_t)p.k * bits / 8);
  uint64_t s_bytes = MLXN_SIZE(p.n, p.k / gs, 2), y_bytes = MLXN_SIZE(p.m, p.n, 4);
  MLXN_NEED_BUF(a, 0, x_bytes, err, cap);
  MLXN_NEED_BUF(a, 1, w_bytes, err, cap);
  MLXN_NEED_BUF(a, 2, s_bytes, err, cap);
  MLXN_NEED_BUF(a, 3, s_bytes, err, cap);
  MLXN_NEED_BUF(a, 4, y_bytes, err, cap);
  MLXN_NO_OVERLAP(a, 4, y_bytes, 0, x_bytes, err, cap);
  MLXN_NO_OVERLAP(a, 4, y_bytes, 1, w_bytes, err, cap);
  MLXN_NO_OVERLAP(a, 4, y_bytes, 2, s_bytes, err, cap);
  MLXN_NO_OVERLAP(a, 4, y_bytes, 3, s_bytes, err, cap);
  MLXN_NEED_ALIGN(a, MLXN_SLOTS2(0, 4), 4, err, cap);
  MLXN_NEED_ALIGN(a, MLXN_SLOTS2(2, 3), 2, err, cap);
  return need_mm_tg(a, outs == OUTS_FAST ? 256 : 128, "ops.quantizedMatmul", err, cap);
}

static int qmatmul_affine_validate(const mlxn_kargs *a, char *err, size_t cap) {
  return affine_validate_common(a, OUTS, err, cap);
}

static int qmatmul_affine_fast_validate(const mlxn_kargs *a, char *err, size_t cap) {
  if (affine_validate_common(a, OUTS_FAST, err, cap)) return 1;
  mm_params p = read_mm(a, 5);
  uint32_t bits = mlxn_arg_u32(a, 5, 12);
  if (p.n % 8 || p.k % 256 || (bits != 4 && bits != 8))
    return mlxn_kfail(err, cap, "the fast kernel needs N %% 8 == 0, K %% 256 == 0 and 4 or 8 bits");
  return 0;
}

static int affine_general_check(mm_params p, uint32_t bits, uint32_t gs, uint32_t t, char *err, size_t cap) {
  if (bits < 2 || bits > 8 || bits == 7)
    return mlxn_kfail(err, cap, "bits must be 2, 3, 4, 5, 6 or 8, got %u", bits);
  if (gs != 32 && gs != 64 && gs != 128) return mlxn_kfail(err, cap, "group size must be 32, 64 or 128, got %u", gs);
  if (p.k % gs) return mlxn_kfail(err, cap, "K=%u must be a multiple of the group size %u", p.k, gs);
  if (t > MLXN_T_BF16) return mlxn_kfail(err, cap, "scale type must be 0 (f32), 1 (f16) or 2 (bf16), got %u", t);
  return 0;
}

static int qmatmul_affine_general_validate(const mlxn_kargs *a, char *err, size_t cap) {
  MLXN_NEED_BYTES(a, 5, 24, err, cap);
  mm_params p = read_mm(a, 5);
  uint32_t bits = mlxn_arg_u32(a, 5, 12), gs = mlxn_arg_u32(a, 5, 16), t = mlxn_arg_u32(a, 5, 20);
  if (check_mm(a, p, OUTS, err, cap) || affine_general_check(p, bits, gs, t, err, cap)) return 1;
  uint64_t x_bytes = MLXN_SIZE(p.m, p.k, 4), w_bytes = MLXN_SIZE(p.n, (uint64_t)p.k / 8 * bits);
  uint64_t s_bytes = MLXN_SIZE(p.n, p.k / gs, mlxn_ftype_size((mlxn_ftype)t)), y_bytes = MLXN_SIZE(p.m, p.n, 4);
  MLXN_NEED_BUF(a, 0, x_bytes, err, cap);
  MLXN_NEED_BUF(a, 1, w_bytes, err, cap);
  MLXN_NEED_BUF(a, 2, s_bytes, err, cap);
  MLXN_NEED_BUF(a, 3, s_bytes, err, cap);
  MLXN_NEED_BUF(a, 4, y_bytes, err, cap);
  MLXN_NO_OVERLAP(a, 4, y_bytes, 0, x_bytes, err, cap);
  MLXN_NO_OVERLAP(a, 4, y_bytes, 1, w_bytes, err, cap);
  MLXN_NO_OVERLAP(a, 4, y_bytes, 2, s_bytes, err, cap);
  MLXN_NO_OVERLAP(a, 4, y_bytes, 3, s_bytes, err, cap);
  MLXN_NEED_ALIGN(a, MLXN_SLOTS2(0, 4), 4, err, cap);
  MLXN_NEED_ALIGN(a, MLXN_SLOTS2(2, 3), mlxn_ftype_size((mlxn_ftype)t), err, cap);
  return need_mm_tg(a, 128, "ops.quantizedMatmul", err, cap);
}

static int qmatmul_affine_gather_validate(const mlxn_kargs *a, char *err, size_t cap) {
  MLXN_NEED_BYTES(a, 6, 32, err, cap);
  uint32_t rows = mlxn_arg_u32(a, 6, 0), n = mlxn_arg_u32(a, 6, 4), k = mlxn_arg_u32(a, 6, 8);
  uint32_t top_k = mlxn_arg_u32(a, 6, 12), experts = mlxn_arg_u32(a, 6, 16);
  uint32_t bits = mlxn_arg_u32(a, 6, 20), gs = mlxn_arg_u32(a, 6, 24), t = mlxn_arg_u32(a, 6, 28);
  if (!rows || !n || !k || !top_k || !experts)
    return mlxn_kfail(err, cap, "rows, N, K, top_k and n_experts must be > 0");
  if (rows % top_k) return mlxn_kfail(err, cap, "rows=%u must be a multiple of top_k=%u", rows, top_k);
  mm_params p = {rows, n, k};
  if (affine_general_check(p, bits, gs, t, err, cap)) return 1;
  if ((uint64_t)a->groups[0] * OUTS < n || a->groups[1] < rows)
    return mlxn_kfail(err, cap, "grid does not cover N=%u, rows=%u", n, rows);
  uint64_t x_bytes = MLXN_SIZE(rows / top_k, k, 4), w_bytes = MLXN_SIZE(experts, n, (uint64_t)k / 8 * bits);
  uint64_t s_bytes = MLXN_SIZE(experts, n, (uint64_t)(k / gs) * mlxn_ftype_size((mlxn_ftype)t));
  uint64_t id_bytes = MLXN_SIZE(rows, 4), y_bytes = MLXN_SIZE(rows, n, 4);
  MLXN_NEED_BUF(a, 0, x_bytes, err, cap);
  MLXN_NEED_BUF(a, 1, w_bytes, err, cap);
  MLXN_NEED_BUF(a, 2, s_bytes, err, cap);
  MLXN_NEED_BUF(a, 3, s_bytes, err, cap);
  MLXN_NEED_BUF(a, 4, id_bytes, err, cap);
  MLXN_NEED_BUF(a, 5, y_bytes, err, cap);
  MLXN_NO_OVERLAP(a, 5, y_bytes, 0, x_bytes, err, cap);
  MLXN_NO_OVERLAP(a, 5, y_bytes, 1, w_bytes, err, cap);
  MLXN_NO_OVERLAP(a, 5, y_bytes, 2, s_bytes, err, cap);
  MLXN_NO_OVERLAP(a, 5, y_bytes, 3, s_bytes, err, cap);
  MLXN_NO_OVERLAP(a, 5, y_bytes, 4, id_bytes, err, cap);
  MLXN_NEED_ALIGN(a, MLXN_SLOTS3(0, 4, 5), 4, err, cap);
  MLXN_NEED_ALIGN(a, MLXN_SLOTS2(2, 3), mlxn_ftype_size((mlxn_ftype)t), err, cap);
  return need_mm_tg(a, 128, "ops.quantizedMatmulAffineGather", err, cap);
}

/* ---- ggml block formats ------------------------------------------------------------------------ */

typedef enum {
  GGML_Q4_0 = 0,
  GGML_Q8_0 = 1,
  GGML_Q6_K = 2,
  GGML_Q4_1 = 3,
  GGML_Q5_0 = 4,
  GGML_Q5_1 = 5,
  GGML_Q4_K = 6,
  GGML_Q5_K = 7,
} ggml_fmt;

static const uint32_t ggml_block_values[] = {32, 32, 256, 32, 32, 32, 256, 256};
static const uint32_t ggml_block_bytes[] = {18, 34, 210, 20, 22, 24, 144, 176};

static int ggml_check_k(ggml_fmt f, uint32_t k, char *err, size_t cap) {
  if (k % ggml_block_values[f])
    return mlxn_kfail(err, cap, "K=%u must be a multiple of the block size %u", k, ggml_block_values[f]);
  return 0;
}

/* ---- quantized_matmul_ggml: 0 x, 1 W blocks [N, K/bv], 2 y, 3 {M, N, K} ------------------------
 * mv (M ≤ 8): OUTS outputs for every row per threadgroup, grid (ceil(N/OUTS), 1);
 * mm: grid (ceil(N/OUTS), M). Same arithmetic, different work split. */

#define GGML_KERNELS(NAME, F)                                                                     \
  static int NAME##_validate_common(const mlxn_kargs *a, uint32_t rows_needed, char *err,        \
                                    size_t cap) {                                                  \
    MLXN_NEED_BYTES(a, 3, 12, err, cap);                                                           \
    mm_params p = read_mm(a, 3);                                                                   \
    if (p.m == 0 || p.n == 0 || p.k == 0) return mlxn_kfail(err, cap, "M, N and K must be > 0"); \
    if (ggml_check_k(F, p.k, err, cap)) return 1;                                                  \
    if ((uint64_t)a->groups[0] * OUTS < p.n || a->groups[1] < rows_needed)                         \
      return mlxn_kfail(err, cap, "grid does not cover N=%u, M=%u", p.n, p.m);                     \
    uint64_t x_bytes = MLXN_SIZE(p.m, p.k, 4), y_bytes = MLXN_SIZE(p.m, p.n, 4);                   \
    uint64_t w_bytes = MLXN_SIZE(p.n, p.k / ggml_block_values[F], ggml_block_bytes[F]);            \
    MLXN_NEED_BUF(a, 0, x_bytes, err, cap);                                                        \
    MLXN_NEED_BUF(a, 1, w_bytes, err, cap);                                                        \
    MLXN_NEED_BUF(a, 2, y_bytes, err, cap);                                                        \
    MLXN_NO_OVERLAP(a, 2, y_bytes, 0, x_bytes, err, cap);                                          \
    MLXN_NO_OVERLAP(a, 2, y_bytes, 1, w_bytes, err, cap);                                          \
    MLXN_NEED_ALIGN(a, MLXN_SLOTS2(0, 2), 4, err, cap);                                            \
    MLXN_NEED_ALIGN(a, 1u << 1, 2, err, cap);                                                      \
    return need_mm_tg(a, 128, "ops.quantizedMatmulGgml", err, cap);                                \
  }                                                                                                \
  static int NAME##_mv_validate(const mlxn_kargs *a, char *err, size_t cap) {                    \
    if (NAME##_validate_common(a, 1, err, cap)) return 1;                                          \
    if (read_mm(a, 3).m > 8) return mlxn_kfail(err, cap, "the mat-vec kernel takes M <= 8");       \
    return 0;                                                                                      \
  }                                                                                                \
  static int NAME##_mm_validate(const mlxn_kargs *a, char *err, size_t cap) {                    \
    return NAME##_validate_common(a, read_mm(a, 3).m, err, cap);                                   \
  }                                                                                                \

GGML_KERNELS(qmatmul_q4_0, GGML_Q4_0)
GGML_KERNELS(qmatmul_q8_0, GGML_Q8_0)
GGML_KERNELS(qmatmul_q6_k, GGML_Q6_K)
GGML_KERNELS(qmatmul_q4_1, GGML_Q4_1)
GGML_KERNELS(qmatmul_q5_0, GGML_Q5_0)
GGML_KERNELS(qmatmul_q5_1, GGML_Q5_1)
GGML_KERNELS(qmatmul_q4_k, GGML_Q4_K)
GGML_KERNELS(qmatmul_q5_k, GGML_Q5_K)

/* ---- quantized_matmul_id_ggml (MoE): 0 x [tokens, K], 1 W [E, N, K/bv blocks], 2 ids u32
 *      [tokens·top_k], 3 y [tokens·top_k, N], 4 {rows = tokens·top_k, N, K, top_k, n_experts};
 *      output row r = x[r / top_k] · W[ids[r]]ᵀ. Grid (ceil(N/OUTS), rows). Expert ids are checked
 *      at run time (they are data): an out-of-range id fails the dispatch. */

#define GGML_ID_KERNEL(NAME, F)                                                                   \
  static int NAME##_validate(const mlxn_kargs *a, char *err, size_t cap) {                       \
    MLXN_NEED_BYTES(a, 4, 20, err, cap);                                                           \
    uint32_t rows = mlxn_arg_u32(a, 4, 0), n = mlxn_arg_u32(a, 4, 4), k = mlxn_arg_u32(a, 4, 8);  \
    uint32_t top_k = mlxn_arg_u32(a, 4, 12), experts = mlxn_arg_u32(a, 4, 16);                    \
    if (!rows || !n || !k || !top_k || !experts)                                                   \
      return mlxn_kfail(err, cap, "rows, N, K, top_k and n_experts must be > 0");                  \
    if (rows % top_k) return mlxn_kfail(err, cap, "rows=%u must be a multiple of top_k=%u", rows, top_k); \
    if (ggml_check_k(F, k, err, cap)) return 1;                                                    \
    if ((uint64_t)a->groups[0] * OUTS < n || a->groups[1] < rows)                                  \
      return mlxn_kfail(err, cap, "grid does not cover N=%u, rows=%u", n, rows);                   \
    uint64_t row_bytes = (uint64_t)(k / ggml_block_values[F]) * ggml_block_bytes[F];              \
    uint64_t x_bytes = MLXN_SIZE(rows / top_k, k, 4), w_bytes = MLXN_SIZE(experts, n, row_bytes);  \
    uint64_t id_bytes = MLXN_SIZE(rows, 4), y_bytes = MLXN_SIZE(rows, n, 4);                       \
    MLXN_NEED_BUF(a, 0, x_bytes, err, cap);                                                        \
    MLXN_NEED_BUF(a, 1, w_bytes, err, cap);                                                        \
    MLXN_NEED_BUF(a, 2, id_bytes, err, cap);                                                       \
    MLXN_NEED_BUF(a, 3, y_bytes, err, cap);                                                        \
    MLXN_NO_OVERLAP(a, 3, y_bytes, 0, x_bytes, err, cap);                                          \
    MLXN_NO_OVERLAP(a, 3, y_bytes, 1, w_bytes, err, cap);                                          \
    MLXN_NO_OVERLAP(a, 3, y_bytes, 2, id_bytes, err, cap);                                         \
    MLXN_NEED_ALIGN(a, MLXN_SLOTS3(0, 2, 3), 4, err, cap);                                         \
    MLXN_NEED_ALIGN(a, 1u << 1, 2, err, cap);                                                      \
    return need_mm_tg(a, 128, "ops.quantizedMatmulIdGgml", err, cap);                             \
  }                                                                                                \

GGML_ID_KERNEL(qmatmul_id_q4_0, GGML_Q4_0)
GGML_ID_KERNEL(qmatmul_id_q8_0, GGML_Q8_0)
GGML_ID_KERNEL(qmatmul_id_q6_k, GGML_Q6_K)
GGML_ID_KERNEL(qmatmul_id_q4_1, GGML_Q4_1)
GGML_ID_KERNEL(qmatmul_id_q5_0, GGML_Q5_0)
GGML_ID_KERNEL(qmatmul_id_q5_1, GGML_Q5_1)
GGML_ID_KERNEL(qmatmul_id_q4_k, GGML_Q4_K)
GGML_ID_KERNEL(qmatmul_id_q5_k, GGML_Q5_K)

MLXN_VALIDATOR(matmul_f32, matmul_f32_validate)
MLXN_VALIDATOR(matmul_bf16, matmul_bf16_validate)
MLXN_VALIDATOR(matmul_f16, matmul_f16_validate)
MLXN_VALIDATOR(qmatmul_affine, qmatmul_affine_validate)
MLXN_VALIDATOR(qmatmul_affine_fast, qmatmul_affine_fast_validate)
MLXN_VALIDATOR(qmatmul_affine_general, qmatmul_affine_general_validate)
MLXN_VALIDATOR(qmatmul_affine_gather, qmatmul_affine_gather_validate)
MLXN_VALIDATOR(qmatmul_q4_0_mv, qmatmul_q4_0_mv_validate)
MLXN_VALIDATOR(qmatmul_q4_0_mm, qmatmul_q4_0_mm_validate)
MLXN_VALIDATOR(qmatmul_q8_0_mv, qmatmul_q8_0_mv_validate)
MLXN_VALIDATOR(qmatmul_q8_0_mm, qmatmul_q8_0_mm_validate)
MLXN_VALIDATOR(qmatmul_q6_k_mv, qmatmul_q6_k_mv_validate)
MLXN_VALIDATOR(qmatmul_q6_k_mm, qmatmul_q6_k_mm_validate)
MLXN_VALIDATOR(qmatmul_id_q4_0, qmatmul_id_q4_0_validate)
MLXN_VALIDATOR(qmatmul_id_q8_0, qmatmul_id_q8_0_validate)
MLXN_VALIDATOR(qmatmul_id_q6_k, qmatmul_id_q6_k_validate)
MLXN_VALIDATOR(qmatmul_q4_1_mv, qmatmul_q4_1_mv_validate)
MLXN_VALIDATOR(qmatmul_q4_1_mm, qmatmul_q4_1_mm_validate)
MLXN_VALIDATOR(qmatmul_q5_0_mv, qmatmul_q5_0_mv_validate)
MLXN_VALIDATOR(qmatmul_q5_0_mm, qmatmul_q5_0_mm_validate)
MLXN_VALIDATOR(qmatmul_q5_1_mv, qmatmul_q5_1_mv_validate)
MLXN_VALIDATOR(qmatmul_q5_1_mm, qmatmul_q5_1_mm_validate)
MLXN_VALIDATOR(qmatmul_q4_k_mv, qmatmul_q4_k_mv_validate)
MLXN_VALIDATOR(qmatmul_q4_k_mm, qmatmul_q4_k_mm_validate)
MLXN_VALIDATOR(qmatmul_q5_k_mv, qmatmul_q5_k_mv_validate)
MLXN_VALIDATOR(qmatmul_q5_k_mm, qmatmul_q5_k_mm_validate)
MLXN_VALIDATOR(qmatmul_id_q4_1, qmatmul_id_q4_1_validate)
MLXN_VALIDATOR(qmatmul_id_q5_0, qmatmul_id_q5_0_validate)
MLXN_VALIDATOR(qmatmul_id_q5_1, qmatmul_id_q5_1_validate)
MLXN_VALIDATOR(qmatmul_id_q4_k, qmatmul_id_q4_k_validate)
MLXN_VALIDATOR(qmatmul_id_q5_k, qmatmul_id_q5_k_validate)
