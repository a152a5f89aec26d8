/* Native core: the conflict tracker of a command buffer's automatic barriers (MLXN_OP_AUTO_BARRIERS,
 * MLXN_OP_TRACK). It holds, for the current concurrent group, the bytes each allocation had written
 * and had touched (read or written), and answers "does this access conflict with the group?" under
 * one rule: read–read never conflicts; a read conflicts with a written byte (RAW); a write with any
 * touched byte (WAR, WAW); different allocations never conflict; an empty range touches nothing.
 *
 * State is indexed by the buffer table index the decoder already resolved, so finding an allocation
 * costs no search. Each entry carries the group serial (epoch) that wrote it: a barrier bumps the
 * serial, so forgetting the group is O(1). An allocation's written and touched bytes are each one
 * inline interval until a second, disjoint one arrives; then they move to sorted sets of disjoint,
 * non-touching intervals (a binary search per check), kept per entry for reuse. Exact placement:
 * disjoint slices of one buffer never conflict, in any order.
 *
 * Header-only: the decoder (core/stream.c) inlines the per-dispatch check and add; internal.h
 * includes it for the types a command buffer holds. Runs under dev->mu like the decoder. Allocation failure is reported as a
 * non-zero return, never a crash; a tracker is freed with trk_free. */
#ifndef MLXN_TRACKER_H
#define MLXN_TRACKER_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One allocation's bytes as sorted, disjoint, non-touching intervals [iv[2k], iv[2k+1]). */
typedef struct trk_set {
  uint64_t *iv;
  uint32_t n;   /* intervals in use */
  uint32_t cap; /* intervals of room */
} trk_set;

#define TRK_TOUCHED_SPILLED 1u
#define TRK_WRITTEN_SPILLED 2u
/* Every access of the allocation in this group was a write: its written bytes are its touched bytes,
 * kept once (outputs written slice by slice in any order then cost one set, not two). */
#define TRK_WRITTEN_IS_TOUCHED 4u

typedef struct trk_entry {
  uint32_t epoch;     /* the group that holds this entry; another value: not in the group */
  uint32_t spill : 8; /* TRK_*_SPILLED: the bytes live in the entry's sets, not inline; TRK_WRITTEN_IS_TOUCHED */
  uint32_t sets : 24; /* 1 + index of this entry's pair of sets in trk->sets (0: none yet) */
  uint64_t ts, te;    /* touched bytes [ts, te) when not spilled (never empty) */
  uint64_t ws, we;    /* written bytes [ws, we) when not spilled; 0, 0 when none */
} trk_entry;

typedef struct mlxn_tracker {
  trk_entry *e;    /* indexed by buffer table index; grows on demand */
  uint32_t cap;    /* entries */
  uint32_t epoch;  /* the current group; never 0 (0 marks entries never used) */
  trk_set *sets;   /* pairs: [2i] touched, [2i+1] written */
  uint32_t n_sets, cap_sets; /* pairs */
} mlxn_tracker;

/* Forgets the group (a barrier, or the tracking mode changed): O(1) but every 2^32 groups. */
static inline void trk_reset(mlxn_tracker *t) {
  if (++t->epoch == 0) {
    for (uint32_t i = 0; i < t->cap; i++) t->e[i].epoch = 0;
    t->epoch = 1;
  }
}

static inline void trk_free(mlxn_tracker *t) {
  for (uint32_t i = 0; i < 2 * t->n_sets; i++) free(t->sets[i].iv);
  free(t->sets);
  free(t->e);
  memset(t, 0, sizeof *t);
}

/* Index of the first of the set's intervals whose end is >= s (touching counts), or n. */
static inline uint32_t trk_first_ending_from(const trk_set *set, uint64_t s) {
  uint32_t n = set->n, base = 0;
  if (n == 0) return 0;
  /* Branch-free halving (a conditional move per step): the probes of a group's slices in random
   * order are unpredictable, and mispredicted branches were most of a lookup's cost. */
  while (n > 1) {
    uint32_t half = n / 2;
    base = set->iv[2 * (base + half) + 1] < s ? base + half : base;
    n -= half;
  }
  return base + (set->iv[2 * base + 1] < s);
}

