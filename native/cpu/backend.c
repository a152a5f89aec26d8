/* CPU backend: host memory and a worker pool. Each concurrent group's threadgroups, from all of its
 * dispatches, are handed out in chunks to the queue thread and the helper threads; a barrier is
 * the point where every thread has finished the group. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "../../kernels/cpu/cpu_kernel.h"
#include "../core/backend.h"


#define SPIN_NS 50000u /* how long an idle helper polls before it sleeps */

typedef struct group_job {
  mlxn_dispatch *dispatches; /* the group's first dispatch */
  uint32_t count;
  uint64_t *prefix; /* prefix[i] = threadgroups before dispatch i; prefix[count] = total */
  uint32_t prefix_cap;
  uint64_t total, chunk;
  _Atomic uint64_t next;
  _Atomic int failed; /* index+1 of a dispatch whose kernel reported failure */
} group_job;

/* Worker pool: helpers join the queue thread on each concurrent group. Jobs alternate between two
 * slots so a helper arriving late for job K (finding it already drained) never touches the slot
 * being filled for job K+1; the coordinator waits only for helpers that joined. */
typedef struct cpu_pool {
  uint32_t n_workers; /* executing threads, the queue thread included */
  pthread_t *helpers;
  uint32_t n_helpers;
  pthread_mutex_t pool_mu;
  pthread_cond_t pool_cv;
  group_job jobs[2];
  _Atomic uint64_t job_seq; /* the current job is jobs[job_seq & 1] */
  _Atomic uint32_t active;  /* helpers inside a job right now */
  _Atomic uint32_t sleepers; /* helpers blocked on pool_cv */
  _Atomic int pool_stop;
  void *scratch; /* the queue thread's threadgroup memory */
} cpu_pool;

/* run_group results other than the index of a failed dispatch. */
#define GROUP_OK (UINT32_MAX - 1)
#define GROUP_OUT_OF_MEMORY UINT32_MAX

/* Takes chunks of the job's flattened threadgroup range until none are left. */
static void work_on(group_job *job, void *scratch) {
  uint32_t di = 0;
  for (;;) {
    uint64_t idx = atomic_fetch_add(&job->next, job->chunk);
    if (idx >= job->total) return;
    uint64_t end = idx + job->chunk < job->total ? idx + job->chunk : job->total;
    while (idx < end) {
      while (job->prefix[di + 1] <= idx) di++;
      mlxn_dispatch *d = &job->dispatches[di];
      mlxn_cpu_run run = *(const mlxn_cpu_run *)d->kernel;
      const mlxn_kargs *a = &d->args;
      uint64_t dend = end < job->prefix[di + 1] ? end : job->prefix[di + 1];
      uint64_t t0 = mlxn_now_ns();
      for (uint64_t i = idx; i < dend; i++) {
        uint64_t local = i - job->prefix[di];
        uint32_t gx = (uint32_t)(local % a->groups[0]);
        uint64_t rest = local / a->groups[0];
        uint32_t gy = (uint32_t)(rest % a->groups[1]);
        uint32_t gz = (uint32_t)(rest / a->groups[1]);
        if (run(a, gx, gy, gz, scratch) != 0) {
          int expected = 0;
          atomic_compare_exchange_strong(&job->failed, &expected, (int)di + 1);
        }
      }
      uint64_t t1 = mlxn_now_ns();
      mlxn_dispatch_span(d, t0, t1);
      idx = dend;
    }
  }
}

static void *alloc_scratch(void) { return aligned_alloc(64, MLXN_MAX_TG_MEMORY); }

static int job_posted(void *arg) {
  cpu_pool *pool = ((void **)arg)[0];
  uint64_t seen = *(uint64_t *)((void **)arg)[1];
  return atomic_load(&pool->job_seq) != seen || atomic_load(&pool->pool_stop);
}

static void *helper_main(void *arg) {
  cpu_pool *pool = arg;
  void *scratch = alloc_scratch();
  uint64_t seen = 0;
  void *poll[2] = {pool, &seen};
  for (;;) {
    if (!mlxn_spin_until(job_posted, poll, SPIN_NS)) {
      pthread_mutex_lock(&pool->pool_mu);
      atomic_fetch_add(&pool->sleepers, 1);
      while (atomic_load(&pool->job_seq) == seen && !atomic_load(&pool->pool_stop))
        pthread_cond_wait(&pool->pool_cv, &pool->pool_mu);
      atomic_fetch_sub(&pool->sleepers, 1);
      pthread_mutex_unlock(&pool->pool_mu);
    }
    if (atomic_load(&pool->pool_stop)) break;
    uint64_t s = atomic_load(&pool->job_seq);
    atomic_fetch_add(&pool->active, 1);
    /* Still the job we saw? Then its slot is not being refilled (that needs active == 0). */
    if (atomic_load(&pool->job_seq) == s && scratch) work_on(&pool->jobs[s & 1], scratch);
    atomic_fetch_sub(&pool->active, 1);
    seen = s;
  }
  free(scratch);
  return NULL;
}

static void wait_helpers_idle(cpu_pool *pool) {
  while (atomic_load(&pool->active) != 0) mlxn_cpu_relax();
}

