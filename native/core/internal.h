/* Private structures of the native core (backends see only backend.h):
 *   core/device.c  the ABI entry points: device, buffer table, pipelines, command buffers, errors,
 *                  and the defaults of the optional backend hooks
 *   core/stream.c  command-stream decoder and validation (against the contracts of native/contracts)
 *   core/tracker.h the conflict tracker of the decoder's automatic barriers (header-only, inlined there)
 *   core/queue.c   the command queue thread (command buffers run in commit order) */
#ifndef MLXN_CPU_INTERNAL_H
#define MLXN_CPU_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "../mlxn.h"
#include "backend.h"
#include "tracker.h"

/* ---- errors ---------------------------------------------------------------------------------- */

/* Sets the calling thread's last error and returns code. */
int32_t mlxn_set_error(int32_t code, const char *fmt, ...);

/* ---- buffers ---------------------------------------------------------------------------------- */

typedef struct buffer_entry {
  uint8_t *data;     /* the backend's address of the memory (kernels get data + offset) */
  void *handle;      /* the backend's object for it, if any (Metal: the MTLBuffer) */
  uint64_t size;
  uint64_t last_cb;  /* serial of the last command buffer that took a reference */
  /* The handle (generation and slot) while the host holds it, 0 once freed: a lookup is one
   * compare. Generations stay below 2^12, so the handle is exactly what alloc returned. */
  uint32_t live;
  uint32_t refs;     /* command buffers that bind it and have not completed or been freed */
} buffer_entry;

/* A kernel's signature as bit masks over its slots, for O(1) binding checks. */
typedef struct mlxn_slot_masks {
  uint32_t nslots;
  uint32_t all;      /* every slot of the signature */
  uint32_t required; /* slots that must be bound ('b', 'c') */
  uint32_t bytes;    /* inline-bytes slots ('c') */
  uint32_t reads;    /* buffer slots the kernel reads (contract access read or readwrite) */
  uint32_t writes;   /* buffer slots the kernel writes (write or readwrite) */
} mlxn_slot_masks;

/* A pipeline handle's entry in its device's table: what SET_PIPELINE selects, in one place. */
typedef struct mlxn_pipe {
  const mlxn_contract *contract;
  int (*validate)(const mlxn_kargs *a, char *err, size_t cap); /* contract->validate */
  const void *kernel; /* the backend's object for it; NULL: the backend has no such kernel */
  mlxn_slot_masks masks;
} mlxn_pipe;

/* ---- command buffers -------------------------------------------------------------------------- */

typedef struct arena_block {
  struct arena_block *next;
  uint32_t used, cap;
  uint8_t data[];
} arena_block;

struct mlxn_cmdbuf {
  mlxn_device *dev; /* NULL once detached by mlxn_device_close: only status, timings, free remain */
  uint64_t wait_spin_ns; /* the device's, copied: a waiter never touches the device */
  uint64_t serial;
  struct mlxn_cmdbuf *live_prev, *live_next; /* device's list of live command buffers */
  struct mlxn_cmdbuf *queue_next;            /* device's FIFO of committed ones */

  /* decoded content; while decoding, dispatches[n_dispatches] (room for it is kept) is the pending
   * dispatch: bindings are written into it as they arrive, and a valid dispatch record keeps it */
  mlxn_dispatch *dispatches;
  uint32_t n_dispatches, cap_dispatches;
  uint32_t n_groups; /* concurrent groups so far (each dispatch records its own) */
  uint8_t barrier_pending; /* a barrier was seen since the last dispatch */
  arena_block *arena;
  uint32_t *refs; /* buffer table indices this command buffer holds a reference on */
  uint32_t n_refs, cap_refs;

