// Matrix products y = x · Wᵀ on CUDA: one warp per output element (warp w of a 128-thread block
// computes output n = blockIdx.x·4 + w of row blockIdx.y; the fast affine kernel uses 8 warps).
// Lanes split K, then a fixed xor-shuffle reduction: deterministic, and the mat-vec and mat-mat
// ggml paths share the per-lane arithmetic, so they agree bit for bit.
#include "../../native/contracts/matmul.h"
#include "common.cuh"

#define WARPS MM_OUTS // one warp per output

__device__ __forceinline__ uint32_t lane_id() { return threadIdx.x & 31u; }
__device__ __forceinline__ uint32_t warp_id() { return threadIdx.x >> 5; }

// ---- dense ------------------------------------------------------------------------------------
// bf16 fast path (k % 8 == 0, 16 B-aligned rows): the block's 4 warps form 2 pairs; each pair owns
// 2 output rows and its two warps split K between them. A lane loads 16 B of each row per step
// (two steps in flight), reusing the same 8 inputs for both rows, so x costs half the traffic of
// the weights. Measured on an H200 (bench/gpu_kernels_bench.ts): 17–30 % less time than one warp
// per row at the decode shapes.
#define DENSE_ROWS_PER_WARP 2
#define DENSE_SPLIT 2
static_assert(WARPS / DENSE_SPLIT * DENSE_ROWS_PER_WARP == WARPS, "a block covers WARPS outputs");

__device__ __forceinline__ float dot8(uint4 wv, float4 x0, float4 x1) {
  const __nv_bfloat162 *p = reinterpret_cast<const __nv_bfloat162 *>(&wv);
  float2 w01 = __bfloat1622float2(p[0]), w23 = __bfloat1622float2(p[1]);
  float2 w45 = __bfloat1622float2(p[2]), w67 = __bfloat1622float2(p[3]);
  return x0.x * w01.x + x0.y * w01.y + x0.z * w23.x + x0.w * w23.y + x1.x * w45.x + x1.y * w45.y +
         x1.z * w67.x + x1.w * w67.y;
}

// The dense kernels' mode word and outputs per block: native/contracts/matmul.h (EPI_*, MM_*).
#define OUTS_SWIGLU MM_OUTS_SWIGLU

// Stores output i of a dense product, adding the residual when one is bound (slot 4): the same sum
// the separate add kernel computes, so the fused form is bit-identical to it.
__device__ __forceinline__ void store_dense(const mlxn_gpu_args &a, uint32_t epi, uint64_t i, float v) {
  if (epi == EPI_RESIDUAL) v = __fadd_rn(v, buf<const float>(a, 4)[i]);
  buf<float>(a, 2)[i] = v;
}
// What silu_mul computes from the stored gate and up.
__device__ __forceinline__ float swiglu(float gate, float up) { return __fmul_rn(silu_f(gate), up); }

// Chunk steps of each row a lane stages in shared memory before waiting for the producers: the
// weights depend on no kernel, so with a programmatic edge their loads are in flight while the
// producers finish, and the block starts computing as soon as its input is ready. 4 steps cover a
// whole row at k = 2048 (16 KiB per block). Measured in the decode step on an H200 (device ms per
// token): no staging 1.60, 2 steps in registers 1.54, 4 in registers 1.59 (occupancy), 4 staged
// 1.47, 8 staged 1.52; an L2 bulk prefetch instead was slower than nothing (1.63).
#ifndef MLXN_GEMV_STAGE
#define MLXN_GEMV_STAGE 4
#endif
static_assert(MLXN_GEMV_STAGE % 2 == 0, "staged steps are consumed in pairs");

// 16-byte asynchronous copies global → shared (compute capability 8.0+).
__device__ __forceinline__ void copy_async16(void *smem, const void *gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(smem)), "l"(gmem)
               : "memory");
