/* The emulated Metal backend: fills in the native core's backend table (native/core/backend.h) by running
 * the MSL kernels, compiled as C++ by metal_emu/msl_front.ts, with Metal's execution model
 * (runtime.h). Bindings follow objc/mlxn_metal.m exactly: slot i of the kernel contract is
 * [[buffer(i)]] (inline bytes as a private copy, an unbound optional slot as the fault word), the
 * thread grid is [[buffer(28)]], the dispatch tag [[buffer(29)]], the fault word [[buffer(30)]],
 * and threadgroup memory index 0 gets the dispatch's length (raised to one float per thread for the
 * kernels that reduce through it), rounded up to 16 bytes. The threadgroups of one concurrent group
 * run on a worker pool; a barrier waits for all of them. MLXN_EMU_CHECK=1 runs every dispatch twice
 * (threadgroups and their threads in opposite orders, threadgroup memory starting as different
 * bytes) and fails a dispatch whose output differs: a race on threadgroup memory or between
 * threadgroups, or a read of uninitialised threadgroup memory. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../native/core/backend.h"
#include "runtime.h"

/* The extra argument slots every MSL kernel receives (kernels/metal/common.metal). */
enum { SLOT_GRID = 28, SLOT_TAG = 29, SLOT_FAULT = 30 };

#define MAX_KERNELS 512u

/* This backend's object for a kernel (mlxn_dispatch.kernel): its MSL and the slots it may declare. */
typedef struct kernel_entry {
  const mlxn_emu_kernel *msl;
  uint32_t allowed; /* [[buffer(n)]] indices the host binds for this contract */
} kernel_entry;

typedef struct dispatch_consts {
  uint32_t grid[4];
  uint32_t tag;
} dispatch_consts;

typedef struct emu_job {
  mlxn_emu_launch *launches;
  mlxn_dispatch *dispatches; /* launches[i] runs dispatches[i] */
  uint64_t *prefix; /* prefix[i] = threadgroups before launch i */
  uint32_t count;
  uint64_t total;
  int order;
  uint8_t fill;
  _Atomic uint64_t next;
  _Atomic uint32_t failed; /* index + 1 of the first launch that failed */
  pthread_mutex_t err_mu;
  char err[384];
} emu_job;

typedef struct emu_state {
  kernel_entry kernels[MAX_KERNELS];
  uint32_t n_kernels;
  uint32_t flags; /* the device's MLXN_FLAG_* */
  uint32_t n_workers;
  mlxn_emu_worker **workers; /* [0] is the queue thread's */
  pthread_t *helpers;
  uint32_t n_helpers;
  pthread_mutex_t mu;
  pthread_cond_t start_cv, done_cv;
  uint64_t seq;
  uint32_t busy;
  int stop;
  emu_job job;
  /* per command buffer, grown as needed */
  mlxn_emu_launch *launches;
  dispatch_consts *consts;
  uint64_t *prefix;
  uint32_t cap;
  _Atomic uint32_t fault; /* tag + 1 of a dispatch whose kernel reported failure */
  uint32_t fault_pad[7];  /* an unbound optional slot points here too: never read, but in bounds */
  int check;
} emu_state;

/* ---- worker pool ------------------------------------------------------------------------------------ */

static void work_on(emu_job *job, mlxn_emu_worker *w) {
  uint32_t di = 0;
  char err[sizeof job->err];
  for (;;) {
    if (atomic_load_explicit(&job->failed, memory_order_relaxed)) return;
    uint64_t idx = atomic_fetch_add(&job->next, 1);
    if (idx >= job->total) return;
    /* The reverse schedule also takes the threadgroups last to first. */
    if (job->order == MLXN_EMU_ORDER_REVERSE) {
      idx = job->total - 1 - idx;
      di = 0;
    }
    while (job->prefix[di + 1] <= idx) di++;
    const mlxn_emu_launch *l = &job->launches[di];
    uint64_t local = idx - job->prefix[di];
    uint32_t gx = (uint32_t)(local % l->groups[0]);
    uint64_t rest = local / l->groups[0];
    uint32_t gy = (uint32_t)(rest % l->groups[1]), gz = (uint32_t)(rest / l->groups[1]);
    uint64_t t0 = mlxn_now_ns();
    int rc = mlxn_emu_run_group(w, l, gx, gy, gz, job->order, job->fill, err, sizeof err);
    uint64_t t1 = mlxn_now_ns();
    mlxn_dispatch_span(&job->dispatches[di], t0, t1);
    if (rc != 0) {
      pthread_mutex_lock(&job->err_mu);
      if (atomic_load(&job->failed) == 0) {
        snprintf(job->err, sizeof job->err, "%s", err);
        atomic_store(&job->failed, di + 1);
      }
      pthread_mutex_unlock(&job->err_mu);
      return;
    }
  }
}