/* Whether [s, e) (non-empty) shares a byte with the set. */
static inline int trk_set_intersects(const trk_set *set, uint64_t s, uint64_t e) {
  uint32_t n = set->n;
  if (n == 0 || s >= set->iv[2 * n - 1] || e <= set->iv[0]) return 0;
  if (s >= set->iv[2 * n - 2]) return 1; /* starts inside the last interval */
  return set->iv[2 * trk_first_ending_from(set, s + 1)] < e;
}

/* Adds [s, e) (non-empty), merging what it overlaps or touches. Non-zero when out of memory. */
static inline int trk_set_add(trk_set *set, uint64_t s, uint64_t e) {
  uint32_t n = set->n;
  if (n > 0 && s <= set->iv[2 * n - 1] && s >= set->iv[2 * n - 2]) { /* inside or touching the last */
    if (e > set->iv[2 * n - 1]) set->iv[2 * n - 1] = e;
    return 0;
  }
  uint32_t i = n == 0 || s > set->iv[2 * n - 1] ? n : trk_first_ending_from(set, s);
  uint32_t j = i; /* one past the last interval touching [s, e) */
  while (j < n && set->iv[2 * j] <= e) j++;
  if (j == i) { /* touches nothing: insert at i */
    if (n == set->cap) {
      uint32_t cap = set->cap ? set->cap * 2 : 8;
      if (cap < set->cap || (size_t)cap > SIZE_MAX / (2 * sizeof(uint64_t))) return 1;
      uint64_t *iv = realloc(set->iv, (size_t)cap * 2 * sizeof(uint64_t));
      if (!iv) return 1;
      set->iv = iv;
      set->cap = cap;
    }
    memmove(&set->iv[2 * i + 2], &set->iv[2 * i], (size_t)(n - i) * 2 * sizeof(uint64_t));
    set->iv[2 * i] = s;
    set->iv[2 * i + 1] = e;
    set->n = n + 1;
    return 0;
  }
  if (s < set->iv[2 * i]) set->iv[2 * i] = s;
  uint64_t end = set->iv[2 * j - 1];
  set->iv[2 * i + 1] = e > end ? e : end;
  if (j - i > 1) {
    memmove(&set->iv[2 * i + 2], &set->iv[2 * j], (size_t)(n - j) * 2 * sizeof(uint64_t));
    set->n = n - (j - i - 1);
  }
  return 0;
}

/* Whether reading bytes [s, e) (non-empty) — or, with write, writing them — conflicts with entry x,
 * which is in the group (x->epoch == t->epoch). Branches, not selects: a load whose address waits
 * for a conditional move made this several times slower. */
static inline __attribute__((always_inline)) int trk_entry_conflicts(const mlxn_tracker *t, const trk_entry *x,
                                                                      uint64_t s, uint64_t e, int write) {
  uint32_t spill = x->spill;
  if (write) { /* any touched byte */
    if (!(spill & TRK_TOUCHED_SPILLED)) return s < x->te && x->ts < e;
    return trk_set_intersects(&t->sets[2 * (x->sets - 1)], s, e);
  }
  /* A written byte. Inline, [ws, we) is exact (kept equal to [ts, te) while only writes). */
  if (!(spill & (TRK_TOUCHED_SPILLED | TRK_WRITTEN_SPILLED))) return s < x->we && x->ws < e;
  if (spill & TRK_WRITTEN_IS_TOUCHED) return trk_set_intersects(&t->sets[2 * (x->sets - 1)], s, e);
  if (spill & TRK_WRITTEN_SPILLED) return trk_set_intersects(&t->sets[2 * (x->sets - 1) + 1], s, e);
  return s < x->we && x->ws < e;
}

