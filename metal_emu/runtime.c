/* Threadgroup execution with Metal semantics (see runtime.h): fibers, threadgroup barriers and
 * SIMD-group exchanges. On x86-64 a fiber switch is a few instructions (callee-saved registers and
 * the FP control words); elsewhere (other CPUs, Mach-O, or -DMLXN_EMU_UCONTEXT) ucontext is used. */
#define _GNU_SOURCE
#if defined(__APPLE__)
#define _XOPEN_SOURCE 700 /* macOS declares the ucontext functions only with it */
#endif
#include "runtime.h"

#include "../native/mlxn.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#if defined(__x86_64__) && defined(__ELF__) && !defined(MLXN_EMU_UCONTEXT)
#define MLXN_EMU_ASM_SWITCH 1
#else
#include <ucontext.h>
#endif

#define STACK_BYTES (64u * 1024u) /* per thread of a group; kernels keep arrays on the stack */
#define SLOT_BYTES 32u             /* one lane's value in an exchange (up to a 32-byte vector) */
#define STACK_CANARY 0x6d6c786e5f656d75ull /* at the lowest address of each stack */
#define MLXN_EMU_MAX_TG_VARIABLES 64u

enum { READY = 0, AT_SIMD = 1, AT_BARRIER = 2, DONE = 3 };

typedef struct emu_thread {
#if MLXN_EMU_ASM_SWITCH
  void *sp;
#else
  ucontext_t ctx;
#endif
  uint8_t *stack;
  uint32_t state, op, parity;
  uint32_t tg_var_next; /* index of the next threadgroup variable this thread declares */
  const void *site; /* the call site of the exchange the thread waits at */
  uint32_t flat, sg, lane;
  uint32_t pos[MLXN_EMU_POSITION_COUNT][3];
} emu_thread;

/* One SIMD-group's exchange: two alternating buffers, so that a lane that leaves an exchange and
 * starts the next never overwrites values a slower lane is still reading. */
typedef struct emu_simdgroup {
  uint8_t slots[2][MLXN_EMU_SIMD_WIDTH][SLOT_BYTES];
  uint32_t active[2];
  uint32_t live, waiting;
} emu_simdgroup;

struct mlxn_emu_worker {
  uint32_t max_threads;
  emu_thread *threads;
  emu_simdgroup *sgs;
  uint8_t *stacks;
  size_t stacks_len;
  uint8_t *tg_memory;
  /* the group being run */
  const mlxn_emu_launch *launch;
  void *tg_slots[MLXN_EMU_SLOTS];
  emu_thread *current;
  uint32_t live, at_barrier;
  const char *undefined; /* the first undefined behaviour a kernel performed in this group */
  /* threadgroup variables declared in the kernel: allocations in order of declaration */
  uint8_t *tg_vars;
  uint32_t tg_var_offsets[MLXN_EMU_MAX_TG_VARIABLES];
  uint32_t n_tg_vars, tg_vars_used, tg_param_bytes;
  uint8_t tg_fill;
#if MLXN_EMU_ASM_SWITCH
  void *sched_sp;
#else
  ucontext_t sched;
#endif
};

static __thread mlxn_emu_worker *tls_worker;

/* ---- fibers ------------------------------------------------------------------------------------ */

static void fiber_main(emu_thread *t);

#if MLXN_EMU_ASM_SWITCH
void mlxn_emu_switch(void **save_sp, void *to_sp);
void mlxn_emu_fiber_start(void);
__asm__(".text\n"
        ".globl mlxn_emu_switch\n.hidden mlxn_emu_switch\n.type mlxn_emu_switch,@function\n"
        "mlxn_emu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size mlxn_emu_switch, .-mlxn_emu_switch\n"
        ".globl mlxn_emu_fiber_start\n.hidden mlxn_emu_fiber_start\n.type mlxn_emu_fiber_start,@function\n"
        "mlxn_emu_fiber_start:\n"
        "  movq %r12, %rdi\n  callq *%r13\n  ud2\n"
        ".size mlxn_emu_fiber_start, .-mlxn_emu_fiber_start\n");

