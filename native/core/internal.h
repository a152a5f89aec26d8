/* Private structures of the native core, shared by every backend:
 *   core/device.c  the ABI entry points: device, buffer table, pipelines, command buffers, errors
 *   core/stream.c  command-stream decoder and validation (kernel contracts from native/contracts)
 *   core/queue.c   the command queue thread (command buffers run in commit order)
 * A backend (native/cpu, native/cuda) implements the hooks declared at the end: memory, device
 * info, which kernels it runs, and how a decoded command buffer executes. */
#ifndef MLXN_CPU_INTERNAL_H
#define MLXN_CPU_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "../contracts/contracts.h"
#include "../mlxn.h"

/* ---- errors ---------------------------------------------------------------------------------- */

/* Sets the calling thread's last error and returns code. */
int32_t mlxn_set_error(int32_t code, const char *fmt, ...);

/* ---- buffers ---------------------------------------------------------------------------------- */

typedef struct buffer_entry {
  uint8_t *data;     /* the backend's address of the memory (kernels get data + offset) */
  void *handle;      /* the backend's object for it, if any (Metal: the MTLBuffer) */
  uint64_t size;
  uint32_t gen;      /* bumped when the slot is recycled; part of the handle */
  uint32_t refs;     /* command buffers that bind it and have not completed or been freed */
  uint8_t alive;     /* the handle is valid (not yet freed by the host) */
  uint64_t last_cb;  /* serial of the last command buffer that took a reference */
} buffer_entry;

/* A kernel's signature as bit masks over its slots, for O(1) binding checks. */
typedef struct mlxn_slot_masks {
  uint32_t nslots;
  uint32_t all;      /* every slot of the signature */
  uint32_t required; /* slots that must be bound ('b', 'c') */
  uint32_t bytes;    /* inline-bytes slots ('c') */
} mlxn_slot_masks;

/* ---- command buffers -------------------------------------------------------------------------- */

typedef struct decoded_dispatch {
  const mlxn_contract *kernel;
  mlxn_kargs args;
  uint32_t entry[MLXN_CPU_KERNEL_SLOTS]; /* buffer-table index + 1 of each buffer slot, 0 if none */
  uint32_t tag;
  uint64_t tg_total;                /* threadgroups in this dispatch */
  _Atomic uint64_t t_start, t_end;  /* first threadgroup start / last end, ns */
} decoded_dispatch;

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

  /* decoded content */
  decoded_dispatch *dispatches;
  uint32_t n_dispatches, cap_dispatches;
  uint32_t *group_starts; /* index of the first dispatch of each concurrent group */
  uint32_t n_groups, cap_groups;
  uint8_t barrier_pending; /* a barrier was seen since the last dispatch */
  arena_block *arena;
  uint32_t *refs; /* buffer table indices this command buffer holds a reference on */
  uint32_t n_refs, cap_refs;

  /* decoder state carried across chunks */
  const mlxn_contract *pipeline;
  const mlxn_slot_masks *pipeline_masks;
  uint32_t pipeline_handle;
  uint32_t bound_mask; /* slots bound since the last dispatch */
  uint32_t bytes_mask; /* of those, the ones bound to inline bytes */
  uint8_t *slot_ptr[MLXN_MAX_SLOTS];
  uint64_t slot_len[MLXN_MAX_SLOTS];
  uint32_t slot_entry[MLXN_MAX_SLOTS];
  uint32_t tg_memory;
  uint32_t error_offset;

  /* lifecycle */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  _Atomic int32_t status; /* MLXN_CB_*; written under mu, readable without it (spinning waiters) */
  int32_t error_code;
  char error[512];
  uint64_t t_start, t_end;
  /* Owned by a launch/complete backend from launch to complete (CUDA: its in-flight slot, or -1
   * when the launch enqueued nothing). */
  int32_t backend_slot;
};

/* Growable arrays of a command buffer, recycled through the device so that steady-state encoding
 * allocates nothing. */
typedef struct cb_storage {
  decoded_dispatch *dispatches;
  uint32_t cap_dispatches;
  uint32_t *group_starts;
  uint32_t cap_groups;
  uint32_t *refs;
  uint32_t cap_refs;
  arena_block *arena; /* one empty block */
} cb_storage;

#define MLXN_SPARE_STORAGE 4

