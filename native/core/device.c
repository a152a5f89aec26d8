/* Native core: the ABI entry points — device, buffer table, pipelines, command-buffer lifecycle,
 * errors, live counts. Backend specifics go through the backend's table (backend.h); the defaults
 * of its optional hooks are here. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* ---- errors ---------------------------------------------------------------------------------- */

static _Thread_local char last_error[1024];

int32_t mlxn_set_error(int32_t code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return code;
}

static uint32_t copy_text(const char *text, uint8_t *buf, uint32_t cap) {
  size_t n = strlen(text);
  if (buf && cap > 0) {
    size_t k = n < cap - 1 ? n : cap - 1;
    memcpy(buf, text, k);
    buf[k] = 0;
  }
  return (uint32_t)n;
}

uint32_t mlxn_last_error(uint8_t *buf, uint32_t cap) { return copy_text(last_error, buf, cap); }

uint32_t mlxn_abi_version(void) { return MLXN_ABI_VERSION; }

/* ---- live counts ------------------------------------------------------------------------------ */

static _Atomic int64_t live[MLXN_LIVE_COUNT];

void mlxn_live_add(int what, int64_t delta) { atomic_fetch_add(&live[what], delta); }

uint32_t mlxn_live_objects(uint64_t *out, uint32_t cap) {
  if (!out) return 0;
  uint32_t n = cap < MLXN_LIVE_COUNT ? cap : MLXN_LIVE_COUNT;
  for (uint32_t i = 0; i < n; i++) out[i] = (uint64_t)atomic_load(&live[i]);
  return n;
}

uint64_t mlxn_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- device ----------------------------------------------------------------------------------- */

static void slot_release(uint32_t index);
static uint64_t new_device_id(void);
static int resolve_kernels(mlxn_device *dev);

/* ---- the optional backend hooks' defaults (host memory) --------------------------------------- */

static void backend_free(mlxn_device *dev, void *mem, void *object) {
  if (dev->ops->free) dev->ops->free(dev->backend, mem, object);
  else free(mem);
}

static void backend_close(mlxn_device *dev) {
  if (dev->ops->close) dev->ops->close(dev->backend);
  dev->backend = NULL;
}

/* A device owns threads (queue, workers) that run this library's code. Deno unloads an FFI library
 * when its runtime is torn down, which happens at a normal script end while a device is still open;
 * unmapping the code under a running thread crashes the process. Once a device exists, the library
 * pins itself: dlclose then leaves it mapped, and the threads end with the process. */
static pthread_once_t pin_once = PTHREAD_ONCE_INIT;

static void pin_library(void) {
  Dl_info info;
  if (dladdr((void *)&pin_library, &info) && info.dli_fname)
    (void)dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE); /* handle kept on purpose */
}

/* Default polling before sleeping (see mlxn_backend_config): short, because on the CPU backend
 * the work being waited for runs on these very cores. */
#define WAIT_SPIN_NS 30000u
#define IDLE_SPIN_NS 50000u

mlxn_device *mlxn_device_open(uint32_t flags, uint32_t threads) {
  pthread_once(&pin_once, pin_library);
  if (flags & ~(uint32_t)(MLXN_FLAG_SERIAL | MLXN_FLAG_NO_GRAPHS | MLXN_FLAG_NO_PDL | MLXN_FLAG_DISPATCH_TIMING)) {
    mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "unknown device flags 0x%x", flags);
    return NULL;
  }
  if (threads > 1024) {
    mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "threads must be <= 1024 (0 = one per core), got %u", threads);
    return NULL;
  }
  mlxn_device *dev = calloc(1, sizeof *dev);
  if (!dev) {
    mlxn_set_error(MLXN_E_OUT_OF_MEMORY, "out of memory opening the CPU device");
    return NULL;
  }
  dev->flags = flags;
  dev->id = new_device_id();
  dev->next_serial = 1;
  pthread_mutex_init(&dev->mu, NULL);
  pthread_cond_init(&dev->queue_cv, NULL);
  dev->ops = &mlxn_backend;
  if (!dev->ops->open || !dev->ops->info || !dev->ops->kernel || (!dev->ops->run && !dev->ops->launch)) {
    pthread_mutex_destroy(&dev->mu);
    pthread_cond_destroy(&dev->queue_cv);
    free(dev);
    mlxn_set_error(MLXN_E_DEVICE, "the %s backend of this library lacks a required hook (open, info, kernel, run or "
                                  "launch): rebuild it from one source tree", mlxn_backend.name ? mlxn_backend.name : "?");
    return NULL;
  }
  mlxn_backend_config config = {WAIT_SPIN_NS, IDLE_SPIN_NS, 0};
  char err[512] = "";
  int32_t rc = dev->ops->open(&dev->backend, flags, threads, &config, err, sizeof err);
  if (rc != MLXN_OK) {
    pthread_mutex_destroy(&dev->mu);
    pthread_cond_destroy(&dev->queue_cv);
    free(dev);
    mlxn_set_error(rc, "%s", err[0] ? err : "the backend could not open its device");
    return NULL;
  }
  dev->wait_spin_ns = config.wait_spin_ns;
  dev->idle_spin_ns = config.idle_spin_ns;
  dev->max_in_flight = config.max_in_flight;
  const char *problem = dev->max_in_flight > MLXN_MAX_IN_FLIGHT ? "the backend asked for too many command buffers in flight"
                        : resolve_kernels(dev) != 0          ? "out of memory opening the device"
                        : mlxn_queue_start(dev) != 0         ? "could not start the command queue thread"
                                                             : NULL;
  if (problem) {
    backend_close(dev);
    free(dev->pipes);
    pthread_mutex_destroy(&dev->mu);
    pthread_cond_destroy(&dev->queue_cv);
    free(dev);
    mlxn_set_error(MLXN_E_DEVICE, "%s", problem);
    return NULL;
  }
  mlxn_live_add(MLXN_LIVE_DEVICES, 1);
  return dev;
}