  /* automatic barriers (MLXN_OP_AUTO_BARRIERS, MLXN_OP_TRACK) and what mlxn_cmdbuf_barrier_stats
   * reports. Groups here are the barrier-separated groups, whatever MLXN_FLAG_SERIAL does to n_groups. */
  mlxn_tracker tracker;
  uint8_t auto_barriers; /* dispatches are tracked and get a barrier on conflict */
  uint8_t serial_groups; /* MLXN_FLAG_SERIAL: every dispatch gets a group of its own (the device's, copied) */
  uint32_t st_auto_barriers, st_auto_concurrent, st_barriers; /* saturating counters */
  uint32_t lg_groups; /* groups so far, the open one included */
  uint32_t lg_open;   /* dispatches in the open group */
  uint32_t lg_small[MLXN_STAT_SMALL_SIZES]; /* closed groups by size, below MLXN_STAT_SMALL_SIZES */
  uint32_t *lg_wide;  /* sizes of the closed groups of MLXN_STAT_SMALL_SIZES or more, in order */
  uint32_t n_wide, cap_wide;

  /* decoder state carried across chunks (the bindings themselves are in the pending dispatch) */
  const mlxn_pipe *pipe; /* the current pipeline, NULL before the first SET_PIPELINE */
  uint32_t pipeline_handle;
  uint32_t bound_mask; /* slots bound since the last dispatch (any of 0..MLXN_MAX_SLOTS-1) */
  uint32_t bytes_mask; /* of those, the ones bound to inline bytes */
  /* buffer slots below MLXN_KERNEL_SLOTS (the others are refused at the dispatch): the binding's
   * offset in its buffer and the buffer's table index, for the tracker */
  uint64_t slot_off[MLXN_KERNEL_SLOTS];
  uint32_t slot_index[MLXN_KERNEL_SLOTS];
  uint32_t tg_memory;
  uint32_t error_offset;
  /* A template made by mlxn_cmdbuf_encode_template: the stream it decoded, for
   * mlxn_cmdbuf_replay_like. NULL otherwise; such a command buffer takes nothing more. */
  struct cb_source *source;

  /* lifecycle */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  _Atomic int32_t status; /* MLXN_CB_*; written under mu, readable without it (spinning waiters) */
  /* What the backend runs and reports (dispatches, times, error); the error of a failed encode too. */
  mlxn_command cmd;
};

/* Growable arrays of a command buffer, recycled through the device so that steady-state encoding
 * allocates nothing. */
typedef struct cb_storage {
  mlxn_dispatch *dispatches;
  uint32_t cap_dispatches;
  uint32_t *refs;
  uint32_t cap_refs;
  arena_block *arena; /* one empty block */
  mlxn_tracker tracker; /* its epoch carries on, so no stale entry matches a later group */
  uint32_t *lg_wide;
  uint32_t cap_wide;
} cb_storage;

#define MLXN_SPARE_STORAGE 4

/* ---- device ----------------------------------------------------------------------------------- */

struct mlxn_device {
  uint32_t flags;

  pthread_mutex_t mu; /* buffer table, live list, queue */
  pthread_cond_t queue_cv;
  uint64_t id;        /* process-wide, never reused: owner tag of this device's handle slots */
  buffer_entry *buffers; /* indexed by process-wide handle slot (see mlxn_buffer_alloc) */
  uint32_t n_buffers, cap_buffers;
  uint64_t next_serial;
  struct mlxn_cmdbuf *live; /* live command buffers */
  struct mlxn_cmdbuf *queue_head, *queue_tail;
  _Atomic uint32_t queued; /* committed, not yet taken by the queue thread (polled while idle) */
  int closing;
  pthread_t queue_thread;

  const mlxn_backend_ops *ops;
  void *backend;          /* the backend's state (ops->open) */
  mlxn_pipe *pipes;       /* indexed by pipeline handle, 1..n_pipes (entry 0 unused) */
  uint32_t n_pipes;
  uint64_t wait_spin_ns, idle_spin_ns; /* see mlxn_backend_config */
  cb_storage spare[MLXN_SPARE_STORAGE];
  uint32_t n_spare;

  /* Launch/complete mode when max_in_flight > 0 (1..MLXN_MAX_IN_FLIGHT; see queue.c). */
  uint32_t max_in_flight;
  /* queue.c: launched, not yet completed command buffers (a ring, oldest at flight_head). Written
   * under mu; n_flight is also polled without it. */
  pthread_cond_t flight_cv;
  mlxn_cmdbuf *flight[MLXN_MAX_IN_FLIGHT];
  uint32_t flight_head;
  _Atomic uint32_t n_flight;
  _Atomic int launcher_done; /* the queue thread has stopped: the completion thread drains and stops */
  pthread_t completion_thread;
};

