// Token selection and input (kernels/cpu/sample.c is the reference: same steps, same integers).
// argmax and sample: one block per row; the row's maximum is a (key, index) reduction over warps;
// the sampler's radix descent histograms one digit per pass in shared memory (integer atomics, so
// the counts and weight sums do not depend on the order threads add them), then warp 0 scans the
// 256 buckets, 8 per lane. embed_gather: one thread per output element. Every dtype's (or table
// format's) kernel reads its f32 form's slots (asserted in native/contracts/sample.c).
#include "../../native/contracts/sample.h"
#include "common.cuh"

// round(2^31 · 2^(−j/256)), j = 0..256 (the same table as every backend; tests compare them).
__constant__ uint32_t exp2_neg_q31[257] = {
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

#define KEY_NEG_INF 0x007fffffu
#define NO_WEIGHT 0xffffffffu
#define LEVELS 11
#define NO_INDEX 0xffffffffu
// Row elements each thread loads before using any (vocab <= 2^30, so indices never wrap).
#define UNROLL 4

__device__ __forceinline__ uint32_t order_key(float x) {
  uint32_t b = __float_as_uint(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) return 0;
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}

__device__ __forceinline__ float flush_subnormal(float x) {
  uint32_t b = __float_as_uint(x);
  if ((b & 0x7f800000u) == 0) b &= 0x80000000u;
  return __uint_as_float(b);
}

// Explicitly rounded operations: never contracted, so the bits match the CPU's.
__device__ __forceinline__ uint32_t token_distance(float x, float mf, float c) {
  float xf = flush_subnormal(x);
  float d = xf == mf ? 0.0f : __fmul_rn(__fsub_rn(mf, xf), c);
  if (!(d < 31.0f)) return NO_WEIGHT;
  return (uint32_t)__fmul_rn(d, 65536.0f);
}

__device__ __forceinline__ uint32_t distance_weight(uint32_t dq) {
  uint32_t h = (dq >> 8) & 0xffu, lo = dq & 0xffu;
  uint32_t t0 = exp2_neg_q31[h], t1 = exp2_neg_q31[h + 1];
  return (t0 - (((t0 - t1) * lo) >> 8)) >> (dq >> 16);
}

__device__ __forceinline__ uint64_t mulhi64(uint64_t a, uint64_t b) {
  uint64_t a0 = a & 0xffffffffu, a1 = a >> 32, b0 = b & 0xffffffffu, b1 = b >> 32;
  uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
  uint64_t mid = (p00 >> 32) + (p01 & 0xffffffffu) + (p10 & 0xffffffffu);
  return p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
}

__device__ __forceinline__ void philox4x32_10(uint32_t ctr[4], uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; r++) {
    if (r) {
      k0 += 0x9e3779b9u;
      k1 += 0xbb67ae85u;
    }
    uint32_t hi0 = __umulhi(0xd2511f53u, ctr[0]), lo0 = 0xd2511f53u * ctr[0];
    uint32_t hi1 = __umulhi(0xcd9e8d57u, ctr[2]), lo1 = 0xcd9e8d57u * ctr[2];
    uint32_t c0 = hi1 ^ ctr[1] ^ k0, c2 = hi0 ^ ctr[3] ^ k1;
    ctr[0] = c0;
    ctr[1] = lo1;
    ctr[2] = c2;
    ctr[3] = lo0;
  }
}

