// Token selection and input in MSL, step for step as kernels/cuda/sample.cu (and the reference,
// kernels/cpu/sample.c): argmax and sample run one threadgroup per row (32 to 1024 threads, a power
// of two; simdgroups of 32), the radix descent's histograms are threadgroup atomics (u64 weight sums
// as two u32 words with a carry), and simdgroup 0 scans the 256 buckets, 8 per lane.

// round(2^31 · 2^(−j/256)), j = 0..256 (the same table as every backend; tests compare them).
constant uint exp2_neg_q31[257] = {
    0x80000000, 0x7fa765ad, 0x7f4f08ae, 0x7ef6e8da, 0x7e9f0606, 0x7e476009, 0x7deff6b6, 0x7d98c9e6,
    0x7d41d96e, 0x7ceb2523, 0x7c94acde, 0x7c3e7073, 0x7be86fba, 0x7b92aa88, 0x7b3d20b6, 0x7ae7d21a,
    0x7a92be8b, 0x7a3de5df, 0x79e947ef, 0x7994e492, 0x7940bb9e, 0x78ecccec, 0x78991854, 0x78459dac,
    0x77f25cce, 0x779f5590, 0x774c87cc, 0x76f9f359, 0x76a7980f, 0x765575c8, 0x76038c5b, 0x75b1dba2,
    0x75606374, 0x750f23ab, 0x74be1c20, 0x746d4cac, 0x741cb528, 0x73cc556d, 0x737c2d55, 0x732c3cba,
    0x72dc8374, 0x728d015d, 0x723db650, 0x71eea226, 0x719fc4b9, 0x71511de4, 0x7102ad80, 0x70b47368,
    0x70666f76, 0x7018a185, 0x6fcb096f, 0x6f7da710, 0x6f307a41, 0x6ee382de, 0x6e96c0c3, 0x6e4a33c9,
    0x6dfddbcc, 0x6db1b8a8, 0x6d65ca38, 0x6d1a1057, 0x6cce8ae1, 0x6c8339b2, 0x6c381ca6, 0x6bed3399,
    0x6ba27e65, 0x6b57fce9, 0x6b0daeff, 0x6ac39485, 0x6a79ad56, 0x6a2ff94f, 0x69e6784d, 0x699d2a2c,
    0x69540ec9, 0x690b2601, 0x68c26fb1, 0x6879ebb6, 0x683199ed, 0x67e97a34, 0x67a18c68, 0x6759d065,
    0x6712460b, 0x66caed35, 0x6683c5c3, 0x663ccf92, 0x65f60a7f, 0x65af766a, 0x6569132f, 0x6522e0ad,
    0x64dcdec3, 0x64970d4f, 0x64516c2e, 0x640bfb41, 0x63c6ba64, 0x6381a978, 0x633cc85b, 0x62f816eb,
    0x62b39509, 0x626f4292, 0x622b1f66, 0x61e72b65, 0x61a3666d, 0x615fd05e, 0x611c6919, 0x60d9307b,
    0x60962665, 0x60534ab7, 0x60109d51, 0x5fce1e12, 0x5f8bccdb, 0x5f49a98c, 0x5f07b405, 0x5ec5ec26,
    0x5e8451d0, 0x5e42e4e3, 0x5e01a53f, 0x5dc092c7, 0x5d7fad59, 0x5d3ef4d7, 0x5cfe6923, 0x5cbe0a1c,
    0x5c7dd7a4, 0x5c3dd19c, 0x5bfdf7e5, 0x5bbe4a61, 0x5b7ec8f2, 0x5b3f7377, 0x5b0049d4, 0x5ac14bea,
    0x5a82799a, 0x5a43d2c6, 0x5a055751, 0x59c7071c, 0x5988e209, 0x594ae7fb, 0x590d18d3, 0x58cf7474,
    0x5891fac1, 0x5854ab9b, 0x581786e6, 0x57da8c83, 0x579dbc57, 0x57611642, 0x57249a29, 0x56e847ef,
    0x56ac1f75, 0x567020a0, 0x56344b52, 0x55f89f70, 0x55bd1cdb, 0x5581c378, 0x55469329, 0x550b8bd4,
    0x54d0ad5a, 0x5495f7a1, 0x545b6a8b, 0x542105fd, 0x53e6c9da, 0x53acb607, 0x5372ca68, 0x533906e0,
    0x52ff6b55, 0x52c5f7aa, 0x528cabc3, 0x52538786, 0x521a8ad7, 0x51e1b59a, 0x51a907b4, 0x5170810b,
    0x51382182, 0x50ffe8fe, 0x50c7d765, 0x508fec9c, 0x50582888, 0x50208b0e, 0x4fe91413, 0x4fb1c37c,
    0x4f7a9930, 0x4f439514, 0x4f0cb70c, 0x4ed5ff00, 0x4e9f6cd4, 0x4e69006e, 0x4e32b9b4, 0x4dfc988c,
    0x4dc69cdd, 0x4d90c68b, 0x4d5b157e, 0x4d25899c, 0x4cf022ca, 0x4cbae0ef, 0x4c85c3f1, 0x4c50cbb8,
    0x4c1bf829, 0x4be7492b, 0x4bb2bea5, 0x4b7e587e, 0x4b4a169c, 0x4b15f8e6, 0x4ae1ff43, 0x4aae299b,
    0x4a7a77d4, 0x4a46e9d6, 0x4a137f88, 0x49e038d0, 0x49ad1598, 0x497a15c4, 0x4947393f, 0x49147fee,
    0x48e1e9ba, 0x48af768a, 0x487d2646, 0x484af8d6, 0x4818ee22, 0x47e70611, 0x47b5408c, 0x47839d7b,
    0x47521cc6, 0x4720be55, 0x46ef8210, 0x46be67e0, 0x468d6fae, 0x465c9961, 0x462be4e2, 0x45fb521a,
    0x45cae0f2, 0x459a9152, 0x456a6323, 0x453a564d, 0x450a6abb, 0x44daa054, 0x44aaf702, 0x447b6ead,
    0x444c0740, 0x441cc0a3, 0x43ed9ac0, 0x43be957f, 0x438fb0cb, 0x4360ec8d, 0x433248ae, 0x4303c518,
    0x42d561b4, 0x42a71e6c, 0x4278fb2b, 0x424af7da, 0x421d1462, 0x41ef50ae, 0x41c1aca7, 0x41942839,
    0x4166c34c, 0x41397dcc, 0x410c57a2, 0x40df50b8, 0x40b268fa, 0x4085a051, 0x4058f6a8, 0x402c6be9,
    0x40000000,
};