/* Buffer handles: generation (12 bits) << 20 | slot index + 1 (20 bits). Slots are process-wide
 * (device.c), so a handle is unique across devices; each device's table is indexed by slot. */
#define HANDLE_INDEX_BITS 20u
#define HANDLE_INDEX_MASK ((1u << HANDLE_INDEX_BITS) - 1u)

/* The live entry of `handle` in a buffer table of n entries, or NULL (bad index, freed, or a recycled
 * slot's stale generation). Inline: the decoder calls it for every buffer binding. */
static inline buffer_entry *mlxn_buffer_in_table(buffer_entry *table, uint32_t n, uint32_t handle, uint32_t *index_out) {
  uint32_t index = (handle & HANDLE_INDEX_MASK) - 1u; /* slot 0 (never a handle) wraps past any n */
  if (index >= n || table[index].live != handle) return NULL;
  if (index_out) *index_out = index;
  return &table[index];
}
/* The live entry of a handle in the device's table, or NULL. Caller holds dev->mu. */
static inline buffer_entry *mlxn_buffer_lookup(mlxn_device *dev, uint32_t handle, uint32_t *index_out) {
  return mlxn_buffer_in_table(dev->buffers, dev->n_buffers, handle, index_out);
}

/* device.c */
void mlxn_buffer_release_locked(mlxn_device *dev, uint32_t index);
/* Why `handle` is not a live buffer of dev (freed, another device's, never allocated): a sentence
 * that says what to do, for error messages. Caller may hold dev->mu. */
const char *mlxn_handle_problem(const mlxn_device *dev, uint32_t handle);
void mlxn_live_add(int what, int64_t delta);


/* stream.c */
int32_t mlxn_cmdbuf_decode(mlxn_cmdbuf *cb, const uint8_t *stream, uint32_t len);
/* mlxn_cmdbuf_replay's copy, with dev->mu held and both command buffers' states checked (cb empty,
 * `from` decoded whole records). On failure nothing in cb is referenced
 * or counted (the caller marks it failed). */
int32_t mlxn_cmdbuf_copy_decoded(mlxn_cmdbuf *cb, const mlxn_cmdbuf *from);
/* Applies n entries of a patch list (mlxn_cmdbuf_replay_patched) to cb's inline constants and
 * validates each patched dispatch again. dev->mu held. */
int32_t mlxn_cmdbuf_patch_constants(mlxn_cmdbuf *cb, const uint32_t *patch, uint32_t n);
/* Keeps a copy of the stream cb decoded whole (mlxn_cmdbuf_encode_template) and where its patchable
 * words are. dev->mu held. */
int32_t mlxn_cmdbuf_keep_source(mlxn_cmdbuf *cb, const uint8_t *stream, uint32_t len);
void mlxn_cmdbuf_free_source(mlxn_cmdbuf *cb);
/* mlxn_cmdbuf_replay_like's work with both command buffers checked, dev->mu held: MLXN_OK (replayed),
 * MLXN_UNLIKE (cb untouched) or an error. */
int32_t mlxn_cmdbuf_replay_source(mlxn_cmdbuf *cb, const mlxn_cmdbuf *from, const uint8_t *stream, uint32_t len);
/* Drops buffer references and empties the content (keeping capacity). */
void mlxn_cmdbuf_release_content(mlxn_cmdbuf *cb);
/* Sets up cb->cmd for the backend (dispatch times unknown, no error) before it runs. */
void mlxn_command_prepare(mlxn_cmdbuf *cb);
/* Moves a spare storage into an empty command buffer / a command buffer's storage into a spare. */
void mlxn_storage_adopt(mlxn_cmdbuf *cb, cb_storage *spare);
void mlxn_storage_give(mlxn_cmdbuf *cb, cb_storage *spare);
/* Frees whatever storage the command buffer still owns. */
void mlxn_storage_free(mlxn_cmdbuf *cb);

/* queue.c */
int mlxn_queue_start(mlxn_device *dev);
void mlxn_queue_stop(mlxn_device *dev);
void mlxn_queue_enqueue_locked(mlxn_device *dev, mlxn_cmdbuf *cb);

#endif /* MLXN_CPU_INTERNAL_H */
