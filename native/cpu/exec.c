/* CPU backend: execution. One queue thread runs committed command buffers in commit order (the
 * order a Metal command queue guarantees). Each concurrent group's threadgroups, from all of its
 * dispatches, are handed out in chunks to the queue thread and the helper threads; a barrier is
 * the point where every thread has finished the group. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define SPIN_NS 50000u /* how long an idle thread polls before it sleeps */

/* run_group results other than the index of a failed dispatch. */
#define GROUP_OK (UINT32_MAX - 1)
#define GROUP_OUT_OF_MEMORY UINT32_MAX

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static void atomic_min_u64(_Atomic uint64_t *p, uint64_t v) {
  uint64_t cur = atomic_load_explicit(p, memory_order_relaxed);
  while (v < cur && !atomic_compare_exchange_weak(p, &cur, v)) {
  }
}

static void atomic_max_u64(_Atomic uint64_t *p, uint64_t v) {
  uint64_t cur = atomic_load_explicit(p, memory_order_relaxed);
  while (v > cur && !atomic_compare_exchange_weak(p, &cur, v)) {
  }
}

/* Takes chunks of the job's flattened threadgroup range until none are left. */
static void work_on(group_job *job, void *scratch) {
  uint32_t di = 0;
  for (;;) {
    uint64_t idx = atomic_fetch_add(&job->next, job->chunk);
    if (idx >= job->total) return;
    uint64_t end = idx + job->chunk < job->total ? idx + job->chunk : job->total;
    while (idx < end) {
      while (job->prefix[di + 1] <= idx) di++;
      decoded_dispatch *d = &job->dispatches[di];
      const mlxn_kargs *a = &d->args;
      uint64_t dend = end < job->prefix[di + 1] ? end : job->prefix[di + 1];
      uint64_t t0 = mlxn_now_ns();
      for (uint64_t i = idx; i < dend; i++) {
        uint64_t local = i - job->prefix[di];
        uint32_t gx = (uint32_t)(local % a->groups[0]);
        uint64_t rest = local / a->groups[0];
        uint32_t gy = (uint32_t)(rest % a->groups[1]);
        uint32_t gz = (uint32_t)(rest / a->groups[1]);
        if (d->kernel->run(a, gx, gy, gz, scratch) != 0) {
          int expected = 0;
          atomic_compare_exchange_strong(&job->failed, &expected, (int)di + 1);
        }
      }
      uint64_t t1 = mlxn_now_ns();
      atomic_min_u64(&d->t_start, t0);
      atomic_max_u64(&d->t_end, t1);
      idx = dend;
    }
  }
}

static void *alloc_scratch(void) { return aligned_alloc(64, MLXN_MAX_TG_MEMORY); }

static int job_posted(void *arg) {
  mlxn_device *dev = ((void **)arg)[0];
  uint64_t seen = *(uint64_t *)((void **)arg)[1];
  return atomic_load(&dev->job_seq) != seen || atomic_load(&dev->pool_stop);
}

static void *helper_main(void *arg) {
  mlxn_device *dev = arg;
  void *scratch = alloc_scratch();
  uint64_t seen = 0;
  void *poll[2] = {dev, &seen};
  for (;;) {
    if (!mlxn_spin_until(job_posted, poll, SPIN_NS)) {
      pthread_mutex_lock(&dev->pool_mu);
      atomic_fetch_add(&dev->sleepers, 1);
      while (atomic_load(&dev->job_seq) == seen && !atomic_load(&dev->pool_stop))
        pthread_cond_wait(&dev->pool_cv, &dev->pool_mu);
      atomic_fetch_sub(&dev->sleepers, 1);
      pthread_mutex_unlock(&dev->pool_mu);
    }
    if (atomic_load(&dev->pool_stop)) break;
    uint64_t s = atomic_load(&dev->job_seq);
    atomic_fetch_add(&dev->active, 1);
    /* Still the job we saw? Then its slot is not being refilled (that needs active == 0). */
    if (atomic_load(&dev->job_seq) == s && scratch) work_on(&dev->jobs[s & 1], scratch);
    atomic_fetch_sub(&dev->active, 1);
    seen = s;
  }
  free(scratch);
  return NULL;
}

static void wait_helpers_idle(mlxn_device *dev) {
  while (atomic_load(&dev->active) != 0) cpu_relax();
}

/* Runs one concurrent group; returns GROUP_OK, GROUP_OUT_OF_MEMORY or a failed dispatch index. */
static uint32_t run_group(mlxn_device *dev, decoded_dispatch *ds, uint32_t count, void *scratch) {
  /* Helpers still inside the previous job only find it drained; let them leave before the slot
   * that job K-1 used is refilled for K+1. */
  wait_helpers_idle(dev);
  uint64_t seq = atomic_load(&dev->job_seq) + 1;
  group_job *job = &dev->jobs[seq & 1];
  if (count + 1 > job->prefix_cap) {
    uint32_t cap = (count + 1) * 2;
    uint64_t *p = realloc(job->prefix, cap * sizeof *p);
    if (!p) return GROUP_OUT_OF_MEMORY;
    job->prefix = p;
    job->prefix_cap = cap;
  }
  job->dispatches = ds;
  job->count = count;
  job->prefix[0] = 0;
  for (uint32_t i = 0; i < count; i++) job->prefix[i + 1] = job->prefix[i] + ds[i].tg_total;
  job->total = job->prefix[count];
  uint64_t per = job->total / ((uint64_t)dev->n_workers * 4);
  job->chunk = per > 0 ? per : 1;
  atomic_store(&job->next, 0);
  atomic_store(&job->failed, 0);
  if (dev->n_helpers > 0 && job->total > 1) {
    atomic_store(&dev->job_seq, seq); /* publish: helpers may join from here on */
    if (atomic_load(&dev->sleepers) > 0) {
      pthread_mutex_lock(&dev->pool_mu);
      pthread_cond_broadcast(&dev->pool_cv);
      pthread_mutex_unlock(&dev->pool_mu);
    }
  }
  work_on(job, scratch);
  /* The barrier: every chunk was taken; wait for the helpers still running theirs. */
  wait_helpers_idle(dev);
  int failed = atomic_load(&job->failed);
  return failed ? (uint32_t)(failed - 1) : GROUP_OK;
}

