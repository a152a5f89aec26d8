/* Token selection and input on the device: argmax and seeded sampling over rows of logits (f32,
 * bf16), and the embedding gather (f32, bf16, q8_0, q4_0 tables) whose token ids are read from
 * device memory. src/ops/sample.ts defines the semantics; this file is the reference backend and the
 * CUDA and MSL kernels follow its structure step by step.
 *
 * Token ring: ids live in a u32 buffer of `ring` slots of `rows` ids. With the optional cursor
 * buffer bound, a dispatch uses slot cursor[0] % ring (one command stream serves every step of a
 * token loop); without it, slot 0. Row r of slot s is element s·rows + r.
 *
 * The sampler decides on integers so that every backend picks the same token: each logit gets an
 * integer weight ≈ 2³¹·2^(−(max − x)·log2(e)/T) computed from correctly rounded f32 operations, a
 * truncation and a shared table; sums are u64 (exact in any order); thresholds are found by a radix
 * descent over the tokens in descending (logit, then lower index) order. */
#include <stdlib.h>
#include <string.h>

#include "cpu_kernel.h"
#include "../../native/contracts/sample.h"

/* round(2³¹ · 2^(−j/256)), j = 0..256: 2^−f in Q31 at steps of 1/256 (every backend holds this
 * table; a test compares the copies with the formula). */
static const uint32_t exp2_neg_q31[257] = {
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

static inline uint32_t f32_bits(float x) {
  uint32_t b;
  memcpy(&b, &x, 4);
  return b;
}

/* A logit's place in the total order as an unsigned key: larger values get larger keys, −0 equals
 * +0, NaN sorts below −inf. */
static inline uint32_t order_key(float x) {
  uint32_t b = f32_bits(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) return 0;
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}
#define KEY_NEG_INF 0x007fffffu

/* Subnormals read as zero (GPUs may flush them; the weights must not depend on whether they do). */
static inline float flush_subnormal(float x) {
  uint32_t b = f32_bits(x);
  if ((b & 0x7f800000u) == 0) b &= 0x80000000u;
  float f;
  memcpy(&f, &b, 4);
  return f;
}

/* Fixed-point distance below the maximum: floor((mf − x)·c·2¹⁶), or UINT32_MAX when the weight is
 * zero ((mf − x)·c ≥ 31, −inf, or +inf below a +inf maximum). mf is the flushed maximum. */
#define NO_WEIGHT 0xffffffffu
static inline uint32_t token_distance(float x, float mf, float c) {
  float xf = flush_subnormal(x);
  float d = xf == mf ? 0.0f : (mf - xf) * c;
  if (!(d < 31.0f)) return NO_WEIGHT;
  return (uint32_t)(d * 65536.0f);
}

/* 2³¹·2^(−dq/2¹⁶), truncated: the table at the top 8 fraction bits, linear between entries. */
static inline uint32_t distance_weight(uint32_t dq) {
  uint32_t h = (dq >> 8) & 0xffu, lo = dq & 0xffu;
  uint32_t t0 = exp2_neg_q31[h], t1 = exp2_neg_q31[h + 1];
  return (t0 - (((t0 - t1) * lo) >> 8)) >> (dq >> 16);
}

/* floor(a·b / 2⁶⁴) from 32-bit halves (the GPU kernels use the same steps). */
static inline uint64_t mulhi64(uint64_t a, uint64_t b) {
  uint64_t a0 = a & 0xffffffffu, a1 = a >> 32, b0 = b & 0xffffffffu, b1 = b >> 32;
  uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
  uint64_t mid = (p00 >> 32) + (p01 & 0xffffffffu) + (p10 & 0xffffffffu);
  return p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
}

/* Philox4x32-10 (Salmon et al., SC'11): a counter-based generator, 10 rounds. */
static void philox4x32_10(uint32_t ctr[4], uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; r++) {
    if (r) {
      k0 += 0x9e3779b9u;
      k1 += 0xbb67ae85u;
    }
    uint64_t p0 = (uint64_t)0xd2511f53u * ctr[0], p1 = (uint64_t)0xcd9e8d57u * ctr[2];
    uint32_t c0 = (uint32_t)(p1 >> 32) ^ ctr[1] ^ k0, c2 = (uint32_t)(p0 >> 32) ^ ctr[3] ^ k1;
    ctr[0] = c0;
    ctr[1] = (uint32_t)p1;
    ctr[2] = c2;
    ctr[3] = (uint32_t)p0;
  }
}