__device__ __forceinline__ uint32_t block_row() {
  return (uint32_t)(((uint64_t)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x);
}

__device__ __forceinline__ uint64_t ring_element(const mlxn_gpu_args &a, int cursor, uint32_t rows, uint32_t ring,
                                                 uint32_t has_cursor, uint32_t row) {
  uint32_t slot = has_cursor ? buf<const uint32_t>(a, cursor)[0] % ring : 0;
  return (uint64_t)slot * rows + row;
}

// (key, index) pairs: the larger key wins, then the lower index.
__device__ __forceinline__ bool pair_wins(uint32_t k, uint32_t i, uint32_t bk, uint32_t bi) {
  return k > bk || (k == bk && i < bi);
}

struct row_max {
  uint32_t key, index;
  bool nan;
};

// The row's maximum in the total order, ties to the lowest index, and whether any logit is NaN.
// blockDim.x is a power of two in [32, MLXN_TOKEN_MAX_THREADS] (the contract's validation checks it).
template <int T> __device__ row_max block_argmax(const void *x, uint64_t base, uint32_t vocab) {
  __shared__ uint32_t wk[MLXN_TOKEN_MAX_THREADS / 32], wi[MLXN_TOKEN_MAX_THREADS / 32];
  uint32_t bk = 0, bi = NO_INDEX;
  int nan = 0;
  for (uint32_t i0 = threadIdx.x; i0 < vocab; i0 += UNROLL * blockDim.x) {
    float v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) { // all loads first: UNROLL memory round trips in flight
      uint32_t i = i0 + u * blockDim.x;
      v[u] = i < vocab ? load<T>(x, base + i) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
      uint32_t i = i0 + u * blockDim.x, k = order_key(v[u]);
      if (i >= vocab) break;
      nan |= v[u] != v[u];
      if (k > bk || bi == NO_INDEX) { // this thread's indices increase: the first of equal keys stays
        bk = k;
        bi = i;
      }
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    uint32_t ok = __shfl_xor_sync(0xffffffffu, bk, o), oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (pair_wins(ok, oi, bk, bi)) {
      bk = ok;
      bi = oi;
    }
  }
  const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) {
    wk[warp] = bk;
    wi[warp] = bi;
  }
  bool any_nan = __syncthreads_or(nan) != 0;
  bk = lane < warps ? wk[lane] : 0;
  bi = lane < warps ? wi[lane] : NO_INDEX;
  for (int o = 16; o > 0; o >>= 1) {
    uint32_t ok = __shfl_xor_sync(0xffffffffu, bk, o), oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (pair_wins(ok, oi, bk, bi)) {
      bk = ok;
      bi = oi;
    }
  }
  __syncthreads(); // wk/wi are free for the next call
  return row_max{bk, bi, any_nan};
}

// ---- argmax_{f32,bf16}: 0 logits, 1 ids ring, 2 {vocab, rows, ring, has_cursor}, 3 cursor ------

template <int T> __global__ void k_argmax(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args(args);
  const mlxn_params_argmax p = mlxn_params_argmax_at(a, MLXN_SLOT_ARGMAX_F32_ARGMAX);
  const uint32_t vocab = p.vocab, rows = p.rows;
  uint32_t row = block_row();
  if (row >= rows) return;
  row_max m = block_argmax<T>(buf<const void>(a, 0), (uint64_t)row * vocab, vocab);
  if (threadIdx.x == 0) {
    buf<uint32_t>(a, 1)[ring_element(a, MLXN_SLOT_ARGMAX_F32_CURSOR, rows, p.ring, p.has_cursor, row)] = m.index;
    if (m.nan) fault(a);
  }
}

// ---- sample_{f32,bf16}: 0 logits, 1 ids ring, 2 {vocab, rows, ring, has_cursor, c, top_k,
//      top_p (Q31), seed_lo, seed_hi, counter}, 3 cursor -----------------------------------------

// The radix descent's digits: F0 = 0x1fffff − distance (21 bits: 8, 8, 5), the key (4 × 8) and
// ~index (4 × 8), most significant first.
__device__ __forceinline__ uint32_t level_digit(int level, uint32_t f0, uint32_t key, uint32_t nidx) {
  if (level == 0) return f0 >> 13;
  if (level == 1) return (f0 >> 5) & 0xffu;
  if (level == 2) return f0 & 0x1fu;
  if (level < 7) return (key >> (24 - 8 * (level - 3))) & 0xffu;
  return (nidx >> (24 - 8 * (level - 7))) & 0xffu;
}