/* Most command buffers a launch/complete backend may have in flight (see queue.c). */
#define MLXN_MAX_IN_FLIGHT 4

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

  void *backend; /* the backend's private state */
  /* How long a waiter polls before it sleeps, ns: a host thread waiting for a command buffer, and
   * the idle queue thread waiting for the next commit. Defaults suit backends whose work runs on
   * these same cores; a backend with idle host cores (CUDA) polls longer, saving the wake-ups. */
  uint64_t wait_spin_ns, idle_spin_ns;
  cb_storage spare[MLXN_SPARE_STORAGE];
  uint32_t n_spare;

  /* Pipelined running, optional: a backend that can enqueue work and wait for it later sets all
   * three in mlxn_backend_open (NULL launch: the queue calls mlxn_backend_run). launch enqueues the
   * command buffer's work and returns at once (or records an error in cb); complete waits for it
   * and fills what mlxn_backend_run would (timings, error). queue.c states the guarantees. */
  void (*launch)(mlxn_device *dev, mlxn_cmdbuf *cb);
  void (*complete)(mlxn_device *dev, mlxn_cmdbuf *cb);
  uint32_t max_in_flight; /* 1..MLXN_MAX_IN_FLIGHT */
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
  uint32_t idx1 = handle & HANDLE_INDEX_MASK;
  if (idx1 == 0 || idx1 > n) return NULL;
  buffer_entry *e = &table[idx1 - 1];
  if (!e->alive || (e->gen & 0xfffu) != handle >> HANDLE_INDEX_BITS) return NULL;
  if (index_out) *index_out = idx1 - 1;
  return e;
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
uint64_t mlxn_now_ns(void);
/* A polite busy-wait step. */
static inline void mlxn_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Polls `done(arg)` for up to ns nanoseconds; returns whether it became true. Cheap waits for work
 * that is about to arrive, before falling back to a condition variable. */
int mlxn_spin_until(int (*done)(void *), void *arg, uint64_t ns);

const mlxn_contract *mlxn_pipeline_kernel(uint32_t handle, const mlxn_slot_masks **masks);

/* stream.c */
int32_t mlxn_cmdbuf_decode(mlxn_cmdbuf *cb, const uint8_t *stream, uint32_t len);
/* Drops buffer references and empties the content (keeping capacity). */
void mlxn_cmdbuf_release_content(mlxn_cmdbuf *cb);
/* Moves a spare storage into an empty command buffer / a command buffer's storage into a spare. */
void mlxn_storage_adopt(mlxn_cmdbuf *cb, cb_storage *spare);
void mlxn_storage_give(mlxn_cmdbuf *cb, cb_storage *spare);
/* Frees whatever storage the command buffer still owns. */
void mlxn_storage_free(mlxn_cmdbuf *cb);

/* queue.c */
int mlxn_queue_start(mlxn_device *dev);
void mlxn_queue_stop(mlxn_device *dev);
void mlxn_queue_enqueue_locked(mlxn_device *dev, mlxn_cmdbuf *cb);

/* ---- backend hooks ------------------------------------------------------------------------------- */

/* Creates the backend's state in dev->backend (and may change dev->wait_spin_ns / idle_spin_ns);
 * returns 0, or sets the thread's error and returns -1. */
int mlxn_backend_open(mlxn_device *dev, uint32_t threads);
/* Frees it (the queue is drained and stopped first). */
void mlxn_backend_close(mlxn_device *dev);
/* Writes the device-info JSON; returns its length. */
uint32_t mlxn_backend_info(mlxn_device *dev, char *buf, uint32_t cap);
/* nbytes of zero-filled device memory (NULL on failure); *handle may receive a backend object. */
void *mlxn_backend_alloc(mlxn_device *dev, uint64_t nbytes, void **handle);
void mlxn_backend_free(mlxn_device *dev, void *mem, void *handle);
/* Copies between host memory and device memory; returns MLXN_OK or an error code (error set). */
int32_t mlxn_backend_copy(mlxn_device *dev, uint8_t *mem, uint8_t *host, uint64_t len, int to_device);
/* Whether buffer memory is host-addressable (mlxn_buffer_contents returns it). */
int mlxn_backend_host_visible(mlxn_device *dev);
/* Whether the backend implements kernel k. */
int mlxn_backend_has_kernel(mlxn_device *dev, const mlxn_contract *k);
/* Executes a decoded command buffer on the queue thread and returns when it is done (backends that
 * set dev->launch use that and dev->complete instead; see struct mlxn_device): sets
 * cb->t_start/t_end, per-dispatch times where available, and cb->error_code/error on failure.
 * The buffers a command buffer binds stay alive until this returns; their table entries may be
 * read under dev->mu (the table can move while the host allocates). */
void mlxn_backend_run(mlxn_device *dev, mlxn_cmdbuf *cb);

#endif /* MLXN_CPU_INTERNAL_H */