static void run_cmdbuf(mlxn_device *dev, mlxn_cmdbuf *cb, void *scratch) {
  cb->t_start = mlxn_now_ns();
  for (uint32_t g = 0; g < cb->n_groups && cb->error_code == 0; g++) {
    uint32_t first = cb->group_starts[g];
    uint32_t last = g + 1 < cb->n_groups ? cb->group_starts[g + 1] : cb->n_dispatches;
    uint32_t r = scratch ? run_group(dev, &cb->dispatches[first], last - first, scratch) : GROUP_OUT_OF_MEMORY;
    if (r == GROUP_OUT_OF_MEMORY) {
      cb->error_code = MLXN_E_OUT_OF_MEMORY;
      strcpy(cb->error, "out of memory while executing the command buffer");
    } else if (r != GROUP_OK) {
      decoded_dispatch *d = &cb->dispatches[first + r];
      cb->error_code = MLXN_E_EXECUTION;
      snprintf(cb->error, sizeof cb->error, "dispatch %u (tag %u, kernel %s) failed while executing",
               first + r, d->tag, d->kernel->name);
    }
  }
  cb->t_end = mlxn_now_ns();
}

int mlxn_spin_until(int (*done)(void *), void *arg, uint64_t ns) {
  uint64_t t0 = mlxn_now_ns();
  for (uint32_t n = 0;; n++) {
    if (done(arg)) return 1;
    /* Yield rather than burn the core: on small machines the thread we wait for (the caller's,
     * the queue's or a helper) may need this very core to make progress. */
    if (n & 1u) sched_yield();
    else cpu_relax();
    if ((n & 15u) == 15u && mlxn_now_ns() - t0 > ns) return done(arg);
  }
}

static int queue_has_work(void *arg) { return atomic_load(&((mlxn_device *)arg)->queued) > 0; }

static void *queue_main(void *arg) {
  mlxn_device *dev = arg;
  void *scratch = alloc_scratch();
  pthread_mutex_lock(&dev->mu);
  for (;;) {
    if (!dev->queue_head && !dev->closing) {
      /* Idle: poll briefly (a commit usually follows a commit), then sleep. */
      pthread_mutex_unlock(&dev->mu);
      mlxn_spin_until(queue_has_work, dev, SPIN_NS);
      pthread_mutex_lock(&dev->mu);
    }
    while (!dev->queue_head && !dev->closing) pthread_cond_wait(&dev->queue_cv, &dev->mu);
    mlxn_cmdbuf *cb = dev->queue_head;
    if (!cb) break; /* closing and drained */
    dev->queue_head = cb->queue_next;
    if (!dev->queue_head) dev->queue_tail = NULL;
    atomic_fetch_sub(&dev->queued, 1);
    pthread_mutex_unlock(&dev->mu);

    run_cmdbuf(dev, cb, scratch);

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
  free(scratch);
  return NULL;
}

void mlxn_exec_enqueue_locked(mlxn_device *dev, mlxn_cmdbuf *cb) {
  cb->queue_next = NULL;
  if (dev->queue_tail) dev->queue_tail->queue_next = cb;
  else dev->queue_head = cb;
  dev->queue_tail = cb;
  atomic_fetch_add(&dev->queued, 1);
  pthread_cond_signal(&dev->queue_cv);
}

int mlxn_exec_start(mlxn_device *dev, uint32_t threads) {
  dev->n_workers = threads;
  dev->n_helpers = 0;
  pthread_mutex_init(&dev->pool_mu, NULL);
  pthread_cond_init(&dev->pool_cv, NULL);
  if (threads > 1) {
    dev->helpers = calloc(threads - 1, sizeof(pthread_t));
    if (!dev->helpers) return -1;
    for (uint32_t i = 0; i + 1 < threads; i++) {
      if (pthread_create(&dev->helpers[i], NULL, helper_main, dev) != 0) break;
      dev->n_helpers++;
    }
  }
  dev->n_workers = dev->n_helpers + 1;
  if (pthread_create(&dev->queue_thread, NULL, queue_main, dev) != 0) {
    dev->closing = 1;
    mlxn_exec_stop(dev);
    return -1;
  }
  return 0;
}

void mlxn_exec_stop(mlxn_device *dev) {
  pthread_mutex_lock(&dev->mu);
  int had_queue = !dev->closing;
  dev->closing = 1;
  pthread_cond_broadcast(&dev->queue_cv);
  pthread_mutex_unlock(&dev->mu);
  if (had_queue) pthread_join(dev->queue_thread, NULL);
  pthread_mutex_lock(&dev->pool_mu);
  atomic_store(&dev->pool_stop, 1);
  pthread_cond_broadcast(&dev->pool_cv);
  pthread_mutex_unlock(&dev->pool_mu);
  for (uint32_t i = 0; i < dev->n_helpers; i++) pthread_join(dev->helpers[i], NULL);
  free(dev->helpers);
  dev->helpers = NULL;
  dev->n_helpers = 0;
  for (int i = 0; i < 2; i++) {
    free(dev->jobs[i].prefix);
    dev->jobs[i].prefix = NULL;
  }
  pthread_mutex_destroy(&dev->pool_mu);
  pthread_cond_destroy(&dev->pool_cv);
}
