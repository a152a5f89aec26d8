// Shared pieces of the CUDA kernels: the argument block every kernel receives by value, dtype
// loads/stores and warp/block reductions. Geometry matches the CPU kernels: blockIdx = threadgroup,
// threadIdx = thread within it, `grid` = threads per dimension (for the non-uniform edge).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#define MLXN_GPU_SLOTS 12
#define MLXN_GPU_BYTES 256

struct mlxn_gpu_args {
  unsigned long long ptr[MLXN_GPU_SLOTS]; // device address of each buffer slot (bytes slots: 0)
  unsigned long long len[MLXN_GPU_SLOTS]; // bytes visible in the slot
  unsigned int boff[MLXN_GPU_SLOTS];      // offset of each inline-bytes slot in `bytes`
  unsigned int grid[3], tg[3], groups[3];
  unsigned int tag;                       // the host's dispatch tag, reported on a fault
  unsigned long long fault;               // device address of the device's fault word
  alignas(16) unsigned char bytes[MLXN_GPU_BYTES];
};

enum mlxn_gpu_type { T_F32 = 0, T_F16 = 1, T_BF16 = 2 };

template <typename P> __device__ __forceinline__ P *buf(const mlxn_gpu_args &a, int slot) {
  return reinterpret_cast<P *>(a.ptr[slot]);
}

template <int T> __device__ __forceinline__ float load(const void *base, uint64_t i) {
  if (T == T_F32) return static_cast<const float *>(base)[i];
  if (T == T_F16) return __half2float(static_cast<const __half *>(base)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16 *>(base)[i]);
}
template <int T> __device__ __forceinline__ void store(void *base, uint64_t i, float v) {
  if (T == T_F32) static_cast<float *>(base)[i] = v;
  else if (T == T_F16) static_cast<__half *>(base)[i] = __float2half_rn(v);
  else static_cast<__nv_bfloat16 *>(base)[i] = __float2bfloat16_rn(v);
}
// What a store followed by a load yields (fused kernels round intermediates like the unfused pair).
template <int T> __device__ __forceinline__ float round_to(float v) {
  if (T == T_F32) return v;
  if (T == T_F16) return __half2float(__float2half_rn(v));
  return __bfloat162float(__float2bfloat16_rn(v));
}

// The first statement of every kernel: `const mlxn_gpu_args &a = kernel_args(args);`. A kernel gets
// a pointer to its arguments in device memory (the backend copies a command buffer's arguments
// once, so a cached graph never needs per-node updates). The block copies them into shared memory,
// then waits for its producers: in a CUDA graph with programmatic edges (compute capability 9.0+)
// a kernel may start while the kernels it depends on still run, so the copy (which depends on no
// kernel) overlaps them, and every later read of an argument is a shared-memory read. The wait
// returns once the producers have completed and their writes are visible; elsewhere at once.
// A kernel with work that reads nothing a producer writes (loading weights) splits the two:
// `kernel_args_early`, that work, then `wait_producers()` before touching any producer's output.
__device__ __forceinline__ const mlxn_gpu_args &kernel_args_early(const mlxn_gpu_args *__restrict__ args) {
  __shared__ mlxn_gpu_args local;
  static_assert(sizeof(mlxn_gpu_args) % 16 == 0, "copied in 16-byte pieces");
  const uint32_t tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const uint32_t threads = blockDim.x * blockDim.y * blockDim.z;
  const uint4 *src = reinterpret_cast<const uint4 *>(args);
  uint4 *dst = reinterpret_cast<uint4 *>(&local);
  for (uint32_t i = tid; i < sizeof(mlxn_gpu_args) / 16; i += threads) dst[i] = __ldg(src + i);
  __syncthreads();
  return local;
}
__device__ __forceinline__ void wait_producers() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ const mlxn_gpu_args &kernel_args(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args_early(args);
  wait_producers();
  return a;
}

// x · sigmoid(x): shared by silu, silu_mul and the fused SwiGLU epilogue so that they agree bit for bit.
__device__ __forceinline__ float silu_f(float g) { return g / (1.0f + expf(-g)); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Deterministic block reductions over blockDim.x threads (a power of two), through `sh` (one
// float per warp): shuffles within each warp, then the first warp combines the warps' results.
// Every thread gets the result; `sh` is free again on return.
template <typename Op> __device__ __forceinline__ float block_reduce(float v, float *sh, Op op) {
  const unsigned n = blockDim.x, lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  if (n <= 32) { // one warp, possibly partial: xor partners stay inside the n active lanes
    const unsigned mask = n == 32 ? 0xffffffffu : (1u << n) - 1u;
    for (unsigned o = n / 2; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(mask, v, o));
    return v;
  }
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = sh[lane < n / 32 ? lane : 0];
    for (unsigned o = 16; o > 0; o >>= 1) {
      float other = __shfl_xor_sync(0xffffffffu, w, o);
      if ((lane ^ o) < n / 32 && lane < n / 32) w = op(w, other);
    }
    if (lane == 0) sh[0] = w;
  }
  __syncthreads();
  float r = sh[0];
  __syncthreads();
  return r;
}
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
__device__ __forceinline__ float block_sum(float v, float *sh) { return block_reduce(v, sh, SumOp()); }
__device__ __forceinline__ float block_max(float v, float *sh) { return block_reduce(v, sh, MaxOp()); }

// Reports a data-dependent failure of this dispatch (e.g. an expert id out of range).
__device__ __forceinline__ void fault(const mlxn_gpu_args &a) {
  atomicCAS(reinterpret_cast<unsigned int *>(a.fault), 0u, a.tag + 1u);
}

__device__ __forceinline__ uint64_t thread_x(const mlxn_gpu_args &a) {
  return (uint64_t)blockIdx.x * a.tg[0] + threadIdx.x;
}

// A kernel of this backend: name (as in the contract), entry point, and the floats of dynamic shared
// memory it needs per thread (the contract's threadgroup-memory rule).
struct mlxn_cuda_kernel {
  const char *name;
  const void *func;
  int shared_floats_per_thread;
};

// Names FN (a __global__ function) as the body of kernel NAME; the generated table
// (kernels/cuda/table.gen.cu) refers to every described kernel's body, so a missing one fails the link.
#define MLXN_CUDA_KERNEL(NAME, FN)                                                                  \
  extern const void *const mlxn_cuda_fn_##NAME;                                                    \
  const void *const mlxn_cuda_fn_##NAME = (const void *)(FN)

// The kernel called `name`, or null (kernels/cuda/table.gen.cu).
const mlxn_cuda_kernel *mlxn_cuda_find_kernel(const char *name);

// Readers of the parameter blocks, generated from the kernel descriptions.
#include "params.gen.cuh"
