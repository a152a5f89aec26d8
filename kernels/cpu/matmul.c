/* Matrix products y = x · Wᵀ (x f32 [M, K], W [N, K], y f32 [M, N]) with W dense (f32/bf16/f16),
 * MLX affine-quantized (4/6/8 bits, groups of 32/64/128, bf16 scales and biases) or in ggml block
 * formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), plus the MoE variant that picks an expert's weights per output row.
 *
 * Geometry (shared with the GPU kernels): threadgroups (ceil(N / OUTS), rows) — each threadgroup
 * produces OUTS consecutive outputs of one row of x (rows = M, or tokens·top_k for MoE). The CPU
 * kernels accumulate in f32 in index order. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../../native/contracts/matmul.h"
#include "cpu_kernel.h"

/* Outputs per threadgroup and the dense mode word: native/contracts/matmul.h, shared with the
 * validators. The parameter blocks are the generated mlxn_params_* of contracts.gen.h. */
#define OUTS MM_OUTS
#define OUTS_FAST MM_OUTS_FAST

/* ---- dense: 0 x, 1 W, 2 y, 3 {M, N, K, mode}, 4 residual (optional) --------------------------
 * mode = epilogue | constant_weights << 8. constant_weights: W is written by no dispatch of this
 * command buffer, so a GPU may start reading it before the dispatch's producers finish (the CPU
 * backend has nothing to gain from it).
 * epilogue 0: y = x · Wᵀ.
 * epilogue 1 (residual): y = x · Wᵀ + residual [M, N] (slot 4; y may be the residual itself,
 *   y += x · Wᵀ, but must not partly overlap it).
 * epilogue 2 (SwiGLU): W holds 2N rows, gate rows then up rows; y[j] = silu(x · W[j]) · x · W[N + j].
 * Each equals the unfused sequence (matmul, then add or silu_mul) bit for bit. */

static float dense_dot(const float *x, const void *w, uint64_t row, uint32_t k, mlxn_ftype t) {
  float acc = 0.0f;
  for (uint32_t i = 0; i < k; i++) acc += x[i] * mlxn_load(w, row + i, t);
  return acc;
}