/* Detaches a live command buffer from its closing device: it keeps its status, error and timings
 * (the queue ran everything committed), drops its buffer references, and from now on never touches
 * the device; the host still frees it with mlxn_cmdbuf_free. One still encoding can never run. */
static void detach_locked(mlxn_device *dev, mlxn_cmdbuf *cb) {
  pthread_mutex_lock(&cb->mu);
  if (cb->status == MLXN_CB_ENCODING) mlxn_cmdbuf_release_content(cb); /* never runs: nothing to time */
  for (uint32_t i = 0; i < cb->n_refs; i++) mlxn_buffer_release_locked(dev, cb->refs[i]);
  cb->n_refs = 0;
  if (cb->status == MLXN_CB_ENCODING) {
    cb->status = MLXN_CB_ERROR;
    cb->cmd.error_code = MLXN_E_STATE;
    snprintf(cb->cmd.error, sizeof cb->cmd.error,
             "the device was closed before this command buffer was committed; open a new device and encode again");
  }
  cb->dev = NULL;
  cb->live_prev = cb->live_next = NULL;
  pthread_mutex_unlock(&cb->mu);
  mlxn_live_add(MLXN_LIVE_CMDBUFS, -1); /* no longer a command buffer of any device */
}

void mlxn_device_close(mlxn_device *dev) {
  if (!dev) return;
  mlxn_queue_stop(dev); /* drains the queue first: every committed command buffer has completed */
  pthread_mutex_lock(&dev->mu);
  for (mlxn_cmdbuf *cb = dev->live, *next; cb; cb = next) {
    next = cb->live_next;
    detach_locked(dev, cb);
  }
  dev->live = NULL;
  for (uint32_t i = 0; i < dev->n_buffers; i++) {
    buffer_entry *e = &dev->buffers[i];
    if (e->data) {
      backend_free(dev, e->data, e->handle);
      mlxn_live_add(MLXN_LIVE_BUFFERS, -1);
      mlxn_live_add(MLXN_LIVE_BUFFER_BYTES, -(int64_t)e->size);
      slot_release(i);
    }
  }
  pthread_mutex_unlock(&dev->mu);
  free(dev->buffers);
  for (uint32_t i = 0; i < dev->n_spare; i++) {
    mlxn_cmdbuf tmp;
    memset(&tmp, 0, sizeof tmp);
    mlxn_storage_adopt(&tmp, &dev->spare[i]);
    mlxn_storage_free(&tmp);
  }
  backend_close(dev);
  free(dev->pipes);
  pthread_mutex_destroy(&dev->mu);
  pthread_cond_destroy(&dev->queue_cv);
  free(dev);
  mlxn_live_add(MLXN_LIVE_DEVICES, -1);
}

uint32_t mlxn_device_info(mlxn_device *dev, uint8_t *buf, uint32_t cap) {
  if (!dev) return 0;
  char own[768], text[1024];
  uint32_t n = dev->ops->info(dev->backend, own, sizeof own);
  if (n >= sizeof own) own[0] = 0; /* cut short: better without the backend's members than invalid JSON */
  snprintf(text, sizeof text,
           "{\"backend\":\"%s\",%s%s\"maxThreadsPerGroup\":%d,\"maxThreadgroupMemory\":%d,\"maxInlineBytes\":%d,"
           "\"maxSlots\":%d,\"serial\":%s}",
           dev->ops->name, own, own[0] ? "," : "", MLXN_MAX_THREADS_PER_GROUP, MLXN_MAX_TG_MEMORY,
           MLXN_MAX_INLINE_BYTES, MLXN_KERNEL_SLOTS, (dev->flags & MLXN_FLAG_SERIAL) ? "true" : "false");
  return copy_text(text, buf, cap);
}

/* ---- buffers ---------------------------------------------------------------------------------- */