/* Element of row `row` in the ring slot this dispatch uses. */
static inline uint64_t ring_element(const mlxn_kargs *a, int cursor, uint32_t rows, uint32_t ring,
                                    uint32_t has_cursor, uint32_t row) {
  uint32_t slot = has_cursor ? ((const uint32_t *)a->ptr[cursor])[0] % ring : 0;
  return (uint64_t)slot * rows + row;
}

static inline uint32_t row_index(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz) {
  return (uint32_t)(((uint64_t)gz * a->groups[1] + gy) * a->groups[0] + gx);
}

/* The row's maximum in the total order, ties to the lowest index; *nan tells whether any logit is
 * NaN. */
static uint32_t row_argmax(const uint8_t *row, uint32_t vocab, mlxn_ftype t, uint32_t *best_key, int *nan) {
  uint32_t bk = 0, bi = 0;
  int any_nan = 0;
  for (uint32_t i = 0; i < vocab; i++) {
    float x = mlxn_load(row, i, t);
    uint32_t k = order_key(x);
    any_nan |= x != x;
    if (k > bk || i == 0) {
      bk = k;
      bi = i;
    }
  }
  *best_key = bk;
  *nan = any_nan;
  return bi;
}

/* Every dtype's kernel reads its f32 form's slots (asserted in native/contracts/sample.c). */
static int argmax_run_t(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, mlxn_ftype t) {
  mlxn_params_argmax p = mlxn_params_argmax_of(a, MLXN_SLOT_ARGMAX_F32_ARGMAX);
  uint32_t vocab = p.vocab, rows = p.rows;
  uint32_t row = row_index(a, gx, gy, gz);
  if (row >= rows) return 0;
  uint32_t key;
  int nan;
  const uint8_t *x = a->ptr[0] + (uint64_t)row * vocab * mlxn_ftype_size(t);
  uint32_t id = row_argmax(x, vocab, t, &key, &nan);
  uint64_t at = ring_element(a, MLXN_SLOT_ARGMAX_F32_CURSOR, rows, p.ring, p.has_cursor, row);
  ((uint32_t *)a->ptr[1])[at] = id;
  return nan; /* data-dependent: reported as a failed dispatch */
}

/* ---- sample_{f32,bf16}: 0 logits [rows, vocab], 1 ids u32 ring, 2 {vocab, rows, ring,
 *      has_cursor, c: f32 = log2(e)/T (0: greedy), top_k (0: all), top_p: Q31 (2³¹: off),
 *      seed_lo, seed_hi, counter}, 3 cursor u32 (optional; also added to the counter);
 *      threadgroups (rows). A row holding NaN, or only −inf, fails the dispatch and gets the argmax. */

/* The radix descent. Tokens of positive weight are ranked by three fields, most significant first:
 * F0 = 0x1fffff − distance (21 bits), the order key, and ~index: descending order of (F0, key,
 * ~index) is descending order of (logit, then lower index). Each level histograms one digit of the
 * tokens that match the digits chosen so far. */
#define LEVELS 11
static inline uint32_t level_digit(int level, uint32_t f0, uint32_t key, uint32_t nidx) {
  if (level == 0) return f0 >> 13;
  if (level == 1) return (f0 >> 5) & 0xffu;
  if (level == 2) return f0 & 0x1fu;
  if (level < 7) return (key >> (24 - 8 * (level - 3))) & 0xffu;
  return (nidx >> (24 - 8 * (level - 7))) & 0xffu;
}

/* Adds digit d of `level` to the chosen prefix (field masks and values). */
static inline void level_fix(int level, uint32_t d, uint32_t mask[3], uint32_t val[3]) {
  int f = level < 3 ? 0 : level < 7 ? 1 : 2;
  uint32_t shift = level == 0 ? 13 : level == 1 ? 5 : level == 2 ? 0 : (uint32_t)(24 - 8 * ((level - 3) % 4));
  uint32_t width = level == 2 ? 0x1fu : 0xffu;
  mask[f] |= width << shift;
  val[f] |= d << shift;
}