#endif
}
__device__ __forceinline__ void copy_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
__device__ __forceinline__ void copy_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// bf16 fast path. Rows r0 and r1 of W: two consecutive outputs, or (SwiGLU) the gate and up rows
// of one output. Waits for the producers itself, after staging its first weights.
__device__ void matmul_bf16_rows(const mlxn_gpu_args &a, uint32_t row, uint32_t n_, uint32_t k, uint32_t epi,
                                 bool constant_weights) {
  __shared__ float partial[WARPS][DENSE_ROWS_PER_WARP];
  const uint32_t warp = warp_id(), lane = lane_id(), pair = warp / DENSE_SPLIT, half = warp % DENSE_SPLIT;
  const bool glu = epi == EPI_SWIGLU;
  // Plain: outputs n0, n0 + 1. SwiGLU: output n0 from rows n0 and n_ + n0.
  const uint32_t n0 = glu ? blockIdx.x * OUTS_SWIGLU + pair : blockIdx.x * WARPS + pair * DENSE_ROWS_PER_WARP;
  const __nv_bfloat16 *w = buf<const __nv_bfloat16>(a, 1);
  // Rows past n read row n-1 (in bounds) and are not stored.
  const uint32_t last = n_ - 1;
  const uint32_t r0 = min(n0, last), r1 = glu ? n_ + min(n0, last) : min(n0 + 1, last);
  const uint4 *w0 = reinterpret_cast<const uint4 *>(w + (uint64_t)r0 * k);
  const uint4 *w1 = reinterpret_cast<const uint4 *>(w + (uint64_t)r1 * k);
  const uint32_t chunks = k / 8, stride = 32 * DENSE_SPLIT;
  uint32_t c = half * 32 + lane;
  if (!constant_weights) wait_producers();
#if MLXN_GEMV_STAGE > 0
  // Asynchronous copies: each lane later reads back only what it staged (no block barrier needed).
  __shared__ uint4 stage[WARPS][MLXN_GEMV_STAGE][2][32];
#pragma unroll
  for (int j = 0; j < MLXN_GEMV_STAGE; j++) {
    const uint32_t cj = c + j * stride;
    if (cj < chunks) {
      copy_async16(&stage[warp][j][0][lane], w0 + cj);
      copy_async16(&stage[warp][j][1][lane], w1 + cj);
    }
  }
  copy_async_commit();
#endif
  if (constant_weights) wait_producers(); // else the wait came first: a producer may write W
  const float4 *x4 = reinterpret_cast<const float4 *>(buf<const float>(a, 0) + (uint64_t)row * k);
  float acc0 = 0.0f, acc1 = 0.0f;
  // One step over chunks c and c + stride of both rows (the same sums whichever way the weights
  // arrived, so every path agrees bit for bit).
  auto pair_step = [&](uint4 a0, uint4 b0, uint4 a1, uint4 b1) {
    const uint32_t d = c + stride;
    float4 xc0 = x4[2 * c], xc1 = x4[2 * c + 1], xd0 = x4[2 * d], xd1 = x4[2 * d + 1];
    acc0 += dot8(a0, xc0, xc1) + dot8(b0, xd0, xd1);
    acc1 += dot8(a1, xc0, xc1) + dot8(b1, xd0, xd1);
    c += 2 * stride;
  };
#if MLXN_GEMV_STAGE > 0
  copy_async_wait_all();
#pragma unroll
  for (int j = 0; j < MLXN_GEMV_STAGE; j += 2)
    if (c + stride < chunks)
      pair_step(stage[warp][j][0][lane], stage[warp][j + 1][0][lane], stage[warp][j][1][lane], stage[warp][j + 1][1][lane]);
#endif
  while (c + stride < chunks) pair_step(__ldg(w0 + c), __ldg(w0 + c + stride), __ldg(w1 + c), __ldg(w1 + c + stride));
  if (c < chunks) {
    float4 x0 = x4[2 * c], x1 = x4[2 * c + 1];
    acc0 += dot8(__ldg(w0 + c), x0, x1);
    acc1 += dot8(__ldg(w1 + c), x0, x1);
  }
  acc0 = warp_sum(acc0);
  acc1 = warp_sum(acc1);
  if (lane == 0) {
    partial[warp][0] = acc0;
    partial[warp][1] = acc1;
  }
  __syncthreads();
  if (half != 0) return;
  if (glu) {
    if (lane == 0 && n0 < n_) {
      float g = 0.0f, u = 0.0f; // summed as the plain path sums each row
      for (uint32_t s = 0; s < DENSE_SPLIT; s++) g += partial[warp + s][0];
      for (uint32_t s = 0; s < DENSE_SPLIT; s++) u += partial[warp + s][1];
      buf<float>(a, 2)[(uint64_t)row * n_ + n0] = swiglu(g, u);
    }
  } else if (lane < DENSE_ROWS_PER_WARP && n0 + lane < n_) {
    float v = 0.0f;
    for (uint32_t s = 0; s < DENSE_SPLIT; s++) v += partial[warp + s][lane];
    store_dense(a, epi, (uint64_t)row * n_ + n0 + lane, v);
  }
}

