/* Native core: the command-stream decoder. Validates every record (format, handles, ranges, the
 * kernel contract's signature and argument checks) and turns dispatches into the mlxn_dispatch
 * entries a backend runs, numbered into concurrent groups by barriers. Runs with dev->mu held. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static int grow(void **arr, uint32_t *cap, uint32_t need, size_t elem) {
  if (need <= *cap) return 1;
  uint32_t ncap = *cap ? *cap : 16;
  while (ncap < need) {
    if (ncap > UINT32_MAX / 2) return 0; /* reported as out of memory */
    ncap *= 2;
  }
  void *p = realloc(*arr, (size_t)ncap * elem);
  if (!p) return 0;
  *arr = p;
  *cap = ncap;
  return 1;
}

/* A new arena block with room for need bytes, in front of the others. NULL when out of memory. */
static __attribute__((noinline)) arena_block *arena_grow(mlxn_cmdbuf *cb, uint32_t need) {
  uint32_t cap = need > 65536 ? need : 65536;
  arena_block *nb = malloc(sizeof *nb + cap);
  if (!nb) return NULL;
  nb->next = cb->arena;
  nb->used = 0;
  nb->cap = cap;
  cb->arena = nb;
  return nb;
}

static inline __attribute__((always_inline)) uint8_t *arena_copy(mlxn_cmdbuf *cb, const uint8_t *src, uint32_t n) {
  arena_block *b = cb->arena;
  uint32_t need = (n + 15u) & ~15u;
  if (!b || b->cap - b->used < need) {
    b = arena_grow(cb, need);
    if (!b) return NULL;
  }
  uint8_t *dst = b->data + b->used;
  /* SET_BYTES data is padded to whole words in the record, so whole words can be copied (never past
   * the record). Typical inline constants are a few words: copied 16 bytes at a time, without a call. */
  uint32_t padded = (n + 3u) & ~3u;
  if (padded <= 64) {
    uint32_t i = 0;
    for (; i + 16 <= padded; i += 16) memcpy(dst + i, src + i, 16);
    if (i + 8 <= padded) {
      memcpy(dst + i, src + i, 8);
      i += 8;
    }
    if (i < padded) memcpy(dst + i, src + i, 4);
  } else {
    memcpy(dst, src, n);
  }
  b->used += need;
  return dst;
}

void mlxn_cmdbuf_release_content(mlxn_cmdbuf *cb) {
  for (uint32_t i = 0; i < cb->n_refs; i++) mlxn_buffer_release_locked(cb->dev, cb->refs[i]);
  cb->n_refs = 0;
  cb->n_dispatches = 0;
  cb->n_groups = 0;
  cb->lg_groups = cb->lg_open = cb->n_wide = 0;
  memset(cb->lg_small, 0, sizeof cb->lg_small);
  /* Keep one arena block (the oldest, at the tail) for reuse; free the rest. */
  while (cb->arena && cb->arena->next) {
    arena_block *n = cb->arena->next;
    free(cb->arena);
    cb->arena = n;
  }
  if (cb->arena) cb->arena->used = 0;
}

void mlxn_storage_adopt(mlxn_cmdbuf *cb, cb_storage *sp) {
  cb->dispatches = sp->dispatches;
  cb->cap_dispatches = sp->cap_dispatches;
  cb->refs = sp->refs;
  cb->cap_refs = sp->cap_refs;
  cb->arena = sp->arena;
  cb->tracker = sp->tracker;
  cb->lg_wide = sp->lg_wide;
  cb->cap_wide = sp->cap_wide;
  memset(sp, 0, sizeof *sp);
}

void mlxn_storage_give(mlxn_cmdbuf *cb, cb_storage *sp) {
  sp->dispatches = cb->dispatches;
  sp->cap_dispatches = cb->cap_dispatches;
  sp->refs = cb->refs;
  sp->cap_refs = cb->cap_refs;
  sp->arena = cb->arena;
  sp->tracker = cb->tracker;
  sp->lg_wide = cb->lg_wide;
  sp->cap_wide = cb->cap_wide;
  cb->dispatches = NULL;
  cb->refs = NULL;
  cb->arena = NULL;
  cb->cap_dispatches = cb->cap_refs = 0;
  memset(&cb->tracker, 0, sizeof cb->tracker);
  cb->lg_wide = NULL;
  cb->cap_wide = cb->n_wide = 0;
}

void mlxn_storage_free(mlxn_cmdbuf *cb) {
  free(cb->dispatches);
  free(cb->refs);
  while (cb->arena) {
    arena_block *n = cb->arena->next;
    free(cb->arena);
    cb->arena = n;
  }
  cb->dispatches = NULL;
  cb->refs = NULL;
  cb->cap_dispatches = cb->cap_refs = 0;
  trk_free(&cb->tracker);
  free(cb->lg_wide);
  cb->lg_wide = NULL;
  cb->cap_wide = cb->n_wide = 0;
}

void mlxn_command_prepare(mlxn_cmdbuf *cb) {
  mlxn_command *cmd = &cb->cmd;
  cmd->dispatches = cb->dispatches;
  cmd->n_dispatches = cb->n_dispatches;
  cmd->n_groups = cb->n_groups;
  cmd->t_start = cmd->t_end = 0;
  cmd->backend_slot = -1;
}

/* Records the failing record's offset and sets the error. Out of line and cold: the decoder has
 * dozens of these, and formatting them in place crowded its registers and its code. */
static __attribute__((cold, noinline, format(printf, 4, 5))) int32_t fail_at(mlxn_cmdbuf *cb, uint32_t off,
                                                                            int32_t code, const char *fmt, ...) {
  cb->error_offset = off;
  char msg[640];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return mlxn_set_error(code, "command stream, record at byte %u: %s", off, msg);
}
#define FAIL(code, ...) return fail_at(cb, off, code, __VA_ARGS__)

