/* CUDA backend, C side: implements the core's hooks by translating its structures into the plain
 * data of cuda_api.h (the CUDA C++ side cannot include the core's C11 atomics). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/internal.h"
#include "cuda_api.h"

/* A script may end while a command buffer still runs. exit() then tears the CUDA runtime down,
 * and a queue thread still inside it crashes the process (about 1 run in 12 on an H200 before this
 * guard). A handler registered after the runtime has initialised runs before that teardown: it
 * turns further command buffers away and waits for the ones in progress (as long as the GPU work
 * already submitted, at most 10 s). */
static atomic_int exiting, running;
static pthread_once_t exit_guard_once = PTHREAD_ONCE_INIT;

/* Waits at most 10 s: a GPU that never finishes must not turn the exit into a hang. */
static void quiesce_at_exit(void) {
  atomic_store(&exiting, 1);
  for (int i = 0; i < 100000 && atomic_load(&running) > 0; i++) nanosleep(&(struct timespec){0, 100000}, NULL);
}

static void register_exit_guard(void) { atexit(quiesce_at_exit); }

static void launch_command_buffer(mlxn_device *dev, mlxn_cmdbuf *cb);
static void complete_command_buffer(mlxn_device *dev, mlxn_cmdbuf *cb);

int mlxn_backend_open(mlxn_device *dev, uint32_t threads) {
  (void)threads;
  char err[512];
  int rc = mlxn_cuda_open(&dev->backend, err, sizeof err);
  if (rc != 0) return mlxn_set_error(rc, "%s", err), -1;
  pthread_once(&exit_guard_once, register_exit_guard); /* the runtime is initialised by now */
  /* The GPU does the work and the host has cores to spare: waiters poll for up to 2 ms instead of
   * sleeping after 30–50 µs, which saves a thread wake-up (tens of µs on a VM) per command buffer. */
  dev->wait_spin_ns = 2000000u;
  dev->idle_spin_ns = 2000000u;
  dev->launch = launch_command_buffer;
  dev->complete = complete_command_buffer;
  dev->max_in_flight = MLXN_CUDA_IN_FLIGHT;
  return 0;
}

void mlxn_backend_close(mlxn_device *dev) {
  mlxn_cuda_close(dev->backend);
  dev->backend = NULL;
}

uint32_t mlxn_backend_info(mlxn_device *dev, char *buf, uint32_t cap) {
  return mlxn_cuda_info(dev->backend, dev->flags, buf, cap);
}

void *mlxn_backend_alloc(mlxn_device *dev, uint64_t nbytes, void **handle) {
  (void)dev;
  (void)handle;
  return mlxn_cuda_alloc(nbytes);
}

void mlxn_backend_free(mlxn_device *dev, void *mem, void *handle) {
  (void)dev;
  (void)handle;
  mlxn_cuda_free(mem);
}

int32_t mlxn_backend_copy(mlxn_device *dev, uint8_t *mem, uint8_t *host, uint64_t len, int to_device) {
  (void)dev;
  char err[512];
  int rc = mlxn_cuda_copy(mem, host, len, to_device, err, sizeof err);
  return rc == 0 ? MLXN_OK : mlxn_set_error(rc, "%s", err);
}

int mlxn_backend_host_visible(mlxn_device *dev) {
  (void)dev;
  return 0;
}

int mlxn_backend_has_kernel(mlxn_device *dev, const mlxn_contract *k) {
  (void)dev;
  return mlxn_cuda_has_kernel(k->name);
}

/* The core's launch/complete hooks (see native/core/queue.c): a launch enqueues the command buffer
 * on the CUDA stream and returns; its completion waits for it. `running` counts launched command
 * buffers until their completion, so the exit guard waits for their GPU work. */
static void launch_command_buffer(mlxn_device *dev, mlxn_cmdbuf *cb) {
  cb->backend_slot = -1;
  atomic_fetch_add(&running, 1); /* counted before the check, so the exit handler cannot miss it */
  int32_t rc = MLXN_E_STATE;
  const char *why = "the process is exiting: the command buffer was not run";
  mlxn_cuda_dispatch *ds = NULL;
  if (!atomic_load(&exiting)) {
    ds = mlxn_cuda_dispatches(dev->backend, cb->n_dispatches ? cb->n_dispatches : 1);
    rc = MLXN_E_OUT_OF_MEMORY;
    why = "out of memory while launching the command buffer";
  }
  if (!ds) {
    cb->t_start = cb->t_end = mlxn_now_ns();
    cb->error_code = rc;
    snprintf(cb->error, sizeof cb->error, "%s", why);
    atomic_fetch_sub(&running, 1);
    return;
  }
  for (uint32_t g = 0, i = 0; g < cb->n_groups; g++) {
    uint32_t end = g + 1 < cb->n_groups ? cb->group_starts[g + 1] : cb->n_dispatches;
    for (; i < end; i++) {
      const decoded_dispatch *d = &cb->dispatches[i];
      mlxn_cuda_dispatch *o = &ds[i];
      o->kernel = d->kernel->name;
      o->signature = d->kernel->signature;
      for (int s = 0; s < MLXN_CUDA_SLOTS && s < MLXN_CPU_KERNEL_SLOTS; s++) {
        o->ptr[s] = d->args.ptr[s];
        o->len[s] = d->args.len[s];
      }
      for (int k = 0; k < 3; k++) {
        o->grid[k] = d->args.grid[k];
        o->tg[k] = d->args.tg[k];
        o->groups[k] = d->args.groups[k];
      }
      o->tg_memory = d->args.tg_memory;
      o->tag = d->tag;
      o->group = g;
    }
  }
  int32_t slot = -1;
  rc = mlxn_cuda_launch(dev->backend, dev->flags, cb->n_dispatches, &slot, cb->error, sizeof cb->error);
  if (rc != 0) {
    cb->t_start = cb->t_end = mlxn_now_ns();
    cb->error_code = rc;
    atomic_fetch_sub(&running, 1);
    return;
  }
  cb->backend_slot = slot;
}

static void complete_command_buffer(mlxn_device *dev, mlxn_cmdbuf *cb) {
  if (cb->backend_slot < 0) return; /* the launch failed and recorded why */
  uint64_t t_start = 0, gpu_ns = 0;
  uint32_t failed = UINT32_MAX;
  int rc = mlxn_cuda_complete(dev->backend, dev->flags, cb->backend_slot, &t_start, &gpu_ns, &failed, cb->error,
                              sizeof cb->error);
  if (rc != 0) cb->error_code = rc;
  cb->t_start = t_start;
  cb->t_end = t_start + gpu_ns;
  if (rc == 0 && (dev->flags & MLXN_FLAG_DISPATCH_TIMING)) {
    const mlxn_cuda_dispatch *ds = mlxn_cuda_slot_dispatches(dev->backend, cb->backend_slot);
    for (uint32_t i = 0; i < cb->n_dispatches; i++) {
      atomic_store(&cb->dispatches[i].t_start, t_start + ds[i].start_ns);
      atomic_store(&cb->dispatches[i].t_end, t_start + ds[i].end_ns);
    }
  }
  cb->backend_slot = -1;
  atomic_fetch_sub(&running, 1);
}

/* The core's default path; this backend sets launch/complete, so the queue does not call it. */
void mlxn_backend_run(mlxn_device *dev, mlxn_cmdbuf *cb) {
  launch_command_buffer(dev, cb);
  complete_command_buffer(dev, cb);
}