// Generic path: warp w of the block computes output blockIdx.x·outs + w (outs = 4, or 2 with SwiGLU,
// whose warp then takes the gate and the up row in turn).
template <int T> __device__ float dense_row_dot(const float *x, const void *w, uint64_t wrow, uint32_t k, uint32_t lane) {
  float acc = 0.0f;
  for (uint32_t i = lane; i < k; i += 32) acc += x[i] * load<T>(w, wrow + i);
  return warp_sum(acc);
}

template <int T> __global__ void k_matmul(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args_early(args);
  const mlxn_params_dense p = mlxn_params_dense_at(a, MLXN_SLOT_MATMUL_F32_DENSE);
  uint32_t m = p.m, n_ = p.n, k = p.k, mode = p.mode;
  uint32_t epi = mode & MM_EPILOGUE_MASK;
  uint32_t row = blockIdx.y, lane = lane_id();
  bool aligned = ((a.ptr[0] | a.ptr[1]) & 15u) == 0; // slices need only be element-aligned
  if constexpr (T == T_BF16) { // (constexpr: only this kernel carries the staging buffer)
    if (k % 8 == 0 && aligned) { // uniform per block: the whole block takes it
      if (row < m) matmul_bf16_rows(a, row, n_, k, epi, (mode & MM_MODE_CONSTANT_WEIGHTS) != 0);
      return;
    }
  }
  wait_producers();
  const uint32_t outs = epi == EPI_SWIGLU ? OUTS_SWIGLU : WARPS, n = blockIdx.x * outs + warp_id();
  if (row >= m || warp_id() >= outs || n >= n_) return;
  const float *x = buf<const float>(a, 0) + (uint64_t)row * k;
  const void *w = buf<const void>(a, 1);
  float acc = dense_row_dot<T>(x, w, (uint64_t)n * k, k, lane);
  if (epi == EPI_SWIGLU) acc = swiglu(acc, dense_row_dot<T>(x, w, ((uint64_t)n_ + n) * k, k, lane));
  if (lane == 0) store_dense(a, epi, (uint64_t)row * n_ + n, acc);
}

// ---- MLX affine ---------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t affine_q(const uint8_t *row, uint32_t k, uint32_t bits) {
  if (bits == 8) return row[k];
  if (bits == 4) return (row[k >> 1] >> ((k & 1u) * 4)) & 0xfu;
  const uint8_t *t = row + (k >> 2) * 3;
  uint32_t v = (uint32_t)t[0] | ((uint32_t)t[1] << 8) | ((uint32_t)t[2] << 16);
  return (v >> ((k & 3u) * 6)) & 0x3fu;
}

