// Rotary embeddings (f32), one thread per rotated pair, as the CPU kernels.
#include "common.cuh"

__global__ void k_rope(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args(args);
  uint32_t i = blockIdx.x * a.tg[0] + threadIdx.x, t = blockIdx.y * a.tg[1] + threadIdx.y;
  const mlxn_params_rope p = mlxn_params_rope_at(a, MLXN_SLOT_ROPE_F32_ROPE);
  const float theta = p.theta;
  const uint32_t hd = p.head_dim, seq = p.seq_len;
  if (i >= hd / 2 || i >= a.grid[0] || t >= seq || t >= a.grid[1]) return;
  float freq = powf(theta, -2.0f * (float)i / (float)hd);
  float ang = (float)buf<const uint32_t>(a, MLXN_SLOT_ROPE_F32_POSITIONS)[t] * freq;
  float c = cosf(ang), s = sinf(ang);
  uint64_t j = (uint64_t)t * hd + 2 * i;
  const float *in = buf<const float>(a, 0);
  float x0 = in[j], x1 = in[j + 1];
  float *out = buf<float>(a, 1);
  out[j] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
  out[j + 1] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

// Pair i of a row: (i, i + rope_dim/2) (NeoX) or (2i, 2i + 1) (ADJACENT: ggml's normal mode). Both
// kernels share rope_neox_f32's slot layout (asserted by their validators).
template <bool ADJACENT> __global__ void k_rope_heads(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args(args);
  uint32_t i = blockIdx.x * a.tg[0] + threadIdx.x, r = blockIdx.y * a.tg[1] + threadIdx.y;
  const mlxn_params_rope_heads p = mlxn_params_rope_heads_at(a, MLXN_SLOT_ROPE_NEOX_F32_ROPE_HEADS);
  const mlxn_params_rope_layout l = mlxn_params_rope_layout_at(a, MLXN_SLOT_ROPE_NEOX_F32_ROPE_LAYOUT);
  const float theta = p.theta;
  const uint32_t hd = p.head_dim, rd = p.rope_dim, heads = l.n_heads, has_ff = l.has_freq_factors;
  uint32_t half = rd / 2;
  if (i >= half || i >= a.grid[0] || r >= a.grid[1]) return;
  // Step state: token t at position state[0] + t, rows moved by state[0]·out_pos_stride; a position
  // at or past max_pos fails the dispatch and writes nothing.
  uint32_t has_state = l.has_state, base = has_state ? buf<const uint32_t>(a, MLXN_SLOT_ROPE_NEOX_F32_STATE)[0] : 0;
  if (has_state && base >= l.max_pos) {
    fault(a);
    return;
  }
  float freq = powf(theta, -2.0f * (float)i / (float)rd);
  if (has_ff) freq = freq / buf<const float>(a, MLXN_SLOT_ROPE_NEOX_F32_FREQ_FACTORS)[i];
  uint32_t tpos = has_state ? base + r / heads : buf<const uint32_t>(a, MLXN_SLOT_ROPE_NEOX_F32_POSITIONS)[r / heads];
  float ang = (float)tpos * freq;
  float c = cosf(ang), s = sinf(ang);
  uint64_t row = (uint64_t)r * hd; // output row: token r / heads at its stride, head r % heads at its
  uint64_t orow = (uint64_t)base * l.out_pos_stride + (uint64_t)(r / heads) * l.out_token_stride +
                  (uint64_t)(r % heads) * l.out_head_stride;
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