/* Handle slots are process-wide: a slot belongs to one device at a time (its owner id), so no two
 * devices hand out the same handle and a handle bound on the wrong device is recognised. A slot's
 * generation is bumped at every release; one whose 12-bit generation is used up is retired for
 * good instead of wrapping, so a stale handle can never name a newer buffer. Only alloc, free and
 * error paths take slots_mu (never the decoder's hot path); lock order: dev->mu, then slots_mu. */
#define GEN_LIMIT 0x1000u

typedef struct handle_slot {
  uint64_t owner; /* device id, 0 when free or retired */
  uint32_t gen;   /* GEN_LIMIT: retired */
} handle_slot;

static pthread_mutex_t slots_mu = PTHREAD_MUTEX_INITIALIZER;
static handle_slot *slots;
static uint32_t n_slots, cap_slots;
static uint32_t *free_slots; /* LIFO of released, unretired slots */
static uint32_t n_free;
static uint64_t last_device_id;

static uint64_t new_device_id(void) {
  pthread_mutex_lock(&slots_mu);
  uint64_t id = ++last_device_id;
  pthread_mutex_unlock(&slots_mu);
  return id;
}

/* Takes a free slot for `owner`; returns 0, or sets the error and returns -1. */
static int slot_take(uint64_t owner, uint32_t *index, uint32_t *gen) {
  pthread_mutex_lock(&slots_mu);
  if (n_free > 0) {
    *index = free_slots[--n_free];
  } else {
    if (n_slots == HANDLE_INDEX_MASK) {
      pthread_mutex_unlock(&slots_mu);
      return mlxn_set_error(MLXN_E_OUT_OF_MEMORY,
                            "buffer handles are used up (%u live buffers, or about 4 billion allocations in this "
                            "process); free buffers you no longer need, or reuse buffers instead of reallocating",
                            HANDLE_INDEX_MASK), -1;
    }
    if (n_slots == cap_slots) {
      uint32_t cap = cap_slots ? cap_slots * 2 : 1024;
      if (cap > HANDLE_INDEX_MASK) cap = HANDLE_INDEX_MASK;
      handle_slot *ns = realloc(slots, cap * sizeof *ns);
      if (ns) slots = ns;
      uint32_t *nf = ns ? realloc(free_slots, cap * sizeof *nf) : NULL;
      if (nf) free_slots = nf;
      if (!ns || !nf) {
        pthread_mutex_unlock(&slots_mu);
        return mlxn_set_error(MLXN_E_OUT_OF_MEMORY, "out of memory growing the buffer handle table"), -1;
      }
      cap_slots = cap;
    }
    *index = n_slots;
    slots[n_slots++] = (handle_slot){0, 0};
  }
  slots[*index].owner = owner;
  *gen = slots[*index].gen;
  pthread_mutex_unlock(&slots_mu);
  return 0;
}

static void slot_release(uint32_t index) {
  pthread_mutex_lock(&slots_mu);
  handle_slot *sl = &slots[index];
  sl->owner = 0;
  if (++sl->gen < GEN_LIMIT) free_slots[n_free++] = index; /* else retired: never handed out again */
  pthread_mutex_unlock(&slots_mu);
}

const char *mlxn_handle_problem(const mlxn_device *dev, uint32_t handle) {
  uint32_t idx1 = handle & HANDLE_INDEX_MASK, gen = handle >> HANDLE_INDEX_BITS;
  const char *why = "was never allocated: pass the handle of a live buffer";
  pthread_mutex_lock(&slots_mu);
  if (idx1 != 0 && idx1 <= n_slots) {
    const handle_slot *sl = &slots[idx1 - 1];
    /* Same generation, still owned by dev: freed by the host, memory waiting for in-flight work. */
    if (gen < sl->gen || (gen == sl->gen && sl->owner == dev->id))
      why = "was freed (a stale handle): keep a buffer alive while it is still used";
    else if (gen == sl->gen && sl->owner != 0)
      why = "belongs to another device: bind a buffer only on the device that allocated it "
            "(copy the data through the host to use it here)";
  }
  pthread_mutex_unlock(&slots_mu);
  return why;
}

static void recycle_locked(mlxn_device *dev, uint32_t index) {
  buffer_entry *e = &dev->buffers[index];
  backend_free(dev, e->data, e->handle);
  e->handle = NULL;
  mlxn_live_add(MLXN_LIVE_BUFFERS, -1);
  mlxn_live_add(MLXN_LIVE_BUFFER_BYTES, -(int64_t)e->size);
  e->data = NULL;
  e->size = 0;
  e->last_cb = 0;
  slot_release(index);
}

/* Drops one command-buffer reference; frees memory whose handle was already released. */
void mlxn_buffer_release_locked(mlxn_device *dev, uint32_t index) {
  buffer_entry *e = &dev->buffers[index];
  if (--e->refs == 0 && !e->live) recycle_locked(dev, index);
}

