// Attention in MSL. sdpa: one thread per query row (threadgroups (batch, heads, ceil(seq/32)), 32
// threads). flash_attn_vec: one simdgroup per (head, workgroup), each lane owning head_dim/32
// dimensions; then a reduce kernel combines the workgroups. Online softmax in f32. Parameter blocks:
// the generated mlxn_params_sdpa, mlxn_params_flash and mlxn_params_flash_reduce (_params.gen.metal).

#define SDPA(NAME, T)                                                                               \
  kernel void NAME(device const T *q [[buffer(0)]], device const T *k [[buffer(1)]],                \
                   device const T *v [[buffer(2)]], device T *o [[buffer(3)]],                      \
                   constant mlxn_params_sdpa &p [[buffer(4)]], MLXN_ARGS_TAIL) {                    \
    uint b = gid.x, h = gid.y, r = gid.z * MLXN_SDPA_ROWS + lid.x;                                  \
    if (h >= p.heads || r >= p.seq) return;                                                         \
    uint kvh = h / (p.heads / p.kv_heads);                                                          \
    ulong qo = ((ulong(b) * p.heads + h) * p.seq + r) * p.hd;                                       \
    ulong kbase = ((ulong(b) * p.kv_heads + kvh) * p.kv_cap) * p.hd;                                \
    float acc[MLXN_MAX_HEAD_DIM];                                                                   \
    for (uint d = 0; d < p.hd; d++) acc[d] = 0.0f;                                                  \
    uint last = p.kv_len - p.seq + r;                                                               \
    float m = -INFINITY, l = 0.0f;                                                                  \
    for (uint key = 0; key <= last; key++) {                                                        \
      ulong ko = kbase + ulong(key) * p.hd;                                                         \
      float s = 0.0f;                                                                               \
      for (uint d = 0; d < p.hd; d++) s += ld(q, qo + d) * ld(k, ko + d);                           \
      s *= p.scale;                                                                                 \
      float mn = max(m, s), corr = precise::exp(m - mn), e = precise::exp(s - mn);                  \
      l = l * corr + e;                                                                             \
      for (uint d = 0; d < p.hd; d++) acc[d] = acc[d] * corr + e * ld(v, ko + d);                   \
      m = mn;                                                                                       \
    }                                                                                               \
    for (uint d = 0; d < p.hd; d++) st(o, qo + d, acc[d] / l);                                      \
  }
SDPA(sdpa_f32, float)
SDPA(sdpa_bf16, ushort)

#define FLASH(NAME, T)                                                                              \
  kernel void NAME(device const float *q [[buffer(0)]], device const T *k [[buffer(1)]],            \
                   device const T *v [[buffer(2)]], device float *tmp [[buffer(3)]],                \
                   constant mlxn_params_flash &p [[buffer(4)]], device const uint *state [[buffer(5)]], \
                   MLXN_ARGS_TAIL, uint lane [[thread_index_in_simdgroup]]) {                       \
    uint h = gid.x, w = gid.y;                                                                      \
    if (h >= p.heads || w >= p.nwg) return;                                                         \
    uint kv_len = p.kv_len; /* with a step state: state[0] + 1, bounded by kv_seq_len */            \
    if (p.has_state) {                                                                              \
      if (state[0] >= kv_len) {                                                                     \
        if (lane == 0) report_fault(fault_word, tag);                                               \
        return;                                                                                     \
      }                                                                                             \
      kv_len = state[0] + 1;                                                                        \
    }                                                                                               \
    uint per = p.hd / 32, kvh = h / (p.heads / p.kv_heads);                                         \
    ulong kbase = ulong(kvh) * p.kv_cap * p.hd;                                                     \
    float ql[MLXN_MAX_HEAD_DIM / 32], acc[MLXN_MAX_HEAD_DIM / 32];                                  \
    for (uint i = 0; i < per; i++) {                                                                \
      ql[i] = q[ulong(h) * p.hd + lane + 32 * i];                                                   \
      acc[i] = 0.0f;                                                                                \
    }                                                                                               \
    uint chunk = (kv_len + p.nwg - 1) / p.nwg, k0 = w * chunk, k1 = min(k0 + chunk, kv_len);        \
    uint pos = kv_len - 1;                                                                          \
    if (p.mask == 2 && pos + 1 > p.window && k0 < pos + 1 - p.window) k0 = pos + 1 - p.window;      \
    float m = -INFINITY, l = 0.0f;                                                                  \
    for (uint key = k0; key < k1; key++) {                                                          \
      ulong ko = kbase + ulong(key) * p.hd + lane;                                                  \
      float part = 0.0f;                                                                            \
      for (uint i = 0; i < per; i++) part += ql[i] * ld(k, ko + 32 * i);                            \
      float s = simd_sum(part) * p.scale;                                                           \
      if (p.softcap > 0.0f) s = p.softcap * precise::tanh(s / p.softcap);                           \
      float mn = max(m, s), corr = precise::exp(m - mn), e = precise::exp(s - mn);                  \
      l = l * corr + e;                                                                             \
      for (uint i = 0; i < per; i++) acc[i] = acc[i] * corr + e * ld(v, ko + 32 * i);               \
      m = mn;                                                                                       \
    }                                                                                               \
    device float *out = tmp + (ulong(h) * p.nwg + w) * (p.hd + 2);                                  \
    for (uint i = 0; i < per; i++) out[lane + 32 * i] = acc[i];                                     \
    if (lane == 0) {                                                                                \
      out[p.hd] = m;                                                                                \
      out[p.hd + 1] = l;                                                                            \
    }                                                                                               \
  }
FLASH(flash_attn_vec_f32, float)
FLASH(flash_attn_vec_f16, half)

kernel void flash_attn_vec_reduce(device const float *tmp [[buffer(0)]], device float *o [[buffer(1)]],
                                  constant mlxn_params_flash_reduce &p [[buffer(2)]], MLXN_ARGS_TAIL) {
  uint h = gid.x;
  if (h >= p.n_heads) return;
  device const float *t = tmp + ulong(h) * p.nwg * (p.head_dim + 2);
  float m = -INFINITY;
  for (uint w = 0; w < p.nwg; w++) m = max(m, t[w * (p.head_dim + 2) + p.head_dim]);
  float l = 0.0f;
  for (uint w = 0; w < p.nwg; w++) {
    device const float *part = t + w * (p.head_dim + 2);
    if (part[p.head_dim + 1] != 0.0f) l += part[p.head_dim + 1] * precise::exp(part[p.head_dim] - m);
  }
  for (uint d = lid.x; d < p.head_dim; d += tpg.x) {
    float acc = 0.0f;
    for (uint w = 0; w < p.nwg; w++) {
      device const float *part = t + w * (p.head_dim + 2);
      if (part[p.head_dim + 1] != 0.0f) acc += part[d] * precise::exp(part[p.head_dim] - m);
    }
    o[ulong(h) * p.head_dim + d] = acc / l;
  }
}
