// Matrix products y = x · Wᵀ in MSL: simdgroup w of a 128-thread threadgroup computes output
// n = group.x·4 + w of row group.y (the fast affine kernel: 8 simdgroups). Lanes split K, then a
// simd_sum. The ggml mat-vec and mat-mat kernels share the per-lane arithmetic.

struct mm_params { uint m; uint n; uint k; };
struct dense_params { uint m; uint n; uint k; uint mode; }; // epilogue (bits 0-7): 0 none, 1 residual, 2 SwiGLU
struct affine_params { uint m; uint n; uint k; uint bits; uint group_size; };
struct moe_params { uint rows; uint n; uint k; uint top_k; uint n_experts; };

#define MM_TAIL MLXN_ARGS_TAIL, uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]

// Epilogues as kernels/cpu/matmul.c: 1 adds res (slot 4; an unbound slot is never read), 2 takes
// W's 2n rows as gate then up, output j = silu(gate j) · up j (2 outputs per threadgroup).
#define DENSE(NAME, T)                                                                               \
  kernel void NAME(device const float *x [[buffer(0)]], device const T *w [[buffer(1)]],            \
                   device float *y [[buffer(2)]], constant dense_params &p [[buffer(3)]],             \
                   device const float *res [[buffer(4)]], MM_TAIL) {                                  \
    uint epi = p.mode & 0xffu; /* bit 8 (constant weights) changes nothing here */                   \
    bool glu = epi == 2;                                                                            \
    uint n = gid.x * (glu ? 2 : 4) + sg, row = gid.y;                                               \
    if ((glu && sg >= 2) || n >= p.n || row >= p.m) return;                                         \
    float acc = 0.0f;                                                                               \
    for (uint i = lane; i < p.k; i += 32) acc += x[ulong(row) * p.k + i] * ld(w, ulong(n) * p.k + i); \
    acc = simd_sum(acc);                                                                            \
    if (glu) {                                                                                      \
      float up = 0.0f;                                                                              \
      ulong urow = (ulong(p.n) + n) * p.k;                                                          \
      for (uint i = lane; i < p.k; i += 32) up += x[ulong(row) * p.k + i] * ld(w, urow + i);       \
      acc = silu(acc) * simd_sum(up);                                                               \
    }                                                                                               \
    ulong o = ulong(row) * p.n + n;                                                                 \
    if (lane == 0) y[o] = epi == 1 ? acc + res[o] : acc;                                            \
  }
DENSE(matmul_f32, float)
DENSE(matmul_bf16, ushort)

inline uint affine_q(device const uchar *row, uint k, uint bits) {
  if (bits == 8) return row[k];
  if (bits == 4) return (row[k >> 1] >> ((k & 1u) * 4)) & 0xfu;
  device const uchar *t = row + (k >> 2) * 3;
  uint v = uint(t[0]) | (uint(t[1]) << 8) | (uint(t[2]) << 16);
  return (v >> ((k & 3u) * 6)) & 0x3fu;
}

#define AFFINE(NAME, OUTS, FAST)                                                                     \
  kernel void NAME(device const float *x [[buffer(0)]], device const uchar *w [[buffer(1)]],        \
                   device const ushort *sc [[buffer(2)]], device const ushort *bi [[buffer(3)]],     \
                   device float *y [[buffer(4)]], constant affine_params &p [[buffer(5)]], MM_TAIL) { \
    uint n = gid.x * OUTS + sg, row = gid.y;                                                        \
    if (n >= p.n || row >= p.m) return;                                                             \
    ulong row_bytes = ulong(p.k) * p.bits / 8, groups = p.k / p.group_size;                          \
    device const uchar *wr = w + n * row_bytes;                                                     \
    device const float *xr = x + ulong(row) * p.k;                                                  \
    float acc = 0.0f;                                                                               \
    if (FAST) {                                                                                     \
      for (uint c = lane; c < p.k / 8; c += 32) {                                                   \
        uint k0 = c * 8, g = k0 / p.group_size;                                                     \
        float qx = 0.0f, sx = 0.0f;                                                                 \
        for (uint j = 0; j < 8; j++) {                                                              \
          qx += float(affine_q(wr, k0 + j, p.bits)) * xr[k0 + j];                                   \
          sx += xr[k0 + j];                                                                         \
        }                                                                                           \
        acc += bf16_to_f32(sc[n * groups + g]) * qx + bf16_to_f32(bi[n * groups + g]) * sx;         \
      }                                                                                             \
    } else {                                                                                        \
      for (uint i = lane; i < p.k; i += 32) {                                                       \
        uint g = i / p.group_size;                                                                  \
        acc += xr[i] * (bf16_to_f32(sc[n * groups + g]) * float(affine_q(wr, i, p.bits)) + bf16_to_f32(bi[n * groups + g])); \
      }                                                                                             \
    }                                                                                               \
    acc = simd_sum(acc);                                                                            \
    if (lane == 0) y[ulong(row) * p.n + n] = acc;                                                   \
  }
