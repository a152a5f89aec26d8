/* mlxn_key_compare against a plain reference loop, standalone: tests/key_compare_arch_test.ts builds
 * it with the SIMD comparison of the host (SSE2 on x86-64), with the portable one
 * (-DMLXN_KEY_COMPARE_PORTABLE), and for AArch64 (NEON) run under qemu-aarch64 where a cross compiler
 * and qemu are installed, so each of native/core/key_compare.c's paths is checked on this machine.
 * Prints "key compare: ok N cases" and exits 0, or names the first disagreement and exits 1. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../native/mlxn.h"

/* key_compare.c reports refusals through the core's error setter; only the code matters here. */
int32_t mlxn_set_error(int32_t code, const char *fmt, ...) {
  (void)fmt;
  return code;
}

typedef struct {
  uint32_t n, n_records, n_patch, cap;
  uint32_t *now, *key, *constants, *map, *records, *patch;
  int32_t *value_at;
} test_case;

typedef struct {
  int32_t rc;
  uint32_t *key, *records, *patch, *changed, n_changed;
} outcome;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void) { /* xorshift64* */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}
static double next_unit(void) { return next_u32() / 4294967296.0; }

static void *zalloc(size_t words) {
  void *p = calloc(words ? words : 1, 4);
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  return p;
}
static uint32_t *copy_words(const uint32_t *src, uint32_t n) {
  uint32_t *d = zalloc(n);
  if (n) memcpy(d, src, (size_t)n * 4);
  return d;
}
static int is_constant(const uint32_t *c, uint32_t k) { return (c[k >> 5] >> (k & 31)) & 1u; }

/* The comparison as mlxn.h specifies it, one word at a time. */
static outcome reference(const test_case *c) {
  outcome o = {MLXN_OK, copy_words(c->key, c->n), copy_words(c->records, c->n_records),
               copy_words(c->patch, c->n_patch), zalloc(c->cap), 0};
  for (uint32_t k = 0; k < c->n; k++)
    if (c->now[k] != o.key[k] && !is_constant(c->constants, k)) {
      o.rc = MLXN_UNLIKE;
      return o;
    }
  for (uint32_t k = 0; k < c->n; k++) {
    uint32_t v = c->now[k], t = c->map[k];
    if (v == o.key[k]) continue;
    if (t != MLXN_KEY_FREE) {
      if (t >= c->n_records) {
        o.rc = MLXN_E_INVALID_ARGUMENT;
        return o;
      }
      int32_t p = c->value_at[t];
      if ((p >= 0 && (uint32_t)p >= c->n_patch) || (p < 0 && o.n_changed == c->cap)) {
        o.rc = MLXN_E_INVALID_ARGUMENT;
        return o;
      }
      if (p >= 0) o.patch[p] = v;
      else o.changed[o.n_changed++] = t;
      o.records[t] = v;
    }
    o.key[k] = v;
  }
  return o;
}

static outcome native(const test_case *c) {
  outcome o = {0, copy_words(c->key, c->n), copy_words(c->records, c->n_records), copy_words(c->patch, c->n_patch),
               zalloc(c->cap), 0};
  o.rc = mlxn_key_compare(c->now, o.key, c->n, c->constants, c->map, o.records, c->n_records, c->value_at, o.patch,
                          c->n_patch, o.changed, c->cap, &o.n_changed);
  return o;
}

static void free_outcome(outcome *o) {
  free(o->key);
  free(o->records);
  free(o->patch);
  free(o->changed);
}

static void free_case(test_case *c) {
  free(c->now);
  free(c->key);
  free(c->constants);
  free(c->map);
  free(c->records);
  free(c->patch);
  free(c->value_at);
}

/* n words, constants at rate `constant_rate`, `changes` changed constants, optionally one changed
 * word that is not a constant; map entries, patch slots and list room as the plan cache has them,
 * with a share of entries out of range when `bad_entries`. */