/* A fresh stack whose first switch "returns" into mlxn_emu_fiber_start, which calls fiber_main(t). */
static void fiber_init(emu_thread *t) {
  uintptr_t top = ((uintptr_t)t->stack + STACK_BYTES) & ~(uintptr_t)15;
  uint64_t *sp = (uint64_t *)(top - 80);
  uint32_t csr = 0x1f80u, fcw = 0x037fu; /* default MXCSR and x87 control word */
  memcpy(&sp[0], &csr, 4);
  memcpy((uint8_t *)&sp[0] + 4, &fcw, 2);
  sp[1] = 0;                          /* r15 */
  sp[2] = 0;                          /* r14 */
  sp[3] = (uint64_t)(uintptr_t)fiber_main; /* r13 */
  sp[4] = (uint64_t)(uintptr_t)t;     /* r12 */
  sp[5] = 0;                          /* rbx */
  sp[6] = 0;                          /* rbp */
  sp[7] = (uint64_t)(uintptr_t)mlxn_emu_fiber_start;
  t->sp = sp;
}
static void to_fiber(mlxn_emu_worker *w, emu_thread *t) { mlxn_emu_switch(&w->sched_sp, t->sp); }
static void to_scheduler(mlxn_emu_worker *w, emu_thread *t) { mlxn_emu_switch(&t->sp, w->sched_sp); }
#else
static void fiber_entry(unsigned lo, unsigned hi) {
  fiber_main((emu_thread *)(((uintptr_t)hi << 32) | (uintptr_t)lo));
}
static void fiber_init(emu_thread *t) {
  getcontext(&t->ctx);
  t->ctx.uc_stack.ss_sp = t->stack;
  t->ctx.uc_stack.ss_size = STACK_BYTES;
  t->ctx.uc_link = NULL;
  uintptr_t p = (uintptr_t)t;
  makecontext(&t->ctx, (void (*)(void))fiber_entry, 2, (unsigned)(p & 0xffffffffu), (unsigned)(p >> 32));
}
static void to_fiber(mlxn_emu_worker *w, emu_thread *t) { swapcontext(&w->sched, &t->ctx); }
static void to_scheduler(mlxn_emu_worker *w, emu_thread *t) { swapcontext(&t->ctx, &w->sched); }
#endif

static void fiber_main(emu_thread *t) {
  mlxn_emu_worker *w = tls_worker;
  const mlxn_emu_launch *l = w->launch;
  l->kernel->entry(l->buffers, w->tg_slots, (const unsigned(*)[3])t->pos);
  t->state = DONE;
  w->live--;
  w->sgs[t->sg].live--;
  to_scheduler(w, t);
  abort(); /* a finished fiber is never resumed */
}

/* ---- what the kernels call (declared in include/metal_stdlib) ------------------------------------ */

__attribute__((visibility("hidden"))) const unsigned char *mlxn_emu_simd_exchange(const void *value, unsigned size,
                                                                                  unsigned op, unsigned *active) {
  mlxn_emu_worker *w = tls_worker;
  emu_thread *t = w->current;
  emu_simdgroup *g = &w->sgs[t->sg];
  uint32_t parity = t->parity;
  memcpy(g->slots[parity][t->lane], value, size < SLOT_BYTES ? size : SLOT_BYTES);
  t->state = AT_SIMD;
  t->op = op;
  t->site = __builtin_return_address(0);
  g->waiting++;
  to_scheduler(w, t);
  t->parity = parity ^ 1u;
  *active = g->active[parity];
  return &g->slots[parity][0][0];
}

__attribute__((visibility("hidden"))) void mlxn_emu_threadgroup_barrier(unsigned flags) {
  (void)flags; /* every flag orders memory the same way here: all threads share one address space */
  mlxn_emu_worker *w = tls_worker;
  emu_thread *t = w->current;
  t->state = AT_BARRIER;
  w->at_barrier++;
  to_scheduler(w, t);
}

__attribute__((visibility("hidden"))) void mlxn_emu_simdgroup_barrier(unsigned flags) {
  (void)flags;
  unsigned active;
  uint8_t none = 0;
  mlxn_emu_simd_exchange(&none, 1, 0, &active);
}

