/* Native core: the plan cache's key comparison (mlxn_key_compare). A recorded pass hits a cached
 * plan when its stream words equal the key's everywhere but at inline-constant values; the values
 * that changed are copied into the key and into the plan's records. One pass over the words at
 * memory speed replaces a per-constant loop on the host. Touches no device state. */
#include <string.h>

#include "internal.h"

/* MLXN_KEY_COMPARE_PORTABLE forces the plain C comparison (tests build it beside the SIMD one). */
#if defined(__SSE2__) && !defined(MLXN_KEY_COMPARE_PORTABLE)
#include <emmintrin.h>

/* Bit j: words j of a and b differ (j < 16). */
static inline uint32_t differing16(const uint32_t *a, const uint32_t *b) {
  __m128i e0 = _mm_cmpeq_epi32(_mm_loadu_si128((const __m128i *)a), _mm_loadu_si128((const __m128i *)b));
  __m128i e1 = _mm_cmpeq_epi32(_mm_loadu_si128((const __m128i *)(a + 4)), _mm_loadu_si128((const __m128i *)(b + 4)));
  __m128i e2 = _mm_cmpeq_epi32(_mm_loadu_si128((const __m128i *)(a + 8)), _mm_loadu_si128((const __m128i *)(b + 8)));
  __m128i e3 = _mm_cmpeq_epi32(_mm_loadu_si128((const __m128i *)(a + 12)), _mm_loadu_si128((const __m128i *)(b + 12)));
  __m128i e = _mm_packs_epi16(_mm_packs_epi32(e0, e1), _mm_packs_epi32(e2, e3)); /* one byte per word */
  return ~(uint32_t)_mm_movemask_epi8(e) & 0xffffu;
}
#elif defined(__aarch64__) && defined(__ARM_NEON) && !defined(MLXN_KEY_COMPARE_PORTABLE)
#include <arm_neon.h>

/* Bit j: words j of a and b differ (j < 16). AArch64 has no byte movemask: the equal-lanes bytes are
 * weighted by their bit and summed across each half. */
static inline uint32_t differing16(const uint32_t *a, const uint32_t *b) {
  static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  uint16x8_t e01 = vcombine_u16(vmovn_u32(vceqq_u32(vld1q_u32(a), vld1q_u32(b))),
                                vmovn_u32(vceqq_u32(vld1q_u32(a + 4), vld1q_u32(b + 4))));
  uint16x8_t e23 = vcombine_u16(vmovn_u32(vceqq_u32(vld1q_u32(a + 8), vld1q_u32(b + 8))),
                                vmovn_u32(vceqq_u32(vld1q_u32(a + 12), vld1q_u32(b + 12))));
  uint8x16_t e = vandq_u8(vcombine_u8(vmovn_u16(e01), vmovn_u16(e23)), vld1q_u8(bit)); /* one byte per word */
  uint32_t equal = (uint32_t)vaddv_u8(vget_low_u8(e)) | (uint32_t)vaddv_u8(vget_high_u8(e)) << 8;
  return ~equal & 0xffffu;
}
#else
static inline uint32_t differing16(const uint32_t *a, const uint32_t *b) {
  uint32_t m = 0;
  for (uint32_t j = 0; j < 16; j++) m |= (uint32_t)(a[j] != b[j]) << j;
  return m;
}
#endif

/* Bit j: words j of a and b differ (j < 64). Branch-free: where the differing words fall is
 * irregular, and a branch per word or per block mispredicts. */
static inline uint64_t differing64(const uint32_t *a, const uint32_t *b) {
  return (uint64_t)differing16(a, b) | (uint64_t)differing16(a + 16, b + 16) << 16 |
         (uint64_t)differing16(a + 32, b + 32) << 32 | (uint64_t)differing16(a + 48, b + 48) << 48;
}

/* Words whose difference bitmap (one bit per word) sits on the stack: a key up to this long is
 * compared in one pass, a longer one in two (the first only checks the words that must be equal). */
#define CHUNK_WORDS 65536u

/* Bit j: word at + j of now and key differ, for the words below n. */
static inline uint64_t block_differs(const uint32_t *now, const uint32_t *key, uint32_t at, uint32_t n) {
  if (n - at >= 64) return differing64(now + at, key + at);
  uint64_t m = 0;
  for (uint32_t k = at; k < n; k++) m |= (uint64_t)(now[k] != key[k]) << (k - at);
  return m;
}