static void *helper_main(void *arg) {
  void **a = arg;
  emu_state *s = a[0];
  mlxn_emu_worker *w = a[1];
  free(arg);
  uint64_t seen = 0;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (s->seq == seen && !s->stop) pthread_cond_wait(&s->start_cv, &s->mu);
    if (s->stop) break;
    seen = s->seq;
    pthread_mutex_unlock(&s->mu);
    work_on(&s->job, w);
    pthread_mutex_lock(&s->mu);
    if (--s->busy == 0) pthread_cond_signal(&s->done_cv);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* Runs launches[0..count) as one concurrent group; returns the failed launch's index + 1, or 0. */
static uint32_t run_concurrent(emu_state *s, mlxn_emu_launch *launches, mlxn_dispatch *dispatches, uint32_t count,
                               uint64_t *prefix, int order, uint8_t fill) {
  emu_job *job = &s->job;
  job->launches = launches;
  job->dispatches = dispatches;
  job->prefix = prefix;
  job->count = count;
  prefix[0] = 0;
  for (uint32_t i = 0; i < count; i++)
    prefix[i + 1] = prefix[i] + (uint64_t)launches[i].groups[0] * launches[i].groups[1] * launches[i].groups[2];
  job->total = prefix[count];
  job->order = order;
  job->fill = fill;
  atomic_store(&job->next, 0);
  atomic_store(&job->failed, 0);
  int helpers = s->n_helpers > 0 && job->total > 1;
  if (helpers) {
    pthread_mutex_lock(&s->mu);
    s->busy = s->n_helpers;
    s->seq++;
    pthread_cond_broadcast(&s->start_cv);
    pthread_mutex_unlock(&s->mu);
  }
  work_on(job, s->workers[0]);
  if (helpers) {
    pthread_mutex_lock(&s->mu);
    while (s->busy > 0) pthread_cond_wait(&s->done_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
  }
  return atomic_load(&job->failed);
}

/* ---- binding a dispatch as objc/mlxn_metal.m does -------------------------------------------------- */

/* Threadgroup memory a kernel reduces through, at least (its contract's rule): f32s per thread. */
static uint64_t threadgroup_floats_bytes(const mlxn_contract *k, uint64_t threads) {
  return threads * sizeof(float) * k->tg_floats_per_thread;
}

/* Fills the launch of a decoded dispatch; returns 0 or writes why the binding is impossible. */
static int bind_dispatch(emu_state *s, const mlxn_dispatch *d, mlxn_emu_launch *l, dispatch_consts *c, char *err,
                         size_t cap) {
  const kernel_entry *e = d->kernel;
  const mlxn_emu_kernel *k = e->msl;
  uint32_t stray = k->buffers & ~e->allowed;
  if (stray) {
    return snprintf(err, cap,
                    "kernel %s declares [[buffer(%d)]], a slot the host never binds for this contract (%zu slots)",
                    d->contract->name, __builtin_ctz(stray), strlen(d->contract->signature)),
           -1;
  }
  uint64_t threads = (uint64_t)d->args.tg[0] * d->args.tg[1] * d->args.tg[2];
  if (threads > MLXN_MAX_THREADS_PER_GROUP) {
    return snprintf(err, cap, "kernel %s: %llu threads per threadgroup exceed this pipeline's %d", d->contract->name,
                    (unsigned long long)threads, MLXN_MAX_THREADS_PER_GROUP),
           -1;
  }
  uint64_t tgmem = d->args.tg_memory;
  if (tgmem < threadgroup_floats_bytes(d->contract, threads)) tgmem = threadgroup_floats_bytes(d->contract, threads);
  tgmem = (tgmem + 15) & ~(uint64_t)15;
  if (k->tg_slots & ~1u) {
    return snprintf(err, cap, "kernel %s declares [[threadgroup(%d)]]: the host sets threadgroup memory index 0 only",
                    d->contract->name, __builtin_ctz(k->tg_slots & ~1u)),
           -1;
  }
  if ((k->tg_slots & 1u) && tgmem == 0) {
    return snprintf(err, cap, "kernel %s declares [[threadgroup(0)]] but the dispatch sets no threadgroup memory",
                    d->contract->name),
           -1;
  }
  if (tgmem > MLXN_MAX_TG_MEMORY) {
    return snprintf(err, cap, "kernel %s: %llu bytes of threadgroup memory exceed the device's %d", d->contract->name,
                    (unsigned long long)tgmem, MLXN_MAX_TG_MEMORY),
           -1;
  }
  memset(l->buffers, 0, sizeof l->buffers);
  const char *sig = d->contract->signature;
  for (uint32_t slot = 0; sig[slot] && slot < MLXN_KERNEL_SLOTS; slot++) {
    if (sig[slot] == 'c' || d->args.ptr[slot]) l->buffers[slot] = d->args.ptr[slot];
    else l->buffers[slot] = (void *)&s->fault; /* an unbound optional slot: never read */
  }
  c->grid[0] = d->args.grid[0];
  c->grid[1] = d->args.grid[1];
  c->grid[2] = d->args.grid[2];
  c->grid[3] = 0;
  c->tag = d->tag;
  l->buffers[SLOT_GRID] = c->grid;
  l->buffers[SLOT_TAG] = &c->tag;
  l->buffers[SLOT_FAULT] = (void *)&s->fault;
  l->kernel = k;
  for (int i = 0; i < 3; i++) {
    l->tg[i] = d->args.tg[i];
    l->groups[i] = d->args.groups[i];
  }
  l->tg_memory = (uint32_t)tgmem;
  return 0;
}

/* ---- the checker: the same dispatch in two schedules must write the same bytes --------------------- */

typedef struct snapshot {
  uint8_t *bytes[MLXN_KERNEL_SLOTS];
} snapshot;

static int snapshot_take(const mlxn_dispatch *d, snapshot *sn) {
  memset(sn, 0, sizeof *sn);
  for (uint32_t slot = 0; d->contract->signature[slot] && slot < MLXN_KERNEL_SLOTS; slot++) {
    if (d->contract->signature[slot] == 'c' || !d->args.ptr[slot]) continue;
    sn->bytes[slot] = malloc(d->args.len[slot] ? (size_t)d->args.len[slot] : 1);
    if (!sn->bytes[slot]) return -1;
    memcpy(sn->bytes[slot], d->args.ptr[slot], (size_t)d->args.len[slot]);
  }
  return 0;
}

static void snapshot_free(snapshot *sn) {
  for (int i = 0; i < MLXN_KERNEL_SLOTS; i++) free(sn->bytes[i]);
}

/* Runs one dispatch in both schedules; returns 0, or -1 with the reason in err. */
static int run_checked(emu_state *s, mlxn_dispatch *d, mlxn_emu_launch *l, char *err, size_t cap) {
  snapshot before, first;
  uint64_t prefix[2];
  int rc = -1;
  if (snapshot_take(d, &before) != 0) {
    snapshot_free(&before);
    return snprintf(err, cap, "out of memory in the checker"), -1;
  }
  if (run_concurrent(s, l, d, 1, prefix, MLXN_EMU_ORDER_FORWARD, 0x00) != 0) {
    snprintf(err, cap, "%s", s->job.err);
    snapshot_free(&before);
    return -1;
  }
  if (snapshot_take(d, &first) != 0) {
    snprintf(err, cap, "out of memory in the checker");
    goto out;
  }
  for (int slot = 0; slot < MLXN_KERNEL_SLOTS; slot++)
    if (before.bytes[slot]) memcpy(d->args.ptr[slot], before.bytes[slot], (size_t)d->args.len[slot]);
  if (run_concurrent(s, l, d, 1, prefix, MLXN_EMU_ORDER_REVERSE, 0xff) != 0) {
    snprintf(err, cap, "%s", s->job.err);
    goto out;
  }
  rc = 0;
  for (int slot = 0; slot < MLXN_KERNEL_SLOTS && rc == 0; slot++) {
    if (!first.bytes[slot] || memcmp(first.bytes[slot], d->args.ptr[slot], (size_t)d->args.len[slot]) == 0) continue;
    uint64_t at = 0;
    while (first.bytes[slot][at] == d->args.ptr[slot][at]) at++;
    snprintf(err, cap,
             "checker: slot %d differs at byte %llu between two schedules of the same dispatch: the kernel races "
             "on threadgroup memory (a missing threadgroup_barrier), races between threads or threadgroups on "
             "device memory, or reads threadgroup memory it never wrote",
             slot, (unsigned long long)at);
    rc = -1;
  }
out:
  snapshot_free(&before);
  snapshot_free(&first);
  return rc;
}

/* ---- backend hooks ---------------------------------------------------------------------------------- */

static int grow(emu_state *s, uint32_t n) {
  if (n <= s->cap) return 0;
  uint32_t cap = n * 2;
  mlxn_emu_launch *l = realloc(s->launches, cap * sizeof *l);
  if (l) s->launches = l;
  dispatch_consts *c = realloc(s->consts, cap * sizeof *c);
  if (c) s->consts = c;
  uint64_t *p = realloc(s->prefix, (cap + 1) * sizeof *p);
  if (p) s->prefix = p;
  if (!l || !c || !p) return -1;
  s->cap = cap;
  return 0;
}

static void emu_run(void *state, mlxn_command *cmd) {
  emu_state *s = state;
  cmd->t_start = mlxn_now_ns();
  char err[384];
  if (grow(s, cmd->n_dispatches) != 0) {
    mlxn_command_fail(cmd, MLXN_E_OUT_OF_MEMORY, "out of memory while executing the command buffer");
    cmd->t_end = mlxn_now_ns();
    return;
  }
  /* Bindings come from the dispatches alone: no device state is read while the host goes on. */
  for (uint32_t i = 0; i < cmd->n_dispatches && cmd->error_code == 0; i++) {
    if (bind_dispatch(s, &cmd->dispatches[i], &s->launches[i], &s->consts[i], err, sizeof err) != 0)
      mlxn_command_dispatch_failed(cmd, i, err);
  }
  int serial = (s->flags & MLXN_FLAG_SERIAL) != 0;
  for (uint32_t first = 0, end; first < cmd->n_dispatches && cmd->error_code == 0; first = end) {
    for (end = first + 1; end < cmd->n_dispatches && cmd->dispatches[end].group == cmd->dispatches[first].group;)
      end++;
    if (s->check) {
      for (uint32_t i = first; i < end && cmd->error_code == 0; i++)
        if (run_checked(s, &cmd->dispatches[i], &s->launches[i], err, sizeof err) != 0)
          mlxn_command_dispatch_failed(cmd, i, err);
      continue;
    }
    /* A Serial encoder (MLXN_CONCURRENCY=0) runs each dispatch after the previous one. */
    for (uint32_t i = first; i < end && cmd->error_code == 0; i = serial ? i + 1 : end) {
      uint32_t count = serial ? 1 : end - first;
      uint32_t failed =
          run_concurrent(s, &s->launches[i], &cmd->dispatches[i], count, s->prefix, MLXN_EMU_ORDER_FORWARD, 0xff);
      if (failed) mlxn_command_dispatch_failed(cmd, i + failed - 1, s->job.err);
    }
  }
  cmd->t_end = mlxn_now_ns();
  uint32_t fault = atomic_exchange(&s->fault, 0);
  if (fault != 0) mlxn_command_fault(cmd, fault);
}

static int32_t emu_open(void **state, uint32_t flags, uint32_t threads, mlxn_backend_config *config, char *err,
                        size_t cap) {
  (void)config;
  if (threads == 0) { /* one worker per core, at most 16 (each holds 1024 fiber stacks) */
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    threads = n > 16 ? 16 : n > 0 ? (uint32_t)n : 1;
  }
  emu_state *s = calloc(1, sizeof *s);
  if (!s) return snprintf(err, cap, "out of memory opening the emulated Metal device"), MLXN_E_OUT_OF_MEMORY;
  s->flags = flags;
  const char *check = getenv("MLXN_EMU_CHECK");
  s->check = check && strcmp(check, "1") == 0;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->start_cv, NULL);
  pthread_cond_init(&s->done_cv, NULL);
  pthread_mutex_init(&s->job.err_mu, NULL);
  s->workers = calloc(threads, sizeof *s->workers);
  s->helpers = calloc(threads, sizeof *s->helpers);
  if (s->workers) s->workers[0] = mlxn_emu_worker_new(MLXN_MAX_THREADS_PER_GROUP);
  if (!s->workers || !s->helpers || !s->workers[0]) {
    if (s->workers) mlxn_emu_worker_free(s->workers[0]);
    free(s->workers);
    free(s->helpers);
    free(s);
    return snprintf(err, cap, "out of memory opening the emulated Metal device"), MLXN_E_OUT_OF_MEMORY;
  }
  s->n_workers = 1;
  for (uint32_t i = 1; i < threads; i++) {
    mlxn_emu_worker *w = mlxn_emu_worker_new(MLXN_MAX_THREADS_PER_GROUP);
    void **arg = malloc(2 * sizeof(void *));
    if (!w || !arg) {
      mlxn_emu_worker_free(w);
      free(arg);
      break;
    }
    arg[0] = s;
    arg[1] = w;
    if (pthread_create(&s->helpers[s->n_helpers], NULL, helper_main, arg) != 0) {
      mlxn_emu_worker_free(w);
      free(arg);
      break;
    }
    s->workers[s->n_workers++] = w;
    s->n_helpers++;
  }
  *state = s;
  return MLXN_OK;
}

static void emu_close(void *state) {
  emu_state *s = state;
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  s->stop = 1;
  pthread_cond_broadcast(&s->start_cv);
  pthread_mutex_unlock(&s->mu);
  for (uint32_t i = 0; i < s->n_helpers; i++) pthread_join(s->helpers[i], NULL);
  for (uint32_t i = 0; i < s->n_workers; i++) mlxn_emu_worker_free(s->workers[i]);
  free(s->workers);
  free(s->helpers);
  free(s->launches);
  free(s->consts);
  free(s->prefix);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->start_cv);
  pthread_cond_destroy(&s->done_cv);
  pthread_mutex_destroy(&s->job.err_mu);
  free(s);
}

