// Attention on CUDA. sdpa: one thread per query row (grid (batch, heads, ceil(seq/32)), 32 threads).
// flash_attn_vec: one warp per (head, workgroup); each lane owns head_dim/32 dimensions, a score
// is a warp-wide sum; then a reduce kernel combines the workgroups. Online softmax in f32.
#include "common.cuh"

#define MAX_HEAD_DIM 512

template <int T> __global__ void k_sdpa(const mlxn_gpu_args a) {
  uint32_t heads = arg_u32(a, 4, 0), kv_heads = arg_u32(a, 4, 4), hd = arg_u32(a, 4, 8);
  uint32_t seq = arg_u32(a, 4, 12), kv_len = arg_u32(a, 4, 16), kv_cap = arg_u32(a, 4, 24);
  float scale = arg_f32(a, 4, 20);
  uint32_t b = blockIdx.x, h = blockIdx.y, r = blockIdx.z * 32 + threadIdx.x;
  if (h >= heads || r >= seq) return;
  uint32_t kvh = h / (heads / kv_heads);
  uint64_t qo = (((uint64_t)b * heads + h) * seq + r) * hd;
  uint64_t kbase = (((uint64_t)b * kv_heads + kvh) * kv_cap) * hd;
  const void *Q = buf<const void>(a, 0), *K = buf<const void>(a, 1), *V = buf<const void>(a, 2);
  float acc[MAX_HEAD_DIM];
  for (uint32_t d = 0; d < hd; d++) acc[d] = 0.0f;
  uint32_t last = kv_len - seq + r;
  float m = -INFINITY, l = 0.0f;
  for (uint32_t k = 0; k <= last; k++) {
    uint64_t ko = kbase + (uint64_t)k * hd;
    float s = 0.0f;
    for (uint32_t d = 0; d < hd; d++) s += load<T>(Q, qo + d) * load<T>(K, ko + d);
    s *= scale;
    float mn = fmaxf(m, s), corr = expf(m - mn), w = expf(s - mn);
    l = l * corr + w;
    for (uint32_t d = 0; d < hd; d++) acc[d] = acc[d] * corr + w * load<T>(V, ko + d);
    m = mn;
  }
  for (uint32_t d = 0; d < hd; d++) store<T>(buf<void>(a, 3), qo + d, acc[d] / l);
}

template <int T> __global__ void k_flash_attn_vec(const mlxn_gpu_args a) {
  uint32_t heads = arg_u32(a, 4, 0), kv_heads = arg_u32(a, 4, 4), hd = arg_u32(a, 4, 8);
  uint32_t kv_len = arg_u32(a, 4, 12), kv_cap = arg_u32(a, 4, 16), mask = arg_u32(a, 4, 24);
  uint32_t window = arg_u32(a, 4, 28), nwg = arg_u32(a, 4, 36);
  float scale = arg_f32(a, 4, 20), softcap = arg_f32(a, 4, 32);
  uint32_t h = blockIdx.x, w = blockIdx.y, lane = threadIdx.x;
  if (h >= heads || w >= nwg) return;
  uint32_t per = hd / 32; // 2..16 dimensions per lane
  uint32_t kvh = h / (heads / kv_heads);
  const float *q = buf<const float>(a, 0) + (uint64_t)h * hd;
  const void *K = buf<const void>(a, 1), *V = buf<const void>(a, 2);
  uint64_t kbase = (uint64_t)kvh * kv_cap * hd;
  float ql[16], acc[16];
  for (uint32_t i = 0; i < per; i++) {
    ql[i] = q[lane + 32 * i];
    acc[i] = 0.0f;
  }
  uint32_t chunk = (kv_len + nwg - 1) / nwg, k0 = w * chunk, k1 = min(k0 + chunk, kv_len);
  uint32_t pos = kv_len - 1;
  if (mask == 2 && pos + 1 > window && k0 < pos + 1 - window) k0 = pos + 1 - window;
  float m = -INFINITY, l = 0.0f;
  for (uint32_t k = k0; k < k1; k++) {
    uint64_t ko = kbase + (uint64_t)k * hd + lane;
    float part = 0.0f;
    for (uint32_t i = 0; i < per; i++) part += ql[i] * load<T>(K, ko + 32 * i);
    float s = warp_sum(part) * scale;
    if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
    float mn = fmaxf(m, s), corr = expf(m - mn), e = expf(s - mn);
    l = l * corr + e;
    for (uint32_t i = 0; i < per; i++) acc[i] = acc[i] * corr + e * load<T>(V, ko + 32 * i);
    m = mn;
  }
  float *out = buf<float>(a, 3) + ((uint64_t)h * nwg + w) * (hd + 2);
  for (uint32_t i = 0; i < per; i++) out[lane + 32 * i] = acc[i];
  if (lane == 0) {
    out[hd] = m; // -inf for an empty chunk
    out[hd + 1] = l;
  }
}

__global__ void k_flash_attn_vec_reduce(const mlxn_gpu_args a) {
  uint32_t heads = arg_u32(a, 2, 0), hd = arg_u32(a, 2, 4), nwg = arg_u32(a, 2, 8);
  uint32_t h = blockIdx.x;
  if (h >= heads) return;
  const float *tmp = buf<const float>(a, 0) + (uint64_t)h * nwg * (hd + 2);
  float m = -INFINITY;
  for (uint32_t w = 0; w < nwg; w++) m = fmaxf(m, tmp[w * (hd + 2) + hd]);
  float l = 0.0f;
  for (uint32_t w = 0; w < nwg; w++) {
    const float *part = tmp + w * (hd + 2);
    if (part[hd + 1] != 0.0f) l += part[hd + 1] * expf(part[hd] - m);
  }
  for (uint32_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.0f;
    for (uint32_t w = 0; w < nwg; w++) {
      const float *part = tmp + w * (hd + 2);
      if (part[hd + 1] != 0.0f) o += part[d] * expf(part[hd] - m);
    }
    buf<float>(a, 1)[(uint64_t)h * hd + d] = o / l;
  }
}

extern const mlxn_cuda_kernel mlxn_cuda_attention_kernels[] = {
    {"sdpa_f32", (const void *)k_sdpa<T_F32>, 0},
    {"sdpa_bf16", (const void *)k_sdpa<T_BF16>, 0},
    {"flash_attn_vec_f32", (const void *)k_flash_attn_vec<T_F32>, 0},
    {"flash_attn_vec_f16", (const void *)k_flash_attn_vec<T_F16>, 0},
    {"flash_attn_vec_reduce", (const void *)k_flash_attn_vec_reduce, 0},
    {nullptr, nullptr, 0},
};
