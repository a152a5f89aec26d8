// Matrix products y = x · Wᵀ in MSL: simdgroup w of a 128-thread threadgroup computes output
// n = group.x·4 + w of row group.y (the fast affine kernel: 8 simdgroups). Lanes split K, then a
// simd_sum. The ggml mat-vec and mat-mat kernels share the per-lane arithmetic.

// Parameter blocks: the generated mlxn_params_* of _params.gen.metal. The dense kernels' mode word
// holds the epilogue in bits 0-7 (0 none, 1 residual, 2 SwiGLU).

#define MM_TAIL MLXN_ARGS_TAIL, uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]

// Epilogues as kernels/cpu/matmul.c: 1 adds res (slot 4; an unbound slot is never read), 2 takes
// W's 2n rows as gate then up, output j = silu(gate j) · up j (2 outputs per threadgroup).
#define DENSE(NAME, T)                                                                               \
  kernel void NAME(device const float *x [[buffer(0)]], device const T *w [[buffer(1)]],            \
                   device float *y [[buffer(2)]], constant mlxn_params_dense &p [[buffer(3)]],             \
                   device const float *res [[buffer(4)]], MM_TAIL) {                                  \
    uint epi = p.mode & MLXN_MATMUL_EPILOGUE_MASK; /* constant weights change nothing here */        \
    bool glu = epi == MLXN_MATMUL_EPILOGUE_SWIGLU;                                                  \
    uint outs = glu ? MLXN_MATMUL_OUTS_SWIGLU : MLXN_MATMUL_OUTS;                                   \
    uint n = gid.x * outs + sg, row = gid.y;                                                        \
    if (sg >= outs || n >= p.n || row >= p.m) return;                                               \
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
    if (lane == 0) y[o] = epi == MLXN_MATMUL_EPILOGUE_RESIDUAL ? acc + res[o] : acc;                \
  }