template <bool FAST> __global__ void k_affine(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args(args);
  const mlxn_params_affine p = mlxn_params_affine_at(a, MLXN_SLOT_QMATMUL_AFFINE_AFFINE);
  uint32_t m = p.m, n_ = p.n, k = p.k, bits = p.bits, gs = p.group_size;
  uint32_t n = blockIdx.x * (FAST ? MM_OUTS_FAST : WARPS) + warp_id(), row = blockIdx.y, lane = lane_id();
  if (n >= n_ || row >= m) return;
  const float *x = buf<const float>(a, 0) + (uint64_t)row * k;
  uint64_t row_bytes = (uint64_t)k * bits / 8, groups = k / gs;
  const uint8_t *w = buf<const uint8_t>(a, 1) + n * row_bytes;
  const __nv_bfloat16 *sc = buf<const __nv_bfloat16>(a, 2) + n * groups, *bi = buf<const __nv_bfloat16>(a, 3) + n * groups;
  float acc = 0.0f;
  if (FAST) { // 8 values per lane step, all in one group: scale·Σqx + bias·Σx (MLX's formulation)
    for (uint32_t c = lane; c < k / 8; c += 32) {
      uint32_t k0 = c * 8, g = k0 / gs;
      float qx = 0.0f, sx = 0.0f;
      for (uint32_t j = 0; j < 8; j++) {
        qx += (float)affine_q(w, k0 + j, bits) * x[k0 + j];
        sx += x[k0 + j];
      }
      acc += __bfloat162float(sc[g]) * qx + __bfloat162float(bi[g]) * sx;
    }
  } else {
    for (uint32_t i = lane; i < k; i += 32) {
      uint32_t g = i / gs;
      acc += x[i] * (__bfloat162float(sc[g]) * (float)affine_q(w, i, bits) + __bfloat162float(bi[g]));
    }
  }
  acc = warp_sum(acc);
  if (lane == 0) buf<float>(a, 4)[(uint64_t)row * n_ + n] = acc;
}

// ---- MLX affine, any width and scale dtype (as kernels/cpu/matmul.c: a row is one little-endian
// bit stream, code j at bit j·bits; scale type 0 f32, 1 f16, 2 bf16) ---------------------------
__device__ __forceinline__ uint32_t affine_code(const uint8_t *row, uint32_t k, uint32_t bits) {
  uint64_t at = (uint64_t)k * bits;
  uint32_t shift = (uint32_t)(at & 7u), v = row[at >> 3];
  if (shift + bits > 8) v |= (uint32_t)row[(at >> 3) + 1] << 8; // a code spans at most 2 bytes
  return (v >> shift) & ((1u << bits) - 1u);
}

__device__ __forceinline__ float load_scale(const void *p, uint64_t i, uint32_t t) {
  return t == T_F32 ? load<T_F32>(p, i) : t == T_F16 ? load<T_F16>(p, i) : load<T_BF16>(p, i);
}

// Lane `lane`'s share of one output; scales/biases of the row start at group 0 of sc/bi.
__device__ float affine_general_lane(const float *x, const uint8_t *w, const void *sc, const void *bi, uint64_t s0,
                                     uint32_t k, uint32_t bits, uint32_t gs, uint32_t t, uint32_t lane) {
  float acc = 0.0f;
  for (uint32_t i = lane; i < k; i += 32) {
    uint32_t g = i / gs;
    acc += x[i] * (load_scale(sc, s0 + g, t) * (float)affine_code(w, i, bits) + load_scale(bi, s0 + g, t));
  }
  return acc;
}

__global__ void k_affine_general(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args(args);
  const mlxn_params_affine_general p =
      mlxn_params_affine_general_at(a, MLXN_SLOT_QMATMUL_AFFINE_GENERAL_AFFINE_GENERAL);
  uint32_t m = p.m, n_ = p.n, k = p.k, bits = p.bits, gs = p.group_size, t = p.scale_type;
  uint32_t n = blockIdx.x * WARPS + warp_id(), row = blockIdx.y, lane = lane_id();
  if (n >= n_ || row >= m) return;
  const uint8_t *w = buf<const uint8_t>(a, 1) + (uint64_t)n * (k / 8 * bits);
  float acc = affine_general_lane(buf<const float>(a, 0) + (uint64_t)row * k, w, buf<const void>(a, 2),
                                  buf<const void>(a, 3), (uint64_t)n * (k / gs), k, bits, gs, t, lane);
  acc = warp_sum(acc);
  if (lane == 0) buf<float>(a, 4)[(uint64_t)row * n_ + n] = acc;
}