#define TOKEN_KEY_NEG_INF 0x007fffffu
#define TOKEN_NO_WEIGHT 0xffffffffu
#define TOKEN_NO_INDEX 0xffffffffu
#define TOKEN_LEVELS 11
// Row elements each thread loads before using any (vocab <= 2^30, so indices never wrap).
#define TOKEN_UNROLL 4
#define TOKEN_TAIL MLXN_ARGS_TAIL, uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]

inline uint order_key(float x) {
  uint b = as_type<uint>(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) return 0;
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) != 0 ? ~b : b | 0x80000000u;
}

inline float flush_subnormal(float x) {
  uint b = as_type<uint>(x);
  if ((b & 0x7f800000u) == 0) b &= 0x80000000u;
  return as_type<float>(b);
}

// A subtraction then a product (no fused form exists for it) and an exact scaling: the bits match
// the CPU's.
inline uint token_distance(float x, float mf, float c) {
  float xf = flush_subnormal(x);
  float d = xf == mf ? 0.0f : (mf - xf) * c;
  if (!(d < 31.0f)) return TOKEN_NO_WEIGHT;
  return uint(d * 65536.0f);
}

inline uint distance_weight(uint dq) {
  uint h = (dq >> 8) & 0xffu, lo = dq & 0xffu;
  uint t0 = exp2_neg_q31[h], t1 = exp2_neg_q31[h + 1];
  return (t0 - (((t0 - t1) * lo) >> 8)) >> (dq >> 16);
}

inline ulong mulhi64(ulong a, ulong b) {
  ulong a0 = a & 0xffffffffu, a1 = a >> 32, b0 = b & 0xffffffffu, b1 = b >> 32;
  ulong p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
  ulong mid = (p00 >> 32) + (p01 & 0xffffffffu) + (p10 & 0xffffffffu);
  return p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
}

