/* The conflict tracker (native/core/tracker.h) against a byte map: random groups of reads and writes
 * of a few allocations, each access checked (trk_conflicts) and added (trk_add) as the decoder does,
 * and after every add each spilled set's structure (sorted, disjoint, non-touching intervals; no
 * empty block; each block's recorded last end) and its bytes compared with the map's. Build it with
 * -DTRK_BLOCK=n to exercise block splits and merges across blocks with small blocks
 * (tests/tracker_check_test.ts builds it with 2, 3, 8 and the default). The same groups run again at
 * the top of the 64-bit range (ranges ending at UINT64_MAX), the group serial wraps on the way, and
 * then every allocation the tracker makes is failed in turn: the failing add reports it, the sets stay
 * whole, and the tracker, reset as a recycled command buffer's is, answers exactly again (a sanitized
 * build also sees no leak). Prints "tracker: ok N accesses, F allocation failures" and exits 0, or
 * names the first disagreement and exits 1. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The tracker's allocations, failed on demand: call number fail_at (counted from 0) returns NULL. */
static long alloc_calls, fail_at = -1;
static void *check_malloc(size_t n) { return fail_at >= 0 && alloc_calls++ == fail_at ? NULL : malloc(n); }
static void *check_realloc(void *p, size_t n) {
  return fail_at >= 0 && alloc_calls++ == fail_at ? NULL : realloc(p, n);
}
#define malloc check_malloc
#define realloc check_realloc
#include "../../native/core/tracker.h"
#undef malloc
#undef realloc

#define ALLOCS 3
#define BYTES 2048

static unsigned char touched[ALLOCS][BYTES], written[ALLOCS][BYTES];
static uint64_t seed = 88172645463325252ull;
static uint64_t base; /* the map's byte 0 is the tracker's byte `base` */

static uint32_t next(uint32_t n) {
  seed ^= seed << 13;
  seed ^= seed >> 7;
  seed ^= seed << 17;
  return (uint32_t)(seed % n);
}

static int fail(const char *what, long at) {
  printf("tracker: %s (access %ld, block size %u)\n", what, at, (unsigned)TRK_BLOCK);
  return 1;
}

/* The set's structure, and its bytes against `map` (1 = in the set). */
static int check_set(const trk_set *set, const unsigned char *map, long at) {
  uint64_t prev_end = 0;
  int first = 1;
  unsigned char seen[BYTES] = {0};
  for (uint32_t b = 0; b < set->nb; b++) {
    const trk_block *k = set->blk[b];
    if (k->n == 0 || k->n > TRK_BLOCK) return fail("a block in use is empty or overfull", at);
    if (set->last[b] != k->iv[2 * k->n - 1]) return fail("a block's recorded last end is stale", at);
    for (uint32_t i = 0; i < k->n; i++) {
      uint64_t s = k->iv[2 * i], e = k->iv[2 * i + 1];
      if (s >= e || s < base || e - base > BYTES) return fail("an empty or out-of-range interval", at);
      if (!first && s <= prev_end) return fail("intervals out of order, overlapping or touching", at);
      for (uint64_t x = s - base; x < e - base; x++) seen[x] = 1;
      prev_end = e;
      first = 0;
    }
  }
  for (int x = 0; x < BYTES; x++)
    if (seen[x] != map[x]) return fail("a set's bytes differ from the map's", at);
  return 0;
}

/* The entry's touched and written bytes, spilled or inline, against the maps. */
static int check_entry(const mlxn_tracker *t, uint32_t a, long at) {
  const trk_entry *x = &t->e[a];
  if (x->epoch != t->epoch) return 0;
  unsigned char inline_map[BYTES];
  if (x->spill & TRK_TOUCHED_SPILLED) {
    if (check_set(&t->sets[2 * (x->sets - 1)], touched[a], at)) return 1;
  } else {
    for (uint64_t b = 0; b < BYTES; b++) inline_map[b] = b + base >= x->ts && b + base < x->te;
    if (memcmp(inline_map, touched[a], BYTES) != 0) return fail("the inline touched interval differs", at);
  }
  if (x->spill & TRK_WRITTEN_IS_TOUCHED) {
    if (memcmp(touched[a], written[a], BYTES) != 0) return fail("only writes, yet touched != written", at);
  } else if (x->spill & TRK_WRITTEN_SPILLED) {
    if (check_set(&t->sets[2 * (x->sets - 1) + 1], written[a], at)) return 1;
  } else {
    for (uint64_t b = 0; b < BYTES; b++) inline_map[b] = b + base >= x->ws && b + base < x->we;
    if (memcmp(inline_map, written[a], BYTES) != 0) return fail("the inline written interval differs", at);
  }
  return 0;
}