#define DENSE_KERNEL(SUF, T)                                                                      \
  static int matmul_##SUF##_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz,      \
                                void *s) {                                                         \
    (void)gz; (void)s;                                                                             \
    mlxn_params_dense p = mlxn_params_dense_of(a, MLXN_SLOT_MATMUL_##SUF##_DENSE);                 \
    uint32_t epi = p.mode & MM_EPILOGUE_MASK, outs = epi == EPI_SWIGLU ? MM_OUTS_SWIGLU : OUTS;     \
    if (gy >= p.m) return 0;                                                                       \
    const float *x = (const float *)a->ptr[0] + (uint64_t)gy * p.k;                                \
    float *y = (float *)a->ptr[2] + (uint64_t)gy * p.n;                                            \
    const float *res = epi == EPI_RESIDUAL ? (const float *)a->ptr[4] + (uint64_t)gy * p.n : NULL; \
    for (uint32_t n = gx * outs; n < p.n && n < (gx + 1) * outs; n++) {                            \
      float acc = dense_dot(x, a->ptr[1], (uint64_t)n * p.k, p.k, T);                              \
      if (epi == EPI_SWIGLU) /* what silu_mul computes from the stored gate and up */             \
        acc = mlxn_silu(acc) * dense_dot(x, a->ptr[1], ((uint64_t)p.n + n) * p.k, p.k, T);         \
      y[n] = res ? acc + res[n] : acc; /* the same sum the separate add kernel computes */         \
    }                                                                                              \
    return 0;                                                                                      \
  }

DENSE_KERNEL(F32, MLXN_T_F32)
DENSE_KERNEL(BF16, MLXN_T_BF16)
DENSE_KERNEL(F16, MLXN_T_F16)

/* ---- MLX affine: 0 x, 1 packed W, 2 scales bf16 [N, K/gs], 3 biases bf16, 4 y,
 *      5 {M, N, K, bits, group_size}; w = scale · q + bias -------------------------------------
 * Packing of one row (K values, K·bits/8 bytes): 4 and 8 bits — little-endian u32 words holding
 * 32/bits values, value j of a word at bit j·bits; 6 bits — every 4 values in 3 bytes, value j at
 * bit 6j of the little-endian 24-bit integer. */

static inline uint32_t affine_q(const uint8_t *row, uint32_t k, uint32_t bits) {
  if (bits == 8) return row[k];
  if (bits == 4) return (row[k >> 1] >> ((k & 1u) * 4)) & 0xfu;
  const uint8_t *t = row + (k >> 2) * 3; /* bits == 6 */
  uint32_t v = (uint32_t)t[0] | ((uint32_t)t[1] << 8) | ((uint32_t)t[2] << 16);
  return (v >> ((k & 3u) * 6)) & 0x3fu;
}

/* Scalar: dequantize each weight, then multiply-accumulate in index order. */
static int qmatmul_affine_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {
  (void)gz; (void)s;
  mlxn_params_affine p = mlxn_params_affine_of(a, MLXN_SLOT_QMATMUL_AFFINE_AFFINE);
  uint32_t bits = p.bits, gs = p.group_size;
  if (gy >= p.m) return 0;
  const float *x = (const float *)a->ptr[0] + (uint64_t)gy * p.k;
  float *y = (float *)a->ptr[4] + (uint64_t)gy * p.n;
  uint64_t row_bytes = (uint64_t)p.k * bits / 8, groups = p.k / gs;
  for (uint32_t n = gx * OUTS; n < p.n && n < (gx + 1) * OUTS; n++) {
    const uint8_t *row = a->ptr[1] + n * row_bytes;
    const uint8_t *sc = a->ptr[2] + n * groups * 2, *bi = a->ptr[3] + n * groups * 2;
    float acc = 0.0f;
    for (uint32_t g = 0; g < groups; g++) {
      float scale = mlxn_load(sc, g, MLXN_T_BF16), bias = mlxn_load(bi, g, MLXN_T_BF16);
      for (uint32_t k = g * gs; k < (g + 1) * gs; k++) acc += x[k] * (scale * (float)affine_q(row, k, bits) + bias);
    }
    y[n] = acc;
  }
  return 0;
}

/* Fast: per group, Σ q·x and Σ x, then scale·Σqx + bias·Σx (MLX's SIMD formulation). */
static int qmatmul_affine_fast_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {
  (void)gz; (void)s;
  mlxn_params_affine p = mlxn_params_affine_of(a, MLXN_SLOT_QMATMUL_AFFINE_FAST_AFFINE);
  uint32_t bits = p.bits, gs = p.group_size;
  if (gy >= p.m) return 0;
  const float *x = (const float *)a->ptr[0] + (uint64_t)gy * p.k;
  float *y = (float *)a->ptr[4] + (uint64_t)gy * p.n;
  uint64_t row_bytes = (uint64_t)p.k * bits / 8, groups = p.k / gs;
  for (uint32_t n = gx * OUTS_FAST; n < p.n && n < (gx + 1) * OUTS_FAST; n++) {
    const uint8_t *row = a->ptr[1] + n * row_bytes;
    const uint8_t *sc = a->ptr[2] + n * groups * 2, *bi = a->ptr[3] + n * groups * 2;
    float acc = 0.0f;
    for (uint32_t g = 0; g < groups; g++) {
      float qx = 0.0f, sx = 0.0f;
      for (uint32_t k = g * gs; k < (g + 1) * gs; k++) {
        qx += (float)affine_q(row, k, bits) * x[k];
        sx += x[k];
      }
      acc += mlxn_load(sc, g, MLXN_T_BF16) * qx + mlxn_load(bi, g, MLXN_T_BF16) * sx;
    }
    y[n] = acc;
  }
  return 0;
}

/* ---- MLX affine, any width and scale dtype: 0 x, 1 packed W, 2 scales, 3 biases, 4 y,
 *      5 {M, N, K, bits, group_size, scale type}; the gather (MoE) form: 0 x [tokens, K],
 *      1 W [E, N, K·bits/8], 2 scales [E, N, K/gs], 3 biases, 4 ids u32 [rows], 5 y [rows, N],
 *      6 {rows, N, K, top_k, n_experts, bits, group_size, scale type}; output row r uses token
 *      r / top_k and expert ids[r] (MLX's gather_qmm with sorted-free indices).
 * bits 2, 3, 4, 5, 6 or 8; scale type 0 f32, 1 f16, 2 bf16 (MLX stores scales and biases in the
 * weights' dtype). A row is one little-endian bit stream, code j at bit j·bits (MLX's u32 words for
 * 2/4/8 bits and its 3-, 5- and 3-byte packs for 3, 5 and 6 bits are all this stream). */

static inline uint32_t affine_code(const uint8_t *row, uint32_t k, uint32_t bits) {
  uint64_t at = (uint64_t)k * bits;
  uint32_t shift = (uint32_t)(at & 7u), v = row[at >> 3];
  if (shift + bits > 8) v |= (uint32_t)row[(at >> 3) + 1] << 8; /* a code spans at most 2 bytes */
  return (v >> shift) & ((1u << bits) - 1u);
}

static float affine_general_dot(const float *x, const uint8_t *row, const uint8_t *sc, const uint8_t *bi,
                                uint32_t k, uint32_t bits, uint32_t gs, mlxn_ftype t) {
  float acc = 0.0f;
  for (uint32_t g = 0; g < k / gs; g++) {
    float scale = mlxn_load(sc, g, t), bias = mlxn_load(bi, g, t);
    for (uint32_t i = g * gs; i < (g + 1) * gs; i++) acc += x[i] * (scale * (float)affine_code(row, i, bits) + bias);
  }
  return acc;
}

static int qmatmul_affine_general_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {
  (void)gz; (void)s;
  mlxn_params_affine_general p = mlxn_params_affine_general_of(a, MLXN_SLOT_QMATMUL_AFFINE_GENERAL_AFFINE_GENERAL);
  uint32_t bits = p.bits, gs = p.group_size;
  mlxn_ftype t = (mlxn_ftype)p.scale_type;
  if (gy >= p.m) return 0;
  uint64_t row_bytes = (uint64_t)p.k / 8 * bits, sbytes = (uint64_t)(p.k / gs) * mlxn_ftype_size(t);
  const float *x = (const float *)a->ptr[0] + (uint64_t)gy * p.k;
  float *y = (float *)a->ptr[4] + (uint64_t)gy * p.n;
  for (uint32_t n = gx * OUTS; n < p.n && n < (gx + 1) * OUTS; n++)
    y[n] = affine_general_dot(x, a->ptr[1] + n * row_bytes, a->ptr[2] + n * sbytes, a->ptr[3] + n * sbytes, p.k,
                              bits, gs, t);
  return 0;
}

static int qmatmul_affine_gather_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {
  (void)gz; (void)s;
  mlxn_params_affine_gather p = mlxn_params_affine_gather_of(a, MLXN_SLOT_QMATMUL_AFFINE_GATHER_AFFINE_GATHER);
  uint32_t rows = p.rows, n = p.n, k = p.k, top_k = p.top_k, experts = p.n_experts;
  uint32_t bits = p.bits, gs = p.group_size;
  mlxn_ftype t = (mlxn_ftype)p.scale_type;
  if (gy >= rows) return 0;
  uint32_t e = ((const uint32_t *)a->ptr[4])[gy];
  if (e >= experts) return 1; /* data-dependent: reported as a failed dispatch */
  uint64_t row_bytes = (uint64_t)k / 8 * bits, sbytes = (uint64_t)(k / gs) * mlxn_ftype_size(t);
  const float *x = (const float *)a->ptr[0] + (uint64_t)(gy / top_k) * k;
  float *y = (float *)a->ptr[5] + (uint64_t)gy * n;
  for (uint32_t o = gx * OUTS; o < n && o < (gx + 1) * OUTS; o++) {
    uint64_t wr = (uint64_t)e * n + o;
    y[o] = affine_general_dot(x, a->ptr[1] + wr * row_bytes, a->ptr[2] + wr * sbytes, a->ptr[3] + wr * sbytes, k,
                              bits, gs, t);
  }
  return 0;
}

/* ---- ggml block formats (native/contracts/quant_blocks.h) --------------------------------------- */

static inline float half_at(const uint8_t *p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return mlxn_f16_to_f32(h);
}

/* ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j from the 12 packed bytes. */
static inline void scale_min_k4(uint32_t j, const uint8_t *q, uint32_t *sc, uint32_t *m) {
  if (j < 4) {
    *sc = q[j] & 63u;
    *m = q[j + 4] & 63u;
  } else {
    *sc = (q[j + 4] & 0xfu) | ((uint32_t)(q[j - 4] >> 6) << 4);
    *m = (uint32_t)(q[j + 4] >> 4) | ((uint32_t)(q[j] >> 6) << 4);
  }
}

/* Q4_K (d, dmin, scales[12], qs[128]) and Q5_K (the same with qh[32] before qs): sub-block j of
 * 32 values is d·sc_j·q − dmin·m_j, q the low (even j) or high (odd j) nibbles of qs[32·(j/2)..],
 * plus 16 when bit j of qh[l] is set (Q5_K). As ggml's dequantize_row_q4_K / _q5_K. */
static void kquant_dequant_block(int five, const uint8_t *b, float *out) {
  float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t *scales = b + 4, *qh = b + 16, *qs = b + (five ? 48 : 16);
  for (uint32_t j = 0; j < 8; j++) {
    uint32_t sc, m;
    scale_min_k4(j, scales, &sc, &m);
    float d1 = d * (float)sc, m1 = dmin * (float)m;
    const uint8_t *q = qs + (j / 2) * 32;
    for (uint32_t l = 0; l < 32; l++) {
      uint32_t v = (j & 1u) ? (uint32_t)(q[l] >> 4) : (q[l] & 0xfu);
      if (five) v |= ((qh[l] >> j) & 1u) << 4;
      out[j * 32 + l] = d1 * (float)v - m1;
    }
  }
}

/* Q4_1 (d, m, qs[16]), Q5_0 (d, qh u32, qs[16]) and Q5_1 (d, m, qh, qs[16]): value j uses the low
 * nibble of qs[j] and value j + 16 the high one; qh bit j is the 5th bit of value j. Q5_0
 * subtracts 16, the _1 formats add m. */
static void q32_dequant_block(ggml_fmt f, const uint8_t *b, float *out) {
  float d = half_at(b), m = f == GGML_Q5_0 ? 0.0f : half_at(b + 2);
  uint32_t qh = 0;
  const uint8_t *qs = b + (f == GGML_Q4_1 ? 4 : f == GGML_Q5_0 ? 6 : 8);
  if (f != GGML_Q4_1) {
    const uint8_t *h = b + (f == GGML_Q5_0 ? 2 : 4);
    qh = (uint32_t)h[0] | ((uint32_t)h[1] << 8) | ((uint32_t)h[2] << 16) | ((uint32_t)h[3] << 24);
  }
  for (uint32_t j = 0; j < 16; j++) {
    int lo = (int)((qs[j] & 0xfu) | (((qh >> j) & 1u) << 4));
    int hi = (int)((uint32_t)(qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
    if (f == GGML_Q5_0) {
      out[j] = (float)(lo - 16) * d;
      out[j + 16] = (float)(hi - 16) * d;
    } else {
      out[j] = (float)lo * d + m;
      out[j + 16] = (float)hi * d + m;
    }
  }
}

/* Dequantizes one block into out[values]. */
static void ggml_dequant_block(ggml_fmt f, const uint8_t *b, float *out) {
  if (f == GGML_Q4_K || f == GGML_Q5_K) {
    kquant_dequant_block(f == GGML_Q5_K, b, out);
  } else if (f == GGML_Q4_1 || f == GGML_Q5_0 || f == GGML_Q5_1) {
    q32_dequant_block(f, b, out);
  } else if (f == GGML_Q4_0) {
    float d = half_at(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
      out[j] = (float)((int)(qs[j] & 0xf) - 8) * d;
      out[j + 16] = (float)((int)(qs[j] >> 4) - 8) * d;
    }
  } else if (f == GGML_Q8_0) {
    float d = half_at(b);
    const int8_t *qs = (const int8_t *)(b + 2);
    for (int j = 0; j < 32; j++) out[j] = (float)qs[j] * d;
  } else { /* Q6_K: ql[128] qh[64] scales[16] d */
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = half_at(b + 208);
    for (int n = 0; n < 256; n += 128) {
      for (int l = 0; l < 32; l++) {
        int is = l / 16;
        int q1 = (int)((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
        int q2 = (int)((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
        int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        out[n + l] = d * (float)sc[is] * (float)q1;
        out[n + l + 32] = d * (float)sc[is + 2] * (float)q2;
        out[n + l + 64] = d * (float)sc[is + 4] * (float)q3;
        out[n + l + 96] = d * (float)sc[is + 6] * (float)q4;
      }
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

/* One output: dot(x[0..K), row n of a ggml matrix). */
static float ggml_dot(ggml_fmt f, const uint8_t *row, const float *x, uint32_t k) {
  float w[256];
  float acc = 0.0f;
  uint32_t bv = ggml_block_values(f), bb = ggml_block_bytes(f);
  for (uint32_t blk = 0; blk < k / bv; blk++) {
    ggml_dequant_block(f, row + (uint64_t)blk * bb, w);
    for (uint32_t j = 0; j < bv; j++) acc += x[blk * bv + j] * w[j];
  }
  return acc;
}

/* ---- quantized_matmul_ggml: 0 x, 1 W blocks [N, K/bv], 2 y, 3 {M, N, K} ------------------------
 * mv (M ≤ 8): OUTS outputs for every row per threadgroup, grid (ceil(N/OUTS), 1);
 * mm: grid (ceil(N/OUTS), M). Same arithmetic, different work split. */

#define GGML_KERNELS(NAME, UNAME, F)                                                                     \
  static void NAME##_rows(const mlxn_kargs *a, uint32_t gx, uint32_t m0, uint32_t m1) {          \
    mlxn_params_ggml p = mlxn_params_ggml_of(a, MLXN_SLOT_##UNAME##_MV_GGML);                      \
    uint64_t row_bytes = (uint64_t)(p.k / ggml_block_values(F)) * ggml_block_bytes(F);            \
    for (uint32_t m = m0; m < m1 && m < p.m; m++)                                                  \
      for (uint32_t n = gx * OUTS; n < p.n && n < (gx + 1) * OUTS; n++)                            \
        ((float *)a->ptr[2])[(uint64_t)m * p.n + n] =                                              \
            ggml_dot(F, a->ptr[1] + n * row_bytes, (const float *)a->ptr[0] + (uint64_t)m * p.k, p.k); \
  }                                                                                                \
  static int NAME##_mv_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {\
    (void)gy; (void)gz; (void)s;                                                                   \
    NAME##_rows(a, gx, 0, 8);                                                                      \
    return 0;                                                                                      \
  }                                                                                                \
  static int NAME##_mm_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {\
    (void)gz; (void)s;                                                                             \
    NAME##_rows(a, gx, gy, gy + 1);                                                                \
    return 0;                                                                                      \
  }


/* ---- quantized_matmul_id_ggml (MoE): 0 x [tokens, K], 1 W [E, N, K/bv blocks], 2 ids u32
 *      [tokens·top_k], 3 y [tokens·top_k, N], 4 {rows = tokens·top_k, N, K, top_k, n_experts};
 *      output row r = x[r / top_k] · W[ids[r]]ᵀ. Grid (ceil(N/OUTS), rows). Expert ids are checked
 *      at run time (they are data): an out-of-range id fails the dispatch. */

#define GGML_ID_KERNEL(NAME, UNAME, F)                                                                   \
  static int NAME##_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {   \
    (void)gz; (void)s;                                                                             \
    mlxn_params_ggml_id p = mlxn_params_ggml_id_of(a, MLXN_SLOT_##UNAME##_GGML_ID);                \
    uint32_t rows = p.rows, n = p.n, k = p.k, top_k = p.top_k, experts = p.n_experts;              \
    if (gy >= rows) return 0;                                                                      \
    uint32_t e = ((const uint32_t *)a->ptr[2])[gy];                                                \
    if (e >= experts) return 1; /* data-dependent: reported as a failed dispatch */                \
    uint64_t row_bytes = (uint64_t)(k / ggml_block_values(F)) * ggml_block_bytes(F);              \
    const uint8_t *w = a->ptr[1] + (uint64_t)e * n * row_bytes;                                    \
    const float *x = (const float *)a->ptr[0] + (uint64_t)(gy / top_k) * k;                        \
    float *y = (float *)a->ptr[3] + (uint64_t)gy * n;                                              \
    for (uint32_t o = gx * OUTS; o < n && o < (gx + 1) * OUTS; o++) y[o] = ggml_dot(F, w + o * row_bytes, x, k); \
    return 0;                                                                                      \
  }


MLXN_CPU_BODY(matmul_f32, matmul_F32_run)
MLXN_CPU_BODY(matmul_bf16, matmul_BF16_run)
MLXN_CPU_BODY(matmul_f16, matmul_F16_run)
MLXN_CPU_BODY(qmatmul_affine, qmatmul_affine_run)
MLXN_CPU_BODY(qmatmul_affine_fast, qmatmul_affine_fast_run)
MLXN_CPU_BODY(qmatmul_affine_general, qmatmul_affine_general_run)
MLXN_CPU_BODY(qmatmul_affine_gather, qmatmul_affine_gather_run)

#define GGML_FORMAT(f, F)                                                                          \
  GGML_KERNELS(qmatmul_##f, QMATMUL_##F, GGML_##F)                                                 \
  GGML_ID_KERNEL(qmatmul_id_##f, QMATMUL_ID_##F, GGML_##F)                                         \
  MLXN_CPU_BODY(qmatmul_##f##_mv, qmatmul_##f##_mv_run)                                            \
  MLXN_CPU_BODY(qmatmul_##f##_mm, qmatmul_##f##_mm_run)                                            \
  MLXN_CPU_BODY(qmatmul_id_##f, qmatmul_id_##f##_run)
MLXN_GGML_FORMATS(GGML_FORMAT)
