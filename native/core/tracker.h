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
 * non-touching intervals, kept per entry for reuse. A set is a list of blocks of at most TRK_BLOCK
 * intervals with each block's last end in an array of its own: a check is two binary searches and an
 * insertion moves at most one block's intervals (and, when that block splits, the block list), so a
 * group of tens of thousands of slices of one buffer, in any order, costs about what a few do. Exact
 * placement: disjoint slices of one buffer never conflict, in any order.
 *
 * Header-only: the decoder (core/stream.c) inlines the per-dispatch check and add; internal.h
 * includes it for the types a command buffer holds. Runs under dev->mu like the decoder. Allocation failure is reported as a
 * non-zero return, never a crash; a tracker is freed with trk_free. */
#ifndef MLXN_TRACKER_H
#define MLXN_TRACKER_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef TRK_BLOCK
#define TRK_BLOCK 64u /* intervals per block of a set (a test build makes it small) */
#endif
#if TRK_BLOCK < 2
#error "TRK_BLOCK must be at least 2 (a full block splits into two non-empty halves)"
#endif

/* Consecutive intervals [iv[2k], iv[2k+1]) of a set, k < n (never 0 while the block is in use). */
typedef struct trk_block {
  uint32_t n;
  uint64_t iv[2 * TRK_BLOCK];
} trk_block;

