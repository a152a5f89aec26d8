// Attention on CUDA. sdpa: one thread per query row (grid (batch, heads, ceil(seq/32)), 32 threads).
// flash_attn_vec: one warp per (head, workgroup); each lane owns head_dim/32 dimensions, a score
// is a warp-wide sum; then a reduce kernel combines the workgroups. Online softmax in f32.
#include "common.cuh"

// Each kernel reads its f32 form's slots: sdpa_bf16 and flash_attn_vec_f16 share them (asserted in
// native/contracts/attention.c).
template <int T> __global__ void k_sdpa(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args(args);
  const mlxn_params_sdpa p = mlxn_params_sdpa_at(a, MLXN_SLOT_SDPA_F32_SDPA);
  const uint32_t heads = p.heads, kv_heads = p.kv_heads, hd = p.hd;
  const uint32_t seq = p.seq, kv_len = p.kv_len, kv_cap = p.kv_cap;
  const float scale = p.scale;
  uint32_t b = blockIdx.x, h = blockIdx.y, r = blockIdx.z * MLXN_SDPA_ROWS + threadIdx.x;
  if (h >= heads || r >= seq) return;
  uint32_t kvh = h / (heads / kv_heads);
  uint64_t qo = (((uint64_t)b * heads + h) * seq + r) * hd;
  uint64_t kbase = (((uint64_t)b * kv_heads + kvh) * kv_cap) * hd;
  const void *Q = buf<const void>(a, 0), *K = buf<const void>(a, 1), *V = buf<const void>(a, 2);
  float acc[MLXN_MAX_HEAD_DIM];
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

// The vec kernel's body for PER = head_dim / 32 dimensions per lane, a compile-time constant so the
// query, the accumulator and the step's K/V rows live in registers (a runtime count put them in
// local memory, which made the kernel ~6× slower on its dependent path). A step takes KEYS keys and
// issues all their K and V loads at once: the kernel's latency is one memory round trip per step
// (a workgroup's chunk at ctx 512 and 32 workgroups is one step).
template <int T, int PER>
__device__ __forceinline__ void flash_vec_body(const mlxn_gpu_args &a, uint32_t h, uint32_t w, uint32_t lane) {
  constexpr int KEYS = 64 / PER; // 64 K and 64 V registers per lane
  const mlxn_params_flash p = mlxn_params_flash_at(a, MLXN_SLOT_FLASH_ATTN_VEC_F32_FLASH);
  const uint32_t heads = p.heads, kv_heads = p.kv_heads, kv_cap = p.kv_cap, mask = p.mask;
  const uint32_t window = p.window, nwg = p.nwg;
  const float scale = p.scale, softcap = p.softcap;
  uint32_t kv_len = p.kv_len;
  if (p.has_state) { // step state: keys = state[0] + 1, bounded by kv_len (else fail, touch nothing)
    uint32_t sp = buf<const uint32_t>(a, MLXN_SLOT_FLASH_ATTN_VEC_F32_STATE)[0];
    if (sp >= kv_len) {
      if (lane == 0) fault(a);
      return;
    }
    kv_len = sp + 1;
  }
  const uint32_t hd = PER * 32;
  uint32_t kvh = h / (heads / kv_heads);
  const float *q = buf<const float>(a, 0) + (uint64_t)h * hd;
  const void *K = buf<const void>(a, 1), *V = buf<const void>(a, 2);
  uint64_t kbase = (uint64_t)kvh * kv_cap * hd + lane;
  float ql[PER], acc[PER];
#pragma unroll
  for (int i = 0; i < PER; i++) {
    ql[i] = q[lane + 32 * i];
    acc[i] = 0.0f;
  }
  uint32_t chunk = (kv_len + nwg - 1) / nwg, k0 = w * chunk, k1 = min(k0 + chunk, kv_len);
  uint32_t pos = kv_len - 1;
  if (mask == 2 && pos + 1 > window && k0 < pos + 1 - window) k0 = pos + 1 - window;
  float m = -INFINITY, l = 0.0f;
  for (uint32_t kb = k0; kb < k1; kb += KEYS) {
    // Keys past k1 load nothing and get a -inf score (weight 0).
    float kv[KEYS][PER], vv[KEYS][PER];
#pragma unroll
    for (int j = 0; j < KEYS; j++) {
      uint64_t ro = kbase + (uint64_t)(kb + j) * hd;
      bool in = kb + j < k1;
#pragma unroll
      for (int i = 0; i < PER; i++) {
        kv[j][i] = in ? load<T>(K, ro + 32 * i) : 0.0f;
        vv[j][i] = in ? load<T>(V, ro + 32 * i) : 0.0f;
      }
    }
    float s[KEYS], mn = m;
#pragma unroll
    for (int j = 0; j < KEYS; j++) {
      float part = 0.0f;
#pragma unroll
      for (int i = 0; i < PER; i++) part += ql[i] * kv[j][i];
      float v = warp_sum(part) * scale;
      if (softcap > 0.0f) v = softcap * tanhf(v / softcap);
      s[j] = kb + j < k1 ? v : -INFINITY;
      mn = fmaxf(mn, s[j]);
    }
    float corr = expf(m - mn); // m = -inf on the first step: corr = 0 scales zeros
    l *= corr;
#pragma unroll
    for (int i = 0; i < PER; i++) acc[i] *= corr;
#pragma unroll
    for (int j = 0; j < KEYS; j++) {
      float e = kb + j < k1 ? expf(s[j] - mn) : 0.0f;
      l += e;
#pragma unroll
      for (int i = 0; i < PER; i++) acc[i] += e * vv[j][i];
    }
    m = mn;
  }
  float *out = buf<float>(a, 3) + ((uint64_t)h * nwg + w) * (hd + 2);
#pragma unroll
  for (int i = 0; i < PER; i++) out[lane + 32 * i] = acc[i];
  if (lane == 0) {
    out[hd] = m; // -inf for an empty chunk
    out[hd + 1] = l;
  }
}

template <int T> __global__ void k_flash_attn_vec(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args(args);
  const mlxn_params_flash p = mlxn_params_flash_at(a, MLXN_SLOT_FLASH_ATTN_VEC_F32_FLASH);
  uint32_t h = blockIdx.x, w = blockIdx.y, lane = threadIdx.x;
  if (h >= p.heads || w >= p.nwg) return;
  static_assert(MLXN_MAX_HEAD_DIM / 32 == 16, "the cases below cover head_dim 64..MLXN_MAX_HEAD_DIM");
  switch (p.hd) { // the validator admits the powers of two 64..MLXN_MAX_HEAD_DIM
    case 64: flash_vec_body<T, 2>(a, h, w, lane); break;
    case 128: flash_vec_body<T, 4>(a, h, w, lane); break;
    case 256: flash_vec_body<T, 8>(a, h, w, lane); break;
    default: flash_vec_body<T, 16>(a, h, w, lane); break;
  }
}

// Workgroups whose partial results a thread loads at once (more are taken in further rounds).
#define REDUCE_BATCH 32

// One block per head; thread d combines output dimension d. Each thread loads the (m, l) pairs and
// its dimension of a batch of workgroups in one round, then weighs them locally: the kernel's
// latency is one memory round trip per REDUCE_BATCH workgroups (one at the default 32).
__global__ void k_flash_attn_vec_reduce(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args(args);
  const mlxn_params_flash_reduce p = mlxn_params_flash_reduce_at(a, MLXN_SLOT_FLASH_ATTN_VEC_REDUCE_FLASH_REDUCE);
  const uint32_t heads = p.n_heads, hd = p.head_dim, nwg = p.nwg;
  uint32_t h = blockIdx.x;
  if (h >= heads) return;
  const float *tmp = buf<const float>(a, 0) + (uint64_t)h * nwg * (hd + 2);
  for (uint32_t d = threadIdx.x; d < hd; d += blockDim.x) {
    // Running max / sum over batches, rescaled like the online softmax of the split kernel.
    float m = -INFINITY, l = 0.0f, o = 0.0f;
    for (uint32_t w0 = 0; w0 < nwg; w0 += REDUCE_BATCH) {
      float pm[REDUCE_BATCH], pl[REDUCE_BATCH], po[REDUCE_BATCH];
#pragma unroll
      for (int j = 0; j < REDUCE_BATCH; j++) {
        const float *part = tmp + (uint64_t)(w0 + j) * (hd + 2);
        bool in = w0 + j < nwg;
        pm[j] = in ? part[hd] : -INFINITY;
        pl[j] = in ? part[hd + 1] : 0.0f;
        po[j] = in ? part[d] : 0.0f;
      }
      float mn = m;
#pragma unroll
      for (int j = 0; j < REDUCE_BATCH; j++) mn = fmaxf(mn, pm[j]);
      float corr = m == -INFINITY ? 0.0f : expf(m - mn);
      l *= corr;
      o *= corr;
#pragma unroll
      for (int j = 0; j < REDUCE_BATCH; j++) {
        float e = pl[j] != 0.0f ? expf(pm[j] - mn) : 0.0f; // an empty chunk has l = 0, m = -inf
        l += pl[j] * e;
        o += po[j] * e;
      }
      m = mn;
    }
    buf<float>(a, 1)[(uint64_t)h * hd + d] = o / l;
  }
}

MLXN_CUDA_KERNEL(sdpa_f32, (k_sdpa<T_F32>));
MLXN_CUDA_KERNEL(sdpa_bf16, (k_sdpa<T_BF16>));
MLXN_CUDA_KERNEL(flash_attn_vec_f32, (k_flash_attn_vec<T_F32>));
MLXN_CUDA_KERNEL(flash_attn_vec_f16, (k_flash_attn_vec<T_F16>));
MLXN_CUDA_KERNEL(flash_attn_vec_reduce, (k_flash_attn_vec_reduce));