struct select_state {
  uint32_t mask[3], val[3];
  unsigned long long need_c, need_w, above_c, above_w;
  unsigned long long count, weight; // of the result
  uint32_t index;
  int done, found;
};

struct selection {
  unsigned long long count, weight;
  uint32_t index;
  bool found;
};

// See select_desc in kernels/cpu/sample.c: the first token in descending order at which the running
// count reaches need_c and the running weight reaches need_w.
template <int T>
__device__ selection block_select(const void *x, uint64_t base, uint32_t vocab, float mf, float c,
                                  unsigned long long need_c, unsigned long long need_w) {
  __shared__ uint32_t h_cnt[256], h_min[256];
  __shared__ unsigned long long h_w[256];
  __shared__ select_state st;
  const uint32_t tid = threadIdx.x, lane = tid & 31u;
  if (tid == 0) {
    for (int f = 0; f < 3; f++) st.mask[f] = st.val[f] = 0;
    st.need_c = need_c;
    st.need_w = need_w;
    st.above_c = st.above_w = 0;
    st.done = st.found = 0;
  }
  for (int level = 0; level < LEVELS; level++) {
    // An index level whose digit is 0xff for every index below vocab needs no pass (never the last).
    if (level >= 7 && level < LEVELS - 1 && ((vocab - 1) >> (24 - 8 * (level - 7))) == 0) {
      if (tid == 0) {
        st.mask[2] |= 0xffu << (24 - 8 * (level - 7));
        st.val[2] |= 0xffu << (24 - 8 * (level - 7));
      }
      continue; // the next level's first barrier publishes the digit
    }
    for (uint32_t b = tid; b < 256; b += blockDim.x) {
      h_cnt[b] = 0;
      h_w[b] = 0;
      h_min[b] = NO_INDEX;
    }
    __syncthreads();
    const uint32_t m0 = st.mask[0], m1 = st.mask[1], m2 = st.mask[2];
    const uint32_t v0 = st.val[0], v1 = st.val[1], v2 = st.val[2];
    for (uint32_t i0 = tid; i0 < vocab; i0 += UNROLL * blockDim.x) {
      float vs[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; u++) {
        uint32_t i = i0 + u * blockDim.x;
        vs[u] = i < vocab ? load<T>(x, base + i) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < UNROLL; u++) {
        uint32_t i = i0 + u * blockDim.x;
        if (i >= vocab) break;
        uint32_t dq = token_distance(vs[u], mf, c);
        if (dq == NO_WEIGHT) continue;
        uint32_t f0 = 0x1fffffu - dq, key = order_key(vs[u]), nidx = ~i;
        if ((f0 & m0) != v0 || (key & m1) != v1 || (nidx & m2) != v2) continue;
        uint32_t d = level_digit(level, f0, key, nidx);
        atomicAdd(&h_cnt[d], 1u);
        atomicAdd(&h_w[d], (unsigned long long)distance_weight(dq));
        atomicMin(&h_min[d], i);
      }
    }
    __syncthreads();
    if (tid < 32) {
      unsigned long long nc = st.need_c, nw = st.need_w, lc = 0, lw = 0;
      for (int j = 0; j < 8; j++) {
        lc += h_cnt[255 - 8 * lane - j];
        lw += h_w[255 - 8 * lane - j];
      }
      if (level == 0) { // count mode: at most every token of positive weight
        unsigned long long total = lc;
        for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
        if (nc > total) nc = total;
      }
      unsigned long long ic = lc, iw = lw; // inclusive scan over lanes (lane 0 holds the top buckets)
      for (int o = 1; o < 32; o <<= 1) {
        unsigned long long pc = __shfl_up_sync(0xffffffffu, ic, o), pw = __shfl_up_sync(0xffffffffu, iw, o);
        if (lane >= (uint32_t)o) {
          ic += pc;
          iw += pw;
        }
      }
      unsigned long long cc = ic - lc, cw = iw - lw;
      bool crossing = ic >= nc && iw >= nw && !(cc >= nc && cw >= nw);
      if (crossing) {
        int b = -1;
        for (int j = 0; j < 8; j++) {
          int k = 255 - 8 * (int)lane - j;
          if (cc + h_cnt[k] >= nc && cw + h_w[k] >= nw) {
            b = k;
            break;
          }
          cc += h_cnt[k];
          cw += h_w[k];
        }
        // b >= 0: the predicate turns true inside this lane's buckets.
        st.above_c += cc;
        st.above_w += cw;
        nc = nc > cc ? nc - cc : 0;
        nw = nw > cw ? nw - cw : 0;
        st.need_c = nc;
        st.need_w = nw;
        int f = level < 3 ? 0 : level < 7 ? 1 : 2;
        uint32_t shift = level == 0 ? 13 : level == 1 ? 5 : level == 2 ? 0 : (uint32_t)(24 - 8 * ((level - 3) % 4));
        st.mask[f] |= (level == 2 ? 0x1fu : 0xffu) << shift;
        st.val[f] |= (uint32_t)b << shift;
        if (h_cnt[b] == (nc ? nc : 1ull) || level == LEVELS - 1) {
          st.count = st.above_c + h_cnt[b];
          st.weight = st.above_w + h_w[b];
          st.index = h_min[b];
          st.found = 1;
          st.done = 1;
        }
      }
      if (!__any_sync(0xffffffffu, crossing) && lane == 0) st.done = 1; // the totals fall short
    }
    __syncthreads();
    if (st.done) break;
  }
  selection s{st.count, st.weight, st.index, st.found != 0};
  __syncthreads(); // st and the histograms are free for the next call
  return s;
}

