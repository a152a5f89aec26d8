// Elementwise CUDA kernels: one thread per element (the CPU kernels' per-thread bodies).
#include "common.cuh"

// The binary kernels (add, mul, silu_mul) share one slot layout (asserted by their validators).
#define BINARY_PARAMS MLXN_SLOT_ELEMENTWISE_ADD_F32_N

template <int T, int OP> __global__ void k_binary(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args(args);
  uint64_t i = thread_x(a), n = mlxn_params_n_at(a, BINARY_PARAMS).n;
  if (i >= n || i >= a.grid[0]) return;
  float x = load<T>(buf<void>(a, 0), i), y = load<T>(buf<void>(a, 1), i);
  store<T>(buf<void>(a, 2), i, OP == 0 ? __fadd_rn(x, y) : __fmul_rn(x, y));
}

__device__ __forceinline__ float gelu_tanh(float x) {
  float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  inner = fminf(15.0f, fmaxf(-15.0f, inner)); // clamp: tanh is saturated long before
  return 0.5f * x * (1.0f + tanhf(inner));
}

template <int T, int FN> __global__ void k_unary(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args(args);
  uint64_t i = thread_x(a);
  if (i >= a.grid[0]) return;
  float x = load<T>(buf<void>(a, 0), i);
  store<T>(buf<void>(a, 1), i, FN == 0 ? gelu_tanh(x) : silu_f(x));
}

// SwiGLU: silu(gate) rounded to the storage type, times up (equals the silu → mul pair).
template <int T> __global__ void k_silu_mul(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args(args);
  uint64_t i = thread_x(a), n = mlxn_params_n_at(a, BINARY_PARAMS).n;
  if (i >= n || i >= a.grid[0]) return;
  float g = load<T>(buf<void>(a, 0), i);
  g = round_to<T>(silu_f(g));
  store<T>(buf<void>(a, 2), i, __fmul_rn(g, load<T>(buf<void>(a, 1), i)));
}

__global__ void k_softcap(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args(args);
  uint64_t i = thread_x(a);
  const mlxn_params_softcap p = mlxn_params_softcap_at(a, MLXN_SLOT_SOFTCAP_F32_SOFTCAP);
  if (i >= p.n || i >= a.grid[0]) return;
  const float c = p.cap;
  buf<float>(a, 1)[i] = tanhf(buf<const float>(a, 0)[i] / c) * c;
}

__global__ void k_axpby(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args(args);
  uint64_t i = thread_x(a);
  const mlxn_params_axpby p = mlxn_params_axpby_at(a, MLXN_SLOT_AXPBY_F32_AXPBY);
  if (i >= p.n || i >= a.grid[0]) return;
  const float alpha = p.alpha, beta = p.beta;
  float x = buf<const float>(a, 0)[i], y = buf<const float>(a, 1)[i];
  buf<float>(a, 2)[i] = __fadd_rn(__fmul_rn(alpha, x), __fmul_rn(beta, y)); // no FMA contraction
}

// scale_f32: out = alpha · x (slots and parameter block from the generated contract header).
__global__ void k_scale(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args(args);
  uint64_t i = thread_x(a);
  const mlxn_params_scale p = mlxn_params_scale_at(a, MLXN_SLOT_SCALE_F32_SCALE);
  if (i >= p.n || i >= a.grid[0]) return;
  buf<float>(a, MLXN_SLOT_SCALE_F32_OUT)[i] = __fmul_rn(p.alpha, buf<const float>(a, MLXN_SLOT_SCALE_F32_X)[i]);
}

__global__ void k_strided_copy(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args(args);
  uint32_t c = blockIdx.x * a.tg[0] + threadIdx.x, r = blockIdx.y * a.tg[1] + threadIdx.y;
  const mlxn_params_strided_copy p = mlxn_params_strided_copy_at(a, MLXN_SLOT_STRIDED_COPY_F32_STRIDED_COPY);
  const uint32_t ss = p.src_stride, ds = p.dst_stride;
  if (c >= p.cols || r >= p.rows || c >= a.grid[0] || r >= a.grid[1]) return;
  uint64_t o = 0;
  if (p.has_state) { // step state: rows moved by state[0]·dst_pos_stride, bounded by max_pos
    uint32_t pos = buf<const uint32_t>(a, MLXN_SLOT_STRIDED_COPY_F32_STATE)[0];
    if (pos >= p.max_pos) {
      fault(a);
      return;
    }
    o = (uint64_t)pos * p.dst_pos_stride;
  }
  buf<float>(a, 1)[o + (uint64_t)r * ds + c] = buf<const float>(a, 0)[(uint64_t)r * ss + c];
}

__global__ void k_debug_fault(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args(args);
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  if (mlxn_params_debug_fault_at(a, MLXN_SLOT_DEBUG_FAULT_DEBUG_FAULT).fail) fault(a);
  else buf<uint32_t>(a, 0)[0] = 1;
}

MLXN_CUDA_KERNEL(elementwise_add_f32, (k_binary<T_F32, 0>));
MLXN_CUDA_KERNEL(elementwise_add_f16, (k_binary<T_F16, 0>));
MLXN_CUDA_KERNEL(elementwise_add_bf16, (k_binary<T_BF16, 0>));
MLXN_CUDA_KERNEL(elementwise_mul_f32, (k_binary<T_F32, 1>));
MLXN_CUDA_KERNEL(elementwise_mul_f16, (k_binary<T_F16, 1>));
MLXN_CUDA_KERNEL(elementwise_mul_bf16, (k_binary<T_BF16, 1>));
MLXN_CUDA_KERNEL(gelu_f32, (k_unary<T_F32, 0>));
MLXN_CUDA_KERNEL(gelu_f16, (k_unary<T_F16, 0>));
MLXN_CUDA_KERNEL(gelu_bf16, (k_unary<T_BF16, 0>));
MLXN_CUDA_KERNEL(silu_f32, (k_unary<T_F32, 1>));
MLXN_CUDA_KERNEL(silu_f16, (k_unary<T_F16, 1>));
MLXN_CUDA_KERNEL(silu_bf16, (k_unary<T_BF16, 1>));
MLXN_CUDA_KERNEL(silu_mul_f32, (k_silu_mul<T_F32>));
MLXN_CUDA_KERNEL(silu_mul_f16, (k_silu_mul<T_F16>));
MLXN_CUDA_KERNEL(silu_mul_bf16, (k_silu_mul<T_BF16>));
MLXN_CUDA_KERNEL(softcap_f32, (k_softcap));
MLXN_CUDA_KERNEL(axpby_f32, (k_axpby));
MLXN_CUDA_KERNEL(strided_copy_f32, (k_strided_copy));
MLXN_CUDA_KERNEL(debug_fault, (k_debug_fault));
MLXN_CUDA_KERNEL(scale_f32, (k_scale));