typedef struct {
  uint64_t count, weight; /* tokens and weight up to and including the selected one (or bucket) */
  uint32_t index;         /* the selected token (weight mode) */
  int found;
} selection;

/* Index levels whose digit is the same for every index below vocab (~index digit 0xff) need no
 * pass: the descent fixes them directly (never the last level). */
static inline int level_is_constant(int level, uint32_t vocab) {
  return level >= 7 && level < LEVELS - 1 && ((vocab - 1) >> (24 - 8 * (level - 7))) == 0;
}

/* A token's descent fields; 0 when its weight is zero (it takes no part in any selection). */
static inline int token_fields(const uint8_t *row, uint32_t i, mlxn_ftype t, float mf, float c, uint32_t *dq,
                               uint32_t *f0, uint32_t *key) {
  float x = mlxn_load(row, i, t);
  *dq = token_distance(x, mf, c);
  if (*dq == NO_WEIGHT) return 0;
  *f0 = 0x1fffffu - *dq;
  *key = order_key(x);
  return 1;
}

static inline int token_matches(uint32_t f0, uint32_t key, uint32_t i, const uint32_t mask[3], const uint32_t val[3]) {
  return (f0 & mask[0]) == val[0] && (key & mask[1]) == val[1] && (~i & mask[2]) == val[2];
}

/* The first token in descending order at which the running count reaches need_c and the running
 * weight reaches need_w (count mode: need_c ≥ 1, need_w = 0, clamped to the tokens there are;
 * weight mode: need_c = 0, need_w ≥ 1). Count mode may stop at a bucket that ends exactly there.
 * After the first level, this backend keeps the list of tokens matching the chosen digits and
 * visits only those (the GPU kernels rescan the row; the result is the same). */
static selection select_desc(const uint8_t *row, uint32_t vocab, mlxn_ftype t, float mf, float c, uint64_t need_c,
                             uint64_t need_w) {
  uint32_t mask[3] = {0, 0, 0}, val[3] = {0, 0, 0};
  uint64_t above_c = 0, above_w = 0;
  selection s = {0, 0, 0, 0};
  uint32_t *cand = NULL, ncand = 0;
  for (int level = 0; level < LEVELS; level++) {
    if (level_is_constant(level, vocab)) {
      level_fix(level, 0xffu, mask, val);
      continue;
    }
    uint32_t cnt[256], min_idx[256];
    uint64_t wsum[256];
    memset(cnt, 0, sizeof cnt);
    memset(wsum, 0, sizeof wsum);
    memset(min_idx, 0xff, sizeof min_idx);
    uint32_t n = cand ? ncand : vocab;
    for (uint32_t j = 0; j < n; j++) {
      uint32_t i = cand ? cand[j] : j, dq, f0, key;
      if (!token_fields(row, i, t, mf, c, &dq, &f0, &key) || !token_matches(f0, key, i, mask, val)) continue;
      uint32_t d = level_digit(level, f0, key, ~i);
      cnt[d]++;
      wsum[d] += distance_weight(dq);
      if (i < min_idx[d]) min_idx[d] = i;
    }
    if (level == 0) { /* count mode: at most every token of positive weight */
      uint64_t total = 0;
      for (int b = 0; b < 256; b++) total += cnt[b];
      if (need_c > total) need_c = total;
    }
    uint64_t cc = 0, cw = 0;
    int b = 255;
    for (; b >= 0; b--) {
      if (cc + cnt[b] >= need_c && cw + wsum[b] >= need_w) break;
      cc += cnt[b];
      cw += wsum[b];
    }
    if (b < 0) break; /* the totals fall short: inconsistent arguments */
    above_c += cc;
    above_w += cw;
    need_c = need_c > cc ? need_c - cc : 0;
    need_w = need_w > cw ? need_w - cw : 0;
    level_fix(level, (uint32_t)b, mask, val);
    if (cnt[b] == (need_c ? need_c : 1) || level == LEVELS - 1) {
      s.count = above_c + cnt[b];
      s.weight = above_w + wsum[b];
      s.index = min_idx[b];
      s.found = 1;
      break;
    }
    /* Narrow the candidates to the chosen bucket (without memory, keep scanning the whole row). */
    if (!cand && (cand = malloc((size_t)cnt[b] * sizeof *cand)) != NULL) {
      for (uint32_t i = 0; i < vocab; i++) {
        uint32_t dq, f0, key;
        if (token_fields(row, i, t, mf, c, &dq, &f0, &key) && token_matches(f0, key, i, mask, val)) cand[ncand++] = i;
      }
    } else if (cand) {
      uint32_t kept = 0;
      for (uint32_t j = 0; j < ncand; j++) {
        uint32_t i = cand[j], dq, f0, key;
        if (token_fields(row, i, t, mf, c, &dq, &f0, &key) && token_matches(f0, key, i, mask, val)) cand[kept++] = i;
      }
      ncand = kept;
    }
  }
  free(cand);
  return s;
}