template <int T> __launch_bounds__(MLXN_TOKEN_MAX_THREADS) __global__ void k_sample(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args(args);
  const mlxn_params_sample sp = mlxn_params_sample_at(a, MLXN_SLOT_SAMPLE_F32_SAMPLE);
  const int cursor = MLXN_SLOT_SAMPLE_F32_CURSOR;
  const uint32_t vocab = sp.vocab, rows = sp.rows, has_cursor = sp.has_cursor;
  const float c = sp.c;
  const uint32_t top_k = sp.top_k, top_p = sp.top_p_q31;
  uint32_t row = block_row();
  if (row >= rows) return;
  const void *x = buf<const void>(a, 0);
  const uint64_t base = (uint64_t)row * vocab;
  uint32_t *out = buf<uint32_t>(a, 1) + ring_element(a, cursor, rows, sp.ring, has_cursor, row);
  row_max m = block_argmax<T>(x, base, vocab);
  if (threadIdx.x == 0) *out = m.index;
  if (m.nan || m.key == KEY_NEG_INF) { // nothing to sample from
    if (threadIdx.x == 0) fault(a);
    return;
  }
  if (c == 0.0f) return; // temperature 0: greedy
  float mf = flush_subnormal(load<T>(x, base + m.index));
  selection k = block_select<T>(x, base, vocab, mf, c, top_k ? top_k : vocab, 0);
  unsigned long long total = k.weight;
  bool found = k.found;
  if (found && top_p < MLXN_SAMPLE_TOP_P_OFF) {
    unsigned long long target = mulhi64(total, (uint64_t)top_p << 33);
    selection p = target ? block_select<T>(x, base, vocab, mf, c, 0, target) : block_select<T>(x, base, vocab, mf, c, 1, 0);
    total = p.weight;
    found = p.found;
  }
  if (found) {
    uint32_t ctr[4] = {sp.counter + (has_cursor ? buf<const uint32_t>(a, cursor)[0] : 0u), row, 0, 0};
    philox4x32_10(ctr, sp.seed_lo, sp.seed_hi);
    unsigned long long r = mulhi64(total, (uint64_t)ctr[1] << 32 | ctr[0]);
    selection s = block_select<T>(x, base, vocab, mf, c, 0, r + 1);
    found = s.found;
    if (found && threadIdx.x == 0) *out = s.index;
  }
  if (!found && threadIdx.x == 0) fault(a);
}