AFFINE(qmatmul_affine, 4, false)
AFFINE(qmatmul_affine_fast, 8, true)

inline float half_at(device const uchar *b) { return float(as_type<half>(ushort(b[0] | (b[1] << 8)))); }

// This lane's share of dot(x[0..k), row) for a ggml format (0 Q4_0, 1 Q8_0, 2 Q6_K).
inline float ggml_lane_dot(uint f, device const uchar *row, device const float *x, uint k, uint lane) {
  float acc = 0.0f;
  if (f < 2) {
    uint bb = f == 0 ? 18 : 34;
    for (uint b = lane; b < k / 32; b += 32) {
      device const uchar *blk = row + ulong(b) * bb;
      float d = half_at(blk);
      device const float *xb = x + b * 32;
      if (f == 0) {
        for (uint j = 0; j < 16; j++) {
          acc += xb[j] * (float(int(blk[2 + j] & 0xf) - 8) * d);
          acc += xb[j + 16] * (float(int(blk[2 + j] >> 4) - 8) * d);
        }
      } else {
        for (uint j = 0; j < 32; j++) acc += xb[j] * (float(as_type<char>(blk[2 + j])) * d);
      }
    }
  } else {
    for (uint sb = lane; sb < k / 16; sb += 32) {
      device const uchar *blk = row + ulong(sb / 16) * 210;
      float ds = half_at(blk + 208) * float(as_type<char>(blk[192 + (sb % 16)]));
      uint v0 = (sb % 16) * 16;
      device const float *xb = x + ulong(sb / 16) * 256;
      for (uint j = 0; j < 16; j++) {
        uint v = v0 + j, hf = v >> 7, off = v & 127, quad = off >> 5, l = off & 31;
        uchar ql = blk[hf * 64 + l + (quad & 1) * 32];
        uint low = quad < 2 ? (ql & 0xf) : (ql >> 4);
        uint high = (blk[128 + hf * 32 + l] >> (2 * quad)) & 3;
        acc += xb[v] * (ds * float(int(low | (high << 4)) - 32));
      }
    }
  }
  return acc;
}

inline uint ggml_row_bytes(uint f, uint k) { return f == 2 ? (k / 256) * 210 : (k / 32) * (f == 0 ? 18 : 34); }

#define GGML(NAME, F, MV)                                                                            \
  kernel void NAME(device const float *x [[buffer(0)]], device const uchar *w [[buffer(1)]],        \
                   device float *y [[buffer(2)]], constant mm_params &p [[buffer(3)]], MM_TAIL) {    \
    uint n = gid.x * 4 + sg;                                                                        \
    if (n >= p.n) return;                                                                           \
    device const uchar *wr = w + ulong(n) * ggml_row_bytes(F, p.k);                                 \
    uint r0 = MV ? 0 : gid.y, r1 = MV ? p.m : gid.y + 1;                                            \
    for (uint r = r0; r < r1 && r < p.m; r++) {                                                     \
      float acc = simd_sum(ggml_lane_dot(F, wr, x + ulong(r) * p.k, p.k, lane));                    \
      if (lane == 0) y[ulong(r) * p.n + n] = acc;                                                   \
    }                                                                                               \
  }
GGML(qmatmul_q4_0_mv, 0, true)
GGML(qmatmul_q4_0_mm, 0, false)
GGML(qmatmul_q8_0_mv, 1, true)
GGML(qmatmul_q8_0_mm, 1, false)
GGML(qmatmul_q6_k_mv, 2, true)
GGML(qmatmul_q6_k_mm, 2, false)

#define GGML_ID(NAME, F)                                                                             \
  kernel void NAME(device const float *x [[buffer(0)]], device const uchar *w [[buffer(1)]],        \
                   device const uint *ids [[buffer(2)]], device float *y [[buffer(3)]],              \
                   constant moe_params &p [[buffer(4)]], MM_TAIL) {                                  \
    uint n = gid.x * 4 + sg, r = gid.y;                                                             \
    if (n >= p.n || r >= p.rows) return;                                                            \
    uint e = ids[r];                                                                                \
    if (e >= p.n_experts) {                                                                         \
      if (lane == 0) report_fault(fault_word, tag);                                                 \
      return;                                                                                       \
    }                                                                                               \
    device const uchar *wr = w + (ulong(e) * p.n + n) * ggml_row_bytes(F, p.k);                     \
    float acc = simd_sum(ggml_lane_dot(F, wr, x + ulong(r / p.top_k) * p.k, p.k, lane));            \
    if (lane == 0) y[ulong(r) * p.n + n] = acc;                                                     \
  }
GGML_ID(qmatmul_id_q4_0, 0)
GGML_ID(qmatmul_id_q8_0, 1)
GGML_ID(qmatmul_id_q6_k, 2)