/* Whether reading bytes [s, e) of the buffer at table index idx — or, with write, writing them —
 * conflicts with the group. e > s. */
static inline int trk_conflicts(const mlxn_tracker *t, uint32_t idx, uint64_t s, uint64_t e, int write) {
  if (idx >= t->cap) return 0;
  const trk_entry *x = &t->e[idx];
  return x->epoch == t->epoch && trk_entry_conflicts(t, x, s, e, write);
}

/* Room for table index idx. Non-zero when out of memory. */
static inline int trk_fit(mlxn_tracker *t, uint32_t idx) {
  if (idx < t->cap) return 0;
  uint32_t cap = t->cap ? t->cap : 64;
  while (cap <= idx) {
    if (cap > UINT32_MAX / 2) return 1;
    cap *= 2;
  }
  if ((size_t)cap > SIZE_MAX / sizeof(trk_entry)) return 1;
  trk_entry *e = realloc(t->e, (size_t)cap * sizeof *e);
  if (!e) return 1;
  memset(e + t->cap, 0, (size_t)(cap - t->cap) * sizeof *e);
  t->e = e;
  t->cap = cap;
  return 0;
}

/* The entry's pair of sets (taken on its first spill, kept for later groups). NULL when out of memory. */
static inline trk_set *trk_sets_of(mlxn_tracker *t, trk_entry *x) {
  if (x->sets == 0) {
    if (t->n_sets >= (1u << 24) - 1) return NULL; /* the entry's 24-bit index */
    if (t->n_sets == t->cap_sets) {
      uint32_t cap = t->cap_sets ? t->cap_sets * 2 : 8;
      if (cap < t->cap_sets || (size_t)cap > SIZE_MAX / (2 * sizeof(trk_set))) return NULL;
      trk_set *s = realloc(t->sets, (size_t)cap * 2 * sizeof *s);
      if (!s) return NULL;
      memset(s + 2 * t->cap_sets, 0, (size_t)(cap - t->cap_sets) * 2 * sizeof *s);
      t->sets = s;
      t->cap_sets = cap;
    }
    x->sets = ++t->n_sets;
  }
  return &t->sets[2 * (x->sets - 1)];
}

/* Adds [s, e) (non-empty) to one of the entry's byte sets (touched: which = 0, written: 1), whose
 * inline interval is [*lo, *hi) (empty when equal). Non-zero when out of memory. */
static inline int trk_add_to(mlxn_tracker *t, trk_entry *x, int which, uint64_t *lo, uint64_t *hi, uint64_t s, uint64_t e) {
  uint32_t bit = which ? TRK_WRITTEN_SPILLED : TRK_TOUCHED_SPILLED;
  if (x->spill & bit) return trk_set_add(&trk_sets_of(t, x)[which], s, e);
  if (*lo == *hi) { /* empty */
    *lo = s;
    *hi = e;
    return 0;
  }
  if (s <= *hi && *lo <= e) { /* overlaps or touches: still one interval */
    if (s < *lo) *lo = s;
    if (e > *hi) *hi = e;
    return 0;
  }
  trk_set *pair = trk_sets_of(t, x);
  if (!pair) return 1;
  trk_set *set = &pair[which];
  set->n = 0;
  if (trk_set_add(set, *lo, *hi) || trk_set_add(set, s, e)) return 1;
  x->spill |= bit;
  return 0;
}

/* The allocation is read for the first time in the group after only writes: its written bytes
 * become a copy of its touched bytes. Non-zero when out of memory. */
static inline int trk_split_written(mlxn_tracker *t, trk_entry *x) {
  x->spill &= ~TRK_WRITTEN_IS_TOUCHED;
  if (!(x->spill & TRK_TOUCHED_SPILLED)) {
    x->ws = x->ts;
    x->we = x->te;
    return 0;
  }
  trk_set *pair = trk_sets_of(t, x);
  trk_set *touched = &pair[0], *written = &pair[1];
  if (written->cap < touched->n) {
    uint64_t *iv = realloc(written->iv, (size_t)touched->cap * 2 * sizeof(uint64_t));
    if (!iv) return 1;
    written->iv = iv;
    written->cap = touched->cap;
  }
  memcpy(written->iv, touched->iv, (size_t)touched->n * 2 * sizeof(uint64_t));
  written->n = touched->n;
  x->spill |= TRK_WRITTEN_SPILLED;
  return 0;
}