__attribute__((visibility("hidden"))) unsigned mlxn_emu_lane(void) { return tls_worker->current->lane; }

__attribute__((visibility("hidden"))) void mlxn_emu_undefined(const char *what) {
  if (!tls_worker->undefined) tls_worker->undefined = what;
}

__attribute__((visibility("hidden"))) void *mlxn_emu_threadgroup_variable(unsigned long size, unsigned long align) {
  mlxn_emu_worker *w = tls_worker;
  emu_thread *t = w->current;
  uint32_t k = t->tg_var_next++;
  if (k < w->n_tg_vars) return w->tg_vars + w->tg_var_offsets[k];
  /* The first thread to reach the k-th declaration allocates it; the others reuse it. */
  uint64_t at = ((uint64_t)w->tg_vars_used + align - 1) / align * align;
  if (k != w->n_tg_vars || k >= MLXN_EMU_MAX_TG_VARIABLES ||
      at + size + w->tg_param_bytes > MLXN_MAX_TG_MEMORY) {
    mlxn_emu_undefined(k != w->n_tg_vars ? "threads of one threadgroup declared threadgroup variables in different orders"
                                         : "the kernel's threadgroup variables and threadgroup memory exceed 32 KiB");
    return w->tg_vars; /* the dispatch fails when the fiber yields */
  }
  w->tg_var_offsets[k] = (uint32_t)at;
  w->tg_vars_used = (uint32_t)(at + size);
  w->n_tg_vars++;
  memset(w->tg_vars + at, w->tg_fill, size);
  return w->tg_vars + at;
}


/* The conversions clang emits for `half` (__fp16) on targets without them in hardware: IEEE
 * binary16, round to nearest even, as the GPU converts. */
__attribute__((visibility("hidden"))) float __gnu_h2f_ieee(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0) { /* zero or subnormal: man · 2^-24, exact in f32 */
    float v = (float)man * 0x1p-24f;
    memcpy(&bits, &v, 4);
    bits |= sign;
  } else if (exp == 0x1fu) { /* Inf or NaN (payload kept) */
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127u - 15u) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
__attribute__((visibility("hidden"))) uint16_t __gnu_f2h_ieee(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN, quieted */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);                      /* rounds to >= 65520: Inf */
  if (a < 0x38800000u) { /* below 2^-14: a multiple of 2^-24, rounded to nearest even */
    float v;
    memcpy(&v, &a, 4);
    v *= 0x1p24f;                   /* exact: a power-of-two scale */
    v = (v + 0x1p23f) - 0x1p23f;    /* rounds to an integer, ties to even (the default rounding mode) */
    return (uint16_t)(sign | (uint32_t)v); /* 1024 is the smallest normal's encoding */
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u); /* round to nearest even at bit 13 */
  return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

/* ---- the scheduler --------------------------------------------------------------------------------- */

mlxn_emu_worker *mlxn_emu_worker_new(uint32_t max_threads) {
  mlxn_emu_worker *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  uint32_t nsg = (max_threads + MLXN_EMU_SIMD_WIDTH - 1) / MLXN_EMU_SIMD_WIDTH;
  w->max_threads = max_threads;
  w->threads = calloc(max_threads, sizeof *w->threads);
  w->sgs = calloc(nsg, sizeof *w->sgs);
  w->tg_memory = aligned_alloc(64, MLXN_MAX_TG_MEMORY);
  w->tg_vars = aligned_alloc(64, MLXN_MAX_TG_MEMORY);
  /* One mapping for every stack (no guard pages: a mapping each would exhaust the process's map
   * count); only the pages a kernel touches are committed. Overflow is caught by a canary. */
  w->stacks_len = (size_t)STACK_BYTES * max_threads;
  void *m = mmap(NULL, w->stacks_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED || !w->threads || !w->sgs || !w->tg_memory || !w->tg_vars) {
    if (m != MAP_FAILED) munmap(m, w->stacks_len);
    w->stacks = NULL;
    mlxn_emu_worker_free(w);
    return NULL;
  }
  w->stacks = m;
  for (uint32_t i = 0; i < max_threads; i++) w->threads[i].stack = w->stacks + (size_t)STACK_BYTES * i;
  return w;
}