/* The sets' storage after a failed allocation: every block in use is there. */
static int check_storage(const mlxn_tracker *t, long at) {
  for (uint32_t i = 0; i < 2 * t->n_sets; i++) {
    const trk_set *set = &t->sets[i];
    if (set->nb > set->cap) return fail("a set has more blocks in use than room", at);
    for (uint32_t b = 0; b < set->nb; b++)
      if (!set->blk[b]) return fail("a block in use is missing", at);
  }
  return 0;
}

/* `groups` random groups at `base`. Returns the accesses checked, or -1 on a disagreement. With
 * fail_at set, an add may fail: then the run stops there (as the decoder does), the sets' storage is
 * checked and *failed is set. */
static long run_groups(mlxn_tracker *t, int groups, int *failed) {
  long accesses = 0;
  for (int group = 0; group < groups; group++) {
    trk_reset(t);
    memset(touched, 0, sizeof touched);
    memset(written, 0, sizeof written);
    /* Groups of every width, from one access to well past a block's worth of disjoint slices. */
    int width = 1 + (int)next(group % 7 == 0 ? 600 : 60);
    /* 0: short ranges anywhere; 1: gapped slices shuffled; 2: long ranges; 3: mixed; 4: gapped slices
     * written only, then read and written (a read copies the written bytes out of many blocks). */
    int style = (int)next(5);
    for (int k = 0; k < width; k++, accesses++) {
      uint32_t a = next(ALLOCS);
      uint64_t s, e;
      if (style == 1 || style == 4 || (style == 3 && next(2))) {
        uint32_t slot = next(BYTES / 8);
        s = slot * 8;
        e = s + 1 + next(4);
      } else if (style == 2 || next(16) == 0) {
        s = next(BYTES);
        e = s + 1 + next(BYTES - (uint32_t)s);
      } else {
        s = next(BYTES);
        e = s + 1 + next(12);
        if (e > BYTES) e = BYTES;
      }
      int write = style == 4 && k < width / 2 ? 1 : (int)next(2);
      int want = 0;
      for (uint64_t b = s; b < e; b++) want |= write ? touched[a][b] : written[a][b];
      if (trk_conflicts(t, a, base + s, base + e, write) != want) {
        fail("trk_conflicts disagrees with the map", accesses);
        return -1;
      }
      if (trk_add(t, a, base + s, base + e, write)) {
        if (fail_at < 0 || alloc_calls <= fail_at) { /* no allocation failed */
          fail("out of memory", accesses);
          return -1;
        }
        *failed = 1;
        return check_storage(t, accesses) ? -1 : accesses;
      }
      for (uint64_t b = s; b < e; b++) {
        touched[a][b] = 1;
        if (write) written[a][b] = 1;
      }
      if (check_entry(t, a, accesses)) return -1;
    }
  }
  return accesses;
}

int main(void) {
  mlxn_tracker t;
  memset(&t, 0, sizeof t);
  t.epoch = UINT32_MAX - 1000; /* the group serial wraps during the run */
  int failed = 0;
  long accesses = run_groups(&t, 3000, &failed), more;
  if (accesses < 0) return 1;
  base = UINT64_MAX - BYTES; /* the top of the range: the last byte is UINT64_MAX - 1 */
  if ((more = run_groups(&t, 500, &failed)) < 0) return 1;
  accesses += more;
  trk_free(&t);
  /* Allocation failure: for a few fixed sequences, each allocation call in turn fails on a fresh
   * tracker; after the failure the tracker is reset and must then run the same sequence exactly. */
  base = 0;
  long failures = 0;
  for (uint64_t run = 1; run <= 3; run++) {
    for (long at = 0;; at++) {
      memset(&t, 0, sizeof t);
      t.epoch = 1;
      failed = 0;
      alloc_calls = 0;
      fail_at = at;
      seed = run * 0x9e3779b97f4a7c15ull;
      if ((more = run_groups(&t, 8, &failed)) < 0) return 1;
      if (!failed && alloc_calls > fail_at) return fail("an allocation failed, yet every add succeeded", accesses);
      fail_at = -1;
      accesses += more;
      if (failed) {
        failures++;
        seed = run * 0x9e3779b97f4a7c15ull;
        if ((more = run_groups(&t, 8, &failed)) < 0) return 1;
        accesses += more;
      }
      trk_free(&t);
      if (!failed) break; /* every allocation of the sequence has failed once */
    }
  }
  printf("tracker: ok %ld accesses, %ld allocation failures\n", accesses, failures);
  return 0;
}