uint32_t mlxn_buffer_alloc(mlxn_device *dev, uint64_t nbytes) {
  if (!dev) return mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "null device"), 0;
  if (nbytes == 0) return mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "buffer size must be > 0"), 0;
  if (nbytes > ((uint64_t)1 << 46))
    return mlxn_set_error(MLXN_E_OUT_OF_MEMORY, "buffer of %llu bytes is larger than any device",
                          (unsigned long long)nbytes), 0;
  void *handle = NULL;
  uint8_t *data = dev->ops->alloc ? dev->ops->alloc(dev->backend, nbytes, &handle) : calloc(1, (size_t)nbytes); /* zero-filled: no cold-run garbage */
  if (!data)
    return mlxn_set_error(MLXN_E_OUT_OF_MEMORY, "could not allocate %llu bytes", (unsigned long long)nbytes), 0;
  uint32_t index, gen;
  if (slot_take(dev->id, &index, &gen) != 0) {
    backend_free(dev, data, handle);
    return 0;
  }
  pthread_mutex_lock(&dev->mu);
  if (index >= dev->cap_buffers) {
    uint32_t cap = dev->cap_buffers ? dev->cap_buffers : 256;
    while (cap <= index) cap *= 2;
    buffer_entry *nb = realloc(dev->buffers, (size_t)cap * sizeof *nb);
    if (!nb) {
      pthread_mutex_unlock(&dev->mu);
      slot_release(index);
      backend_free(dev, data, handle);
      return mlxn_set_error(MLXN_E_OUT_OF_MEMORY, "out of memory growing the buffer table"), 0;
    }
    memset(nb + dev->cap_buffers, 0, (size_t)(cap - dev->cap_buffers) * sizeof *nb);
    dev->buffers = nb;
    dev->cap_buffers = cap;
  }
  if (index >= dev->n_buffers) dev->n_buffers = index + 1;
  buffer_entry *e = &dev->buffers[index];
  memset(e, 0, sizeof *e);
  e->data = data;
  e->handle = handle;
  e->size = nbytes;
  uint32_t h = (gen << HANDLE_INDEX_BITS) | (index + 1u);
  e->live = h;
  pthread_mutex_unlock(&dev->mu);
  mlxn_live_add(MLXN_LIVE_BUFFERS, 1);
  mlxn_live_add(MLXN_LIVE_BUFFER_BYTES, (int64_t)nbytes);
  return h;
}

int32_t mlxn_buffer_free(mlxn_device *dev, uint32_t handle) {
  if (!dev) return mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "null device");
  pthread_mutex_lock(&dev->mu);
  uint32_t index;
  buffer_entry *e = mlxn_buffer_lookup(dev, handle, &index);
  if (!e) {
    pthread_mutex_unlock(&dev->mu);
    return mlxn_set_error(MLXN_E_BAD_HANDLE, "buffer handle 0x%x is not a live buffer: it %s", handle,
                          mlxn_handle_problem(dev, handle));
  }
  e->live = 0;
  if (e->refs == 0) recycle_locked(dev, index); /* else: the last command buffer frees it */
  pthread_mutex_unlock(&dev->mu);
  return MLXN_OK;
}

void *mlxn_buffer_contents(mlxn_device *dev, uint32_t handle) {
  if (!dev) return NULL;
  pthread_mutex_lock(&dev->mu);
  buffer_entry *e = mlxn_buffer_lookup(dev, handle, NULL);
  void *p = e && !dev->ops->device_memory ? e->data : NULL;
  pthread_mutex_unlock(&dev->mu);
  return p;
}

static int32_t buffer_copy(mlxn_device *dev, uint32_t handle, uint64_t offset, uint8_t *host,
                           uint64_t len, int to_device) {
  if (!dev) return mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "null device");
  if (len > 0 && !host) return mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "null host pointer");
  pthread_mutex_lock(&dev->mu);
  buffer_entry *e = mlxn_buffer_lookup(dev, handle, NULL);
  if (!e) {
    pthread_mutex_unlock(&dev->mu);
    return mlxn_set_error(MLXN_E_BAD_HANDLE, "buffer handle 0x%x is not a live buffer: it %s", handle,
                          mlxn_handle_problem(dev, handle));
  }
  if (offset > e->size || len > e->size - offset) {
    uint64_t size = e->size;
    pthread_mutex_unlock(&dev->mu);
    return mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "range [%llu, %llu) is outside the buffer's %llu bytes",
                          (unsigned long long)offset, (unsigned long long)(offset + len),
                          (unsigned long long)size);
  }
  uint8_t *data = e->data;
  pthread_mutex_unlock(&dev->mu);
  if (len == 0) return MLXN_OK;
  if (!dev->ops->copy) {
    if (to_device) memcpy(data + offset, host, (size_t)len);
    else memcpy(host, data + offset, (size_t)len);
    return MLXN_OK;
  }
  char err[512] = "";
  int32_t rc = dev->ops->copy(dev->backend, data + offset, host, len, to_device, err, sizeof err);
  return rc == MLXN_OK ? MLXN_OK : mlxn_set_error(rc, "%s", err[0] ? err : "the buffer copy failed");
}

