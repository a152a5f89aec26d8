/* Validators of the matrix products (dense, MLX affine, ggml block formats and their MoE forms): every dispatch on every backend passes through these before it runs.
 * The slot layouts and the semantics are documented with the bodies, kernels/cpu/matmul.c. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "contracts.h"
#include "matmul.h"

/* The GPU kernels give each output one 32-lane simdgroup (lanes split K, then a simd_sum): a
 * threadgroup of `threads` holds threads/32 of them, the outputs of one group. `op` dispatches it. */
static __attribute__((cold, noinline)) int mm_tg_fail(const mlxn_kargs *a, uint32_t threads, const char *op, char *err,
                                                      size_t cap) {
  char why[160]; /* formatted only for the refusal */
  snprintf(why, sizeof why, "one 32-lane simdgroup per output, %u outputs per threadgroup; use %s", threads / 32, op);
  return mlxn_need_tg(a, threads, why, err, cap);
}

static inline int need_mm_tg(const mlxn_kargs *a, uint32_t threads, const char *op, char *err, size_t cap) {
  if (a->tg[0] == threads && a->tg[1] == 1 && a->tg[2] == 1) return 0;
  return mm_tg_fail(a, threads, op, err, cap);
}

/* Inlined into each product's validator (a call per check was a tenth of its cost). */
static inline __attribute__((always_inline)) int check_mm(const mlxn_kargs *a, uint32_t m, uint32_t n, uint32_t k,
                                                           uint32_t outs, char *err, size_t cap) {
  if (m == 0 || n == 0 || k == 0) return mlxn_kfail(err, cap, "M, N and K must be > 0");
  if (mlxn_need_dims(a, 2, err, cap)) return 1;
  if ((uint64_t)a->groups[0] * outs < n || a->groups[1] < m)
    return mlxn_kfail(err, cap, "grid %ux%u threadgroups does not cover N=%u (x%u per group) and M=%u",
                      a->groups[0], a->groups[1], n, outs, m);
  return 0;
}

/* ---- dense: mode = epilogue | constant weights (native/contracts/matmul.h; semantics with the bodies) */