// ---- embed_gather_{f32,bf16,q8_0,q4_0}: 0 table, 1 ids ring, 2 out f32 [rows, dim],
//      3 {rows, dim, vocab, ring, has_cursor}, 4 cursor; threads (dim, rows) ----------------------

template <int F> __global__ void k_embed_gather(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args(args);
  const mlxn_params_gather p = mlxn_params_gather_at(a, MLXN_SLOT_EMBED_GATHER_F32_GATHER);
  const uint32_t rows = p.rows, dim = p.dim, vocab = p.vocab;
  uint64_t j = thread_x(a);
  uint32_t r = blockIdx.y * a.tg[1] + threadIdx.y;
  if (j >= dim || r >= rows) return;
  const uint64_t at = ring_element(a, MLXN_SLOT_EMBED_GATHER_F32_CURSOR, rows, p.ring, p.has_cursor, r);
  uint32_t id = buf<const uint32_t>(a, 1)[at];
  float *out = buf<float>(a, 2) + (uint64_t)r * dim;
  if (id >= vocab) { // data-dependent: the row is zeros and the dispatch fails
    out[j] = 0.0f;
    fault(a);
    return;
  }
  const uint8_t *table = buf<const uint8_t>(a, 0);
  float v;
  if (F == G_F32) {
    v = reinterpret_cast<const float *>(table)[(uint64_t)id * dim + j];
  } else if (F == G_BF16) {
    v = __bfloat162float(reinterpret_cast<const __nv_bfloat16 *>(table)[(uint64_t)id * dim + j]);
  } else if (F == G_Q8_0) {
    constexpr uint32_t n = ggml_block_values(GGML_Q8_0);
    const uint8_t *blk = table + ((uint64_t)id * (dim / n) + j / n) * ggml_block_bytes(GGML_Q8_0);
    v = __fmul_rn(__half2float(*reinterpret_cast<const __half *>(blk)), (float)(int8_t)blk[2 + j % n]);
  } else {
    constexpr uint32_t n = ggml_block_values(GGML_Q4_0);
    const uint8_t *blk = table + ((uint64_t)id * (dim / n) + j / n) * ggml_block_bytes(GGML_Q4_0);
    uint32_t e = (uint32_t)(j % n), q = e < n / 2 ? blk[2 + e] & 0xfu : blk[2 + e - n / 2] >> 4;
    v = __fmul_rn(__half2float(*reinterpret_cast<const __half *>(blk)), (float)((int)q - 8));
  }
  out[j] = v;
}

MLXN_CUDA_KERNEL(argmax_f32, (k_argmax<T_F32>));
MLXN_CUDA_KERNEL(argmax_bf16, (k_argmax<T_BF16>));
MLXN_CUDA_KERNEL(sample_f32, (k_sample<T_F32>));
MLXN_CUDA_KERNEL(sample_bf16, (k_sample<T_BF16>));
MLXN_CUDA_KERNEL(embed_gather_f32, (k_embed_gather<G_F32>));
MLXN_CUDA_KERNEL(embed_gather_bf16, (k_embed_gather<G_BF16>));
MLXN_CUDA_KERNEL(embed_gather_q8_0, (k_embed_gather<G_Q8_0>));
MLXN_CUDA_KERNEL(embed_gather_q4_0, (k_embed_gather<G_Q4_0>));

// state[i] += add for i < words (one thread): ends a token pass on the device.
__global__ void k_step_advance(const mlxn_gpu_args *__restrict__ args) {
  const mlxn_gpu_args &a = kernel_args(args);
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const mlxn_params_step_advance p = mlxn_params_step_advance_at(a, MLXN_SLOT_STEP_ADVANCE_U32_STEP_ADVANCE);
  uint32_t *state = buf<uint32_t>(a, MLXN_SLOT_STEP_ADVANCE_U32_STATE);
  for (uint32_t i = 0; i < p.count; i++) state[i] += p.add;
}

MLXN_CUDA_KERNEL(step_advance_u32, (k_step_advance));