/* Runs one concurrent group; returns GROUP_OK, GROUP_OUT_OF_MEMORY or a failed dispatch index. */
static uint32_t run_group(cpu_pool *pool, mlxn_dispatch *ds, uint32_t count) {
  /* Helpers still inside the previous job only find it drained; let them leave before the slot
   * that job K-1 used is refilled for K+1. */
  wait_helpers_idle(pool);
  uint64_t seq = atomic_load(&pool->job_seq) + 1;
  group_job *job = &pool->jobs[seq & 1];
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
  uint64_t per = job->total / ((uint64_t)pool->n_workers * 4);
  job->chunk = per > 0 ? per : 1;
  atomic_store(&job->next, 0);
  atomic_store(&job->failed, 0);
  if (pool->n_helpers > 0 && job->total > 1) {
    atomic_store(&pool->job_seq, seq); /* publish: helpers may join from here on */
    if (atomic_load(&pool->sleepers) > 0) {
      pthread_mutex_lock(&pool->pool_mu);
      pthread_cond_broadcast(&pool->pool_cv);
      pthread_mutex_unlock(&pool->pool_mu);
    }
  }
  work_on(job, pool->scratch);
  /* The barrier: every chunk was taken; wait for the helpers still running theirs. */
  wait_helpers_idle(pool);
  int failed = atomic_load(&job->failed);
  return failed ? (uint32_t)(failed - 1) : GROUP_OK;
}

/* ---- backend hooks ------------------------------------------------------------------------------- */

/* Runs each concurrent group (a run of dispatches with one group index) to its end before the next. */
static void cpu_run(void *state, mlxn_command *cmd) {
  cpu_pool *pool = state;
  cmd->t_start = mlxn_now_ns();
  for (uint32_t first = 0, last; first < cmd->n_dispatches && cmd->error_code == 0; first = last) {
    for (last = first + 1; last < cmd->n_dispatches && cmd->dispatches[last].group == cmd->dispatches[first].group;)
      last++;
    uint32_t r = pool->scratch ? run_group(pool, &cmd->dispatches[first], last - first) : GROUP_OUT_OF_MEMORY;
    if (r == GROUP_OUT_OF_MEMORY)
      mlxn_command_fail(cmd, MLXN_E_OUT_OF_MEMORY, "out of memory while executing the command buffer");
    else if (r != GROUP_OK)
      mlxn_command_dispatch_failed(cmd, first + r, NULL);
  }
  cmd->t_end = mlxn_now_ns();
}

static void cpu_close(void *state) {
  cpu_pool *pool = state;
  if (!pool) return;
  pthread_mutex_lock(&pool->pool_mu);
  atomic_store(&pool->pool_stop, 1);
  pthread_cond_broadcast(&pool->pool_cv);
  pthread_mutex_unlock(&pool->pool_mu);
  for (uint32_t i = 0; i < pool->n_helpers; i++) pthread_join(pool->helpers[i], NULL);
  free(pool->helpers);
  for (int i = 0; i < 2; i++) free(pool->jobs[i].prefix);
  free(pool->scratch);
  pthread_mutex_destroy(&pool->pool_mu);
  pthread_cond_destroy(&pool->pool_cv);
  free(pool);
}

static int32_t cpu_open(void **state, uint32_t flags, uint32_t threads, mlxn_backend_config *config, char *err,
                        size_t cap) {
  (void)flags;
  if (threads == 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    threads = n > 0 ? (uint32_t)n : 1;
  }
  cpu_pool *pool = calloc(1, sizeof *pool);
  if (!pool) return snprintf(err, cap, "out of memory opening the CPU device"), MLXN_E_OUT_OF_MEMORY;
  pool->scratch = alloc_scratch();
  pthread_mutex_init(&pool->pool_mu, NULL);
  pthread_cond_init(&pool->pool_cv, NULL);
  if (threads > 1) {
    pool->helpers = calloc(threads - 1, sizeof(pthread_t));
    for (uint32_t i = 0; pool->helpers && i + 1 < threads; i++) {
      if (pthread_create(&pool->helpers[i], NULL, helper_main, pool) != 0) break;
      pool->n_helpers++;
    }
  }
  pool->n_workers = pool->n_helpers + 1;
  *state = pool;
  /* MLXN_CPU_PIPELINED=1 runs this backend through the core's launch/complete path (the one CUDA
   * uses): the work runs at launch (the default launch is run) and completion happens on the
   * completion thread, so the suite can check that path's ordering, waits, frees and close on a
   * machine without a GPU. */
  const char *pipelined = getenv("MLXN_CPU_PIPELINED");
  if (pipelined && strcmp(pipelined, "1") == 0) config->max_in_flight = 2;
  return MLXN_OK;
}

static uint32_t cpu_info(void *state, char *buf, uint32_t cap) {
  cpu_pool *pool = state;
  return (uint32_t)snprintf(buf, cap,
                            "\"name\":\"CPU (%u threads)\",\"threads\":%u,\"unifiedMemory\":true,"
                            "\"perDispatchTiming\":true",
                            pool->n_workers, pool->n_workers);
}

/* This backend's object for a kernel is its entry in the CPU body table (NULL: no body). */
static const void *cpu_kernel(void *state, const mlxn_contract *contract) {
  (void)state;
  return contract->id < MLXN_KERNEL_COUNT && mlxn_cpu_runs[contract->id] ? &mlxn_cpu_runs[contract->id] : NULL;
}

/* Host memory, the core's defaults: no alloc, free or copy hook. */
const mlxn_backend_ops mlxn_backend = {
    .name = "cpu",
    .open = cpu_open,
    .close = cpu_close,
    .info = cpu_info,
    .kernel = cpu_kernel,
    .run = cpu_run,
};