static uint32_t word(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

static const char *op_name(uint32_t op) {
  switch (op) {
    case MLXN_OP_SET_PIPELINE: return "SET_PIPELINE";
    case MLXN_OP_SET_BUFFER: return "SET_BUFFER";
    case MLXN_OP_SET_BYTES: return "SET_BYTES";
    case MLXN_OP_SET_TG_MEMORY: return "SET_TG_MEMORY";
    case MLXN_OP_DISPATCH_THREADS: return "DISPATCH_THREADS";
    case MLXN_OP_DISPATCH_GROUPS: return "DISPATCH_GROUPS";
    case MLXN_OP_BARRIER: return "BARRIER";
    case MLXN_OP_SET_BUFFER64: return "SET_BUFFER64";
    case MLXN_OP_SET_BUFFER_WHOLE: return "SET_BUFFER_WHOLE";
    case MLXN_OP_AUTO_BARRIERS: return "AUTO_BARRIERS";
    case MLXN_OP_TRACK: return "TRACK";
    default: return "?";
  }
}

static inline void sat_inc(uint32_t *v) {
  if (*v != UINT32_MAX) ++*v;
}

/* Counts the open group (cb->lg_open dispatches) as closed. Non-zero when out of memory. */
static inline int close_group(mlxn_cmdbuf *cb) {
  uint32_t size = cb->lg_open;
  cb->lg_open = 0;
  if (size < MLXN_STAT_SMALL_SIZES) {
    cb->lg_small[size]++;
    return 0;
  }
  if (!grow((void **)&cb->lg_wide, &cb->cap_wide, cb->n_wide + 1, sizeof(uint32_t))) return 1;
  cb->lg_wide[cb->n_wide++] = size;
  return 0;
}

static __attribute__((noinline)) int grow_dispatches(mlxn_cmdbuf *cb) {
  return grow((void **)&cb->dispatches, &cb->cap_dispatches, cb->n_dispatches + 1, sizeof(mlxn_dispatch));
}

/* Room for the pending dispatch after the last one (see mlxn_cmdbuf.dispatches). */
static inline __attribute__((always_inline)) int room_for_pending(mlxn_cmdbuf *cb) {
  return cb->n_dispatches < cb->cap_dispatches || grow_dispatches(cb);
}

/* The automatic barrier before dispatch d (bindings in d->args, masks m): checks the accesses against
 * the group before adding any (a dispatch never conflicts with itself), starts a new group on
 * conflict, then adds them. The check pass also notes which accesses would change the group: a read
 * inside the bytes an allocation already had touched (and none written) changes nothing, so the add
 * pass skips it (inputs bound by every dispatch of a group cost one pass, not two). Each pass reads
 * the slot's binding again: cheaper than keeping the accesses in a local array between the passes.
 * Returns 1 when a new group starts, 0 when not, -1 when out of memory. */
static inline __attribute__((always_inline)) int track_dispatch(mlxn_cmdbuf *cb, const mlxn_dispatch *d,
                                                                 const mlxn_slot_masks *m, uint32_t bound) {
  uint32_t writes = bound & m->writes, touched = bound & (m->reads | m->writes); /* buffer slots only */
  mlxn_tracker *t = &cb->tracker;
  trk_entry *base = t->e; /* t->cap covers the buffer table (mlxn_cmdbuf_decode) */
  uint32_t epoch = t->epoch;
  uint32_t adds = 0; /* the accesses that change the group */
  int conflict = 0;
  for (uint32_t left = touched; left; left &= left - 1) {
    uint32_t s = (uint32_t)__builtin_ctz(left);
    uint64_t len = d->args.len[s]; /* an empty range touches nothing */
    if (!len) continue;
    const trk_entry *x = &base[cb->slot_index[s]];
    if (x->epoch != epoch) { /* not in the group yet */
      adds |= 1u << s;
      continue;
    }
    uint64_t lo = cb->slot_off[s], hi = lo + len;
    if (trk_entry_conflicts(t, x, lo, hi, (writes >> s) & 1u)) {
      conflict = 1;
      break;
    }
    /* A read that changes nothing: no spilled set, not only writes so far, inside the touched bytes. */
    if (((writes >> s) & 1u) || x->spill != 0 || lo < x->ts || hi > x->te) adds |= 1u << s;
  }
  int new_group = 0;
  if (conflict && cb->n_dispatches > 0) {
    trk_reset(t);
    new_group = 1;
    adds = touched;
    sat_inc(&cb->st_auto_barriers);
    sat_inc(&cb->st_barriers);
  } else {
    if (conflict) adds = touched; /* the first dispatch: no group to leave, add everything */
    sat_inc(&cb->st_auto_concurrent);
  }
  for (uint32_t left = adds; left; left &= left - 1) {
    uint32_t s = (uint32_t)__builtin_ctz(left);
    uint64_t len = d->args.len[s];
    if (len && trk_entry_add(t, &base[cb->slot_index[s]], cb->slot_off[s], cb->slot_off[s] + len, (writes >> s) & 1u))
      return -1;
  }
  return new_group;
}

/* Validates the dispatch record r against the pipeline and the pending dispatch d's bindings (bound,
 * bytes: the slot masks) and keeps it. */
static inline __attribute__((always_inline)) int32_t decode_dispatch(mlxn_cmdbuf *cb, mlxn_dispatch *d,
                                                                      const uint8_t *r, uint32_t op,
                                                                      uint32_t bound, uint32_t bytes,
                                                                      uint32_t off) {
  const mlxn_pipe *p = cb->pipe;
  if (!p) FAIL(MLXN_E_STREAM, "dispatch before any SET_PIPELINE");
  const mlxn_contract *k = p->contract;
  uint32_t g[3], t[3];
  for (int i = 0; i < 3; i++) {
    g[i] = word(r + 4 + 4 * i);
    t[i] = word(r + 16 + 4 * i);
  }
  uint32_t tag = word(r + 28);
  uint64_t tg_threads = (uint64_t)t[0] * t[1] * t[2];
  if (t[0] == 0 || t[1] == 0 || t[2] == 0 || tg_threads > MLXN_MAX_THREADS_PER_GROUP)
    FAIL(MLXN_E_STREAM, "kernel %s: threadgroup %ux%ux%u must have 1..%d threads", k->name, t[0],
         t[1], t[2], MLXN_MAX_THREADS_PER_GROUP);
  if (g[0] == 0 || g[1] == 0 || g[2] == 0)
    FAIL(MLXN_E_STREAM, "kernel %s: grid %ux%ux%u has a zero dimension", k->name, g[0], g[1], g[2]);
  mlxn_kernel_args *a = &d->args;
  for (int i = 0; i < 3; i++) {
    a->tg[i] = t[i];
    if (op == MLXN_OP_DISPATCH_THREADS) {
      a->grid[i] = g[i];
      /* Threadgroup sizes are nearly always powers of two: a shift instead of a division. */
      a->groups[i] = (t[i] & (t[i] - 1)) == 0 ? (uint32_t)(((uint64_t)g[i] + t[i] - 1) >> __builtin_ctz(t[i]))
                                               : (uint32_t)(((uint64_t)g[i] + t[i] - 1) / t[i]);
    } else {
      uint64_t threads = (uint64_t)g[i] * t[i];
      if (threads > UINT32_MAX)
        FAIL(MLXN_E_STREAM, "kernel %s: %u threadgroups of %u threads overflow dimension %d", k->name,
             g[i], t[i], i);
      a->groups[i] = g[i];
      a->grid[i] = (uint32_t)threads;
    }
  }
  /* Bindings must match the kernel's signature exactly: no missing, mistyped or extra slot. */
  const mlxn_slot_masks *m = &p->masks;
  uint32_t missing = m->required & ~bound;
  uint32_t extra = bound & ~m->all;
  uint32_t mistyped = bound & (bytes ^ m->bytes);
  if (missing | extra | mistyped) {
    if (missing) {
      uint32_t s = (uint32_t)__builtin_ctz(missing);
      FAIL(MLXN_E_STREAM, "kernel %s: slot %u (%s) is not bound", k->name, s,
           (m->bytes >> s) & 1u ? "inline bytes" : "buffer");
    }
    if (extra)
      FAIL(MLXN_E_STREAM, "kernel %s takes %u slots but slot %u is bound", k->name, m->nslots,
           (uint32_t)__builtin_ctz(extra));
    uint32_t s = (uint32_t)__builtin_ctz(mistyped);
    FAIL(MLXN_E_STREAM, "kernel %s: slot %u expects %s but got %s", k->name, s,
         (m->bytes >> s) & 1u ? "inline bytes" : "a buffer", (m->bytes >> s) & 1u ? "a buffer" : "inline bytes");
  }
  /* Unbound optional slots read as NULL/0 (the pending dispatch may hold an earlier one's); slots
   * past the signature are never read by the kernel. */
  for (uint32_t left = m->all & ~bound; left; left &= left - 1) {
    uint32_t s = (uint32_t)__builtin_ctz(left);
    a->ptr[s] = NULL;
    a->len[s] = 0;
    d->object[s] = NULL;
  }
  a->tg_memory = cb->tg_memory;
  uint64_t tg_total;
  if (__builtin_mul_overflow((uint64_t)a->groups[0] * a->groups[1], (uint64_t)a->groups[2], &tg_total))
    FAIL(MLXN_E_STREAM, "kernel %s: %ux%ux%u threadgroups overflow 64 bits; dispatch a grid the size of the data",
         k->name, a->groups[0], a->groups[1], a->groups[2]);
  char why[512];
  why[0] = 0;
  if (p->validate(a, why, sizeof why)) FAIL(MLXN_E_STREAM, "kernel %s: %s", k->name, why);

  int new_group = cb->n_dispatches == 0 || cb->barrier_pending;
  if (cb->auto_barriers) {
    int placed = track_dispatch(cb, d, m, bound);
    if (placed < 0) FAIL(MLXN_E_OUT_OF_MEMORY, "out of memory tracking the accesses of kernel %s", k->name);
    new_group |= placed;
  }
  if (new_group) {
    if (cb->n_dispatches > 0 && close_group(cb)) FAIL(MLXN_E_OUT_OF_MEMORY, "out of memory");
    cb->lg_groups++;
  }
  cb->lg_open++;
  cb->n_groups += (uint32_t)(new_group | cb->serial_groups);
  d->kernel = p->kernel;
  d->contract = k;
  d->tag = tag;
  d->group = cb->n_groups - 1;
  d->tg_total = tg_total;
  d->t_start = UINT64_MAX;
  d->t_end = 0;
  cb->barrier_pending = 0;
  cb->n_dispatches++;
  if (!room_for_pending(cb)) FAIL(MLXN_E_OUT_OF_MEMORY, "out of memory");
  return MLXN_OK;
}

/* Checks a fixed-size record's length and that only slot-carrying records use the slot field. */
#define NEED_WORDS(op, fixed)                                                                      \
  do {                                                                                             \
    if (words != (fixed)) FAIL(MLXN_E_STREAM, "%s must be %u words, header says %u", op_name(op), (fixed), words); \
  } while (0)
#define NO_SLOT(op)                                                                                \
  do {                                                                                             \
    if (slot != 0) FAIL(MLXN_E_STREAM, "%s has no slot, but the header's slot field is %u", op_name(op), slot); \
  } while (0)

/* Keeps buffer e (table index `index`) alive, and its index from being recycled, until the command
 * buffer completes: referenced once, at its first binding or tracked range in this command buffer.
 * Zero when out of memory. */
static inline __attribute__((always_inline)) int keep_buffer(mlxn_cmdbuf *cb, buffer_entry *e, uint32_t index) {
  if (e->last_cb == cb->serial) return 1;
  if (!grow((void **)&cb->refs, &cb->cap_refs, cb->n_refs + 1, sizeof(uint32_t))) return 0;
  cb->refs[cb->n_refs++] = index;
  e->refs++;
  e->last_cb = cb->serial;
  return 1;
}

/* Binds bytes [boff, boff + blen) of buffer `handle` at `slot` (with `whole`: all of it) into the
 * pending dispatch d, looked up in the device's buffer table (passed in: the caller reads it once
 * per chunk, since the stores here could alias it for the compiler). Always inlined: it runs for
 * nearly every record. */
static inline __attribute__((always_inline)) int32_t bind_buffer(mlxn_cmdbuf *cb, mlxn_dispatch *d,
                                                                  buffer_entry *buffers, uint32_t n_buffers,
                                                                  uint32_t slot, uint32_t handle, uint64_t boff,
                                                                  uint64_t blen, int whole, uint32_t off) {
  if (slot >= MLXN_MAX_SLOTS) FAIL(MLXN_E_STREAM, "buffer slot %u out of range 0..%d", slot, MLXN_MAX_SLOTS - 1);
  uint32_t index;
  buffer_entry *e = mlxn_buffer_in_table(buffers, n_buffers, handle, &index);
  if (!e)
    FAIL(MLXN_E_BAD_HANDLE, "slot %u: buffer handle 0x%x is not a live buffer: it %s", slot, handle,
         mlxn_handle_problem(cb->dev, handle));
  if (whole) {
    blen = e->size;
  } else if (boff > e->size || blen > e->size - boff) {
    FAIL(MLXN_E_STREAM, "slot %u: range [%llu, %llu) is past the end of a %llu-byte buffer", slot,
         (unsigned long long)boff, (unsigned long long)(boff + blen), (unsigned long long)e->size);
  }
  if (!keep_buffer(cb, e, index)) FAIL(MLXN_E_OUT_OF_MEMORY, "out of memory");
  if (slot < MLXN_KERNEL_SLOTS) { /* a higher slot is only marked bound: the dispatch refuses it */
    d->args.ptr[slot] = e->data + boff;
    d->args.len[slot] = blen;
    d->object[slot] = e->handle;
    cb->slot_off[slot] = boff;
    cb->slot_index[slot] = index;
  }
  return MLXN_OK;
}

/* A TRACK record: validates every entry (and keeps each buffer referenced) before it changes the
 * group; with CHECK, places a barrier if a range conflicts; then adds every range. */
static int32_t decode_track(mlxn_cmdbuf *cb, const uint8_t *r, uint32_t words, uint32_t off) {
  if (words < MLXN_REC_TRACK_HEADER_WORDS + MLXN_REC_TRACK_ENTRY_WORDS ||
      (words - MLXN_REC_TRACK_HEADER_WORDS) % MLXN_REC_TRACK_ENTRY_WORDS != 0)
    FAIL(MLXN_E_STREAM, "TRACK must be %d + %d words per range (at least one), header says %u",
         MLXN_REC_TRACK_HEADER_WORDS, MLXN_REC_TRACK_ENTRY_WORDS, words);
  uint32_t n = (words - MLXN_REC_TRACK_HEADER_WORDS) / MLXN_REC_TRACK_ENTRY_WORDS;
  if (n > MLXN_MAX_TRACK_ENTRIES)
    FAIL(MLXN_E_STREAM, "TRACK of %u ranges: at most %d per record; split it", n, MLXN_MAX_TRACK_ENTRIES);
  mlxn_device *dev = cb->dev;
  const uint8_t *first = r + 4 * MLXN_REC_TRACK_HEADER_WORDS;
  uint32_t check = word(first + 4) & MLXN_TRACK_CHECK;
  for (uint32_t i = 0; i < n; i++) {
    const uint8_t *x = first + 4 * MLXN_REC_TRACK_ENTRY_WORDS * i;
    uint32_t handle = word(x), flags = word(x + 4);
    uint64_t boff = word(x + 8) | ((uint64_t)word(x + 12) << 32);
    uint64_t blen = word(x + 16) | ((uint64_t)word(x + 20) << 32);
    if (flags & ~(uint32_t)(MLXN_TRACK_READ | MLXN_TRACK_WRITE | MLXN_TRACK_CHECK))
      FAIL(MLXN_E_STREAM, "TRACK range %u: unknown flags 0x%x", i, flags);
    if (!(flags & (MLXN_TRACK_READ | MLXN_TRACK_WRITE)))
      FAIL(MLXN_E_STREAM, "TRACK range %u is neither read nor written (flags 0x%x)", i, flags);
    if ((flags & MLXN_TRACK_CHECK) != check)
      FAIL(MLXN_E_STREAM, "TRACK range %u: CHECK must be set in every range of a record or in none", i);
    uint32_t index;
    buffer_entry *e = mlxn_buffer_in_table(dev->buffers, dev->n_buffers, handle, &index);
    if (!e)
      FAIL(MLXN_E_BAD_HANDLE, "TRACK range %u: buffer handle 0x%x is not a live buffer: it %s", i, handle,
           mlxn_handle_problem(dev, handle));
    if (boff > e->size || blen > e->size - boff)
      FAIL(MLXN_E_STREAM, "TRACK range %u: [%llu, +%llu) is past the end of a %llu-byte buffer", i,
           (unsigned long long)boff, (unsigned long long)blen, (unsigned long long)e->size);
    if (!keep_buffer(cb, e, index)) FAIL(MLXN_E_OUT_OF_MEMORY, "out of memory");
  }
  mlxn_tracker *t = &cb->tracker;
  if (check) {
    int conflict = 0;
    for (uint32_t i = 0; i < n && !conflict; i++) {
      const uint8_t *x = first + 4 * MLXN_REC_TRACK_ENTRY_WORDS * i;
      uint64_t boff = word(x + 8) | ((uint64_t)word(x + 12) << 32);
      uint64_t blen = word(x + 16) | ((uint64_t)word(x + 20) << 32);
      uint32_t index = (word(x) & HANDLE_INDEX_MASK) - 1; /* validated above */
      if (blen) conflict = trk_conflicts(t, index, boff, boff + blen, (word(x + 4) & MLXN_TRACK_WRITE) != 0);
    }
    if (conflict && cb->n_dispatches > 0) {
      trk_reset(t);
      cb->barrier_pending = 1;
      sat_inc(&cb->st_auto_barriers);
      sat_inc(&cb->st_barriers);
    } else {
      sat_inc(&cb->st_auto_concurrent);
    }
  }
  for (uint32_t i = 0; i < n; i++) {
    const uint8_t *x = first + 4 * MLXN_REC_TRACK_ENTRY_WORDS * i;
    uint64_t boff = word(x + 8) | ((uint64_t)word(x + 12) << 32);
    uint64_t blen = word(x + 16) | ((uint64_t)word(x + 20) << 32);
    uint32_t index = (word(x) & HANDLE_INDEX_MASK) - 1;
    if (blen && trk_add(t, index, boff, boff + blen, (word(x + 4) & MLXN_TRACK_WRITE) != 0))
      FAIL(MLXN_E_OUT_OF_MEMORY, "out of memory tracking TRACK range %u", i);
  }
  return MLXN_OK;
}

/* Tracker state for every buffer table index, so that a tracked dispatch indexes it unchecked (the
 * table does not change while the decoder holds dev->mu). Non-zero when out of memory. */
static inline int tracker_covers_table(mlxn_cmdbuf *cb, uint32_t n_table) {
  return n_table > cb->tracker.cap && trk_fit(&cb->tracker, n_table - 1);
}

int32_t mlxn_cmdbuf_decode(mlxn_cmdbuf *cb, const uint8_t *stream, uint32_t len) {
  mlxn_device *dev = cb->dev;
  buffer_entry *table = dev->buffers; /* the table does not change while the decoder holds dev->mu */
  uint32_t n_table = dev->n_buffers;
  uint32_t off = 0;
  /* Binding state in locals, stored back at the end (a failed chunk leaves the command buffer in its
   * error state, so nothing reads it after a FAIL). */
  uint32_t bound = cb->bound_mask, bytes = cb->bytes_mask;
  cb->serial_groups = (dev->flags & MLXN_FLAG_SERIAL) != 0;
  if (!room_for_pending(cb)) FAIL(MLXN_E_OUT_OF_MEMORY, "out of memory");
  if (cb->auto_barriers && tracker_covers_table(cb, n_table)) FAIL(MLXN_E_OUT_OF_MEMORY, "out of memory");
  mlxn_dispatch *d = &cb->dispatches[cb->n_dispatches]; /* the pending dispatch */
  while (off < len) {
    const uint8_t *r = stream + off;
    uint32_t hdr = word(r);
    uint32_t op = hdr & 0xffu, slot = (hdr >> 8) & 0xffu, words = hdr >> 16;
    /* One compare for both: a zero length wraps past any number of remaining words. */
    if (words - 1u >= (len - off) / 4) {
      if (words == 0) FAIL(MLXN_E_STREAM, "record length is zero");
      FAIL(MLXN_E_STREAM, "truncated record: %s claims %u words, %u bytes remain", op_name(op), words, len - off);
    }
    /* Ordered by frequency: a dispatch is typically a few buffers, one SET_BYTES and the dispatch. */
    switch (op) {
      case MLXN_OP_SET_BUFFER_WHOLE:
      case MLXN_OP_SET_BUFFER: {
        /* A dispatch's buffers come in a run: bind them in this loop, without a trip through the
         * switch between them (the same checks, record by record). */
        for (;;) {
          int whole = op == MLXN_OP_SET_BUFFER_WHOLE;
          NEED_WORDS(op, whole ? MLXN_REC_SET_BUFFER_WHOLE_WORDS : MLXN_REC_SET_BUFFER_WORDS);
          int32_t rc = bind_buffer(cb, d, table, n_table, slot, word(r + 4), whole ? 0 : word(r + 8),
                                   whole ? 0 : word(r + 12), whole, off);
          if (rc != MLXN_OK) return rc;
          bytes &= ~(1u << slot);
          bound |= 1u << slot;
          uint32_t next = off + words * 4;
          if (len - next < MLXN_REC_SET_BUFFER_WHOLE_WORDS * 4) break;
          uint32_t h = word(stream + next), hop = h & 0xffu, hwords = h >> 16;
          uint32_t expect = hop == MLXN_OP_SET_BUFFER_WHOLE ? MLXN_REC_SET_BUFFER_WHOLE_WORDS : MLXN_REC_SET_BUFFER_WORDS;
          if ((hop != MLXN_OP_SET_BUFFER_WHOLE && hop != MLXN_OP_SET_BUFFER) || hwords != expect ||
              len - next < hwords * 4)
            break; /* anything else (or a malformed record) goes through the switch */
          off = next;
          r = stream + off;
          op = hop;
          slot = (h >> 8) & 0xffu;
          words = hwords;
        }
        break;
      }
      case MLXN_OP_DISPATCH_THREADS:
      case MLXN_OP_DISPATCH_GROUPS: {
        NEED_WORDS(op, MLXN_REC_DISPATCH_WORDS);
        NO_SLOT(op);
        int32_t rc = decode_dispatch(cb, d, r, op, bound, bytes, off);
        if (rc != MLXN_OK) return rc;
        d = &cb->dispatches[cb->n_dispatches]; /* the next pending one (the array may have moved) */
        bound = 0; /* every dispatch carries its complete binding set */
        cb->tg_memory = 0;
        break;
      }
      case MLXN_OP_SET_BYTES: {
        if (words < MLXN_REC_SET_BYTES_HEADER_WORDS)
          FAIL(MLXN_E_STREAM, "SET_BYTES must be at least %d words", MLXN_REC_SET_BYTES_HEADER_WORDS);
        uint32_t n = word(r + 4);
        if (slot >= MLXN_MAX_SLOTS) FAIL(MLXN_E_STREAM, "bytes slot %u out of range 0..%d", slot, MLXN_MAX_SLOTS - 1);
        if (n == 0 || n > MLXN_MAX_INLINE_BYTES)
          FAIL(MLXN_E_STREAM, "slot %u: %u inline bytes, must be 1..%d", slot, n, MLXN_MAX_INLINE_BYTES);
        if (words != MLXN_REC_SET_BYTES_HEADER_WORDS + (n + 3) / 4)
          FAIL(MLXN_E_STREAM, "SET_BYTES of %u bytes must be %u words, header says %u", n,
               MLXN_REC_SET_BYTES_HEADER_WORDS + (n + 3) / 4, words);
        uint8_t *copy = arena_copy(cb, r + 8, n);
        if (!copy) FAIL(MLXN_E_OUT_OF_MEMORY, "out of memory");
        if (slot < MLXN_KERNEL_SLOTS) { /* a higher slot is only marked bound: the dispatch refuses it */
          d->args.ptr[slot] = copy;
          d->args.len[slot] = n;
          d->object[slot] = NULL;
        }
        bytes |= 1u << slot;
        bound |= 1u << slot;
        break;
      }
      case MLXN_OP_SET_PIPELINE: {
        NEED_WORDS(op, MLXN_REC_SET_PIPELINE_WORDS);
        NO_SLOT(op);
        uint32_t handle = word(r + 4);
        if (handle == cb->pipeline_handle && cb->pipe) break;
        if (handle - 1u >= dev->n_pipes || !dev->pipes[handle].kernel)
          FAIL(MLXN_E_BAD_HANDLE, "unknown pipeline handle %u", handle);
        cb->pipe = &dev->pipes[handle];
        cb->pipeline_handle = handle;
        break;
      }
      case MLXN_OP_BARRIER:
        NEED_WORDS(op, MLXN_REC_BARRIER_WORDS);
        NO_SLOT(op);
        if (cb->n_dispatches > 0) {
          cb->barrier_pending = 1;
          sat_inc(&cb->st_barriers);
        }
        trk_reset(&cb->tracker); /* every earlier write is visible (or there was none) */
        break;
      case MLXN_OP_AUTO_BARRIERS:
        NEED_WORDS(op, MLXN_REC_AUTO_BARRIERS_WORDS);
        if (slot > 1) FAIL(MLXN_E_STREAM, "AUTO_BARRIERS takes 0 (off) or 1 (on) in the slot field, got %u", slot);
        if (slot && tracker_covers_table(cb, n_table)) FAIL(MLXN_E_OUT_OF_MEMORY, "out of memory");
        /* The group stays: what was tracked before the switch still shares the group with what follows. */
        cb->auto_barriers = (uint8_t)slot;
        break;
      case MLXN_OP_TRACK: {
        NO_SLOT(op);
        int32_t rc = decode_track(cb, r, words, off);
        if (rc != MLXN_OK) return rc;
        break;
      }
      case MLXN_OP_SET_BUFFER64: {
        NEED_WORDS(op, MLXN_REC_SET_BUFFER64_WORDS);
        int32_t rc = bind_buffer(cb, d, table, n_table, slot, word(r + 4),
                                 word(r + 8) | ((uint64_t)word(r + 12) << 32),
                                 word(r + 16) | ((uint64_t)word(r + 20) << 32), 0, off);
        if (rc != MLXN_OK) return rc;
        bytes &= ~(1u << slot);
        bound |= 1u << slot;
        break;
      }
      case MLXN_OP_SET_TG_MEMORY: {
        NEED_WORDS(op, MLXN_REC_SET_TG_MEMORY_WORDS);
        uint32_t n = word(r + 4);
        if (slot != 0) FAIL(MLXN_E_STREAM, "threadgroup memory index %u: only index 0 is supported", slot);
        if (n > MLXN_MAX_TG_MEMORY)
          FAIL(MLXN_E_STREAM, "%u bytes of threadgroup memory exceed the limit of %d", n, MLXN_MAX_TG_MEMORY);
        cb->tg_memory = n;
        break;
      }
      default: FAIL(MLXN_E_STREAM, "unknown opcode %u", op);
    }
    off += words * 4;
  }
  cb->bound_mask = bound;
  cb->bytes_mask = bytes;
  return MLXN_OK;
}

/* ---- replay of a decoded command buffer (mlxn_cmdbuf_replay) ---------------------------------- */

/* Bit s: slot s of contract k holds inline bytes ('c' in its signature). */
static uint32_t bytes_slots(const mlxn_contract *k) {
  uint32_t m = 0;
  for (uint32_t s = 0; s < MLXN_KERNEL_SLOTS && k->signature[s]; s++) m |= (uint32_t)(k->signature[s] == 'c') << s;
  return m;
}

int32_t mlxn_cmdbuf_copy_decoded(mlxn_cmdbuf *cb, const mlxn_cmdbuf *from) {
  mlxn_device *dev = cb->dev;
  /* Every buffer first, so that a refusal leaves cb as it was. `from` holds a reference on each, so
   * no slot was recycled: the entry is live unless the host freed the buffer since. */
  for (uint32_t i = 0; i < from->n_refs; i++) {
    uint32_t index = from->refs[i];
    if (index >= dev->n_buffers || !dev->buffers[index].live)
      return mlxn_set_error(MLXN_E_BAD_HANDLE,
                            "the template binds a buffer that was freed after the template was encoded; encode "
                            "the pass again (or keep its buffers while the template is in use)");
  }
  uint32_t n = from->n_dispatches;
  if (!grow((void **)&cb->dispatches, &cb->cap_dispatches, n + 1, sizeof(mlxn_dispatch)) ||
      !grow((void **)&cb->refs, &cb->cap_refs, from->n_refs, sizeof(uint32_t)) ||
      !grow((void **)&cb->lg_wide, &cb->cap_wide, from->n_wide, sizeof(uint32_t)))
    return mlxn_set_error(MLXN_E_OUT_OF_MEMORY, "out of memory replaying a command buffer");
  /* The records were validated when `from` decoded them. Only their inline constants live in
   * `from`'s memory (its arena): each arena block is copied whole into one block of cb's, and each
   * constant's pointer moved by its block's displacement. */
  uint32_t arena_bytes = 0;
  for (const arena_block *b = from->arena; b; b = b->next)
    if (__builtin_add_overflow(arena_bytes, b->used, &arena_bytes))
      return mlxn_set_error(MLXN_E_OUT_OF_MEMORY, "a template's inline constants exceed 4 GiB");
  uint8_t *dst = NULL;
  if (arena_bytes > 0) {
    arena_block *b = cb->arena;
    if (!b || b->cap - b->used < arena_bytes) b = arena_grow(cb, arena_bytes);
    if (!b) return mlxn_set_error(MLXN_E_OUT_OF_MEMORY, "out of memory replaying a command buffer");
    dst = b->data + b->used;
    b->used += arena_bytes;
    uint32_t at = 0;
    for (const arena_block *f = from->arena; f; f = f->next) {
      memcpy(dst + at, f->data, f->used);
      at += f->used;
    }
  }
  memcpy(cb->dispatches, from->dispatches, (size_t)n * sizeof(mlxn_dispatch));
  /* Constants went into `from`'s arena in stream order, each new block in front of the list: walking
   * the dispatches from the last one walks the blocks from the first. The block of the previous
   * constant (and then the ones after it) is tried before the whole list, so that finding a
   * constant's block costs O(1) per dispatch, not O(blocks), however large the pass's constants. */
  const arena_block *blk = from->arena;
  uintptr_t blk_at = 0; /* blk's offset in dst */
  const mlxn_contract *ck = NULL;
  uint32_t ck_bytes = 0; /* bytes_slots(ck): dispatches of one kernel in a row scan its signature once */
  for (uint32_t k = n; k-- > 0;) {
    mlxn_dispatch *d = &cb->dispatches[k];
    if (d->contract != ck) {
      ck = d->contract;
      ck_bytes = bytes_slots(ck);
    }
    for (uint32_t left = ck_bytes; left; left &= left - 1) {
      uint32_t s = (uint32_t)__builtin_ctz(left);
      uintptr_t p = (uintptr_t)d->args.ptr[s];
      /* unsigned: an address below a block's data wraps past any size */
      if (!blk || p - (uintptr_t)blk->data >= blk->used) {
        const arena_block *b = blk ? blk->next : NULL;
        uintptr_t at = blk ? blk_at + blk->used : 0;
        while (b && p - (uintptr_t)b->data >= b->used) at += b->used, b = b->next;
        if (!b) /* a newer block: from the list's start */
          for (at = 0, b = from->arena; b && p - (uintptr_t)b->data >= b->used; b = b->next) at += b->used;
        if (!b) continue; /* a decoded inline-bytes slot always points into the arena */
        blk = b;
        blk_at = at;
      }
      d->args.ptr[s] = dst + blk_at + (p - (uintptr_t)blk->data);
    }
  }
  for (uint32_t i = 0; i < from->n_refs; i++) /* room was made above: keep_buffer cannot fail */
    keep_buffer(cb, &dev->buffers[from->refs[i]], from->refs[i]);
  cb->n_dispatches = n;
  cb->n_groups = from->n_groups;
  cb->st_auto_barriers = from->st_auto_barriers;
  cb->st_auto_concurrent = from->st_auto_concurrent;
  cb->st_barriers = from->st_barriers;
  cb->lg_groups = from->lg_groups;
  cb->lg_open = from->lg_open;
  memcpy(cb->lg_small, from->lg_small, sizeof cb->lg_small);
  if (from->n_wide) memcpy(cb->lg_wide, from->lg_wide, (size_t)from->n_wide * sizeof(uint32_t));
  cb->n_wide = from->n_wide;
  cb->pipe = from->pipe;
  cb->pipeline_handle = from->pipeline_handle;
  /* What `from`'s tracker held is not copied: a dispatch after the replay starts a new group, tracked
   * if `from` ended tracking. */
  cb->barrier_pending = n > 0;
  cb->auto_barriers = from->auto_barriers;
  trk_reset(&cb->tracker); /* (sized by the next decode, as after an AUTO_BARRIERS record) */
  return MLXN_OK;
}

/* Validates dispatch k again (its constants were patched). */
static int32_t revalidate(mlxn_cmdbuf *cb, uint32_t k) {
  mlxn_dispatch *d = &cb->dispatches[k];
  char why[512];
  why[0] = 0;
  if (d->contract->validate(&d->args, why, sizeof why))
    return mlxn_set_error(MLXN_E_STREAM, "patched dispatch %u: kernel %s: %s", k, d->contract->name, why);
  return MLXN_OK;
}

int32_t mlxn_cmdbuf_patch_constants(mlxn_cmdbuf *cb, const uint32_t *patch, uint32_t n) {
  /* A dispatch is validated on its final constants, never on a mix of old and new ones. Entries in
   * dispatch order (the usual case) put all of a dispatch's entries together: it is validated right
   * after its last one, while its memory is still at hand. Otherwise every entry goes first, then
   * every patched dispatch is validated. */
  int ordered = 1;
  for (uint32_t i = 1; i < n && ordered; i++)
    ordered = patch[(size_t)i * MLXN_PATCH_WORDS] >= patch[(size_t)(i - 1) * MLXN_PATCH_WORDS];
  const mlxn_contract *ck = NULL;
  uint32_t ck_bytes = 0; /* bytes_slots(ck): entries of one kernel in a row scan its signature once */
  for (uint32_t i = 0; i < n; i++) {
    const uint32_t *e = patch + (size_t)i * MLXN_PATCH_WORDS;
    uint32_t k = e[0], slot = e[1], off = e[2];
    if (k >= cb->n_dispatches)
      return mlxn_set_error(MLXN_E_STREAM, "patch %u: dispatch %u, but the command buffer has %u", i, k,
                            cb->n_dispatches);
    mlxn_dispatch *d = &cb->dispatches[k];
    if (d->contract != ck) {
      ck = d->contract;
      ck_bytes = bytes_slots(ck);
    }
    if (slot >= MLXN_KERNEL_SLOTS || !((ck_bytes >> slot) & 1u))
      return mlxn_set_error(MLXN_E_STREAM, "patch %u: slot %u of kernel %s (dispatch %u) holds no inline constants", i,
                            slot, ck->name, k);
    if (off % 4 != 0 || (uint64_t)off + 4 > d->args.len[slot])
      return mlxn_set_error(MLXN_E_STREAM,
                            "patch %u: byte offset %u of slot %u (dispatch %u) is not a whole word inside its %llu "
                            "inline bytes", i, off, slot, k, (unsigned long long)d->args.len[slot]);
    memcpy(d->args.ptr[slot] + off, &e[3], 4); /* cb's own copy of the constants (copy_decoded) */
    if (ordered && (i + 1 == n || patch[(size_t)(i + 1) * MLXN_PATCH_WORDS] != k)) {
      int32_t rc = revalidate(cb, k);
      if (rc != MLXN_OK) return rc;
    }
  }
  if (ordered) return MLXN_OK;
  uint32_t last = UINT32_MAX; /* consecutive entries of one dispatch: validated once */
  for (uint32_t i = 0; i < n; i++) {
    uint32_t k = patch[(size_t)i * MLXN_PATCH_WORDS];
    if (k == last) continue;
    last = k;
    int32_t rc = revalidate(cb, k);
    if (rc != MLXN_OK) return rc;
  }
  return MLXN_OK;
}

/* ---- templates that keep their stream (mlxn_cmdbuf_encode_template, mlxn_cmdbuf_replay_like) ---- */

/* A record whose words a replay may patch: the inline constants of a SET_BYTES, or the offset and
 * length of a SET_BUFFER / SET_BUFFER64, that reach dispatch `dispatch` at `slot`. Every other word
 * of the stream is fixed: a stream that differs there is decoded. */
typedef struct src_record {
  uint32_t start;    /* word index of the record's header */
  uint32_t dispatch; /* the dispatch that consumes the binding */
  uint16_t words;    /* patchable words from start + 2; 0 once a later record of the slot replaced it */
  uint8_t range;     /* 1: a buffer range (SET_BUFFER, SET_BUFFER64), 0: inline constants */
  uint8_t slot;
} src_record;

struct cb_source {
  uint32_t *words;
  uint32_t n_words;
  src_record *recs; /* in stream order */
  uint32_t n_recs;
  /* Ranges never change: TRACK records (ranges given by the host), or AUTO_BARRIERS other than one
   * "on" before the first dispatch (dispatches outside the tracker). */
  uint8_t ranges_fixed;
  uint8_t tracked; /* automatic barriers placed the template's barriers */
};

static void free_source(struct cb_source *s) {
  if (!s) return;
  free(s->words);
  free(s->recs);
  free(s);
}

void mlxn_cmdbuf_free_source(mlxn_cmdbuf *cb) {
  free_source(cb->source);
  cb->source = NULL;
}

int32_t mlxn_cmdbuf_keep_source(mlxn_cmdbuf *cb, const uint8_t *stream, uint32_t len) {
  struct cb_source *s = calloc(1, sizeof *s);
  uint32_t n = len / 4;
  if (!s || (n && !(s->words = malloc((size_t)n * 4)))) {
    free(s);
    return mlxn_set_error(MLXN_E_OUT_OF_MEMORY, "out of memory keeping a template's stream");
  }
  if (n) memcpy(s->words, stream, (size_t)n * 4);
  s->n_words = n;
  uint32_t cap = 0, dispatch = 0, autos = 0, auto_late = 0, auto_off = 0;
  int32_t holder[MLXN_MAX_SLOTS]; /* the record each slot of the pending dispatch holds, or -1 */
  for (uint32_t i = 0; i < MLXN_MAX_SLOTS; i++) holder[i] = -1;
  /* The stream was decoded whole just now: every record is well-formed. */
  for (uint32_t at = 0; at < n;) {
    uint32_t h = s->words[at], op = h & 0xffu, slot = (h >> 8) & 0xffu, words = h >> 16;
    int patchable = op == MLXN_OP_SET_BYTES || op == MLXN_OP_SET_BUFFER || op == MLXN_OP_SET_BUFFER64;
    if (patchable || op == MLXN_OP_SET_BUFFER_WHOLE) {
      if (slot < MLXN_MAX_SLOTS && holder[slot] >= 0) s->recs[holder[slot]].words = 0; /* replaced: dead */
      if (slot < MLXN_MAX_SLOTS) holder[slot] = -1;
    }
    if (patchable && slot < MLXN_KERNEL_SLOTS) { /* a higher slot never reaches a decoded dispatch */
      if (s->n_recs == cap) {
        uint32_t want = cap ? cap * 2 : 64;
        src_record *r = realloc(s->recs, (size_t)want * sizeof *r);
        if (!r) {
          free_source(s);
          return mlxn_set_error(MLXN_E_OUT_OF_MEMORY, "out of memory keeping a template's stream");
        }
        s->recs = r;
        cap = want;
      }
      src_record *r = &s->recs[s->n_recs];
      r->start = at;
      r->dispatch = dispatch;
      r->slot = (uint8_t)slot;
      r->range = op != MLXN_OP_SET_BYTES;
      /* Constants: whole words only (a partial last word stays fixed). */
      r->words = (uint16_t)(op == MLXN_OP_SET_BYTES ? s->words[at + 1] / 4 : op == MLXN_OP_SET_BUFFER ? 2 : 4);
      holder[slot] = (int32_t)s->n_recs++;
    } else if (op == MLXN_OP_DISPATCH_THREADS || op == MLXN_OP_DISPATCH_GROUPS) {
      dispatch++;
      for (uint32_t i = 0; i < MLXN_MAX_SLOTS; i++) holder[i] = -1; /* each dispatch has its own bindings */
    } else if (op == MLXN_OP_AUTO_BARRIERS) {
      autos++;
      auto_late |= dispatch > 0;
      auto_off |= slot == 0;
    } else if (op == MLXN_OP_TRACK) {
      s->ranges_fixed = 1;
    }
    at += words;
  }
  /* Bindings after the last dispatch reach none: the replay refuses such a template anyway. */
  for (uint32_t i = 0; i < MLXN_MAX_SLOTS; i++)
    if (holder[i] >= 0) s->recs[holder[i]].words = 0;
  if (autos > 1 || auto_late || auto_off) s->ranges_fixed = 1;
  s->tracked = autos == 1 && !auto_late && !auto_off;
  cb->source = s;
  return MLXN_OK;
}

/* The first word at or after byte `at` where a and b differ, as a byte offset (n when none). */
static uint32_t next_difference(const uint8_t *a, const uint8_t *b, uint32_t at, uint32_t n) {
  typedef uint64_t v4 __attribute__((vector_size(32)));
  for (; at + 64 <= n; at += 64) {
    v4 x0, x1, y0, y1;
    memcpy(&x0, a + at, 32);
    memcpy(&x1, a + at + 32, 32);
    memcpy(&y0, b + at, 32);
    memcpy(&y1, b + at + 32, 32);
    v4 d = (x0 ^ y0) | (x1 ^ y1);
    if (d[0] | d[1] | d[2] | d[3]) break;
  }
  for (; at < n; at += 4)
    if (word(a + at) != word(b + at)) return at;
  return n;
}

/* The patchable record holding word w, or NULL. */
static const src_record *record_of(const struct cb_source *s, uint32_t w) {
  uint32_t lo = 0, hi = s->n_recs; /* the last record starting at or before w */
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (s->recs[mid].start <= w) lo = mid + 1;
    else hi = mid;
  }
  if (lo == 0) return NULL;
  const src_record *r = &s->recs[lo - 1];
  return w >= r->start + 2 && w < r->start + 2u + r->words ? r : NULL;
}