int32_t mlxn_buffer_write(mlxn_device *dev, uint32_t handle, uint64_t offset, const uint8_t *src,
                          uint64_t len) {
  return buffer_copy(dev, handle, offset, (uint8_t *)src, len, 1);
}

int32_t mlxn_buffer_read(mlxn_device *dev, uint32_t handle, uint64_t offset, uint8_t *dst,
                         uint64_t len) {
  return buffer_copy(dev, handle, offset, dst, len, 0);
}

/* ---- pipelines -------------------------------------------------------------------------------- */

/* Pipeline handles number the kernel contracts in table order, from 1. The flat table is built once
 * so that SET_PIPELINE is an array index, not a search. */
#define MAX_KERNELS 512
static const mlxn_contract *kernel_table[MAX_KERNELS + 1];
static mlxn_slot_masks kernel_masks[MAX_KERNELS + 1];
static uint32_t kernel_count;
static pthread_once_t kernel_once = PTHREAD_ONCE_INIT;

static void add_contract(const mlxn_contract *k) {
  size_t nslots = strlen(k->signature);
  /* A contract the table cannot hold, or with more slots than a dispatch carries, gets no handle:
   * it is a build error of the contracts, and every backend then reports the kernel as unknown. */
  if (kernel_count >= MAX_KERNELS || nslots > MLXN_KERNEL_SLOTS) return;
  mlxn_slot_masks *m = &kernel_masks[++kernel_count];
  kernel_table[kernel_count] = k;
  m->nslots = (uint32_t)nslots;
  for (uint32_t i = 0; i < m->nslots; i++) {
    m->all |= 1u << i;
    if (k->signature[i] != 'o') m->required |= 1u << i;
    if (k->signature[i] == 'c') m->bytes |= 1u << i;
  }
  /* Access modes of buffer slots only: a mask bit on another slot would be a contract table error. */
  m->reads = k->reads & m->all & ~m->bytes;
  m->writes = k->writes & m->all & ~m->bytes;
}

/* Pipeline handles number the contracts in table order. */
static void build_kernel_table(void) {
  const mlxn_contract *c;
  for (uint32_t id = 0; (c = mlxn_contract_at(id)) != NULL; id++) add_contract(c);
}

/* Builds the device's pipeline table: each handle's contract, validator and slot masks with the
 * backend's object for the kernel (NULL: it has none), asked once per device. */
static int resolve_kernels(mlxn_device *dev) {
  pthread_once(&kernel_once, build_kernel_table);
  dev->pipes = calloc(kernel_count + 1, sizeof *dev->pipes);
  if (!dev->pipes) return -1;
  dev->n_pipes = kernel_count;
  for (uint32_t i = 1; i <= kernel_count; i++) {
    mlxn_pipe *p = &dev->pipes[i];
    p->contract = kernel_table[i];
    p->validate = kernel_table[i]->validate;
    p->masks = kernel_masks[i];
    p->kernel = dev->ops->kernel(dev->backend, kernel_table[i]);
  }
  return 0;
}

uint32_t mlxn_pipeline_get(mlxn_device *dev, const uint8_t *name) {
  if (!dev || !name) return mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "null device or name"), 0;
  for (uint32_t i = 1; i <= dev->n_pipes; i++)
    if (dev->pipes[i].kernel && strcmp(dev->pipes[i].contract->name, (const char *)name) == 0) return i;
  return mlxn_set_error(MLXN_E_BAD_HANDLE, "no kernel named '%.200s' in this backend", (const char *)name), 0;
}

uint32_t mlxn_pipeline_signature(mlxn_device *dev, uint32_t pipeline, uint8_t *buf, uint32_t cap) {
  if (!dev || pipeline == 0 || pipeline > dev->n_pipes) return 0;
  return copy_text(dev->pipes[pipeline].contract->signature, buf, cap);
}

/* ---- command buffers -------------------------------------------------------------------------- */

#define DEVICE_CLOSED "the device of this command buffer was closed; open a new device and encode again"

mlxn_cmdbuf *mlxn_cmdbuf_new(mlxn_device *dev) {
  if (!dev) return mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "null device"), NULL;
  mlxn_cmdbuf *cb = calloc(1, sizeof *cb);
  if (!cb) return mlxn_set_error(MLXN_E_OUT_OF_MEMORY, "out of memory creating a command buffer"), NULL;
  cb->dev = dev;
  cb->wait_spin_ns = dev->wait_spin_ns;
  pthread_mutex_init(&cb->mu, NULL);
  pthread_cond_init(&cb->cv, NULL);
  cb->status = MLXN_CB_ENCODING;
  pthread_mutex_lock(&dev->mu);
  if (dev->n_spare > 0) mlxn_storage_adopt(cb, &dev->spare[--dev->n_spare]);
  trk_reset(&cb->tracker); /* a recycled tracker's entries belong to an earlier group */
  cb->serial = dev->next_serial++;
  cb->live_next = dev->live;
  if (dev->live) dev->live->live_prev = cb;
  dev->live = cb;
  pthread_mutex_unlock(&dev->mu);
  mlxn_live_add(MLXN_LIVE_CMDBUFS, 1);
  return cb;
}