/* Bit j: word at + j is an inline constant (`constants` holds ceil(n / 32) words; at is a multiple of 64). */
static inline uint64_t block_constants(const uint32_t *constants, uint32_t at, uint32_t n) {
  uint64_t m = constants[at / 32];
  if (n - at > 32) m |= (uint64_t)constants[at / 32 + 1] << 32;
  return m;
}

static int misaligned(const void *p) { return ((uintptr_t)p & 3u) != 0; }

int32_t mlxn_key_compare(const uint32_t *now, uint32_t *key, uint32_t n_words, const uint32_t *constants,
                         const uint32_t *map, uint32_t *records, uint32_t n_records, const int32_t *value_at,
                         uint32_t *patch, uint32_t n_patch, uint32_t *changed, uint32_t cap,
                         uint32_t *n_changed) {
  if (!n_changed || misaligned(n_changed))
    return mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "n_changed must point at one aligned 32-bit word");
  *n_changed = 0;
  if (n_words > 0 && (!now || !key || !constants || !map))
    return mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "null pass, key, constants or map for %u words", n_words);
  if (n_records > 0 && (!records || !value_at))
    return mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "null records or value_at for %u words", n_records);
  if (n_patch > 0 && !patch) return mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "null patch array of %u words", n_patch);
  if (cap > 0 && !changed) return mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "null changed list of %u words", cap);
  if ((n_words > 0 && (misaligned(now) || misaligned(key) || misaligned(constants) || misaligned(map))) ||
      (n_records > 0 && (misaligned(records) || misaligned(value_at))) || (n_patch > 0 && misaligned(patch)) ||
      (cap > 0 && misaligned(changed)))
    return mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "every array must be 4-byte aligned (a Uint32Array)");
  /* Nothing is written unless no word but a constant's differs (a miss changes nothing). The
   * bitmap of differing words is made without a branch on the data (where differences fall is
   * irregular: a branch per word or per block mispredicts), then only its set bits are visited. */
  uint64_t bits[CHUNK_WORDS / 64];
  int one_pass = n_words <= CHUNK_WORDS;
  if (!one_pass) {
    uint64_t fixed = 0;
    for (uint32_t at = 0; at < n_words; at += 64)
      fixed |= block_differs(now, key, at, n_words) & ~block_constants(constants, at, n_words);
    if (fixed) return MLXN_UNLIKE;
  }
  uint32_t n = 0;
  for (uint32_t c = 0; c < n_words; c += CHUNK_WORDS) {
    uint32_t end = n_words - c < CHUNK_WORDS ? n_words : c + CHUNK_WORDS, blocks = (end - c + 63) / 64;
    uint64_t fixed = 0;
    for (uint32_t b = 0; b < blocks; b++) {
      uint32_t at = c + 64 * b;
      bits[b] = block_differs(now, key, at, end);
      fixed |= bits[b] & ~block_constants(constants, at, n_words);
    }
    if (fixed) return MLXN_UNLIKE; /* (in one pass: before any write) */
    /* Every constant that differs is copied into the key and, where the map names one, into the
     * records word and the patch value that word's template entry holds (value_at); a records word
     * with no entry is listed. An entry is checked before its writes (after a bad one, the
     * constants before it are copied and listed, the rest not). */
    for (uint32_t b = 0; b < blocks; b++) {
      for (uint64_t m = bits[b]; m; m &= m - 1) {
        uint32_t k = c + 64 * b + (uint32_t)__builtin_ctzll(m), v = now[k], t = map[k];
        if (t != MLXN_KEY_FREE) {
          if (t >= n_records) {
            *n_changed = n;
            return mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "key map word %u names records word %u, but the records "
                                  "hold %u", k, t, n_records);
          }
          int32_t p = value_at[t];
          if (p >= 0) {
            if ((uint32_t)p >= n_patch) {
              *n_changed = n;
              return mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "value_at[%u] = %d is past the %u-word patch array", t,
                                    p, n_patch);
            }
            patch[p] = v;
          } else {
            if (n == cap) {
              *n_changed = n;
              return mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "more than %u records words changed without a patch "
                                    "entry: the changed list is full (size it to the key's constant words)", cap);
            }
            changed[n++] = t;
          }
          records[t] = v;
        }
        key[k] = v;
      }
    }
  }
  *n_changed = n;
  return MLXN_OK;
}
