// Row MSL kernels: one threadgroup per row; the row sum is a fixed tree over the threadgroup,
// shared by the unfused and fused kernels so that fusion stays bit-identical.

// Parameter blocks: the generated mlxn_params_norm and mlxn_params_softmax (_params.gen.metal).

inline ulong row_of(uint3 gid, uint3 ngroups) { return (ulong(gid.z) * ngroups.y + gid.y) * ngroups.x + gid.x; }

template <typename T>
inline float row_inv_rms(device const T *x, ulong base, uint dim, float eps, threadgroup float *sh, uint i, uint n) {
  float part = 0.0f;
  for (uint k = i; k < dim; k += n) {
    float v = ld(x, base + k);
    part += v * v;
  }
  return 1.0f / precise::sqrt(tg_sum(part, sh, i, n) / float(dim) + eps);
}

#define RMS_NORM(SUF, T)                                                                             \
  kernel void rms_norm_##SUF(device const T *in [[buffer(0)]], device const T *w [[buffer(1)]],     \
                             device T *out [[buffer(2)]], constant mlxn_params_norm &p [[buffer(3)]],     \
                             threadgroup float *sh [[threadgroup(0)]], MLXN_ARGS_TAIL) {             \
    ulong base = row_of(gid, ngroups) * p.dim;                                                      \
    float inv = row_inv_rms(in, base, p.dim, p.eps, sh, lid.x, tpg.x);                              \
    for (uint k = lid.x; k < p.dim; k += tpg.x) st(out, base + k, (ld(in, base + k) * inv) * ld(w, k)); \
  }                                                                                                 \
  kernel void rms_norm_mul_##SUF(device const T *in [[buffer(0)]], device const T *w [[buffer(1)]], \
                                 device const T *scale [[buffer(2)]], device T *out [[buffer(3)]],   \
                                 constant mlxn_params_norm &p [[buffer(4)]],                              \
                                 threadgroup float *sh [[threadgroup(0)]], MLXN_ARGS_TAIL) {         \
    ulong base = row_of(gid, ngroups) * p.dim;                                                      \
    float inv = row_inv_rms(in, base, p.dim, p.eps, sh, lid.x, tpg.x);                              \
    for (uint k = lid.x; k < p.dim; k += tpg.x) {                                                   \
      float n = round_to((ld(in, base + k) * inv) * ld(w, k), in);                                  \
      st(out, base + k, n * ld(scale, base + k));                                                   \
    }                                                                                               \
  }                                                                                                 \
  kernel void rms_norm_mul_add_##SUF(device const T *in [[buffer(0)]], device const T *w [[buffer(1)]], \
                                     device const T *scale [[buffer(2)]], device const T *res [[buffer(3)]], \
                                     device T *out [[buffer(4)]], constant mlxn_params_norm &p [[buffer(5)]], \
                                     threadgroup float *sh [[threadgroup(0)]], MLXN_ARGS_TAIL) {     \
    ulong base = row_of(gid, ngroups) * p.dim;                                                      \
    float inv = row_inv_rms(in, base, p.dim, p.eps, sh, lid.x, tpg.x);                              \
    for (uint k = lid.x; k < p.dim; k += tpg.x) {                                                   \
      float n = round_to((ld(in, base + k) * inv) * ld(w, k), in);                                  \
      float m = round_to(n * ld(scale, base + k), in);                                              \
      st(out, base + k, m + ld(res, base + k));                                                     \
    }                                                                                               \
  }
RMS_NORM(f32, float)
RMS_NORM(f16, half)
RMS_NORM(bf16, ushort)

kernel void rms_norm_no_scale_f32(device const float *in [[buffer(0)]], device float *out [[buffer(1)]],
                                  constant mlxn_params_norm &p [[buffer(2)]], threadgroup float *sh [[threadgroup(0)]],
                                  MLXN_ARGS_TAIL) {
  ulong base = row_of(gid, ngroups) * p.dim;
  float inv = row_inv_rms(in, base, p.dim, p.eps, sh, lid.x, tpg.x);
  for (uint k = lid.x; k < p.dim; k += tpg.x) out[base + k] = in[base + k] * inv;
}

kernel void softmax_f32(device const float *in [[buffer(0)]], device float *out [[buffer(1)]],
                        constant mlxn_params_softmax &p [[buffer(2)]], threadgroup float *sh [[threadgroup(0)]],
                        MLXN_ARGS_TAIL) {
  const uint cols = p.cols;
  ulong base = row_of(gid, ngroups) * cols;
  float m = -INFINITY;
  for (uint k = lid.x; k < cols; k += tpg.x) m = max(m, in[base + k]);
  m = tg_max(m, sh, lid.x, tpg.x);
  float part = 0.0f;
  for (uint k = lid.x; k < cols; k += tpg.x) part += precise::exp(in[base + k] - m);
  float inv = 1.0f / tg_sum(part, sh, lid.x, tpg.x);
  for (uint k = lid.x; k < cols; k += tpg.x) out[base + k] = precise::exp(in[base + k] - m) * inv;
}