/* MLXN_OK when cb can take more of its stream; else the error that says why not. */
static int32_t check_encoding(mlxn_cmdbuf *cb) {
  if (!cb) return mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "null command buffer");
  if (!cb->dev) return mlxn_set_error(MLXN_E_STATE, "%s", cb->cmd.error[0] ? cb->cmd.error : DEVICE_CLOSED);
  if (cb->status != MLXN_CB_ENCODING)
    return mlxn_set_error(cb->status == MLXN_CB_ERROR ? MLXN_E_STREAM : MLXN_E_STATE,
                          cb->status == MLXN_CB_ERROR
                              ? "command buffer already failed: %s"
                              : "command buffer was already committed; encode into a new one%s",
                          cb->status == MLXN_CB_ERROR ? cb->cmd.error : "");
  if (cb->source)
    return mlxn_set_error(MLXN_E_STATE, "a template (mlxn_cmdbuf_encode_template) takes no more records: replay it "
                                        "into a new command buffer");
  return MLXN_OK;
}

/* A half-decoded (or dropped) chunk means the command buffer must never run: sticky error. */
static int32_t fail_encoding(mlxn_cmdbuf *cb, int32_t rc) {
  if (rc != MLXN_OK) {
    cb->status = MLXN_CB_ERROR;
    cb->cmd.error_code = rc;
    copy_text(last_error, (uint8_t *)cb->cmd.error, sizeof cb->cmd.error);
  }
  return rc;
}

int32_t mlxn_cmdbuf_encode(mlxn_cmdbuf *cb, const uint8_t *stream, uint32_t len) {
  int32_t rc = check_encoding(cb);
  if (rc != MLXN_OK) return rc;
  if (len % 4 != 0 || (len > 0 && !stream)) {
    cb->error_offset = 0;
    rc = mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "stream length %u is not a whole number of words", len);
  } else {
    pthread_mutex_lock(&cb->dev->mu);
    rc = mlxn_cmdbuf_decode(cb, stream, len);
    pthread_mutex_unlock(&cb->dev->mu);
  }
  return fail_encoding(cb, rc);
}

/* MLXN_OK when `from` can be replayed into cb (both checked as mlxn_cmdbuf_replay documents); else the
 * error that says why not. */
static int32_t check_replay(mlxn_cmdbuf *cb, mlxn_cmdbuf *from) {
  if (!from) return mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "null template command buffer");
  if (from == cb) return mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "a command buffer cannot replay itself");
  if (from->dev != cb->dev)
    return mlxn_set_error(from->dev ? MLXN_E_INVALID_ARGUMENT : MLXN_E_STATE,
                          from->dev ? "the template belongs to another device; encode it on this one"
                                    : "the template's device was closed; encode it again on an open device");
  /* `from` only when it is stable: encoding (never committed, so no backend writes its records) and
   * at a record boundary. */
  if (from->status != MLXN_CB_ENCODING)
    return mlxn_set_error(MLXN_E_STATE, "%s%s",
                          from->status == MLXN_CB_ERROR ? "the template failed to encode: "
                                                        : "the template was committed; a template is never committed",
                          from->status == MLXN_CB_ERROR ? from->cmd.error : "");
  if (from->bound_mask != 0 || from->tg_memory != 0)
    return mlxn_set_error(MLXN_E_STATE, "the template ends inside a dispatch (bindings with no dispatch record); "
                                        "end its stream after a dispatch");
  if (cb->n_dispatches != 0 || cb->n_refs != 0 || cb->bound_mask != 0 || cb->tg_memory != 0 || cb->auto_barriers)
    return mlxn_set_error(MLXN_E_STATE, "replay needs an empty command buffer: replay into a new one, before "
                                        "encoding anything else");
  return MLXN_OK;
}

int32_t mlxn_cmdbuf_encode_template(mlxn_cmdbuf *cb, const uint8_t *stream, uint32_t len) {
  int32_t rc = check_encoding(cb);
  if (rc != MLXN_OK) return rc;
  if (len % 4 != 0 || (len > 0 && !stream)) {
    cb->error_offset = 0;
    rc = mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "stream length %u is not a whole number of words", len);
  } else if (cb->n_dispatches != 0 || cb->n_refs != 0 || cb->bound_mask != 0 || cb->auto_barriers ||
             cb->pipe != NULL) {
    rc = mlxn_set_error(MLXN_E_STATE, "a template is made from a whole pass: encode it into a new command buffer");
  } else {
    pthread_mutex_lock(&cb->dev->mu);
    rc = mlxn_cmdbuf_decode(cb, stream, len);
    if (rc == MLXN_OK && (cb->bound_mask != 0 || cb->tg_memory != 0))
      rc = mlxn_set_error(MLXN_E_STREAM, "a template ends after a dispatch record, not inside a dispatch (bindings "
                                         "with no dispatch); end the pass's stream after its last dispatch");
    if (rc == MLXN_OK) rc = mlxn_cmdbuf_keep_source(cb, stream, len);
    pthread_mutex_unlock(&cb->dev->mu);
  }
  return fail_encoding(cb, rc);
}