static inline __attribute__((always_inline)) int check_epilogue(const mlxn_kargs *a, mlxn_params_dense p, char *err,
                                                                 size_t cap) {
  uint32_t mode = p.mode, epi = mode & MM_EPILOGUE_MASK;
  if (mode & ~(MM_EPILOGUE_MASK | MM_MODE_CONSTANT_WEIGHTS))
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
    MLXN_NEED_BYTES(a, MLXN_SLOT_MATMUL_##SUF##_DENSE, MLXN_PARAMS_DENSE_BYTES, err, cap);         \
    mlxn_params_dense p = mlxn_params_dense_of(a, MLXN_SLOT_MATMUL_##SUF##_DENSE);                 \
    uint32_t rows = (p.mode & MM_EPILOGUE_MASK) == EPI_SWIGLU ? 2 : 1;                             \
    if (check_mm(a, p.m, p.n, p.k, rows == 2 ? MM_OUTS_SWIGLU : MM_OUTS, err, cap)) return 1;      \
    uint64_t x_bytes = MLXN_SIZE(p.m, p.k, 4), y_bytes = MLXN_SIZE(p.m, p.n, 4);                   \
    uint64_t w_bytes = MLXN_SIZE(rows, p.n, p.k, mlxn_ftype_size(T));                              \
    MLXN_NEED_BUF(a, 0, x_bytes, err, cap);                                                        \
    MLXN_NEED_BUF(a, 1, w_bytes, err, cap);                                                        \
    MLXN_NEED_BUF(a, 2, y_bytes, err, cap);                                                        \
    MLXN_NO_OVERLAP(a, 2, y_bytes, 0, x_bytes, err, cap);                                          \
    MLXN_NO_OVERLAP(a, 2, y_bytes, 1, w_bytes, err, cap);                                          \
    MLXN_NEED_ALIGN(a, MLXN_SLOTS3(0, 2, 4), 4, err, cap);                                         \
    MLXN_NEED_ALIGN(a, 1u << 1, mlxn_ftype_size(T), err, cap);                                     \
    if (check_epilogue(a, p, err, cap)) return 1;                                            \
    return need_mm_tg(a, 128, "ops.matmul (the SwiGLU epilogue uses 2 of the 4)", err, cap);       \
  }                                                                                                \

DENSE_KERNEL(F32, MLXN_T_F32)
DENSE_KERNEL(BF16, MLXN_T_BF16)
DENSE_KERNEL(F16, MLXN_T_F16)

/* The affine products' buffers: 0 x [M, K] f32, 1 packed W (w_bytes), 2 scales and 3 biases (s_bytes
 * each, aligned to s_align), 4 y [M, N] f32, which overlaps no input. */
static int affine_buffers(const mlxn_kargs *a, uint32_t m, uint32_t n, uint32_t k, uint64_t w_bytes, uint64_t s_bytes,
                          uint32_t s_align, char *err, size_t cap) {
  uint64_t x_bytes = MLXN_SIZE(m, k, 4), y_bytes = MLXN_SIZE(m, n, 4);
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
  MLXN_NEED_ALIGN(a, MLXN_SLOTS2(2, 3), s_align, err, cap);
  return 0;
}

/* qmatmul_affine and qmatmul_affine_fast take the same slots. */
#define AFFINE_PARAMS MLXN_SLOT_QMATMUL_AFFINE_AFFINE
MLXN_STATIC_ASSERT(AFFINE_PARAMS == MLXN_SLOT_QMATMUL_AFFINE_FAST_AFFINE, "one slot layout");

static int affine_validate_common(const mlxn_kargs *a, uint32_t outs, char *err, size_t cap) {
  MLXN_NEED_BYTES(a, AFFINE_PARAMS, MLXN_PARAMS_AFFINE_BYTES, err, cap);
  mlxn_params_affine p = mlxn_params_affine_of(a, AFFINE_PARAMS);
  uint32_t bits = p.bits, gs = p.group_size;
  if (check_mm(a, p.m, p.n, p.k, outs, err, cap)) return 1;
  if (bits != 4 && bits != 6 && bits != 8) return mlxn_kfail(err, cap, "bits must be 4, 6 or 8, got %u", bits);
  if (gs != 32 && gs != 64 && gs != 128) return mlxn_kfail(err, cap, "group size must be 32, 64 or 128, got %u", gs);
  if (p.k % gs) return mlxn_kfail(err, cap, "K=%u must be a multiple of the group size %u", p.k, gs);
  if (affine_buffers(a, p.m, p.n, p.k, MLXN_SIZE(p.n, (uint64_t)p.k * bits / 8), MLXN_SIZE(p.n, p.k / gs, 2), 2, err,
                     cap))
    return 1;
  return need_mm_tg(a, outs == MM_OUTS_FAST ? 256 : 128, "ops.quantizedMatmul", err, cap);
}

static int qmatmul_affine_validate(const mlxn_kargs *a, char *err, size_t cap) {
  return affine_validate_common(a, MM_OUTS, err, cap);
}

static int qmatmul_affine_fast_validate(const mlxn_kargs *a, char *err, size_t cap) {
  if (affine_validate_common(a, MM_OUTS_FAST, err, cap)) return 1;
  mlxn_params_affine p = mlxn_params_affine_of(a, AFFINE_PARAMS);
  if (p.n % 8 || p.k % 256 || (p.bits != 4 && p.bits != 8))
    return mlxn_kfail(err, cap, "the fast kernel needs N %% 8 == 0, K %% 256 == 0 and 4 or 8 bits");
  return 0;
}

static int affine_general_check(uint32_t k, uint32_t bits, uint32_t gs, uint32_t t, char *err, size_t cap) {
  if (bits < 2 || bits > 8 || bits == 7)
    return mlxn_kfail(err, cap, "bits must be 2, 3, 4, 5, 6 or 8, got %u", bits);
  if (gs != 32 && gs != 64 && gs != 128) return mlxn_kfail(err, cap, "group size must be 32, 64 or 128, got %u", gs);
  if (k % gs) return mlxn_kfail(err, cap, "K=%u must be a multiple of the group size %u", k, gs);
  if (t > MLXN_T_BF16) return mlxn_kfail(err, cap, "scale type must be 0 (f32), 1 (f16) or 2 (bf16), got %u", t);
  return 0;
}

static int qmatmul_affine_general_validate(const mlxn_kargs *a, char *err, size_t cap) {
  const int ps = MLXN_SLOT_QMATMUL_AFFINE_GENERAL_AFFINE_GENERAL;
  MLXN_NEED_BYTES(a, ps, MLXN_PARAMS_AFFINE_GENERAL_BYTES, err, cap);
  mlxn_params_affine_general p = mlxn_params_affine_general_of(a, ps);
  uint32_t bits = p.bits, gs = p.group_size, t = p.scale_type;
  if (check_mm(a, p.m, p.n, p.k, MM_OUTS, err, cap) || affine_general_check(p.k, bits, gs, t, err, cap)) return 1;
  uint32_t es = mlxn_ftype_size((mlxn_ftype)t);
  if (affine_buffers(a, p.m, p.n, p.k, MLXN_SIZE(p.n, (uint64_t)p.k / 8 * bits), MLXN_SIZE(p.n, p.k / gs, es), es, err,
                     cap))
    return 1;
  return need_mm_tg(a, 128, "ops.quantizedMatmul", err, cap);
}

static int qmatmul_affine_gather_validate(const mlxn_kargs *a, char *err, size_t cap) {
  const int ps = MLXN_SLOT_QMATMUL_AFFINE_GATHER_AFFINE_GATHER;
  MLXN_NEED_BYTES(a, ps, MLXN_PARAMS_AFFINE_GATHER_BYTES, err, cap);
  mlxn_params_affine_gather p = mlxn_params_affine_gather_of(a, ps);
  uint32_t rows = p.rows, n = p.n, k = p.k, top_k = p.top_k, experts = p.n_experts;
  uint32_t bits = p.bits, gs = p.group_size, t = p.scale_type;
  if (!rows || !n || !k || !top_k || !experts)
    return mlxn_kfail(err, cap, "rows, N, K, top_k and n_experts must be > 0");
  if (rows % top_k) return mlxn_kfail(err, cap, "rows=%u must be a multiple of top_k=%u", rows, top_k);
  if (affine_general_check(k, bits, gs, t, err, cap)) return 1;
  if (mlxn_need_dims(a, 2, err, cap)) return 1;
  if ((uint64_t)a->groups[0] * MM_OUTS < n || a->groups[1] < rows)
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

/* ---- ggml block formats (quant_blocks.h) ------------------------------------------------------- */

static int ggml_check_k(ggml_fmt f, uint32_t k, char *err, size_t cap) {
  if (k % ggml_block_values(f))
    return mlxn_kfail(err, cap, "K=%u must be a multiple of the block size %u", k, ggml_block_values(f));
  return 0;
}

/* ---- ggml mat-vec (M <= 8, one group row) and mat-mat (a group row per row of x) --------------- */

/* Every ggml product takes its parameters in the same slot (checked per kernel below). */
#define GGML_PARAMS MLXN_SLOT_QMATMUL_Q4_0_MV_GGML

#define GGML_KERNELS(NAME, UNAME, F)                                                                     \
  static int NAME##_validate_common(const mlxn_kargs *a, uint32_t rows_needed, char *err,        \
                                    size_t cap) {                                                  \
    MLXN_NEED_BYTES(a, GGML_PARAMS, MLXN_PARAMS_GGML_BYTES, err, cap);                             \
    mlxn_params_ggml p = mlxn_params_ggml_of(a, GGML_PARAMS);                                      \
    if (p.m == 0 || p.n == 0 || p.k == 0) return mlxn_kfail(err, cap, "M, N and K must be > 0"); \
    if (ggml_check_k(F, p.k, err, cap)) return 1;                                                  \
    if (mlxn_need_dims(a, 2, err, cap)) return 1;                                                  \
    if ((uint64_t)a->groups[0] * MM_OUTS < p.n || a->groups[1] < rows_needed)                      \
      return mlxn_kfail(err, cap, "grid does not cover N=%u, M=%u", p.n, p.m);                     \
    uint64_t x_bytes = MLXN_SIZE(p.m, p.k, 4), y_bytes = MLXN_SIZE(p.m, p.n, 4);                   \
    uint64_t w_bytes = MLXN_SIZE(p.n, p.k / ggml_block_values(F), ggml_block_bytes(F));            \
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
    if (mlxn_params_ggml_of(a, GGML_PARAMS).m > 8)                                                 \
      return mlxn_kfail(err, cap, "the mat-vec kernel takes M <= 8");                              \
    return 0;                                                                                      \
  }                                                                                                \
  MLXN_STATIC_ASSERT(MLXN_SLOT_##UNAME##_MV_GGML == GGML_PARAMS, "one slot layout");             \
  MLXN_STATIC_ASSERT(MLXN_SLOT_##UNAME##_MM_GGML == GGML_PARAMS, "one slot layout");             \
  static int NAME##_mm_validate(const mlxn_kargs *a, char *err, size_t cap) {                    \
    return NAME##_validate_common(a, mlxn_params_ggml_of(a, GGML_PARAMS).m, err, cap);             \
  }                                                                                                \


/* ---- ggml MoE: output row r uses token r / top_k and expert ids[r] (checked at run time) ------- */

#define GGML_ID_KERNEL(NAME, UNAME, F)                                                                   \
  static int NAME##_validate(const mlxn_kargs *a, char *err, size_t cap) {                       \
    const int ps = MLXN_SLOT_##UNAME##_GGML_ID;                                                    \
    MLXN_NEED_BYTES(a, ps, MLXN_PARAMS_GGML_ID_BYTES, err, cap);                                   \
    mlxn_params_ggml_id p = mlxn_params_ggml_id_of(a, ps);                                         \
    uint32_t rows = p.rows, n = p.n, k = p.k, top_k = p.top_k, experts = p.n_experts;              \
    if (!rows || !n || !k || !top_k || !experts)                                                   \
      return mlxn_kfail(err, cap, "rows, N, K, top_k and n_experts must be > 0");                  \
    if (rows % top_k) return mlxn_kfail(err, cap, "rows=%u must be a multiple of top_k=%u", rows, top_k); \
    if (ggml_check_k(F, k, err, cap)) return 1;                                                    \
    if (mlxn_need_dims(a, 2, err, cap)) return 1;                                                  \
    if ((uint64_t)a->groups[0] * MM_OUTS < n || a->groups[1] < rows)                               \
      return mlxn_kfail(err, cap, "grid does not cover N=%u, rows=%u", n, rows);                   \
    uint64_t row_bytes = (uint64_t)(k / ggml_block_values(F)) * ggml_block_bytes(F);              \
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


MLXN_VALIDATOR(matmul_f32, matmul_F32_validate)
MLXN_VALIDATOR(matmul_bf16, matmul_BF16_validate)
MLXN_VALIDATOR(matmul_f16, matmul_F16_validate)
MLXN_VALIDATOR(qmatmul_affine, qmatmul_affine_validate)
MLXN_VALIDATOR(qmatmul_affine_fast, qmatmul_affine_fast_validate)
MLXN_VALIDATOR(qmatmul_affine_general, qmatmul_affine_general_validate)
MLXN_VALIDATOR(qmatmul_affine_gather, qmatmul_affine_gather_validate)

#define GGML_FORMAT(f, F)                                                                          \
  GGML_KERNELS(qmatmul_##f, QMATMUL_##F, GGML_##F)                                                 \
  GGML_ID_KERNEL(qmatmul_id_##f, QMATMUL_ID_##F, GGML_##F)                                         \
  MLXN_VALIDATOR(qmatmul_##f##_mv, qmatmul_##f##_mv_validate)                                      \
  MLXN_VALIDATOR(qmatmul_##f##_mm, qmatmul_##f##_mm_validate)                                      \
  MLXN_VALIDATOR(qmatmul_id_##f, qmatmul_id_##f##_validate)
MLXN_GGML_FORMATS(GGML_FORMAT)