static test_case random_case(uint32_t n, double constant_rate, uint32_t changes, int fixed_change, int bad_entries) {
  test_case c;
  c.n = n;
  c.n_records = n / 2 > 0 ? n / 2 : 1;
  c.n_patch = n / 4 > 0 ? n / 4 : 1;
  c.key = zalloc(n);
  c.constants = zalloc((n + 31) / 32);
  c.map = zalloc(n);
  c.records = zalloc(c.n_records);
  c.patch = zalloc(c.n_patch);
  c.value_at = zalloc(c.n_records);
  uint32_t *constant_words = zalloc(n), n_constants = 0;
  for (uint32_t k = 0; k < n; k++) {
    c.key[k] = next_u32();
    if (next_unit() < constant_rate) {
      c.constants[k >> 5] |= 1u << (k & 31);
      constant_words[n_constants++] = k;
    }
    c.map[k] = next_unit() < 0.1 ? MLXN_KEY_FREE : next_u32() % c.n_records;
    if (bad_entries && next_unit() < 0.001) c.map[k] = c.n_records + next_u32() % 4;
  }
  c.now = copy_words(c.key, n);
  for (uint32_t i = 0; i < changes && n_constants > 0; i++) {
    uint32_t k = constant_words[next_u32() % n_constants];
    c.now[k] += 1 + next_u32() % 1000;
  }
  if (fixed_change && n > 0) {
    uint32_t k = next_u32() % n;
    if (!is_constant(c.constants, k)) c.now[k] ^= 4;
  }
  for (uint32_t t = 0; t < c.n_records; t++) {
    c.records[t] = t;
    c.value_at[t] = next_unit() < 0.4 ? -1 : (int32_t)(next_u32() % c.n_patch);
    if (bad_entries && next_unit() < 0.001) c.value_at[t] = (int32_t)(c.n_patch + next_u32() % 4);
  }
  /* Room for every constant, or (with bad entries) a list that may fill up. */
  c.cap = bad_entries ? n_constants / 8 : n_constants;
  free(constant_words);
  return c;
}

static int same(const uint32_t *a, const uint32_t *b, uint32_t n) { return n == 0 || memcmp(a, b, (size_t)n * 4) == 0; }

static int check(const test_case *c, const char *what) {
  outcome want = reference(c), got = native(c);
  const char *diff = got.rc != want.rc                           ? "status"
                     : !same(got.key, want.key, c->n)            ? "key"
                     : !same(got.records, want.records, c->n_records) ? "records"
                     : !same(got.patch, want.patch, c->n_patch)  ? "patch"
                     : got.n_changed != want.n_changed           ? "changed count"
                     : !same(got.changed, want.changed, want.n_changed) ? "changed list"
                                                                 : NULL;
  if (diff)
    fprintf(stderr, "key compare: %s, %u words: %s differs (status %d, reference %d)\n", what, c->n, diff, got.rc,
            want.rc);
  free_outcome(&want);
  free_outcome(&got);
  return diff == NULL;
}

int main(void) {
  static const uint32_t lengths[] = {0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 1000, 4097, 65536, 65600, 140000};
  uint32_t cases = 0, hits = 0;
  for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) {
    uint32_t n = lengths[i];
    const uint32_t changes[] = {0, 1, n / 50 + 1, 3, n};
    for (int v = 0; v < 10; v++) {
      test_case c = random_case(n, v < 5 ? 0.3 : 0.9, changes[v % 5], v == 3 || v == 8, v == 9);
      if (!check(&c, "random case")) return 1;
      outcome r = reference(&c);
      hits += r.rc == MLXN_OK;
      free_outcome(&r);
      free_case(&c);
      cases++;
    }
  }
  /* Exactly one word of a 64-word block differs, at every position: each lane of each 16-word
   * comparison maps to its own bit (constant: listed; not a constant: unlike). */
  for (uint32_t j = 0; j < 64; j++) {
    for (int fixed = 0; fixed < 2; fixed++) {
      test_case c = random_case(64, 0, 0, 0, 0);
      if (!fixed) c.constants[j >> 5] |= 1u << (j & 31);
      c.cap = 64;
      c.now[j] ^= 0x80000000u;
      char what[64];
      snprintf(what, sizeof what, "word %u alone differs (%s)", j, fixed ? "fixed" : "constant");
      if (!check(&c, what)) return 1;
      free_case(&c);
      cases++;
    }
  }
  if (hits < 50) {
    fprintf(stderr, "key compare: only %u of %u random cases hit: the cases do not exercise the copies\n", hits, cases);
    return 1;
  }
  printf("key compare: ok %u cases\n", cases);
  return 0;
}
