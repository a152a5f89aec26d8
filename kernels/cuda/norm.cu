// Row CUDA kernels: one block per row. The row reduction is a fixed tree over blockDim.x threads,
// shared by the unfused and fused kernels, so fusion stays bit-identical on this backend.
#include "common.cuh"

extern __shared__ float shmem[];

template <int T> __device__ __forceinline__ float row_inv_rms(const void *x, uint64_t base, uint32_t dim, float eps) {
  float part = 0.0f;
  for (uint32_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = load<T>(x, base + i);
    part += v * v;
  }
  float sum = block_sum(part, shmem);
  return 1.0f / sqrtf(sum / (float)dim + eps);
}

__device__ __forceinline__ uint64_t row_index() {
  return ((uint64_t)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
}

// Elements per thread kept in registers by the rms_norm fast path (dim <= ROW_REGS · blockDim.x):
// every load of the row is issued before the reduction, so the kernel pays one memory round trip
// instead of two. Longer rows take the streaming loop.
#define ROW_REGS 8

// MODE 0: rms_norm (in, w, out, params); 1: rms_norm_mul (in, w, scale, out, params);
// 2: rms_norm_mul_add (in, w, scale, residual, out, params); 3: rms_norm_no_scale (in, out, params).
// The per-element arithmetic is one function, so both paths and all modes round identically.
template <int T, int MODE> __device__ __forceinline__ float rms_out(float x, float inv, float w, float sc, float res) {
  float v = __fmul_rn(x, inv);
  if (MODE == 3) return v;
  // Explicit _rn intrinsics: never contracted into an FMA, so the fused kernels round exactly
  // like the unfused mul and add kernels do.
  float n = __fmul_rn(v, w);
  if (MODE == 0) return n;
  float m = __fmul_rn(round_to<T>(n), sc);
  if (MODE == 2) m = __fadd_rn(round_to<T>(m), res);
  return m;
}

template <int T, int MODE> __global__ void k_rms_norm(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args(args);
  const int pslot = MODE == 0   ? MLXN_SLOT_RMS_NORM_F32_NORM
                    : MODE == 1 ? MLXN_SLOT_RMS_NORM_MUL_F32_NORM
                    : MODE == 2 ? MLXN_SLOT_RMS_NORM_MUL_ADD_F32_NORM
                                : MLXN_SLOT_RMS_NORM_NO_SCALE_F32_NORM;
  const int oslot = MODE == 0 ? 2 : MODE == 1 ? 3 : MODE == 2 ? 4 : 1;
  const mlxn_params_norm p = mlxn_params_norm_at(a, pslot);
  const float eps = p.eps;
  const uint32_t dim = p.dim;
  uint64_t base = row_index() * dim;
  const void *x = buf<const void>(a, 0), *w = buf<const void>(a, 1), *sc = buf<const void>(a, 2);
  const void *res = buf<const void>(a, 3);
  void *out = buf<void>(a, oslot);
  if (dim <= ROW_REGS * blockDim.x) {
    float xv[ROW_REGS], wv[ROW_REGS], sv[ROW_REGS], rv[ROW_REGS];
    float part = 0.0f;
#pragma unroll
    for (int j = 0; j < ROW_REGS; j++) {
      uint32_t i = threadIdx.x + j * blockDim.x;
      bool in = i < dim;
      xv[j] = in ? load<T>(x, base + i) : 0.0f;
      wv[j] = in && MODE != 3 ? load<T>(w, i) : 0.0f;
      sv[j] = in && (MODE == 1 || MODE == 2) ? load<T>(sc, base + i) : 0.0f;
      rv[j] = in && MODE == 2 ? load<T>(res, base + i) : 0.0f;
      part += xv[j] * xv[j]; // zeros past the row add nothing, in the loop's order
    }
    float inv = 1.0f / sqrtf(block_sum(part, shmem) / (float)dim + eps);
#pragma unroll
    for (int j = 0; j < ROW_REGS; j++) {
      uint32_t i = threadIdx.x + j * blockDim.x;
      if (i < dim) store<T>(out, base + i, rms_out<T, MODE>(xv[j], inv, wv[j], sv[j], rv[j]));
    }
    return;
  }
  float inv = row_inv_rms<T>(x, base, dim, eps);
  for (uint32_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float wi = MODE != 3 ? load<T>(w, i) : 0.0f;
    float si = MODE == 1 || MODE == 2 ? load<T>(sc, base + i) : 0.0f;
    float ri = MODE == 2 ? load<T>(res, base + i) : 0.0f;
    store<T>(out, base + i, rms_out<T, MODE>(load<T>(x, base + i), inv, wi, si, ri));
  }
}

__global__ void k_softmax(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args(args);
  uint32_t cols = mlxn_params_softmax_at(a, MLXN_SLOT_SOFTMAX_F32_SOFTMAX).cols;
  uint64_t base = row_index() * cols;
  const float *x = buf<const float>(a, 0);
  float *y = buf<float>(a, 1);
  float m = -INFINITY;
  for (uint32_t i = threadIdx.x; i < cols; i += blockDim.x) m = fmaxf(m, x[base + i]);
  m = block_max(m, shmem);
  float part = 0.0f;
  for (uint32_t i = threadIdx.x; i < cols; i += blockDim.x) part += expf(x[base + i] - m);
  float inv = 1.0f / block_sum(part, shmem);
  for (uint32_t i = threadIdx.x; i < cols; i += blockDim.x) y[base + i] = expf(x[base + i] - m) * inv;
}

MLXN_CUDA_KERNEL(rms_norm_f32, (k_rms_norm<T_F32, 0>));
MLXN_CUDA_KERNEL(rms_norm_f16, (k_rms_norm<T_F16, 0>));
MLXN_CUDA_KERNEL(rms_norm_bf16, (k_rms_norm<T_BF16, 0>));
MLXN_CUDA_KERNEL(rms_norm_mul_f32, (k_rms_norm<T_F32, 1>));
MLXN_CUDA_KERNEL(rms_norm_mul_f16, (k_rms_norm<T_F16, 1>));
MLXN_CUDA_KERNEL(rms_norm_mul_bf16, (k_rms_norm<T_BF16, 1>));
MLXN_CUDA_KERNEL(rms_norm_mul_add_f32, (k_rms_norm<T_F32, 2>));
MLXN_CUDA_KERNEL(rms_norm_mul_add_f16, (k_rms_norm<T_F16, 2>));
MLXN_CUDA_KERNEL(rms_norm_mul_add_bf16, (k_rms_norm<T_BF16, 2>));
MLXN_CUDA_KERNEL(rms_norm_no_scale_f32, (k_rms_norm<T_F32, 3>));
MLXN_CUDA_KERNEL(softmax_f32, (k_softmax));
