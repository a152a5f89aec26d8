// Rotary embeddings (f32), one thread per rotated pair, as the CPU kernels.
#include "common.cuh"

__global__ void k_rope(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args(args);
  uint32_t i = blockIdx.x * a.tg[0] + threadIdx.x, t = blockIdx.y * a.tg[1] + threadIdx.y;
  float theta = arg_f32(a, 2, 0);
  uint32_t hd = arg_u32(a, 2, 4), seq = arg_u32(a, 2, 8);
  if (i >= hd / 2 || i >= a.grid[0] || t >= seq || t >= a.grid[1]) return;
  float freq = powf(theta, -2.0f * (float)i / (float)hd);
  float ang = (float)buf<const uint32_t>(a, 3)[t] * freq;
  float c = cosf(ang), s = sinf(ang);
  uint64_t j = (uint64_t)t * hd + 2 * i;
  const float *in = buf<const float>(a, 0);
  float x0 = in[j], x1 = in[j + 1];
  float *out = buf<float>(a, 1);
  out[j] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
  out[j + 1] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

// Pair i of a row: (i, i + rope_dim/2) (NeoX) or (2i, 2i + 1) (ADJACENT: ggml's normal mode).
template <bool ADJACENT> __global__ void k_rope_heads(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args(args);
  uint32_t i = blockIdx.x * a.tg[0] + threadIdx.x, r = blockIdx.y * a.tg[1] + threadIdx.y;
  float theta = arg_f32(a, 2, 0);
  uint32_t hd = arg_u32(a, 2, 4), rd = arg_u32(a, 2, 8), heads = arg_u32(a, 4, 0), has_ff = arg_u32(a, 4, 4);
  uint32_t half = rd / 2;
  if (i >= half || i >= a.grid[0] || r >= a.grid[1]) return;
  // Step state: token t at position state[0] + t, rows moved by state[0]·out_pos_stride; a position
  // at or past max_pos fails the dispatch and writes nothing.
  uint32_t has_state = arg_u32(a, 4, 16), base = has_state ? buf<const uint32_t>(a, 6)[0] : 0;
  if (has_state && base >= arg_u32(a, 4, 24)) {
    fault(a);
    return;
  }
  float freq = powf(theta, -2.0f * (float)i / (float)rd);
  if (has_ff) freq = freq / buf<const float>(a, 5)[i];
  uint32_t tpos = has_state ? base + r / heads : buf<const uint32_t>(a, 3)[r / heads];
  float ang = (float)tpos * freq;
  float c = cosf(ang), s = sinf(ang);
  uint64_t row = (uint64_t)r * hd; // output row: token r / heads at its stride, head r % heads at its
  uint64_t orow = (uint64_t)base * arg_u32(a, 4, 20) + (uint64_t)(r / heads) * arg_u32(a, 4, 12) +
                  (uint64_t)(r % heads) * arg_u32(a, 4, 8);
  const float *in = buf<const float>(a, 0);
  float *out = buf<float>(a, 1);
  const uint32_t i0 = ADJACENT ? 2 * i : i, i1 = ADJACENT ? 2 * i + 1 : i + half;
  float x0 = in[row + i0], x1 = in[row + i1];
  out[orow + i0] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
  out[orow + i1] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
  for (uint32_t d = rd + i; d < hd; d += half) out[orow + d] = in[row + d]; // unrotated tail
}

MLXN_CUDA_KERNEL(rope_f32, (k_rope));
MLXN_CUDA_KERNEL(rope_neox_f32, (k_rope_heads<false>));
MLXN_CUDA_KERNEL(rope_norm_f32, (k_rope_heads<true>));