/* One allocation's bytes as sorted, disjoint, non-touching intervals, in blocks. */
typedef struct trk_set {
  trk_block **blk; /* the blocks in order; blk[nb .. cap) are spare (allocated, or NULL) */
  uint64_t *last;  /* per block in use: the end of its last interval (ascending) */
  uint32_t nb;     /* blocks in use */
  uint32_t cap;    /* room in blk and last */
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

/* Whether n elements of `size` bytes overflow size_t (never with a 32-bit n on a 64-bit host: a
 * function, so compilers check it without warning that it is always false there). */
static inline int trk_too_many(size_t n, size_t size) { return n > SIZE_MAX / size; }

/* Forgets the group (a barrier, or the tracking mode changed): O(1) but every 2^32 groups. */
static inline void trk_reset(mlxn_tracker *t) {
  if (++t->epoch == 0) {
    for (uint32_t i = 0; i < t->cap; i++) t->e[i].epoch = 0;
    t->epoch = 1;
  }
}

static inline void trk_free(mlxn_tracker *t) {
  for (uint32_t i = 0; i < 2 * t->n_sets; i++) {
    trk_set *set = &t->sets[i];
    for (uint32_t b = 0; b < set->cap; b++) free(set->blk[b]);
    free(set->blk);
    free(set->last);
  }
  free(t->sets);
  free(t->e);
  memset(t, 0, sizeof *t);
}

/* Index of the first of n ascending values that is >= s (n when none). Branch-free halving (a
 * conditional move per step): the probes of a group's slices in random order are unpredictable, and
 * mispredicted branches were most of a lookup's cost. `stride` 2 with `v` at an interval's end reads
 * the ends of a block's intervals. */
static inline uint32_t trk_first_at_least(const uint64_t *v, uint32_t stride, uint32_t n, uint64_t s) {
  uint32_t base = 0;
  if (n == 0) return 0;
  while (n > 1) {
    uint32_t half = n / 2;
    base = v[stride * (base + half)] < s ? base + half : base;
    n -= half;
  }
  return base + (v[stride * base] < s);
}

/* The first interval whose end is >= s (touching counts): block *b and index *i in it. Requires
 * s <= the set's last end (so there is one). */
static inline void trk_find(const trk_set *set, uint64_t s, uint32_t *b, uint32_t *i) {
  uint32_t at = trk_first_at_least(set->last, 1, set->nb, s);
  const trk_block *k = set->blk[at];
  *b = at;
  *i = trk_first_at_least(k->iv + 1, 2, k->n, s);
}

/* Whether [s, e) (non-empty) shares a byte with the set. */
/* Out of line: only spilled entries reach it, and inlined it would crowd the decoder's loop. */
static __attribute__((noinline)) int trk_set_intersects(const trk_set *set, uint64_t s, uint64_t e) {
  uint32_t nb = set->nb;
  if (nb == 0 || s >= set->last[nb - 1] || e <= set->blk[0]->iv[0]) return 0;
  const trk_block *l = set->blk[nb - 1];
  if (s >= l->iv[2 * l->n - 2]) return 1; /* starts inside the last interval */
  uint32_t b, i;
  trk_find(set, s + 1, &b, &i); /* the first interval ending past s */
  return set->blk[b]->iv[2 * i] < e;
}

/* Empties the set (its blocks stay, for reuse). */
static inline void trk_set_clear(trk_set *set) { set->nb = 0; }

/* Makes block position p (<= nb) an empty block in use: a spare one, or a new one. NULL when out of
 * memory (the set unchanged). */
static __attribute__((noinline)) trk_block *trk_set_open_block(trk_set *set, uint32_t p) {
  uint32_t nb = set->nb;
  if (nb == set->cap) {
    uint32_t cap = set->cap ? set->cap * 2 : 4;
    if (cap < set->cap || trk_too_many(cap, sizeof(trk_block *))) return NULL;
    trk_block **blk = realloc(set->blk, (size_t)cap * sizeof *blk);
    if (!blk) return NULL;
    memset(blk + set->cap, 0, (size_t)(cap - set->cap) * sizeof *blk);
    set->blk = blk;
    uint64_t *last = realloc(set->last, (size_t)cap * sizeof *last);
    if (!last) return NULL; /* blk grew (its new slots NULL), cap did not: consistent */
    set->last = last;
    set->cap = cap;
  }
  trk_block *k = set->blk[nb];
  if (!k && !(k = malloc(sizeof *k))) return NULL;
  memmove(&set->blk[p + 1], &set->blk[p], (size_t)(nb - p) * sizeof *set->blk);
  memmove(&set->last[p + 1], &set->last[p], (size_t)(nb - p) * sizeof *set->last);
  set->blk[p] = k;
  k->n = 0;
  set->nb = nb + 1;
  return k;
}

/* Reverses blocks [lo, hi) of v. */
static inline void trk_reverse_blocks(trk_block **v, uint32_t lo, uint32_t hi) {
  for (; lo + 1 < hi; lo++, hi--) {
    trk_block *tmp = v[lo];
    v[lo] = v[hi - 1];
    v[hi - 1] = tmp;
  }
}

/* Takes blocks [p, p + count) out of use; they become spares. */
static inline void trk_set_close_blocks(trk_set *set, uint32_t p, uint32_t count) {
  uint32_t nb = set->nb;
  if (count == 0) return;
  /* Rotate blk[p .. nb) left by count (three reversals), so the closed blocks end up past nb - count. */
  trk_reverse_blocks(set->blk, p, p + count);
  trk_reverse_blocks(set->blk, p + count, nb);
  trk_reverse_blocks(set->blk, p, nb);
  memmove(&set->last[p], &set->last[p + count], (size_t)(nb - p - count) * sizeof *set->last);
  set->nb = nb - count;
}

/* Adds [s, e) (non-empty), merging what it overlaps or touches. Non-zero when out of memory. */
static __attribute__((noinline)) int trk_set_add(trk_set *set, uint64_t s, uint64_t e) {
  uint32_t nb = set->nb;
  trk_block *k;
  if (nb > 0) {
    k = set->blk[nb - 1];
    uint64_t end = set->last[nb - 1];
    if (s <= end && s >= k->iv[2 * k->n - 2]) { /* inside or touching the last */
      if (e > end) k->iv[2 * k->n - 1] = set->last[nb - 1] = e;
      return 0;
    }
    if (s > end && k->n == TRK_BLOCK && !(k = trk_set_open_block(set, nb))) return 1;
  } else if (!(k = trk_set_open_block(set, 0))) {
    return 1;
  }
  if (set->nb != nb || s > set->last[nb - 1]) { /* after every interval: append */
    k->iv[2 * k->n] = s;
    k->iv[2 * k->n + 1] = e;
    k->n++;
    set->last[set->nb - 1] = e;
    return 0;
  }
  uint32_t b, i;
  trk_find(set, s, &b, &i);
  k = set->blk[b];
  if (k->iv[2 * i] > e) { /* touches nothing: insert before (b, i) */
    if (k->n == TRK_BLOCK) { /* split the block: its upper half goes into a new one after it */
      trk_block *hi = trk_set_open_block(set, b + 1);
      if (!hi) return 1;
      uint32_t half = TRK_BLOCK / 2;
      k = set->blk[b];
      hi->n = k->n - half;
      memcpy(hi->iv, &k->iv[2 * half], (size_t)hi->n * 2 * sizeof(uint64_t));
      k->n = half;
      set->last[b + 1] = set->last[b];
      set->last[b] = k->iv[2 * half - 1];
      if (i >= half) {
        k = hi;
        i -= half;
      }
    }
    memmove(&k->iv[2 * i + 2], &k->iv[2 * i], (size_t)(k->n - i) * 2 * sizeof(uint64_t));
    k->iv[2 * i] = s;
    k->iv[2 * i + 1] = e;
    k->n++;
    return 0;
  }
  /* [s, e) touches intervals (b, i) … (b2, j). Within block b they are found by walking (each merged
   * interval is removed: O(1) amortised). */
  uint32_t b2 = b, j = i;
  while (j + 1 < k->n && k->iv[2 * j + 2] <= e) j++;
  if (j + 1 == k->n && b + 1 < set->nb && set->blk[b + 1]->iv[0] <= e) {
    /* Past block b: the last is the first interval ending past e, if it starts at or before e, else
     * the one before it (non-touching intervals: the next starts past its end). */
    if (e >= set->last[set->nb - 1]) {
      b2 = set->nb - 1;
      j = set->blk[b2]->n - 1;
    } else {
      trk_find(set, e + 1, &b2, &j);
      if (set->blk[b2]->iv[2 * j] > e) { /* starts past e: the one before it */
        if (j > 0) j--;
        else j = set->blk[--b2]->n - 1;
      }
    }
  }
  trk_block *k2 = set->blk[b2];
  uint64_t end = k2->iv[2 * j + 1];
  if (s < k->iv[2 * i]) k->iv[2 * i] = s;
  k->iv[2 * i + 1] = e > end ? e : end;
  if (b2 == b) { /* one block: close the gap of the merged ones */
    memmove(&k->iv[2 * i + 2], &k->iv[2 * j + 2], (size_t)(k->n - j - 1) * 2 * sizeof(uint64_t));
    k->n -= j - i;
    set->last[b] = k->iv[2 * k->n - 1];
    return 0;
  }
  k->n = i + 1; /* block b ends with the merged interval; k2 loses its first j + 1 */
  set->last[b] = k->iv[2 * i + 1];
  memmove(&k2->iv[0], &k2->iv[2 * j + 2], (size_t)(k2->n - j - 1) * 2 * sizeof(uint64_t));
  k2->n -= j + 1;
  trk_set_close_blocks(set, b + 1, b2 - b - 1 + (k2->n == 0));
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
  if (trk_too_many(cap, sizeof(trk_entry))) return 1;
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
      if (cap < t->cap_sets || trk_too_many(cap, 2 * sizeof(trk_set))) return NULL;
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
  trk_set_clear(set);
  if (trk_set_add(set, *lo, *hi) || trk_set_add(set, s, e)) return 1;
  x->spill |= bit;
  return 0;
}

/* The allocation is read for the first time in the group after only writes: its written bytes
 * become a copy of its touched bytes. Non-zero when out of memory. */
static __attribute__((noinline)) int trk_split_written(mlxn_tracker *t, trk_entry *x) {
  x->spill &= ~TRK_WRITTEN_IS_TOUCHED;
  if (!(x->spill & TRK_TOUCHED_SPILLED)) {
    x->ws = x->ts;
    x->we = x->te;
    return 0;
  }
  trk_set *pair = trk_sets_of(t, x);
  trk_set *touched = &pair[0], *written = &pair[1];
  trk_set_clear(written);
  for (uint32_t b = 0; b < touched->nb; b++) {
    trk_block *k = trk_set_open_block(written, b);
    if (!k) return 1;
    const trk_block *from = touched->blk[b];
    k->n = from->n;
    memcpy(k->iv, from->iv, (size_t)from->n * 2 * sizeof(uint64_t));
    written->last[b] = touched->last[b];
  }
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