int32_t mlxn_cmdbuf_replay_like(mlxn_cmdbuf *cb, mlxn_cmdbuf *from, const uint8_t *stream, uint32_t len) {
  int32_t rc = check_encoding(cb);
  if (rc != MLXN_OK) return rc;
  if (len % 4 != 0 || (len > 0 && !stream))
    rc = mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "stream length %u is not a whole number of words", len);
  else
    rc = check_replay(cb, from);
  if (rc == MLXN_OK && !from->source)
    rc = mlxn_set_error(MLXN_E_INVALID_ARGUMENT,
                        "the template keeps no stream to compare with: make it with mlxn_cmdbuf_encode_template");
  if (rc == MLXN_OK) {
    pthread_mutex_lock(&cb->dev->mu);
    rc = mlxn_cmdbuf_replay_source(cb, from, stream, len);
    pthread_mutex_unlock(&cb->dev->mu);
    if (rc == MLXN_UNLIKE) return rc; /* nothing done: the caller encodes the stream */
  }
  return fail_encoding(cb, rc);
}

int32_t mlxn_cmdbuf_replay(mlxn_cmdbuf *cb, mlxn_cmdbuf *from) { return mlxn_cmdbuf_replay_patched(cb, from, NULL, 0); }

int32_t mlxn_cmdbuf_replay_patched(mlxn_cmdbuf *cb, mlxn_cmdbuf *from, const uint32_t *patch, uint32_t n_words) {
  int32_t rc = check_encoding(cb);
  if (rc != MLXN_OK) return rc;
  /* A refused replay is a dropped chunk, as in mlxn_cmdbuf_encode: cb must never run without it. */
  if (n_words % MLXN_PATCH_WORDS != 0 || (n_words > 0 && !patch))
    rc = mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "a patch list is %d words per entry, got %u words%s",
                        MLXN_PATCH_WORDS, n_words, n_words > 0 && !patch ? " at a null pointer" : "");
  else
    rc = check_replay(cb, from);
  if (rc == MLXN_OK) {
    pthread_mutex_lock(&cb->dev->mu);
    rc = mlxn_cmdbuf_copy_decoded(cb, from);
    if (rc == MLXN_OK && n_words > 0) rc = mlxn_cmdbuf_patch_constants(cb, patch, n_words / MLXN_PATCH_WORDS);
    pthread_mutex_unlock(&cb->dev->mu);
  }
  return fail_encoding(cb, rc);
}

uint32_t mlxn_cmdbuf_error_offset(mlxn_cmdbuf *cb) { return cb ? cb->error_offset : 0; }

int32_t mlxn_cmdbuf_commit(mlxn_cmdbuf *cb) {
  if (!cb) return mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "null command buffer");
  if (!cb->dev) return mlxn_set_error(MLXN_E_STATE, "%s", cb->cmd.error[0] ? cb->cmd.error : DEVICE_CLOSED);
  if (cb->status == MLXN_CB_ERROR)
    return mlxn_set_error(cb->cmd.error_code, "cannot commit a command buffer that failed to encode: %s", cb->cmd.error);
  if (cb->status != MLXN_CB_ENCODING)
    return mlxn_set_error(MLXN_E_STATE, "command buffer was already committed");
  if (cb->source)
    return mlxn_set_error(MLXN_E_STATE, "a template (mlxn_cmdbuf_encode_template) is never committed: replay it "
                                        "into a new command buffer and commit that");
  mlxn_device *dev = cb->dev;
  pthread_mutex_lock(&dev->mu);
  cb->status = MLXN_CB_COMMITTED;
  mlxn_queue_enqueue_locked(dev, cb);
  pthread_mutex_unlock(&dev->mu);
  return MLXN_OK;
}

static int cmdbuf_not_running(void *arg) {
  return atomic_load(&((mlxn_cmdbuf *)arg)->status) != MLXN_CB_COMMITTED;
}

int32_t mlxn_cmdbuf_wait(mlxn_cmdbuf *cb) {
  if (!cb) return mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "null command buffer");
  mlxn_spin_until(cmdbuf_not_running, cb, cb->wait_spin_ns);
  pthread_mutex_lock(&cb->mu);
  if (cb->status == MLXN_CB_ENCODING) {
    pthread_mutex_unlock(&cb->mu);
    return mlxn_set_error(MLXN_E_STATE, "command buffer was never committed; commit it before waiting");
  }
  while (cb->status == MLXN_CB_COMMITTED) pthread_cond_wait(&cb->cv, &cb->mu);
  int32_t rc = cb->status == MLXN_CB_ERROR ? cb->cmd.error_code : MLXN_OK;
  if (rc != MLXN_OK) mlxn_set_error(rc, "%s", cb->cmd.error);
  pthread_mutex_unlock(&cb->mu);
  return rc;
}

