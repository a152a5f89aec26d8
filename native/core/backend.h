/* The backend interface: what the native core asks of a backend, and the plain data it hands it.
 *
 * A backend library defines one table, `mlxn_backend`, of the hooks below; the core (device.c,
 * queue.c) calls nothing else of it. Hooks marked optional may be NULL: the core then does what a
 * host-memory backend needs. Everything here is plain C data (no C11 atomics, no core-private
 * types), so C, C++ (CUDA) and Objective-C backends read a decoded command buffer directly.
 */
#ifndef MLXN_BACKEND_H
#define MLXN_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "../contracts/contracts.h"
#include "../mlxn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Command buffers a launch/complete backend may keep launched and not yet completed. */
#define MLXN_MAX_IN_FLIGHT 4

/* What a kernel receives for one dispatch: the arguments its contract validated. */
typedef mlxn_kargs mlxn_kernel_args;

/* One validated dispatch of a committed command buffer. */
typedef struct mlxn_dispatch {
  const void *kernel;    /* what the backend's `kernel` hook returned for this kernel */
  /* the kernel's contract: id, name, signature (one character per slot: 'b' buffer, 'o' optional
   * buffer, 'c' inline bytes) and threadgroup-memory rule */
  const mlxn_contract *contract;
  mlxn_kernel_args args;
  void *object[MLXN_KERNEL_SLOTS]; /* each bound buffer slot's backend object (`alloc`'s *object) */
  uint32_t tag;   /* the host's dispatch tag, echoed in timings and fault messages */
  uint32_t group; /* index of its concurrent group: groups are separated by barriers */
  uint64_t tg_total; /* threadgroups in this dispatch */
  /* Timing on the core's clock (mlxn_now_ns): the first threadgroup's start and the last one's end.
   * The core sets UINT64_MAX and 0 (unknown); a backend that has times lowers t_start and raises
   * t_end (mlxn_dispatch_span where several threads run one dispatch). */
  uint64_t t_start, t_end;
} mlxn_dispatch;

/* Widens d's time span to [t0, t1]: safe when several threads run threadgroups of one dispatch. */
static inline void mlxn_dispatch_span(mlxn_dispatch *d, uint64_t t0, uint64_t t1) {
  uint64_t cur = __atomic_load_n(&d->t_start, __ATOMIC_RELAXED);
  while (t0 < cur && !__atomic_compare_exchange_n(&d->t_start, &cur, t0, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  cur = __atomic_load_n(&d->t_end, __ATOMIC_RELAXED);
  while (t1 > cur && !__atomic_compare_exchange_n(&d->t_end, &cur, t1, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

/* A committed command buffer as its backend sees it: the dispatches in commit order (in), its
 * times and error (out). It stays valid and unchanged from run/launch to the end of run/complete. */
typedef struct mlxn_command {
  mlxn_dispatch *dispatches;
  uint32_t n_dispatches;
  uint32_t n_groups; /* dispatches[i].group runs from 0 to n_groups - 1, in order */
  /* out: execution start and end on the core's clock, and the first error (error_code 0: none) */
  uint64_t t_start, t_end;
  int32_t error_code;
  char error[512];
  int32_t backend_slot; /* a launch/complete backend's own, from launch to complete */
} mlxn_command;

/* What a backend's `open` may change; the core fills in its defaults first. */
typedef struct mlxn_backend_config {
  /* How long a waiter polls before it sleeps, ns: a host thread waiting for a command buffer, and
   * the idle queue thread. The defaults suit work that runs on the host's cores; a backend with idle
   * host cores (a GPU) polls longer, saving wake-ups. */
  uint64_t wait_spin_ns, idle_spin_ns;
  /* 0: run mode (the queue calls `run` and completes the command buffer when it returns).
   * 1..MLXN_MAX_IN_FLIGHT: launch/complete mode with that many in flight (see core/queue.c). */
  uint32_t max_in_flight;
} mlxn_backend_config;

typedef struct mlxn_backend_ops {
  const char *name; /* the device-info "backend" value: "cpu", "cuda", "metal", "metal-emu" */

  /* Creates the backend's state for a device opened with flags (MLXN_FLAG_*) and threads;
   * returns MLXN_OK, or an MLXN_E_* code with the reason in err. */
  int32_t (*open)(void **state, uint32_t flags, uint32_t threads, mlxn_backend_config *config, char *err,
                  size_t cap);
  /* Frees it (every command buffer has completed). Optional. */
  void (*close)(void *state);
  /* Writes the backend's own device-info JSON members (`"name":…,…`, no braces); returns their
   * length. The core adds "backend" and the limits every backend shares. */
  uint32_t (*info)(void *state, char *buf, uint32_t cap);
  /* The backend's object for a kernel of the core's table (passed back in mlxn_dispatch.kernel), or
   * NULL when this backend does not implement it. Called once per kernel when a device opens. */
  const void *(*kernel)(void *state, const mlxn_contract *contract);

  /* Executes a command buffer and returns when it is done, setting cmd's times (and the dispatches'
   * where it has them) and its error. Run mode; optional in launch/complete mode (the core then
   * launches and completes in sequence). */
  void (*run)(void *state, mlxn_command *cmd);
  /* Launch/complete mode: launch enqueues the work and returns at once (or records an error in
   * cmd); complete waits for it and fills what run would. queue.c states the guarantees. launch
   * defaults to run, complete to nothing. */
  void (*launch)(void *state, mlxn_command *cmd);
  void (*complete)(void *state, mlxn_command *cmd);

  /* nbytes of zero-filled memory (NULL on failure); *object may receive a backend object, handed to
   * free and in mlxn_dispatch.object. Optional: host memory (calloc). */
  void *(*alloc)(void *state, uint64_t nbytes, void **object);
  /* Optional: free(). */
  void (*free)(void *state, void *mem, void *object);
  /* Copies between host memory and buffer memory; returns MLXN_OK, or a code with the reason in
   * err. Optional: memcpy. */
  int32_t (*copy)(void *state, uint8_t *mem, uint8_t *host, uint64_t len, int to_device, char *err, size_t cap);
  /* Buffer memory is not host-addressable (mlxn_buffer_contents returns NULL). */
  int device_memory;
} mlxn_backend_ops;

/* The backend table a library links (each backend defines it). */
extern const mlxn_backend_ops mlxn_backend;

/* The core's clock, CLOCK_MONOTONIC ns: command-buffer and dispatch times are on it. */
uint64_t mlxn_now_ns(void);

/* Polls `done(arg)` for up to ns nanoseconds, yielding the core; returns whether it became true.
 * Cheap waits for work that is about to arrive, before falling back to a condition variable. */
int mlxn_spin_until(int (*done)(void *), void *arg, uint64_t ns);

/* A polite busy-wait step. */
static inline void mlxn_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Records a dispatch that failed while executing (the message every backend reports), unless cmd
 * already holds an error; detail, when not NULL, is appended. */
void mlxn_command_dispatch_failed(mlxn_command *cmd, uint32_t index, const char *detail);
/* The same for a device-side fault word holding tag + 1 (fault: the word's value, non-zero). */
void mlxn_command_fault(mlxn_command *cmd, uint32_t fault);
/* Records an error other than a failed dispatch, unless cmd already holds one. */
void mlxn_command_fail(mlxn_command *cmd, int32_t code, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#ifdef __cplusplus
}
#endif

#endif /* MLXN_BACKEND_H */