void mlxn_emu_worker_free(mlxn_emu_worker *w) {
  if (!w) return;
  if (w->stacks) munmap(w->stacks, w->stacks_len);
  free(w->threads);
  free(w->sgs);
  free(w->tg_memory);
  free(w->tg_vars);
  free(w);
}

/* Releases every SIMD-group whose live lanes all wait at an exchange; returns how many were. On a
 * divergent exchange (lanes at different operations) writes the reason and returns -1. */
static int release_simdgroups(mlxn_emu_worker *w, uint32_t n, char *err, size_t cap) {
  int released = 0;
  uint32_t nsg = (n + MLXN_EMU_SIMD_WIDTH - 1) / MLXN_EMU_SIMD_WIDTH;
  for (uint32_t s = 0; s < nsg; s++) {
    emu_simdgroup *g = &w->sgs[s];
    if (g->waiting == 0 || g->waiting != g->live) continue;
    emu_thread *first = NULL;
    uint32_t mask = 0, end = (s + 1) * MLXN_EMU_SIMD_WIDTH < n ? (s + 1) * MLXN_EMU_SIMD_WIDTH : n;
    for (uint32_t i = s * MLXN_EMU_SIMD_WIDTH; i < end; i++) {
      emu_thread *t = &w->threads[i];
      if (t->state != AT_SIMD) continue;
      if (!first) first = t;
      /* Lanes at different calls (or at the same call a different number of times) would be
       * grouped by the GPU's reconvergence, which this emulator does not model: report it. */
      if (t->op != first->op || t->site != first->site || t->parity != first->parity) {
        snprintf(err, cap,
                 "SIMD-group %u: lanes %u and %u wait at different SIMD-group function calls (divergent "
                 "control flow around simd_*: make the call uniform across the SIMD-group)",
                 s, first->lane, t->lane);
        return -1;
      }
      mask |= 1u << t->lane;
    }
    g->active[first->parity] = mask;
    g->waiting = 0;
    for (uint32_t i = s * MLXN_EMU_SIMD_WIDTH; i < end; i++)
      if (w->threads[i].state == AT_SIMD) w->threads[i].state = READY;
    released++;
  }
  return released;
}