static int sample_run_t(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, mlxn_ftype t) {
  mlxn_params_sample p = mlxn_params_sample_of(a, MLXN_SLOT_SAMPLE_F32_SAMPLE);
  const int cursor = MLXN_SLOT_SAMPLE_F32_CURSOR;
  uint32_t vocab = p.vocab, rows = p.rows, has_cursor = p.has_cursor;
  float c = p.c;
  uint32_t top_k = p.top_k, top_p = p.top_p_q31;
  uint32_t row = row_index(a, gx, gy, gz);
  if (row >= rows) return 0;
  const uint8_t *x = a->ptr[0] + (uint64_t)row * vocab * mlxn_ftype_size(t);
  uint32_t *out = (uint32_t *)a->ptr[1] + ring_element(a, cursor, rows, p.ring, has_cursor, row);
  uint32_t key;
  int nan;
  uint32_t best = row_argmax(x, vocab, t, &key, &nan);
  *out = best;
  if (nan || key == KEY_NEG_INF) return 1; /* nothing to sample from */
  if (c == 0.0f) return 0;                 /* temperature 0: greedy */
  float mf = flush_subnormal(mlxn_load(x, best, t));
  selection k = select_desc(x, vocab, t, mf, c, top_k ? top_k : vocab, 0);
  if (!k.found) return 1;
  uint64_t total = k.weight;
  if (top_p < MLXN_SAMPLE_TOP_P_OFF) {
    uint64_t target = mulhi64(total, (uint64_t)top_p << 33);
    selection p = target ? select_desc(x, vocab, t, mf, c, 0, target) : select_desc(x, vocab, t, mf, c, 1, 0);
    if (!p.found) return 1;
    total = p.weight;
  }
  uint32_t ctr[4] = {p.counter + (has_cursor ? ((const uint32_t *)a->ptr[cursor])[0] : 0), row, 0, 0};
  philox4x32_10(ctr, p.seed_lo, p.seed_hi);
  uint64_t r = mulhi64(total, (uint64_t)ctr[1] << 32 | ctr[0]);
  selection s = select_desc(x, vocab, t, mf, c, 0, r + 1);
  if (!s.found) return 1;
  *out = s.index;
  return 0;
}

/* ---- embed_gather_{f32,bf16,q8_0,q4_0}: 0 table [vocab rows], 1 ids u32 ring, 2 out f32 [rows,
 *      dim], 3 {rows, dim, vocab, ring, has_cursor}, 4 cursor u32 (optional); threads (dim, rows).
 *      An id ≥ vocab fails the dispatch and its row is written as zeros (nothing is read out of
 *      bounds). q8_0/q4_0 rows are ggml blocks of 32 values: f16 scale then 32 int8 (34 B) or 16
 *      bytes of nibbles, value j low, j + 16 high, minus 8 (18 B). */


static inline float gather_value(const uint8_t *row, int fmt, uint32_t j) {
  if (fmt == G_F32) return mlxn_load(row, j, MLXN_T_F32);
  if (fmt == G_BF16) return mlxn_load(row, j, MLXN_T_BF16);
  uint16_t h;
  if (fmt == G_Q8_0) {
    const uint32_t n = ggml_block_values(GGML_Q8_0);
    const uint8_t *blk = row + (uint64_t)(j / n) * ggml_block_bytes(GGML_Q8_0);
    memcpy(&h, blk, 2);
    return mlxn_f16_to_f32(h) * (float)(int8_t)blk[2 + j % n];
  }
  const uint32_t n = ggml_block_values(GGML_Q4_0);
  const uint8_t *blk = row + (uint64_t)(j / n) * ggml_block_bytes(GGML_Q4_0);
  memcpy(&h, blk, 2);
  uint32_t v = j % n, q = v < n / 2 ? blk[2 + v] & 0xfu : blk[2 + v - n / 2] >> 4;
  return mlxn_f16_to_f32(h) * (float)((int)q - 8);
}