__global__ void k_affine_gather(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args(args);
  const mlxn_params_affine_gather p =
      mlxn_params_affine_gather_at(a, MLXN_SLOT_QMATMUL_AFFINE_GATHER_AFFINE_GATHER);
  uint32_t rows = p.rows, n_ = p.n, k = p.k, top_k = p.top_k, experts = p.n_experts;
  uint32_t bits = p.bits, gs = p.group_size, t = p.scale_type;
  uint32_t n = blockIdx.x * WARPS + warp_id(), r = blockIdx.y, lane = lane_id();
  if (n >= n_ || r >= rows) return;
  uint32_t e = buf<const uint32_t>(a, 4)[r];
  if (e >= experts) { // data-dependent: the dispatch fails, the command buffer reports it
    if (lane == 0) fault(a);
    return;
  }
  uint64_t wr = (uint64_t)e * n_ + n;
  const uint8_t *w = buf<const uint8_t>(a, 1) + wr * (k / 8 * bits);
  float acc = affine_general_lane(buf<const float>(a, 0) + (uint64_t)(r / top_k) * k, w, buf<const void>(a, 2),
                                  buf<const void>(a, 3), wr * (k / gs), k, bits, gs, t, lane);
  acc = warp_sum(acc);
  if (lane == 0) buf<float>(a, 5)[(uint64_t)r * n_ + n] = acc;
}

// ---- ggml blocks -------------------------------------------------------------------------------
// The block formats and their sizes: native/contracts/quant_blocks.h. Each family's kernels share
// one slot layout, so the templates read their parameters at the first kernel's slot.
static_assert(MLXN_SLOT_MATMUL_F32_DENSE == MLXN_SLOT_MATMUL_BF16_DENSE &&
                  MLXN_SLOT_MATMUL_F32_DENSE == MLXN_SLOT_MATMUL_F16_DENSE &&
                  MLXN_SLOT_QMATMUL_AFFINE_AFFINE == MLXN_SLOT_QMATMUL_AFFINE_FAST_AFFINE &&
                  MLXN_SLOT_QMATMUL_Q4_0_MV_GGML == MLXN_SLOT_QMATMUL_Q6_K_MM_GGML &&
                  MLXN_SLOT_QMATMUL_ID_Q4_0_GGML_ID == MLXN_SLOT_QMATMUL_ID_Q5_K_GGML_ID,
              "one slot layout per family");