inline uint4 philox4x32_10(uint4 ctr, uint k0, uint k1) {
  for (int r = 0; r < 10; r++) {
    if (r) {
      k0 += 0x9e3779b9u;
      k1 += 0xbb67ae85u;
    }
    uint hi0 = mulhi(0xd2511f53u, ctr.x), lo0 = 0xd2511f53u * ctr.x;
    uint hi1 = mulhi(0xcd9e8d57u, ctr.z), lo1 = 0xcd9e8d57u * ctr.z;
    ctr = uint4(hi1 ^ ctr.y ^ k0, lo1, hi0 ^ ctr.w ^ k1, lo0);
  }
  return ctr;
}

inline ulong ring_element(device const uint *cursor, uint rows, uint ring, uint has_cursor, uint row) {
  uint slot = has_cursor != 0 ? cursor[0] % ring : 0;
  return ulong(slot) * rows + row;
}

inline bool pair_wins(uint k, uint i, uint bk, uint bi) { return k > bk || (k == bk && i < bi); }

struct row_max { uint key; uint index; bool nan; };

// Scratch of the row maximum: one (key, index, nan) per simdgroup.
struct argmax_scratch {
  uint key[MLXN_TOKEN_MAX_THREADS / 32];
  uint index[MLXN_TOKEN_MAX_THREADS / 32];
  uint nan[MLXN_TOKEN_MAX_THREADS / 32];
};

inline void simd_argmax(thread uint &bk, thread uint &bi) {
  for (ushort o = 16; o > 0; o >>= 1) {
    uint ok = simd_shuffle_xor(bk, o), oi = simd_shuffle_xor(bi, o);
    if (pair_wins(ok, oi, bk, bi)) {
      bk = ok;
      bi = oi;
    }
  }
}