static int gather_run_t(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, int fmt) {
  (void)gz;
  mlxn_params_gather p = mlxn_params_gather_of(a, MLXN_SLOT_EMBED_GATHER_F32_GATHER);
  uint32_t rows = p.rows, dim = p.dim, vocab = p.vocab;
  int failed = 0;
  for (uint32_t ty = 0; ty < a->tg[1]; ty++) {
    uint32_t r = gy * a->tg[1] + ty;
    if (r >= rows || r >= a->grid[1]) break;
    uint64_t at = ring_element(a, MLXN_SLOT_EMBED_GATHER_F32_CURSOR, rows, p.ring, p.has_cursor, r);
    uint32_t id = ((const uint32_t *)a->ptr[1])[at];
    float *out = (float *)a->ptr[2] + (uint64_t)r * dim;
    const uint8_t *src = a->ptr[0] + (uint64_t)(id < vocab ? id : 0) * gather_row_bytes(fmt, dim);
    failed |= id >= vocab;
    for (uint32_t tx = 0; tx < a->tg[0]; tx++) {
      uint32_t j = gx * a->tg[0] + tx;
      if (j >= dim || j >= a->grid[0]) break;
      out[j] = id < vocab ? gather_value(src, fmt, j) : 0.0f;
    }
  }
  return failed; /* data-dependent: reported as a failed dispatch */
}

#define TOKEN_KERNELS(SUF, T)                                                                     \
  static int argmax_##SUF##_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) { \
    (void)s;                                                                                       \
    return argmax_run_t(a, gx, gy, gz, T);                                                         \
  }                                                                                                \
  static int sample_##SUF##_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) { \
    (void)s;                                                                                       \
    return sample_run_t(a, gx, gy, gz, T);                                                         \
  }
TOKEN_KERNELS(f32, MLXN_T_F32)
TOKEN_KERNELS(bf16, MLXN_T_BF16)

#define GATHER_KERNEL(SUF, F)                                                                     \
  static int embed_gather_##SUF##_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, \
                                      void *s) {                                                   \
    (void)s;                                                                                       \
    return gather_run_t(a, gx, gy, gz, F);                                                         \
  }
GATHER_KERNEL(f32, G_F32)
GATHER_KERNEL(bf16, G_BF16)
GATHER_KERNEL(q8_0, G_Q8_0)
GATHER_KERNEL(q4_0, G_Q4_0)

MLXN_CPU_BODY(argmax_f32, argmax_f32_run)
MLXN_CPU_BODY(argmax_bf16, argmax_bf16_run)
MLXN_CPU_BODY(sample_f32, sample_f32_run)
MLXN_CPU_BODY(sample_bf16, sample_bf16_run)
MLXN_CPU_BODY(embed_gather_f32, embed_gather_f32_run)
MLXN_CPU_BODY(embed_gather_bf16, embed_gather_bf16_run)
MLXN_CPU_BODY(embed_gather_q8_0, embed_gather_q8_0_run)
MLXN_CPU_BODY(embed_gather_q4_0, embed_gather_q4_0_run)

/* ---- step_advance_u32: 0 state u32[words], 1 {words, add}: state[i] += add (mod 2³²), i < words. */
static int step_advance_u32_run(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *s) {
  (void)s;
  if (gx || gy || gz) return 0; /* one thread's work */
  mlxn_params_step_advance p = mlxn_params_step_advance_of(a, MLXN_SLOT_STEP_ADVANCE_U32_STEP_ADVANCE);
  uint32_t *state = (uint32_t *)a->ptr[MLXN_SLOT_STEP_ADVANCE_U32_STATE];
  for (uint32_t i = 0; i < p.count; i++) state[i] += p.add;
  return 0;
}

MLXN_CPU_BODY(step_advance_u32, step_advance_u32_run)