__device__ __forceinline__ float half_at(const uint8_t *p) {
  return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

// ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j from the 12 packed bytes.
__device__ __forceinline__ void scale_min_k4(uint32_t j, const uint8_t *q, uint32_t &sc, uint32_t &m) {
  if (j < 4) {
    sc = q[j] & 63u;
    m = q[j + 4] & 63u;
  } else {
    sc = (q[j + 4] & 0xfu) | ((uint32_t)(q[j - 4] >> 6) << 4);
    m = (uint32_t)(q[j + 4] >> 4) | ((uint32_t)(q[j] >> 6) << 4);
  }
}

// This lane's share of dot(x[0..k), row): 32-value formats' lanes take whole blocks, Q4_K/Q5_K
// lanes 32-value sub-blocks and Q6_K lanes 16-value sub-blocks (a 256-value block would leave most
// lanes idle).
template <int F> __device__ float ggml_lane_dot(const uint8_t *row, const float *x, uint32_t k, uint32_t lane) {
  float acc = 0.0f;
  if (F == GGML_Q4_1 || F == GGML_Q5_0 || F == GGML_Q5_1) {
    // d, [m], [qh u32], qs[16]: value j < 16 is the low nibble of qs[j], j + 16 the high one; qh
    // bit j is value j's 5th bit. Q5_0 subtracts 16, the _1 formats add m.
    constexpr uint32_t qs_at = F == GGML_Q4_1 ? 4 : F == GGML_Q5_0 ? 6 : 8, qh_at = F == GGML_Q5_0 ? 2 : 4;
    for (uint32_t b = lane; b < k / 32; b += 32) {
      const uint8_t *blk = row + (uint64_t)b * ggml_block_bytes(F);
      float d = half_at(blk), m = F == GGML_Q5_0 ? 0.0f : half_at(blk + 2);
      uint32_t qh = 0;
      if (F != GGML_Q4_1)
        qh = (uint32_t)blk[qh_at] | ((uint32_t)blk[qh_at + 1] << 8) | ((uint32_t)blk[qh_at + 2] << 16) |
             ((uint32_t)blk[qh_at + 3] << 24);
      const float *xb = x + (uint64_t)b * 32;
      for (uint32_t j = 0; j < 16; j++) {
        uint32_t q = blk[qs_at + j];
        int lo = (int)((q & 0xfu) | (((qh >> j) & 1u) << 4)), hi = (int)((q >> 4) | (((qh >> (j + 16)) & 1u) << 4));
        if (F == GGML_Q5_0) {
          acc += xb[j] * ((float)(lo - 16) * d);
          acc += xb[j + 16] * ((float)(hi - 16) * d);
        } else {
          acc += xb[j] * ((float)lo * d + m);
          acc += xb[j + 16] * ((float)hi * d + m);
        }
      }
    }
  } else if (F == GGML_Q4_K || F == GGML_Q5_K) {
    // d, dmin, scales[12], [qh[32]], qs[128]: sub-block j is d·sc_j·q − dmin·m_j, q the low (even
    // j) or high (odd j) nibbles of qs[32·(j/2)..], plus 16 where bit j of qh[l] is set (Q5_K).
    for (uint32_t sb = lane; sb < k / 32; sb += 32) {
      const uint8_t *blk = row + (uint64_t)(sb / 8) * ggml_block_bytes(F);
      uint32_t j = sb % 8, sc, mn;
      scale_min_k4(j, blk + 4, sc, mn);
      float d1 = half_at(blk) * (float)sc, m1 = half_at(blk + 2) * (float)mn;
      const uint8_t *q = blk + (F == GGML_Q5_K ? 48 : 16) + (j / 2) * 32;
      const float *xb = x + (uint64_t)sb * 32;
      for (uint32_t l = 0; l < 32; l++) {
        uint32_t v = (j & 1u) ? (uint32_t)(q[l] >> 4) : (q[l] & 0xfu);
        if (F == GGML_Q5_K) v |= (((uint32_t)blk[16 + l] >> j) & 1u) << 4;
        acc += xb[l] * (d1 * (float)v - m1);
      }
    }
  } else if (F == GGML_Q4_0 || F == GGML_Q8_0) {
    for (uint32_t b = lane; b < k / 32; b += 32) {
      const uint8_t *blk = row + (uint64_t)b * ggml_block_bytes(F);
      float d = half_at(blk);
      const float *xb = x + b * 32;
      if (F == GGML_Q4_0) {
        for (int j = 0; j < 16; j++) {
          acc += xb[j] * ((float)((int)(blk[2 + j] & 0xf) - 8) * d);
          acc += xb[j + 16] * ((float)((int)(blk[2 + j] >> 4) - 8) * d);
        }
      } else {
        for (int j = 0; j < 32; j++) acc += xb[j] * ((float)(int8_t)blk[2 + j] * d);
      }
    }
  } else {
    for (uint32_t sb = lane; sb < k / 16; sb += 32) {
      const uint8_t *blk = row + (uint64_t)(sb / 16) * 210;
      float ds = half_at(blk + 208) * (float)(int8_t)blk[192 + (sb % 16)];
      uint32_t v0 = (sb % 16) * 16;
      const float *xb = x + (uint64_t)(sb / 16) * 256;
      for (uint32_t j = 0; j < 16; j++) {
        uint32_t v = v0 + j, half = v >> 7, off = v & 127, quad = off >> 5, l = off & 31;
        uint8_t ql = blk[half * 64 + l + (quad & 1) * 32];
        uint32_t low = quad < 2 ? (ql & 0xf) : (ql >> 4);
        uint32_t high = (blk[128 + half * 32 + l] >> (2 * quad)) & 3;
        acc += xb[v] * (ds * (float)((int)(low | (high << 4)) - 32));
      }
    }
  }
  return acc;
}

template <int F, bool MV> __global__ void k_ggml(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args(args);
  const mlxn_params_ggml p = mlxn_params_ggml_at(a, MLXN_SLOT_QMATMUL_Q4_0_MV_GGML); // every format's slot
  uint32_t m = p.m, n_ = p.n, k = p.k;
  uint32_t n = blockIdx.x * WARPS + warp_id(), lane = lane_id();
  if (n >= n_) return;
  uint64_t row_bytes = (uint64_t)(k / ggml_block_values(F)) * ggml_block_bytes(F);
  const uint8_t *w = buf<const uint8_t>(a, 1) + n * row_bytes;
  uint32_t r0 = MV ? 0 : blockIdx.y, r1 = MV ? m : blockIdx.y + 1;
  for (uint32_t r = r0; r < r1 && r < m; r++) {
    float acc = warp_sum(ggml_lane_dot<F>(w, buf<const float>(a, 0) + (uint64_t)r * k, k, lane));
    if (lane == 0) buf<float>(a, 2)[(uint64_t)r * n_ + n] = acc;
  }
}

template <int F> __global__ void k_ggml_id(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args(args);
  const mlxn_params_ggml_id p = mlxn_params_ggml_id_at(a, MLXN_SLOT_QMATMUL_ID_Q4_0_GGML_ID); // every format's slot
  uint32_t rows = p.rows, n_ = p.n, k = p.k, top_k = p.top_k, experts = p.n_experts;
  uint32_t n = blockIdx.x * WARPS + warp_id(), r = blockIdx.y, lane = lane_id();
  if (n >= n_ || r >= rows) return;
  uint32_t e = buf<const uint32_t>(a, 2)[r];
  if (e >= experts) { // data-dependent: the dispatch fails, the command buffer reports it
    if (lane == 0) fault(a);
    return;
  }
  uint64_t row_bytes = (uint64_t)(k / ggml_block_values(F)) * ggml_block_bytes(F);
  const uint8_t *w = buf<const uint8_t>(a, 1) + ((uint64_t)e * n_ + n) * row_bytes;
  float acc = warp_sum(ggml_lane_dot<F>(w, buf<const float>(a, 0) + (uint64_t)(r / top_k) * k, k, lane));
  if (lane == 0) buf<float>(a, 3)[(uint64_t)r * n_ + n] = acc;
}

MLXN_CUDA_KERNEL(matmul_f32, (k_matmul<T_F32>));
MLXN_CUDA_KERNEL(matmul_bf16, (k_matmul<T_BF16>));
MLXN_CUDA_KERNEL(matmul_f16, (k_matmul<T_F16>));
MLXN_CUDA_KERNEL(qmatmul_affine, (k_affine<false>));
MLXN_CUDA_KERNEL(qmatmul_affine_fast, (k_affine<true>));
MLXN_CUDA_KERNEL(qmatmul_affine_general, (k_affine_general));
MLXN_CUDA_KERNEL(qmatmul_affine_gather, (k_affine_gather));
#define GGML_FORMAT(f, F)                                                                          \
  MLXN_CUDA_KERNEL(qmatmul_##f##_mv, (k_ggml<GGML_##F, true>));                                    \
  MLXN_CUDA_KERNEL(qmatmul_##f##_mm, (k_ggml<GGML_##F, false>));                                   \
  MLXN_CUDA_KERNEL(qmatmul_id_##f, (k_ggml_id<GGML_##F>));
MLXN_GGML_FORMATS(GGML_FORMAT)