static uint32_t emu_info(void *state, char *buf, uint32_t cap) {
  emu_state *s = state;
  return (uint32_t)snprintf(buf, cap,
                            "\"name\":\"emulated Metal (%u threads%s)\",\"threads\":%u,\"unifiedMemory\":true,"
                            "\"perDispatchTiming\":true,\"simdWidth\":%u,\"checker\":%s",
                            s->n_workers, s->check ? ", checker" : "", s->n_workers, MLXN_EMU_SIMD_WIDTH,
                            s->check ? "true" : "false");
}

/* Pairs a contract with the MSL kernel of the same name (NULL: the library has none). */
static const void *emu_kernel(void *state, const mlxn_contract *contract) {
  emu_state *s = state;
  const mlxn_emu_kernel *msl = NULL;
  for (const mlxn_emu_kernel *e = mlxn_emu_kernels; e->name && !msl; e++)
    if (strcmp(e->name, contract->name) == 0) msl = e;
  if (!msl || s->n_kernels >= MAX_KERNELS) return NULL;
  kernel_entry *k = &s->kernels[s->n_kernels++];
  size_t nsig = strlen(contract->signature);
  k->msl = msl;
  k->allowed = (nsig >= 32 ? 0xffffffffu : (1u << nsig) - 1u) | (1u << SLOT_GRID) | (1u << SLOT_TAG) |
               (1u << SLOT_FAULT);
  return k;
}

/* Host memory, the core's defaults: no alloc, free or copy hook. */
const mlxn_backend_ops mlxn_backend = {
    .name = "metal-emu",
    .open = emu_open,
    .close = emu_close,
    .info = emu_info,
    .kernel = emu_kernel,
    .run = emu_run,
};