int32_t mlxn_cmdbuf_status(mlxn_cmdbuf *cb) {
  if (!cb) return mlxn_set_error(MLXN_E_INVALID_ARGUMENT, "null command buffer");
  pthread_mutex_lock(&cb->mu);
  int32_t s = cb->status;
  pthread_mutex_unlock(&cb->mu);
  return s;
}

uint32_t mlxn_cmdbuf_error(mlxn_cmdbuf *cb, uint8_t *buf, uint32_t cap) {
  if (!cb) return 0;
  pthread_mutex_lock(&cb->mu);
  uint32_t n = copy_text(cb->cmd.error, buf, cap);
  pthread_mutex_unlock(&cb->mu);
  return n;
}

uint32_t mlxn_cmdbuf_dispatch_count(mlxn_cmdbuf *cb) { return cb ? cb->n_dispatches : 0; }

uint32_t mlxn_cmdbuf_timings(mlxn_cmdbuf *cb, uint64_t *out, uint32_t cap) {
  if (!cb || !out || cap < 2) return 0;
  pthread_mutex_lock(&cb->mu);
  int done = cb->status == MLXN_CB_COMPLETED || cb->status == MLXN_CB_ERROR;
  pthread_mutex_unlock(&cb->mu);
  out[0] = done ? cb->cmd.t_start : 0;
  out[1] = done ? cb->cmd.t_end : 0;
  if (!done) return 0;
  uint32_t n = (cap - 2) / 3;
  if (n > cb->n_dispatches) n = cb->n_dispatches;
  for (uint32_t i = 0; i < n; i++) {
    const mlxn_dispatch *d = &cb->dispatches[i]; /* written before the completion we saw under cb->mu */
    uint64_t s = d->t_start, e = d->t_end;
    out[2 + 3 * i] = d->tag;
    out[3 + 3 * i] = s == UINT64_MAX ? 0 : s;
    out[4 + 3 * i] = s == UINT64_MAX ? 0 : e;
  }
  return n;
}

static uint32_t put_stat(uint32_t *out, uint32_t cap, uint32_t i, uint32_t v) {
  if (i < cap) out[i] = v;
  return i + 1;
}

uint32_t mlxn_cmdbuf_barrier_stats(mlxn_cmdbuf *cb, uint32_t *out, uint32_t cap) {
  if (!cb || !out) return 0;
  mlxn_device *dev = cb->dev; /* the decoder writes these under dev->mu; detached, nothing does */
  if (dev) pthread_mutex_lock(&dev->mu);
  uint32_t i = 0;
  i = put_stat(out, cap, i, cb->n_dispatches);
  i = put_stat(out, cap, i, cb->lg_groups);
  i = put_stat(out, cap, i, cb->st_auto_barriers);
  i = put_stat(out, cap, i, cb->st_auto_concurrent);
  i = put_stat(out, cap, i, cb->st_barriers);
  i = put_stat(out, cap, i, cb->lg_open);
  for (uint32_t k = 0; k < MLXN_STAT_SMALL_SIZES; k++) i = put_stat(out, cap, i, cb->lg_small[k]);
  for (uint32_t k = 0; k < cb->n_wide && i != UINT32_MAX; k++) i = put_stat(out, cap, i, cb->lg_wide[k]);
  if (dev) pthread_mutex_unlock(&dev->mu);
  return i;
}

void mlxn_cmdbuf_free(mlxn_cmdbuf *cb) {
  if (!cb) return;
  mlxn_device *dev = cb->dev;
  pthread_mutex_lock(&cb->mu);
  while (cb->status == MLXN_CB_COMMITTED) pthread_cond_wait(&cb->cv, &cb->mu);
  pthread_mutex_unlock(&cb->mu);
  if (dev) {
    pthread_mutex_lock(&dev->mu);
    mlxn_cmdbuf_release_content(cb); /* drops buffer references (uncommitted or failed ones too) */
    if (dev->n_spare < MLXN_SPARE_STORAGE) mlxn_storage_give(cb, &dev->spare[dev->n_spare++]);
    if (cb->live_prev) cb->live_prev->live_next = cb->live_next;
    else dev->live = cb->live_next;
    if (cb->live_next) cb->live_next->live_prev = cb->live_prev;
    pthread_mutex_unlock(&dev->mu);
    mlxn_live_add(MLXN_LIVE_CMDBUFS, -1);
  }
  mlxn_cmdbuf_free_source(cb);
  mlxn_storage_free(cb); /* whatever was not handed back (all of it once detached) */
  pthread_mutex_destroy(&cb->mu);
  pthread_cond_destroy(&cb->cv);
  free(cb);
}