int mlxn_emu_run_group(mlxn_emu_worker *w, const mlxn_emu_launch *l, uint32_t gx, uint32_t gy, uint32_t gz,
                       int order, uint8_t tg_fill, char *err, size_t cap) {
  const uint32_t tx = l->tg[0], ty = l->tg[1], tz = l->tg[2];
  const uint32_t n = tx * ty * tz, nsg = (n + MLXN_EMU_SIMD_WIDTH - 1) / MLXN_EMU_SIMD_WIDTH;
  if (n == 0 || n > w->max_threads) {
    snprintf(err, cap, "%u threads per threadgroup (the emulated device runs 1-%u)", n, w->max_threads);
    return -1;
  }
  tls_worker = w;
  w->launch = l;
  memset(w->tg_slots, 0, sizeof w->tg_slots);
  if (l->tg_memory > 0) {
    memset(w->tg_memory, tg_fill, l->tg_memory);
    w->tg_slots[0] = w->tg_memory;
  }
  w->live = n;
  w->at_barrier = 0;
  w->undefined = NULL;
  w->n_tg_vars = w->tg_vars_used = 0;
  w->tg_param_bytes = l->tg_memory;
  w->tg_fill = tg_fill;
  for (uint32_t s = 0; s < nsg; s++) {
    w->sgs[s].live = s + 1 < nsg ? MLXN_EMU_SIMD_WIDTH : n - s * MLXN_EMU_SIMD_WIDTH;
    w->sgs[s].waiting = 0;
  }
  const uint32_t gid[3] = {gx, gy, gz};
  for (uint32_t i = 0; i < n; i++) {
    emu_thread *t = &w->threads[i];
    uint32_t lid[3] = {i % tx, (i / tx) % ty, i / (tx * ty)};
    t->state = READY;
    t->parity = 0;
    t->tg_var_next = 0;
    t->flat = i;
    t->sg = i / MLXN_EMU_SIMD_WIDTH;
    t->lane = i % MLXN_EMU_SIMD_WIDTH;
    for (int d = 0; d < 3; d++) {
      t->pos[MLXN_EMU_THREAD_POSITION_IN_GRID][d] = gid[d] * l->tg[d] + lid[d];
      t->pos[MLXN_EMU_THREADGROUP_POSITION_IN_GRID][d] = gid[d];
      t->pos[MLXN_EMU_THREAD_POSITION_IN_THREADGROUP][d] = lid[d];
      t->pos[MLXN_EMU_THREADS_PER_THREADGROUP][d] = l->tg[d];
      t->pos[MLXN_EMU_THREADGROUPS_PER_GRID][d] = l->groups[d];
      t->pos[MLXN_EMU_THREADS_PER_GRID][d] = l->groups[d] * l->tg[d];
    }
    uint32_t scalars[][2] = {
        {MLXN_EMU_THREAD_INDEX_IN_THREADGROUP, i},     {MLXN_EMU_SIMDGROUP_INDEX_IN_THREADGROUP, t->sg},
        {MLXN_EMU_THREAD_INDEX_IN_SIMDGROUP, t->lane}, {MLXN_EMU_THREADS_PER_SIMDGROUP, MLXN_EMU_SIMD_WIDTH},
        {MLXN_EMU_SIMDGROUPS_PER_THREADGROUP, nsg},    {MLXN_EMU_THREAD_EXECUTION_WIDTH, MLXN_EMU_SIMD_WIDTH},
    };
    for (size_t k = 0; k < sizeof scalars / sizeof scalars[0]; k++) {
      t->pos[scalars[k][0]][0] = scalars[k][1];
      t->pos[scalars[k][0]][1] = t->pos[scalars[k][0]][2] = 0;
    }
    memcpy(t->stack, &(uint64_t){STACK_CANARY}, sizeof(uint64_t));
    fiber_init(t);
  }
  for (;;) {
    for (uint32_t k = 0; k < n; k++) {
      emu_thread *t = &w->threads[order == MLXN_EMU_ORDER_REVERSE ? n - 1 - k : k];
      if (t->state != READY) continue;
      w->current = t;
      to_fiber(w, t);
    }
    w->current = NULL;
    if (w->undefined) {
      snprintf(err, cap, "threadgroup (%u,%u,%u): %s", gx, gy, gz, w->undefined);
      return -1;
    }
    for (uint32_t i = 0; i < n; i++) {
      uint64_t canary;
      memcpy(&canary, w->threads[i].stack, sizeof canary);
      if (canary != STACK_CANARY) {
        /* The neighbouring stacks may be damaged too: nothing of this group can be trusted. */
        snprintf(err, cap, "thread %u of threadgroup (%u,%u,%u) overflowed its %u KiB stack (large arrays in the "
                 "kernel's thread memory)", i, gx, gy, gz, STACK_BYTES / 1024);
        return -1;
      }
    }
    if (w->live == 0) return 0;
    int released = release_simdgroups(w, n, err, cap);
    if (released < 0) return -1;
    if (released > 0) continue;
    if (w->at_barrier == w->live && w->live < n) {
      snprintf(err, cap,
               "threadgroup (%u,%u,%u): threadgroup_barrier reached by %u of its %u threads, the others returned "
               "(every thread of a threadgroup must reach each barrier)",
               gx, gy, gz, w->live, n);
      return -1;
    }
    if (w->at_barrier == w->live) {
      for (uint32_t i = 0; i < n; i++)
        if (w->threads[i].state == AT_BARRIER) w->threads[i].state = READY;
      w->at_barrier = 0;
      continue;
    }
    uint32_t simd = 0;
    for (uint32_t i = 0; i < n; i++) simd += w->threads[i].state == AT_SIMD;
    snprintf(err, cap,
             "threadgroup (%u,%u,%u) cannot proceed: %u of its %u live threads wait at threadgroup_barrier, %u at "
             "a simd_* operation that other lanes of their SIMD-group never reach (a barrier or SIMD-group "
             "operation in divergent control flow)",
             gx, gy, gz, w->at_barrier, w->live, simd);
    return -1;
  }
}
