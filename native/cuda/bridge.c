/* CUDA backend, C side: the core's backend table, and the guard that keeps exit() from tearing the
 * CUDA runtime down under a running launch. The work is in backend.cu (cuda_api.h). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "../core/backend.h"
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

static int32_t cuda_open(void **state, uint32_t flags, uint32_t threads, mlxn_backend_config *config, char *err,
                         size_t cap) {
  (void)threads;
  int32_t rc = mlxn_cuda_open(state, flags, err, cap);
  if (rc != MLXN_OK) return rc;
  pthread_once(&exit_guard_once, register_exit_guard); /* the runtime is initialised by now */
  /* The GPU does the work and the host has cores to spare: waiters poll for up to 2 ms instead of
   * sleeping after 30–50 µs, which saves a thread wake-up (tens of µs on a VM) per command buffer. */
  config->wait_spin_ns = 2000000u;
  config->idle_spin_ns = 2000000u;
  config->max_in_flight = MLXN_CUDA_IN_FLIGHT;
  return MLXN_OK;
}

/* `running` counts launched command buffers until their completion, so the exit guard waits for
 * their GPU work. */
static void cuda_launch(void *state, mlxn_command *cmd) {
  atomic_fetch_add(&running, 1); /* counted before the check, so the exit handler cannot miss it */
  if (atomic_load(&exiting)) {
    cmd->t_start = cmd->t_end = mlxn_now_ns();
    mlxn_command_fail(cmd, MLXN_E_STATE, "the process is exiting: the command buffer was not run");
  } else {
    mlxn_cuda_launch(state, cmd);
  }
  if (cmd->backend_slot < 0) atomic_fetch_sub(&running, 1); /* nothing was enqueued */
}

static void cuda_complete(void *state, mlxn_command *cmd) {
  if (cmd->backend_slot < 0) return; /* the launch failed and recorded why */
  mlxn_cuda_complete(state, cmd);
  atomic_fetch_sub(&running, 1);
}

/* Launch/complete mode; without `run`, the core launches and completes in sequence where it must. */
const mlxn_backend_ops mlxn_backend = {
    .name = "cuda",
    .open = cuda_open,
    .close = mlxn_cuda_close,
    .info = mlxn_cuda_info,
    .kernel = mlxn_cuda_kernel_of,
    .launch = cuda_launch,
    .complete = cuda_complete,
    .alloc = mlxn_cuda_alloc,
    .free = mlxn_cuda_free,
    .copy = mlxn_cuda_copy,
    .device_memory = 1,
};