/* One changed record: for a range, the binding it now makes. */
typedef struct changed_record {
  const src_record *rec;
  uint8_t *ptr;
  uint64_t len;
} changed_record;

/* The largest concurrent group a changed range is checked against: past it, decoding is cheaper. */
#define LIKE_MAX_GROUP 64u

/* Slot s of dispatch j (of `from`) as the replay will bind it: its changed range among j's changed
 * records (ch[0..n), all of dispatch j: at most one live record per slot), or from's. */
static void bound_range(const mlxn_dispatch *d, const changed_record *ch, uint32_t n, uint32_t s,
                        const uint8_t **ptr, uint64_t *len) {
  *ptr = d->args.ptr[s];
  *len = d->args.len[s];
  for (uint32_t i = 0; i < n; i++)
    if (ch[i].rec->slot == s && ch[i].rec->range) {
      *ptr = ch[i].ptr;
      *len = ch[i].len;
    }
}

/* Whether the changed ranges of dispatch k conflict with another dispatch of its concurrent group
 * (as the decoder's tracker would judge them: a write against any access of the same bytes). */
static int group_conflict(const mlxn_cmdbuf *from, const changed_record *ch, uint32_t n_ch, uint32_t at,
                          int64_t *budget, int *too_wide) {
  uint32_t k = ch[at].rec->dispatch;
  const mlxn_dispatch *ds = from->dispatches;
  uint32_t g = ds[k].group, lo = k, hi = k + 1;
  /* Bounded walks: a group wider than LIKE_MAX_GROUP is refused without being walked whole. */
  while (lo > 0 && ds[lo - 1].group == g && hi - lo <= LIKE_MAX_GROUP) lo--;
  while (hi < from->n_dispatches && ds[hi].group == g && hi - lo <= LIKE_MAX_GROUP) hi++;
  if (hi - lo > LIKE_MAX_GROUP) return *too_wide = 1;
  /* The changed records of the group's dispatches, around k's first (`at`): ch is in stream order,
   * so in dispatch order. */
  uint32_t c0 = at;
  while (c0 > 0 && ch[c0 - 1].rec->dispatch >= lo) c0--;
  uint32_t c1 = at;
  while (c1 < n_ch && ch[c1].rec->dispatch < hi) c1++;
  /* The whole pass's checks are bounded (a budget in dispatch-slot visits, linear in the pass):
   * past it, decoding is cheaper. */
  if ((*budget -= (int64_t)(hi - lo) * MLXN_KERNEL_SLOTS) < 0) return *too_wide = 1;
  const mlxn_contract *ck = ds[k].contract;
  for (uint32_t i = c0; i < c1; i++) {
    if (ch[i].rec->dispatch != k || !ch[i].rec->range) continue;
    uint32_t sk = ch[i].rec->slot;
    if (sk >= MLXN_KERNEL_SLOTS || !ch[i].len) continue;
    int wk = (ck->writes >> sk) & 1u;
    uintptr_t a0 = (uintptr_t)ch[i].ptr, a1 = a0 + ch[i].len;
    uint32_t cur = c0; /* j's changed records start here: both ascend */
    for (uint32_t j = lo; j < hi; j++) {
      while (cur < c1 && ch[cur].rec->dispatch < j) cur++;
      uint32_t end = cur;
      while (end < c1 && ch[end].rec->dispatch == j) end++;
      if (j == k) continue; /* a dispatch never conflicts with itself */
      const mlxn_contract *cj = ds[j].contract;
      for (uint32_t left = (cj->reads | cj->writes) & ((1u << MLXN_KERNEL_SLOTS) - 1u); left; left &= left - 1) {
        uint32_t sj = (uint32_t)__builtin_ctz(left);
        if (ds[j].object[sj] != ds[k].object[sk]) continue;
        int wj = (cj->writes >> sj) & 1u;
        if (!wk && !wj) continue;
        const uint8_t *p;
        uint64_t n;
        bound_range(&ds[j], ch + cur, end - cur, sj, &p, &n);
        if (n && (uintptr_t)p < a1 && a0 < (uintptr_t)p + n) return 1;
      }
    }
  }
  return 0;
}

