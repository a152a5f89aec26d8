/* Native core: the command queue. Committed command buffers run in commit order (the order a Metal
 * command queue or a CUDA stream guarantees) through the backend; then the buffers they bound are
 * released (deferred frees happen here) and their waiters woken. Also the one way a backend reports
 * a failed command buffer (mlxn_command_*).
 *
 * Two ways to run, chosen by the backend's open (mlxn_backend_config.max_in_flight):
 *  - run (0, the default): the queue thread calls the backend's run, which returns when the
 *    command buffer is done, and completes it at once.
 *  - launch/complete (1..MLXN_MAX_IN_FLIGHT): the queue thread launches a command buffer as soon as
 *    it is committed and goes on to the next one; a completion thread waits for each launched one
 *    (the backend's complete) and completes it. So command buffer k+1 is launched while k runs.
 * Invariants of the launch/complete mode:
 *  - at most max_in_flight command buffers are launched and not yet completed (the one being
 *    launched counts): a backend sizes its per-flight resources by it;
 *  - launch is called in commit order, complete in launch order, each exactly once per command
 *    buffer, launch always before complete; launch runs only on the queue thread, complete only on
 *    the completion thread;
 *  - a command buffer's buffer references, status and waiters are touched only at completion,
 *    exactly as in the run mode, so waits, deferred frees and errors see no difference;
 *  - mlxn_queue_stop returns only when every committed command buffer is completed. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>

#include "internal.h"

/* ---- how a backend reports failure: one message for a failed dispatch ------------------------- */

void mlxn_command_fail(mlxn_command *cmd, int32_t code, const char *fmt, ...) {
  if (cmd->error_code != 0) return; /* the first error is the one reported */
  cmd->error_code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd->error, sizeof cmd->error, fmt, ap);
  va_end(ap);
}

void mlxn_command_dispatch_failed(mlxn_command *cmd, uint32_t index, const char *detail) {
  const mlxn_dispatch *d = index < cmd->n_dispatches ? &cmd->dispatches[index] : NULL;
  mlxn_command_fail(cmd, MLXN_E_EXECUTION, "dispatch %u (tag %u, kernel %s) failed while executing%s%s", index,
                    d ? d->tag : 0, d ? d->contract->name : "?", detail ? ": " : "", detail ? detail : "");
}

void mlxn_command_fault(mlxn_command *cmd, uint32_t fault) {
  uint32_t tag = fault - 1, index = 0;
  while (index < cmd->n_dispatches && cmd->dispatches[index].tag != tag) index++;
  if (index < cmd->n_dispatches) {
    mlxn_command_dispatch_failed(cmd, index, NULL);
  } else { /* a fault word no dispatch of this command buffer could have written */
    mlxn_command_fail(cmd, MLXN_E_EXECUTION, "dispatch %u (tag %u, kernel ?) failed while executing", index, tag);
  }
}

/* ---- the queue ------------------------------------------------------------------------------------ */

/* The backend's hooks, with the core's defaults where it has none (see backend.h). */
static void backend_run(mlxn_device *dev, mlxn_cmdbuf *cb) {
  if (dev->ops->run) {
    dev->ops->run(dev->backend, &cb->cmd);
    return;
  }
  dev->ops->launch(dev->backend, &cb->cmd);
  if (dev->ops->complete) dev->ops->complete(dev->backend, &cb->cmd);
}
static void backend_launch(mlxn_device *dev, mlxn_cmdbuf *cb) {
  if (dev->ops->launch) dev->ops->launch(dev->backend, &cb->cmd);
  else dev->ops->run(dev->backend, &cb->cmd);
}
static void backend_complete(mlxn_device *dev, mlxn_cmdbuf *cb) {
  if (dev->ops->complete) dev->ops->complete(dev->backend, &cb->cmd);
}

int mlxn_spin_until(int (*done)(void *), void *arg, uint64_t ns) {
  uint64_t t0 = mlxn_now_ns();
  for (uint32_t n = 0;; n++) {
    if (done(arg)) return 1;
    /* Yield rather than burn the core: on small machines the thread we wait for (the caller's,
     * the queue's or a worker) may need this very core to make progress. */
    if (n & 1u) sched_yield();
    else mlxn_cpu_relax();
    if ((n & 15u) == 15u && mlxn_now_ns() - t0 > ns) return done(arg);
  }
}

static int queue_has_work(void *arg) { return atomic_load(&((mlxn_device *)arg)->queued) > 0; }
static int flight_has_work(void *arg) {
  mlxn_device *dev = arg;
  return atomic_load(&dev->n_flight) > 0 || atomic_load(&dev->launcher_done);
}
static int flight_has_room(void *arg) {
  mlxn_device *dev = arg;
  return atomic_load(&dev->n_flight) < dev->max_in_flight;
}

/* Completes a command buffer whose backend work is done: releases its buffer references (deferred
 * frees happen here), sets its status and wakes its waiters. cb may be freed by its owner after. */
static void finish(mlxn_device *dev, mlxn_cmdbuf *cb) {
  pthread_mutex_lock(&dev->mu);
  for (uint32_t i = 0; i < cb->n_refs; i++) mlxn_buffer_release_locked(dev, cb->refs[i]);
  cb->n_refs = 0;
  pthread_mutex_unlock(&dev->mu);
  pthread_mutex_lock(&cb->mu);
  cb->status = cb->cmd.error_code ? MLXN_CB_ERROR : MLXN_CB_COMPLETED;
  pthread_cond_broadcast(&cb->cv);
  pthread_mutex_unlock(&cb->mu);
}

/* Launch/complete mode, queue thread: launches cb once fewer than max_in_flight are in flight and
 * hands it to the completion thread. Called without dev->mu. */