template <typename T>
row_max tg_argmax(device const T *x, ulong base, uint vocab, threadgroup argmax_scratch &sc, uint tid, uint n,
                  uint sg, uint lane) {
  uint bk = 0, bi = TOKEN_NO_INDEX;
  bool nan = false;
  for (uint i0 = tid; i0 < vocab; i0 += TOKEN_UNROLL * n) {
    float v[TOKEN_UNROLL];
    for (uint u = 0; u < TOKEN_UNROLL; u++) { // all loads first
      uint i = i0 + u * n;
      v[u] = i < vocab ? ld(x, base + i) : 0.0f;
    }
    for (uint u = 0; u < TOKEN_UNROLL; u++) {
      uint i = i0 + u * n, k = order_key(v[u]);
      if (i >= vocab) break;
      nan = nan || isnan(v[u]);
      if (k > bk || bi == TOKEN_NO_INDEX) { // this thread's indices increase: the first of equal keys stays
        bk = k;
        bi = i;
      }
    }
  }
  simd_argmax(bk, bi);
  bool any_nan = simd_any(nan);
  if (lane == 0) {
    sc.key[sg] = bk;
    sc.index[sg] = bi;
    sc.nan[sg] = any_nan ? 1u : 0u;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  uint groups = n / 32;
  bk = lane < groups ? sc.key[lane] : 0;
  bi = lane < groups ? sc.index[lane] : TOKEN_NO_INDEX;
  any_nan = simd_any(lane < groups && sc.nan[lane] != 0);
  simd_argmax(bk, bi);
  threadgroup_barrier(mem_flags::mem_threadgroup); // the scratch is free for the next call
  return row_max{bk, bi, any_nan};
}

// ---- argmax_{f32,bf16}: 0 logits, 1 ids ring, 2 {vocab, rows, ring, has_cursor}, 3 cursor ------

template <typename T>
void argmax_body(device const T *x, device uint *ids, constant mlxn_params_argmax &p, device const uint *cursor,
                 threadgroup argmax_scratch &sc, uint row, uint tid, uint n, uint sg, uint lane, uint tag,
                 device atomic_uint *fault_word) {
  uint vocab = p.vocab, rows = p.rows;
  if (row >= rows) return;
  row_max m = tg_argmax(x, ulong(row) * vocab, vocab, sc, tid, n, sg, lane);
  if (tid == 0) {
    ids[ring_element(cursor, rows, p.ring, p.has_cursor, row)] = m.index;
    if (m.nan) report_fault(fault_word, tag);
  }
}

kernel void argmax_f32(device const float *x [[buffer(0)]], device uint *ids [[buffer(1)]],
                       constant mlxn_params_argmax &p [[buffer(2)]], device const uint *cursor [[buffer(3)]],
                       TOKEN_TAIL) {
  threadgroup argmax_scratch sc;
  argmax_body(x, ids, p, cursor, sc, (gid.z * ngroups.y + gid.y) * ngroups.x + gid.x, lid.x, tpg.x, sg, lane, tag,
              fault_word);
}

kernel void argmax_bf16(device const ushort *x [[buffer(0)]], device uint *ids [[buffer(1)]],
                        constant mlxn_params_argmax &p [[buffer(2)]], device const uint *cursor [[buffer(3)]],
                        TOKEN_TAIL) {
  threadgroup argmax_scratch sc;
  argmax_body(x, ids, p, cursor, sc, (gid.z * ngroups.y + gid.y) * ngroups.x + gid.x, lid.x, tpg.x, sg, lane, tag,
              fault_word);
}

// ---- sample_{f32,bf16}: 0 logits, 1 ids ring, 2 {vocab, rows, ring, has_cursor, c, top_k,
//      top_p (Q31), seed_lo, seed_hi, counter}, 3 cursor -----------------------------------------

// The radix descent's digits: F0 = 0x1fffff − distance (21 bits: 8, 8, 5), the key (4 × 8) and
// ~index (4 × 8), most significant first.
inline uint level_digit(int level, uint f0, uint key, uint nidx) {
  if (level == 0) return f0 >> 13;
  if (level == 1) return (f0 >> 5) & 0xffu;
  if (level == 2) return f0 & 0x1fu;
  if (level < 7) return (key >> (24 - 8 * (level - 3))) & 0xffu;
  return (nidx >> (24 - 8 * (level - 7))) & 0xffu;
}

// The descent's state; its histograms are a separate threadgroup array of 4 × 256 atomic words:
// counts, lowest index, weight low and high words of each bucket.
#define H_CNT 0
#define H_MIN 256
#define H_WLO 512
#define H_WHI 768
struct select_scratch {
  uint mask[3], val[3];
  ulong need_c, need_w, above_c, above_w, count, weight;
  uint index;
  int done, found;
};

struct selection { ulong count; ulong weight; uint index; bool found; };

inline ulong shuffle_up64(ulong v, ushort o) {
  uint lo = simd_shuffle_up(uint(v & 0xffffffffu), o), hi = simd_shuffle_up(uint(v >> 32), o);
  return ulong(hi) << 32 | lo;
}

inline ulong shuffle_xor64(ulong v, ushort o) {
  uint lo = simd_shuffle_xor(uint(v & 0xffffffffu), o), hi = simd_shuffle_xor(uint(v >> 32), o);
  return ulong(hi) << 32 | lo;
}

inline uint hist_load(threadgroup atomic_uint *h, int at) { return atomic_load_explicit(&h[at], memory_order_relaxed); }
inline ulong bucket_weight(threadgroup atomic_uint *h, int b) {
  return ulong(hist_load(h, H_WHI + b)) << 32 | hist_load(h, H_WLO + b);
}

// See select_desc in kernels/cpu/sample.c: the first token in descending order at which the running
// count reaches need_c and the running weight reaches need_w.
template <typename T>
selection tg_select(device const T *x, ulong base, uint vocab, float mf, float c, ulong need_c, ulong need_w,
                    threadgroup select_scratch &s, threadgroup atomic_uint *h, uint tid, uint n, uint sg, uint lane) {
  if (tid == 0) {
    for (int f = 0; f < 3; f++) s.mask[f] = s.val[f] = 0;
    s.need_c = need_c;
    s.need_w = need_w;
    s.above_c = s.above_w = 0;
    s.done = s.found = 0;
  }
  for (int level = 0; level < TOKEN_LEVELS; level++) {
    // An index level whose digit is 0xff for every index below vocab needs no pass (never the last).
    if (level >= 7 && level < TOKEN_LEVELS - 1 && ((vocab - 1) >> uint(24 - 8 * (level - 7))) == 0) {
      if (tid == 0) {
        s.mask[2] |= 0xffu << uint(24 - 8 * (level - 7));
        s.val[2] |= 0xffu << uint(24 - 8 * (level - 7));
      }
      continue; // the next level's first barrier publishes the digit
    }
    for (uint b = tid; b < 256; b += n) {
      atomic_store_explicit(&h[H_CNT + b], 0u, memory_order_relaxed);
      atomic_store_explicit(&h[H_WLO + b], 0u, memory_order_relaxed);
      atomic_store_explicit(&h[H_WHI + b], 0u, memory_order_relaxed);
      atomic_store_explicit(&h[H_MIN + b], TOKEN_NO_INDEX, memory_order_relaxed);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    uint m0 = s.mask[0], m1 = s.mask[1], m2 = s.mask[2], v0 = s.val[0], v1 = s.val[1], v2 = s.val[2];
    for (uint i0 = tid; i0 < vocab; i0 += TOKEN_UNROLL * n) {
      float vs[TOKEN_UNROLL];
      for (uint u = 0; u < TOKEN_UNROLL; u++) {
        uint i = i0 + u * n;
        vs[u] = i < vocab ? ld(x, base + i) : 0.0f;
      }
      for (uint u = 0; u < TOKEN_UNROLL; u++) {
        uint i = i0 + u * n;
        if (i >= vocab) break;
        uint dq = token_distance(vs[u], mf, c);
        if (dq == TOKEN_NO_WEIGHT) continue;
        uint f0 = 0x1fffffu - dq, key = order_key(vs[u]), nidx = ~i;
        if ((f0 & m0) != v0 || (key & m1) != v1 || (nidx & m2) != v2) continue;
        uint d = level_digit(level, f0, key, nidx), w = distance_weight(dq);
        atomic_fetch_add_explicit(&h[H_CNT + d], 1u, memory_order_relaxed);
        uint old = atomic_fetch_add_explicit(&h[H_WLO + d], w, memory_order_relaxed);
        if (old + w < old) atomic_fetch_add_explicit(&h[H_WHI + d], 1u, memory_order_relaxed); // the carry
        atomic_fetch_min_explicit(&h[H_MIN + d], i, memory_order_relaxed);
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (sg == 0) {
      ulong nc = s.need_c, nw = s.need_w, lc = 0, lw = 0;
      for (int j = 0; j < 8; j++) {
        int b = 255 - 8 * int(lane) - j;
        lc += hist_load(h, H_CNT + b);
        lw += bucket_weight(h, b);
      }
      if (level == 0) { // count mode: at most every token of positive weight
        ulong total = lc;
        for (ushort o = 16; o > 0; o >>= 1) total += shuffle_xor64(total, o);
        if (nc > total) nc = total;
      }
      ulong ic = lc, iw = lw; // inclusive scan over lanes (lane 0 holds the top buckets)
      for (ushort o = 1; o < 32; o <<= 1) {
        ulong pc = shuffle_up64(ic, o), pw = shuffle_up64(iw, o);
        if (lane >= o) {
          ic += pc;
          iw += pw;
        }
      }
      ulong cc = ic - lc, cw = iw - lw;
      bool crossing = ic >= nc && iw >= nw && !(cc >= nc && cw >= nw);
      if (crossing) {
        int b = -1;
        for (int j = 0; j < 8; j++) {
          int k = 255 - 8 * int(lane) - j;
          ulong kc = hist_load(h, H_CNT + k), kw = bucket_weight(h, k);
          if (cc + kc >= nc && cw + kw >= nw) {
            b = k;
            break;
          }
          cc += kc;
          cw += kw;
        }
        // b >= 0: the predicate turns true inside this lane's buckets.
        ulong bc = hist_load(h, H_CNT + b), bw = bucket_weight(h, b);
        s.above_c += cc;
        s.above_w += cw;
        nc = nc > cc ? nc - cc : 0;
        nw = nw > cw ? nw - cw : 0;
        s.need_c = nc;
        s.need_w = nw;
        int f = level < 3 ? 0 : level < 7 ? 1 : 2;
        uint shift = level == 0 ? 13u : level == 1 ? 5u : level == 2 ? 0u : uint(24 - 8 * ((level - 3) % 4));
        s.mask[f] |= (level == 2 ? 0x1fu : 0xffu) << shift;
        s.val[f] |= uint(b) << shift;
        if (bc == (nc != 0 ? nc : 1ul) || level == TOKEN_LEVELS - 1) {
          s.count = s.above_c + bc;
          s.weight = s.above_w + bw;
          s.index = hist_load(h, H_MIN + b);
          s.found = 1;
          s.done = 1;
        }
      }
      if (!simd_any(crossing) && lane == 0) s.done = 1; // the totals fall short
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (s.done != 0) break;
  }
  selection r = selection{s.count, s.weight, s.index, s.found != 0};
  threadgroup_barrier(mem_flags::mem_threadgroup); // the scratch is free for the next call
  return r;
}

template <typename T>
void sample_body(device const T *x, device uint *ids, constant mlxn_params_sample &p, device const uint *cursor,
                 threadgroup argmax_scratch &asc, threadgroup select_scratch &ssc, threadgroup atomic_uint *h, uint row,
                 uint tid, uint n, uint sg, uint lane, uint tag, device atomic_uint *fault_word) {
  uint vocab = p.vocab, rows = p.rows, has_cursor = p.has_cursor;
  float c = p.c;
  uint top_k = p.top_k, top_p = p.top_p_q31;
  if (row >= rows) return;
  ulong base = ulong(row) * vocab;
  device uint *out = ids + ring_element(cursor, rows, p.ring, has_cursor, row);
  row_max m = tg_argmax(x, base, vocab, asc, tid, n, sg, lane);
  if (tid == 0) *out = m.index;
  if (m.nan || m.key == TOKEN_KEY_NEG_INF) { // nothing to sample from
    if (tid == 0) report_fault(fault_word, tag);
    return;
  }
  if (c == 0.0f) return; // temperature 0: greedy
  float mf = flush_subnormal(ld(x, base + m.index));
  selection k = tg_select(x, base, vocab, mf, c, top_k != 0 ? top_k : vocab, 0, ssc, h, tid, n, sg, lane);
  ulong total = k.weight;
  bool found = k.found;
  if (found && top_p < MLXN_SAMPLE_TOP_P_OFF) {
    ulong target = mulhi64(total, ulong(top_p) << 33);
    selection q = target != 0 ? tg_select(x, base, vocab, mf, c, 0, target, ssc, h, tid, n, sg, lane)
                              : tg_select(x, base, vocab, mf, c, 1, 0, ssc, h, tid, n, sg, lane);
    total = q.weight;
    found = q.found;
  }
  if (found) {
    uint4 r4 = philox4x32_10(uint4(p.counter + (has_cursor != 0 ? cursor[0] : 0u), row, 0, 0), p.seed_lo, p.seed_hi);
    ulong r = mulhi64(total, ulong(r4.y) << 32 | r4.x);
    selection s = tg_select(x, base, vocab, mf, c, 0, r + 1, ssc, h, tid, n, sg, lane);
    found = s.found;
    if (found && tid == 0) *out = s.index;
  }
  if (!found && tid == 0) report_fault(fault_word, tag);
}

kernel void sample_f32(device const float *x [[buffer(0)]], device uint *ids [[buffer(1)]],
                       constant mlxn_params_sample &p [[buffer(2)]], device const uint *cursor [[buffer(3)]],
                       TOKEN_TAIL) {
  threadgroup argmax_scratch asc;
  threadgroup select_scratch ssc;
  threadgroup atomic_uint hist[4 * 256];
  sample_body(x, ids, p, cursor, asc, ssc, hist, (gid.z * ngroups.y + gid.y) * ngroups.x + gid.x, lid.x, tpg.x, sg, lane,
              tag, fault_word);
}

kernel void sample_bf16(device const ushort *x [[buffer(0)]], device uint *ids [[buffer(1)]],
                        constant mlxn_params_sample &p [[buffer(2)]], device const uint *cursor [[buffer(3)]],
                        TOKEN_TAIL) {
  threadgroup argmax_scratch asc;
  threadgroup select_scratch ssc;
  threadgroup atomic_uint hist[4 * 256];
  sample_body(x, ids, p, cursor, asc, ssc, hist, (gid.z * ngroups.y + gid.y) * ngroups.x + gid.x, lid.x, tpg.x, sg, lane,
              tag, fault_word);
}

// ---- embed_gather_{f32,bf16,q8_0,q4_0}: 0 table, 1 ids ring, 2 out f32 [rows, dim],
//      3 {rows, dim, vocab, ring, has_cursor}, 4 cursor; threads (dim, rows) ----------------------

// The table row's id, or false (the row is written as zeros and the dispatch fails) when out of range.
inline bool gather_id(device const uint *ids, constant mlxn_params_gather &p, device const uint *cursor, uint r,
                      thread uint &id) {
  id = ids[ring_element(cursor, p.rows, p.ring, p.has_cursor, r)];
  return id < p.vocab;
}

inline float q8_0_value(device const uchar *table, ulong row_blocks, uint id, uint j) {
  device const uchar *blk = table + (ulong(id) * row_blocks + j / 32) * 34;
  return float(as_type<half>(ushort(blk[0] | (blk[1] << 8)))) * float(as_type<char>(blk[2 + j % 32]));
}

inline float q4_0_value(device const uchar *table, ulong row_blocks, uint id, uint j) {
  device const uchar *blk = table + (ulong(id) * row_blocks + j / 32) * 18;
  uint e = j % 32, q = e < 16 ? blk[2 + e] & 0xfu : blk[2 + e - 16] >> 4;
  return float(as_type<half>(ushort(blk[0] | (blk[1] << 8)))) * float(int(q) - 8);
}

#define GATHER_PROLOGUE                                                                              \
  uint j = gid.x * tpg.x + lid.x, r = gid.y * tpg.y + lid.y, id;                                   \
  if (j >= p.dim || r >= p.rows) return;                                                          \
  device float *o = out + ulong(r) * p.dim;                                                       \
  if (!gather_id(ids, p, cursor, r, id)) {                                                        \
    o[j] = 0.0f;                                                                                  \
    report_fault(fault_word, tag);                                                                \
    return;                                                                                       \
  }

kernel void embed_gather_f32(device const float *table [[buffer(0)]], device const uint *ids [[buffer(1)]],
                             device float *out [[buffer(2)]], constant mlxn_params_gather &p [[buffer(3)]],
                             device const uint *cursor [[buffer(4)]], MLXN_ARGS_TAIL) {
  GATHER_PROLOGUE
  o[j] = table[ulong(id) * p.dim + j];
}

kernel void embed_gather_bf16(device const ushort *table [[buffer(0)]], device const uint *ids [[buffer(1)]],
                              device float *out [[buffer(2)]], constant mlxn_params_gather &p [[buffer(3)]],
                              device const uint *cursor [[buffer(4)]], MLXN_ARGS_TAIL) {
  GATHER_PROLOGUE
  o[j] = bf16_to_f32(table[ulong(id) * p.dim + j]);
}

kernel void embed_gather_q8_0(device const uchar *table [[buffer(0)]], device const uint *ids [[buffer(1)]],
                              device float *out [[buffer(2)]], constant mlxn_params_gather &p [[buffer(3)]],
                              device const uint *cursor [[buffer(4)]], MLXN_ARGS_TAIL) {
  GATHER_PROLOGUE
  o[j] = q8_0_value(table, p.dim / 32, id, j);
}

kernel void embed_gather_q4_0(device const uchar *table [[buffer(0)]], device const uint *ids [[buffer(1)]],
                              device float *out [[buffer(2)]], constant mlxn_params_gather &p [[buffer(3)]],
                              device const uint *cursor [[buffer(4)]], MLXN_ARGS_TAIL) {
  GATHER_PROLOGUE
  o[j] = q4_0_value(table, p.dim / 32, id, j);
}

// state[i] += add for i < words (one thread): ends a token pass on the device.
kernel void step_advance_u32(device uint *state [[buffer(0)]], constant mlxn_params_step_advance &p [[buffer(1)]],
                             MLXN_ARGS_TAIL) {
  if (lid.x != 0 || gid.x != 0) return;
  for (uint i = 0; i < p.count; i++) state[i] += p.add;
}