int32_t mlxn_cmdbuf_replay_source(mlxn_cmdbuf *cb, const mlxn_cmdbuf *from, const uint8_t *stream, uint32_t len) {
  const struct cb_source *s = from->source;
  if (len != s->n_words * 4) return MLXN_UNLIKE;
  const uint8_t *old = (const uint8_t *)s->words;
  /* A patched dispatch costs about half what decoding it does, on top of the copy of every dispatch:
   * past one changed record per two dispatches, decode. */
  uint32_t n = from->n_dispatches, max_changed = n / 2 > 16 ? n / 2 : 16;
  changed_record stack_ch[64], *ch = stack_ch;
  uint32_t n_ch = 0, cap_ch = 64, ranges = 0;
  int32_t rc = MLXN_OK;
  mlxn_device *dev = cb->dev;
  /* Every difference first: a changed word outside a patchable record, or more changed records than
   * decoding would cost, and the stream is decoded instead (nothing done to cb). */
  for (uint32_t at = next_difference(old, stream, 0, len); at < len; at = next_difference(old, stream, at + 4, len)) {
    const src_record *r = record_of(s, at / 4);
    if (!r || (r->range && s->ranges_fixed)) {
      rc = MLXN_UNLIKE;
      break;
    }
    if (n_ch > 0 && ch[n_ch - 1].rec == r) continue; /* another word of the same record */
    if (n_ch == max_changed) {
      rc = MLXN_UNLIKE;
      break;
    }
    if (n_ch == cap_ch) {
      changed_record *more = malloc((size_t)cap_ch * 2 * sizeof *more);
      if (!more) {
        rc = mlxn_set_error(MLXN_E_OUT_OF_MEMORY, "out of memory replaying a command buffer");
        break;
      }
      memcpy(more, ch, (size_t)n_ch * sizeof *ch);
      if (ch != stack_ch) free(ch);
      ch = more;
      cap_ch *= 2;
    }
    ch[n_ch].rec = r;
    ch[n_ch].ptr = NULL;
    ch[n_ch].len = 0;
    n_ch++;
    /* The rest of this record is one entry: continue after it. */
    at = (r->start + 2u + r->words) * 4 - 4;
  }
  /* A changed range binds the same buffer (its handle is a fixed word): checked as decoding would. */
  for (uint32_t i = 0; rc == MLXN_OK && i < n_ch; i++) {
    const src_record *r = ch[i].rec;
    if (!r->range) continue;
    ranges++;
    const uint8_t *x = stream + 4 * (size_t)r->start;
    uint32_t handle = word(x + 4);
    uint64_t boff = r->words == 2 ? word(x + 8) : word(x + 8) | (uint64_t)word(x + 12) << 32;
    uint64_t blen = r->words == 2 ? word(x + 12) : word(x + 16) | (uint64_t)word(x + 20) << 32;
    buffer_entry *e = mlxn_buffer_lookup(dev, handle, NULL);
    if (!e) {
      rc = mlxn_set_error(MLXN_E_BAD_HANDLE, "slot %u: buffer handle 0x%x is not a live buffer: it %s", r->slot,
                          handle, mlxn_handle_problem(dev, handle));
    } else if (boff > e->size || blen > e->size - boff) {
      rc = mlxn_set_error(MLXN_E_STREAM, "slot %u: range [%llu, %llu) is past the end of a %llu-byte buffer",
                          r->slot, (unsigned long long)boff, (unsigned long long)(boff + blen),
                          (unsigned long long)e->size);
    } else {
      ch[i].ptr = e->data + boff;
      ch[i].len = blen;
    }
  }
  /* The groups the tracker made for the old ranges stay correct when no changed range conflicts with
   * its concurrent group. (Decoding might place a barrier fewer, where an old conflict went away.) */
  /* A serial device gives every dispatch a group of its own, while its tracker's groups (where its
   * automatic barriers go) span dispatches: a moved range there is decoded. */
  if (rc == MLXN_OK && ranges > 0 && s->tracked && from->serial_groups) rc = MLXN_UNLIKE;
  if (rc == MLXN_OK && ranges > 0 && s->tracked) {
    uint32_t last = UINT32_MAX;
    int64_t budget = 8 * (int64_t)MLXN_KERNEL_SLOTS * ((int64_t)n + LIKE_MAX_GROUP);
    for (uint32_t i = 0; i < n_ch && rc == MLXN_OK; i++) {
      uint32_t k = ch[i].rec->dispatch;
      if (!ch[i].rec->range || k == last) continue;
      last = k;
      int too_wide = 0;
      if (group_conflict(from, ch, n_ch, i, &budget, &too_wide) || too_wide) rc = MLXN_UNLIKE;
    }
  }
  if (rc == MLXN_OK) rc = mlxn_cmdbuf_copy_decoded(cb, from);
  if (rc == MLXN_OK && n_ch > 0) {
    for (uint32_t i = 0; i < n_ch; i++) {
      const src_record *r = ch[i].rec;
      mlxn_dispatch *d = &cb->dispatches[r->dispatch];
      if (r->range) {
        d->args.ptr[r->slot] = ch[i].ptr;
        d->args.len[r->slot] = ch[i].len;
      } else {
        memcpy(d->args.ptr[r->slot], stream + 4 * ((size_t)r->start + 2), (size_t)r->words * 4);
      }
    }
    uint32_t last = UINT32_MAX; /* ch is in dispatch order: each patched dispatch validated once */
    for (uint32_t i = 0; i < n_ch && rc == MLXN_OK; i++) {
      if (ch[i].rec->dispatch == last) continue;
      last = ch[i].rec->dispatch;
      rc = revalidate(cb, last);
    }
  }
  if (ch != stack_ch) free(ch);
  return rc;
}