DENSE(matmul_f32, float)
DENSE(matmul_bf16, ushort)
DENSE(matmul_f16, half)

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
                   device float *y [[buffer(4)]], constant mlxn_params_affine &p [[buffer(5)]], MM_TAIL) { \
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
AFFINE(qmatmul_affine, MLXN_MATMUL_OUTS, false)
AFFINE(qmatmul_affine_fast, MLXN_MATMUL_OUTS_FAST, true)

// MLX affine, any width and scale dtype (as kernels/cpu/matmul.c): a row is one little-endian bit
// stream, code j at bit j·bits; scales/biases bound as ushort words, scale type 0 f32 (two words),
// 1 f16, 2 bf16.

inline uint affine_code(device const uchar *row, uint k, uint bits) {
  ulong at = ulong(k) * bits;
  uint shift = uint(at & 7u), v = row[at >> 3];
  if (shift + bits > 8) v |= uint(row[(at >> 3) + 1]) << 8; // a code spans at most 2 bytes
  return (v >> shift) & ((1u << bits) - 1u);
}

inline float load_scale(device const ushort *p, ulong i, uint t) {
  if (t == 0) return as_type<float>(uint(p[2 * i]) | (uint(p[2 * i + 1]) << 16));
  if (t == 1) return float(as_type<half>(p[i]));
  return bf16_to_f32(p[i]);
}

inline float affine_general_lane(device const float *x, device const uchar *w, device const ushort *sc,
                                 device const ushort *bi, ulong s0, uint k, uint bits, uint gs, uint t, uint lane) {
  float acc = 0.0f;
  for (uint i = lane; i < k; i += 32) {
    uint g = i / gs;
    acc += x[i] * (load_scale(sc, s0 + g, t) * float(affine_code(w, i, bits)) + load_scale(bi, s0 + g, t));
  }
  return acc;
}

kernel void qmatmul_affine_general(device const float *x [[buffer(0)]], device const uchar *w [[buffer(1)]],
                                   device const ushort *sc [[buffer(2)]], device const ushort *bi [[buffer(3)]],
                                   device float *y [[buffer(4)]], constant mlxn_params_affine_general &p [[buffer(5)]],
                                   MM_TAIL) {
  uint n = gid.x * MLXN_MATMUL_OUTS + sg, row = gid.y;
  if (n >= p.n || row >= p.m) return;
  device const uchar *wr = w + ulong(n) * (p.k / 8 * p.bits);
  float acc = affine_general_lane(x + ulong(row) * p.k, wr, sc, bi, ulong(n) * (p.k / p.group_size), p.k, p.bits,
                                  p.group_size, p.scale_type, lane);
  acc = simd_sum(acc);
  if (lane == 0) y[ulong(row) * p.n + n] = acc;
}

kernel void qmatmul_affine_gather(device const float *x [[buffer(0)]], device const uchar *w [[buffer(1)]],
                                  device const ushort *sc [[buffer(2)]], device const ushort *bi [[buffer(3)]],
                                  device const uint *ids [[buffer(4)]], device float *y [[buffer(5)]],
                                  constant mlxn_params_affine_gather &p [[buffer(6)]], MM_TAIL) {
  uint n = gid.x * MLXN_MATMUL_OUTS + sg, r = gid.y;
  if (n >= p.n || r >= p.rows) return;
  uint e = ids[r];
  if (e >= p.n_experts) {
    if (lane == 0) report_fault(fault_word, tag);
    return;
  }
  ulong wrow = ulong(e) * p.n + n;
  device const uchar *wr = w + wrow * (p.k / 8 * p.bits);
  float acc = affine_general_lane(x + ulong(r / p.top_k) * p.k, wr, sc, bi, wrow * (p.k / p.group_size), p.k, p.bits,
                                  p.group_size, p.scale_type, lane);
  acc = simd_sum(acc);
  if (lane == 0) y[ulong(r) * p.n + n] = acc;
}

inline float half_at(device const uchar *b) { return float(as_type<half>(ushort(b[0] | (b[1] << 8)))); }

// ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j from the 12 packed bytes.
inline uint2 scale_min_k4(uint j, device const uchar *q) {
  if (j < 4) return uint2(q[j] & 63u, q[j + 4] & 63u);
  return uint2((q[j + 4] & 0xfu) | (uint(q[j - 4] >> 6) << 4), uint(q[j + 4] >> 4) | (uint(q[j] >> 6) << 4));
}

// Q4_1 (d, m, qs), Q5_0 (d, qh, qs), Q5_1 (d, m, qh, qs): value j < 16 is the low nibble of qs[j],
// value j + 16 the high one; qh bit j is value j's 5th bit. Q5_0 subtracts 16, the _1 formats add m.
inline float q32_lane_dot(uint f, device const uchar *row, device const float *x, uint k, uint lane) {
  uint bb = f == 3 ? 20 : f == 4 ? 22 : 24, qs_at = f == 3 ? 4 : f == 4 ? 6 : 8, qh_at = f == 4 ? 2 : 4;
  float acc = 0.0f;
  for (uint b = lane; b < k / 32; b += 32) {
    device const uchar *blk = row + ulong(b) * bb;
    float d = half_at(blk), m = f == 4 ? 0.0f : half_at(blk + 2);
    uint qh = 0;
    if (f != 3)
      qh = uint(blk[qh_at]) | (uint(blk[qh_at + 1]) << 8) | (uint(blk[qh_at + 2]) << 16) | (uint(blk[qh_at + 3]) << 24);
    device const float *xb = x + b * 32;
    for (uint j = 0; j < 16; j++) {
      uchar q = blk[qs_at + j];
      int lo = int((q & 0xfu) | (((qh >> j) & 1u) << 4)), hi = int(uint(q >> 4) | (((qh >> (j + 16)) & 1u) << 4));
      if (f == 4) {
        acc += xb[j] * (float(lo - 16) * d);
        acc += xb[j + 16] * (float(hi - 16) * d);
      } else {
        acc += xb[j] * (float(lo) * d + m);
        acc += xb[j + 16] * (float(hi) * d + m);
      }
    }
  }
  return acc;
}

// Q4_K (d, dmin, scales[12], qs[128]) and Q5_K (qh[32] before qs): lanes take 32-value sub-blocks;
// sub-block j is d·sc_j·q − dmin·m_j, q the low (even j) or high (odd j) nibbles of qs[32·(j/2)..],
// plus 16 where bit j of qh[l] is set.
inline float kquant_lane_dot(bool five, device const uchar *row, device const float *x, uint k, uint lane) {
  uint bb = five ? 176 : 144;
  float acc = 0.0f;
  for (uint sb = lane; sb < k / 32; sb += 32) {
    device const uchar *blk = row + ulong(sb / 8) * bb;
    uint j = sb % 8;
    uint2 sm = scale_min_k4(j, blk + 4);
    float d1 = half_at(blk) * float(sm.x), m1 = half_at(blk + 2) * float(sm.y);
    device const uchar *q = blk + (five ? 48 : 16) + (j / 2) * 32;
    device const float *xb = x + ulong(sb) * 32;
    for (uint l = 0; l < 32; l++) {
      uint v = (j & 1u) ? uint(q[l] >> 4) : (q[l] & 0xfu);
      if (five) v |= ((uint(blk[16 + l]) >> j) & 1u) << 4;
      acc += xb[l] * (d1 * float(v) - m1);
    }
  }
  return acc;
}

// This lane's share of dot(x[0..k), row) for a ggml format (0 Q4_0, 1 Q8_0, 2 Q6_K, 3 Q4_1, 4 Q5_0,
// 5 Q5_1, 6 Q4_K, 7 Q5_K).
inline float ggml_lane_dot(uint f, device const uchar *row, device const float *x, uint k, uint lane) {
  if (f >= 3 && f <= 5) return q32_lane_dot(f, row, x, k, lane);
  if (f >= 6) return kquant_lane_dot(f == 7, row, x, k, lane);
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

inline uint ggml_row_bytes(uint f, uint k) {
  switch (f) {
  case 0: return (k / 32) * 18;
  case 1: return (k / 32) * 34;
  case 2: return (k / 256) * 210;
  case 3: return (k / 32) * 20;
  case 4: return (k / 32) * 22;
  case 5: return (k / 32) * 24;
  case 6: return (k / 256) * 144;
  default: return (k / 256) * 176;
  }
}

#define GGML(NAME, F, MV)                                                                            \
  kernel void NAME(device const float *x [[buffer(0)]], device const uchar *w [[buffer(1)]],        \
                   device float *y [[buffer(2)]], constant mlxn_params_ggml &p [[buffer(3)]], MM_TAIL) {    \
    uint n = gid.x * MLXN_MATMUL_OUTS + sg;                                                         \
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
GGML(qmatmul_q4_1_mv, 3, true)
GGML(qmatmul_q4_1_mm, 3, false)
GGML(qmatmul_q5_0_mv, 4, true)
GGML(qmatmul_q5_0_mm, 4, false)
GGML(qmatmul_q5_1_mv, 5, true)
GGML(qmatmul_q5_1_mm, 5, false)
GGML(qmatmul_q4_k_mv, 6, true)
GGML(qmatmul_q4_k_mm, 6, false)
GGML(qmatmul_q5_k_mv, 7, true)
GGML(qmatmul_q5_k_mm, 7, false)

#define GGML_ID(NAME, F)                                                                             \
  kernel void NAME(device const float *x [[buffer(0)]], device const uchar *w [[buffer(1)]],        \
                   device const uint *ids [[buffer(2)]], device float *y [[buffer(3)]],              \
                   constant mlxn_params_ggml_id &p [[buffer(4)]], MM_TAIL) {                                  \
    uint n = gid.x * MLXN_MATMUL_OUTS + sg, r = gid.y;                                              \
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
GGML_ID(qmatmul_id_q4_1, 3)
GGML_ID(qmatmul_id_q5_0, 4)
GGML_ID(qmatmul_id_q5_1, 5)
GGML_ID(qmatmul_id_q4_k, 6)
GGML_ID(qmatmul_id_q5_k, 7)