static void launch(mlxn_device *dev, mlxn_cmdbuf *cb) {
  if (!flight_has_room(dev)) mlxn_spin_until(flight_has_room, dev, dev->idle_spin_ns);
  pthread_mutex_lock(&dev->mu);
  while (!flight_has_room(dev)) pthread_cond_wait(&dev->flight_cv, &dev->mu);
  pthread_mutex_unlock(&dev->mu);
  mlxn_command_prepare(cb);
  backend_launch(dev, cb); /* only this thread adds to the flight ring: the room cannot vanish */
  pthread_mutex_lock(&dev->mu);
  uint32_t n = atomic_load(&dev->n_flight);
  dev->flight[(dev->flight_head + n) % MLXN_MAX_IN_FLIGHT] = cb;
  atomic_store(&dev->n_flight, n + 1);
  pthread_cond_broadcast(&dev->flight_cv);
  pthread_mutex_unlock(&dev->mu);
}

static void *completion_main(void *arg) {
  mlxn_device *dev = arg;
  pthread_mutex_lock(&dev->mu);
  for (;;) {
    if (!flight_has_work(dev)) {
      /* Nothing launched: poll briefly (a launch usually follows), then sleep. */
      pthread_mutex_unlock(&dev->mu);
      mlxn_spin_until(flight_has_work, dev, dev->idle_spin_ns);
      pthread_mutex_lock(&dev->mu);
    }
    while (!flight_has_work(dev)) pthread_cond_wait(&dev->flight_cv, &dev->mu);
    if (atomic_load(&dev->n_flight) == 0) break; /* the queue thread has stopped and all is completed */
    mlxn_cmdbuf *cb = dev->flight[dev->flight_head];
    pthread_mutex_unlock(&dev->mu);

    backend_complete(dev, cb); /* waits for cb's work; its backend resources are free after */

    pthread_mutex_lock(&dev->mu);
    dev->flight_head = (dev->flight_head + 1) % MLXN_MAX_IN_FLIGHT;
    atomic_fetch_sub(&dev->n_flight, 1);
    pthread_cond_broadcast(&dev->flight_cv); /* room for the next launch */
    pthread_mutex_unlock(&dev->mu);
    finish(dev, cb);
    pthread_mutex_lock(&dev->mu);
  }
  pthread_mutex_unlock(&dev->mu);
  return NULL;
}

static void *queue_main(void *arg) {
  mlxn_device *dev = arg;
  pthread_mutex_lock(&dev->mu);
  for (;;) {
    if (!dev->queue_head && !dev->closing) {
      /* Idle: poll briefly (a commit usually follows a commit), then sleep. */
      pthread_mutex_unlock(&dev->mu);
      mlxn_spin_until(queue_has_work, dev, dev->idle_spin_ns);
      pthread_mutex_lock(&dev->mu);
    }
    while (!dev->queue_head && !dev->closing) pthread_cond_wait(&dev->queue_cv, &dev->mu);
    mlxn_cmdbuf *cb = dev->queue_head;
    if (!cb) break; /* closing and drained */
    dev->queue_head = cb->queue_next;
    if (!dev->queue_head) dev->queue_tail = NULL;
    atomic_fetch_sub(&dev->queued, 1);
    pthread_mutex_unlock(&dev->mu);

    if (dev->max_in_flight > 0) {
      launch(dev, cb);
    } else {
      mlxn_command_prepare(cb);
      backend_run(dev, cb);
      finish(dev, cb);
    }

    pthread_mutex_lock(&dev->mu);
  }
  atomic_store(&dev->launcher_done, 1); /* the completion thread drains what is in flight, then stops */
  pthread_cond_broadcast(&dev->flight_cv);
  pthread_mutex_unlock(&dev->mu);
  return NULL;
}

void mlxn_queue_enqueue_locked(mlxn_device *dev, mlxn_cmdbuf *cb) {
  cb->queue_next = NULL;
  if (dev->queue_tail) dev->queue_tail->queue_next = cb;
  else dev->queue_head = cb;
  dev->queue_tail = cb;
  atomic_fetch_add(&dev->queued, 1);
  pthread_cond_signal(&dev->queue_cv);
}

int mlxn_queue_start(mlxn_device *dev) {
  if (dev->max_in_flight > MLXN_MAX_IN_FLIGHT) return -1; /* a backend bug: refuse rather than overrun the ring */
  if (pthread_cond_init(&dev->flight_cv, NULL) != 0) return -1;
  if (dev->max_in_flight > 0 && pthread_create(&dev->completion_thread, NULL, completion_main, dev) != 0) {
    pthread_cond_destroy(&dev->flight_cv);
    return -1;
  }
  if (pthread_create(&dev->queue_thread, NULL, queue_main, dev) != 0) {
    if (dev->max_in_flight > 0) { /* no launcher: let the completion thread stop */
      pthread_mutex_lock(&dev->mu);
      atomic_store(&dev->launcher_done, 1);
      pthread_cond_broadcast(&dev->flight_cv);
      pthread_mutex_unlock(&dev->mu);
      pthread_join(dev->completion_thread, NULL);
    }
    pthread_cond_destroy(&dev->flight_cv);
    return -1;
  }
  return 0;
}

void mlxn_queue_stop(mlxn_device *dev) {
  pthread_mutex_lock(&dev->mu);
  dev->closing = 1;
  pthread_cond_broadcast(&dev->queue_cv);
  pthread_mutex_unlock(&dev->mu);
  pthread_join(dev->queue_thread, NULL);                  /* every committed one is launched or run */
  if (dev->max_in_flight > 0) pthread_join(dev->completion_thread, NULL); /* and every launched one completed */
  pthread_cond_destroy(&dev->flight_cv);
}
