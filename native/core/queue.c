/* Native core: the command queue. One thread runs committed command buffers in commit order (the
 * order a Metal command queue or a CUDA stream guarantees) through the backend, then releases the
 * buffers they bound (deferred frees happen here) and wakes their waiters. */
#define _GNU_SOURCE
#include <sched.h>

#include "internal.h"

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

    mlxn_backend_run(dev, cb);

    pthread_mutex_lock(&dev->mu);
    /* Completed: buffers it bound may now be freed (their deferred frees happen here). */
    for (uint32_t i = 0; i < cb->n_refs; i++) mlxn_buffer_release_locked(dev, cb->refs[i]);
    cb->n_refs = 0;
    pthread_mutex_unlock(&dev->mu);
    pthread_mutex_lock(&cb->mu);
    cb->status = cb->error_code ? MLXN_CB_ERROR : MLXN_CB_COMPLETED;
    pthread_cond_broadcast(&cb->cv);
    pthread_mutex_unlock(&cb->mu); /* cb may be freed by its owner from here on */
    pthread_mutex_lock(&dev->mu);
  }
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
  return pthread_create(&dev->queue_thread, NULL, queue_main, dev) == 0 ? 0 : -1;
}

void mlxn_queue_stop(mlxn_device *dev) {
  pthread_mutex_lock(&dev->mu);
  dev->closing = 1;
  pthread_cond_broadcast(&dev->queue_cv);
  pthread_mutex_unlock(&dev->mu);
  pthread_join(dev->queue_thread, NULL);
}