/* trk_entry_add past its inline cases. */
static int trk_entry_add_general(mlxn_tracker *t, trk_entry *x, uint64_t s, uint64_t e, int write) {
  if ((x->spill & TRK_WRITTEN_IS_TOUCHED) && !write && trk_split_written(t, x)) return 1;
  if (!(x->spill & TRK_TOUCHED_SPILLED) && s <= x->te && x->ts <= e) { /* the common case, inline */
    if (s < x->ts) x->ts = s;
    if (e > x->te) x->te = e;
  } else if (trk_add_to(t, x, 0, &x->ts, &x->te, s, e)) {
    return 1;
  }
  if (x->spill & TRK_WRITTEN_IS_TOUCHED) { /* only writes (a read split them above) */
    if (!(x->spill & TRK_TOUCHED_SPILLED)) {
      x->ws = x->ts;
      x->we = x->te;
    }
    return 0;
  }
  if (!write) return 0;
  if (!(x->spill & TRK_WRITTEN_SPILLED) && x->ws != x->we && s <= x->we && x->ws <= e) { /* inline too */
    if (s < x->ws) x->ws = s;
    if (e > x->we) x->we = e;
    return 0;
  }
  return trk_add_to(t, x, 1, &x->ws, &x->we, s, e);
}

/* Adds bytes [s, e) (non-empty) of entry x's allocation to the group, as touched and, with write,
 * written. While every access of the allocation in the group was a write and its bytes are one
 * interval, [ws, we) is kept equal to [ts, te) (trk_entry_conflicts reads it). Non-zero when out of
 * memory. */
static inline __attribute__((always_inline)) int trk_entry_add(mlxn_tracker *t, trk_entry *x, uint64_t s,
                                                                uint64_t e, int write) {
  if (x->epoch != t->epoch) { /* first access of this allocation in the group */
    x->epoch = t->epoch;
    x->spill = write ? TRK_WRITTEN_IS_TOUCHED : 0;
    x->ts = s;
    x->te = e;
    x->ws = write ? s : 0;
    x->we = write ? e : 0;
    return 0;
  }
  /* One interval that [s, e) overlaps or touches: only writes so far and a write, a read and no
   * spilled set (the written bytes stay as they are), or the first write after reads. */
  if (s <= x->te && x->ts <= e) {
    uint32_t spill = x->spill;
    if (spill == (write ? TRK_WRITTEN_IS_TOUCHED : 0u)) {
      /* Stores only where the interval grows: a range read again and again changes nothing. */
      if (s < x->ts) {
        x->ts = s;
        if (write) x->ws = s;
      }
      if (e > x->te) {
        x->te = e;
        if (write) x->we = e;
      }
      return 0;
    }
    if (write && spill == 0 && x->ws == x->we) { /* the first write after only reads: an in-place kernel */
      if (s < x->ts) x->ts = s;
      if (e > x->te) x->te = e;
      x->ws = s;
      x->we = e;
      return 0;
    }
  }
  return trk_entry_add_general(t, x, s, e, write);
}

/* Adds bytes [s, e) (non-empty) of the buffer at table index idx to the group, as touched and, with
 * write, written. Non-zero when out of memory. */
static inline int trk_add(mlxn_tracker *t, uint32_t idx, uint64_t s, uint64_t e, int write) {
  if (idx >= t->cap && trk_fit(t, idx)) return 1;
  return trk_entry_add(t, &t->e[idx], s, e, write);
}

#endif /* MLXN_TRACKER_H */
