/*
 * What a kernel receives (mlxn_kargs) and the checks its validator is built from: checked size
 * arithmetic, slice, alignment, overlap and geometry checks. Backend-neutral: the core validates every
 * dispatch with these before any backend runs it.
 */
#ifndef MLXN_KERNEL_ARGS_H
#define MLXN_KERNEL_ARGS_H

#include <stddef.h>
#include <stdint.h>

#include "../mlxn.h"

#ifdef __cplusplus
#define MLXN_STATIC_ASSERT static_assert
#else
#define MLXN_STATIC_ASSERT _Static_assert
#endif

/* Every kernel takes at most this many argument slots. */
#define MLXN_KERNEL_SLOTS 12
/* The former name, still used by the backends. */
#define MLXN_CPU_KERNEL_SLOTS MLXN_KERNEL_SLOTS

typedef struct mlxn_kargs {
  /* Slot i: for a buffer, the bound slice; for inline bytes, a private copy. */
  uint8_t *ptr[MLXN_KERNEL_SLOTS];
  uint64_t len[MLXN_KERNEL_SLOTS];
  uint32_t grid[3];   /* threads per dimension (a threadgroup dispatch: groups × threadgroup) */
  uint32_t tg[3];     /* threads per threadgroup */
  uint32_t groups[3]; /* threadgroups per dimension */
  uint32_t tg_memory; /* threadgroup memory bytes requested (index 0) */
} mlxn_kargs;

/* ---- helpers for kernels ------------------------------------------------------------------ */

/* Fails validation with a formatted reason. */
int mlxn_kfail(char *err, size_t cap, const char *fmt, ...);

/* A parameter block is read whole, as its generated struct: mlxn_params_<name>_of(a, slot)
 * (contracts.gen.h), after MLXN_NEED_BYTES has checked the slot holds MLXN_PARAMS_<NAME>_BYTES. */

/* Checks that inline slot `slot` holds at least `need` bytes. */
#define MLXN_NEED_BYTES(a, slot, need, err, cap)                                                   \
  do {                                                                                             \
    if ((a)->len[slot] < (uint64_t)(need))                                                         \
      return mlxn_kfail(err, cap, "slot %d: inline constants need %u bytes, got %llu", slot,     \
                        (unsigned)(need), (unsigned long long)(a)->len[slot]);                     \
  } while (0)

/* ---- checked size arithmetic ---------------------------------------------------------------
 * Every size a validate() derives from dispatch parameters goes through these. A product or sum that
 * does not fit in 64 bits saturates to MLXN_SIZE_OVERFLOW and stays there, so a wrapped size can
 * never pass a bounds check: MLXN_NEED_BUF reports it as an overflow (no slice is that large). */

#define MLXN_SIZE_OVERFLOW UINT64_MAX

static inline uint64_t mlxn_size_mul(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? MLXN_SIZE_OVERFLOW : r;
}
static inline uint64_t mlxn_size_add(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_add_overflow(a, b, &r) || a == MLXN_SIZE_OVERFLOW || b == MLXN_SIZE_OVERFLOW ? MLXN_SIZE_OVERFLOW : r;
}
static inline uint64_t mlxn_size_prod(const uint64_t *f, size_t n) {
  uint64_t r = 1;
  for (size_t i = 0; i < n; i++) {
    if (f[i] == 0) return 0; /* an empty extent: nothing is touched, whatever the other factors */
    r = mlxn_size_mul(r, f[i]);
  }
  return r;
}
/* MLXN_SIZE(a, b, ...): the checked product of its arguments, each widened to 64 bits. */
#define MLXN_SIZE(...)                                                                             \
  mlxn_size_prod((const uint64_t[]){__VA_ARGS__}, sizeof((const uint64_t[]){__VA_ARGS__}) / sizeof(uint64_t))

/* The reason for a too-small slice (or an overflowing size); returns 1. */
int mlxn_need_buf_fail(const mlxn_kargs *a, int slot, uint64_t need, char *err, size_t cap);

/* Checks that buffer slot `slot` holds at least `need` bytes (need: a checked size). */
#define MLXN_NEED_BUF(a, slot, need, err, cap)                                                     \
  do {                                                                                             \
    uint64_t need_ = (need);                                                                       \
    if ((a)->len[slot] < need_ || need_ == MLXN_SIZE_OVERFLOW)                                      \
      return mlxn_need_buf_fail(a, slot, need_, err, cap);                                         \
  } while (0)

/* Fails unless every bound buffer among the slots of `mask` starts on a multiple of `align` bytes
 * (its element size): kernels, on the GPU and here, access elements of their own type. */
int mlxn_need_align_fail(const mlxn_kargs *a, uint32_t mask, uint32_t align, char *err, size_t cap);
static inline int mlxn_misaligned(const mlxn_kargs *a, uint32_t mask, uint32_t align) {
  uintptr_t bits = 0; /* unbound optional slots are NULL: aligned */
  for (uint32_t m = mask; m; m &= m - 1) bits |= (uintptr_t)a->ptr[__builtin_ctz(m)];
  return (bits & (align - 1)) != 0;
}
#define MLXN_NEED_ALIGN(a, mask, align, err, cap)                                                  \
  do {                                                                                             \
    if (mlxn_misaligned(a, mask, align)) return mlxn_need_align_fail(a, mask, align, err, cap);    \
  } while (0)
#define MLXN_SLOTS2(s0, s1) ((1u << (s0)) | (1u << (s1)))
#define MLXN_SLOTS3(s0, s1, s2) (MLXN_SLOTS2(s0, s1) | (1u << (s2)))
#define MLXN_SLOTS4(s0, s1, s2, s3) (MLXN_SLOTS3(s0, s1, s2) | (1u << (s3)))

/* ---- dispatch geometry -----------------------------------------------------------------------
 * The GPU kernels (kernels/metal, kernels/cuda) map threads to work in fixed ways: a 32-lane
 * simdgroup/warp per output, a tree reduction over the threadgroup, one thread per element. Where
 * a shape breaks that mapping they compute a partial result, even though the CPU kernel (which
 * loops over the work itself) would be right, so the validators enforce the shape on every backend. */

/* The refusals of the checks below, formatted out of line (kernel_args.c) so that the checks stay
 * a few instructions inlined into every validator. Each returns 1. */
int mlxn_need_tg_fail(const mlxn_kargs *a, uint32_t x, const char *why, char *err, size_t cap);
int mlxn_need_dims_fail(const mlxn_kargs *a, int dims, char *err, size_t cap);
int mlxn_need_row_tg_fail(const mlxn_kargs *a, const char *op, char *err, size_t cap);
int mlxn_need_grid_fail(const mlxn_kargs *a, int dim, uint64_t need, const char *what, char *err, size_t cap);

/* Fails unless the threadgroup is exactly (x, 1, 1); `why` says how the kernel uses it and which
 * op dispatches it. */
static inline int mlxn_need_tg(const mlxn_kargs *a, uint32_t x, const char *why, char *err, size_t cap) {
  if (a->tg[0] == x && a->tg[1] == 1 && a->tg[2] == 1) return 0;
  return mlxn_need_tg_fail(a, x, why, err, cap);
}

/* Fails unless the grid and the threadgroup are 1 along every dimension past the first `dims`: the
 * kernel indexes its work along those alone, so a thread along another one would run the same work
 * again (an in-place op applied twice, an accumulating epilogue adding twice, a race on a GPU). */
static inline int mlxn_need_dims(const mlxn_kargs *a, int dims, char *err, size_t cap) {
  int ok = 1;
  for (int d = dims; d < 3; d++) ok &= a->grid[d] == 1 && a->tg[d] == 1;
  if (ok) return 0;
  return mlxn_need_dims_fail(a, dims, err, cap);
}

/* Row kernels reduce one row per threadgroup by a tree over its threads through one f32 of
 * threadgroup memory per thread: the threadgroup must be (2^k, 1, 1) with 4·2^k bytes. */
static inline int mlxn_need_row_tg(const mlxn_kargs *a, const char *op, char *err, size_t cap) {
  uint32_t x = a->tg[0];
  if ((x & (x - 1)) || a->tg[1] != 1 || a->tg[2] != 1 || (uint64_t)a->tg_memory < (uint64_t)x * 4)
    return mlxn_need_row_tg_fail(a, op, err, cap);
  return 0;
}

/* Fails unless the grid has at least `need` threads along dimension `dim` (one thread per `what`:
 * a thread the grid leaves out is work nobody does). */
static inline int mlxn_need_grid(const mlxn_kargs *a, int dim, uint64_t need, const char *what, char *err,
                                 size_t cap) {
  if (a->grid[dim] >= need) return 0;
  return mlxn_need_grid_fail(a, dim, need, what, err, cap);
}

/* Whether the byte ranges [p, p + n) and [q, q + m) share a byte. */
static inline int mlxn_ranges_overlap(const uint8_t *p, uint64_t n, const uint8_t *q, uint64_t m) {
  uintptr_t x = (uintptr_t)p, y = (uintptr_t)q;
  return n && m && x < y + m && y < x + n;
}

/* Fails when the output slot's first out_bytes overlap the input slot's first in_bytes (both
 * already checked against the slices): such a kernel reads inputs after writing outputs. */
#define MLXN_NO_OVERLAP(a, out, out_bytes, in, in_bytes, err, cap)                                 \
  do {                                                                                             \
    if (mlxn_ranges_overlap((a)->ptr[out], (out_bytes), (a)->ptr[in], (in_bytes)))                 \
      return mlxn_kfail(err, cap,                                                                  \
                        "slot %d (output) overlaps slot %d (input); the kernel would read values "  \
                        "it already overwrote: write the result to a separate buffer or a "        \
                        "non-overlapping slice",                                                   \
                        out, in);                                                                  \
  } while (0)

/* Fails when the output slot's first `bytes` overlap the input slot's first `bytes` other than
 * exactly (the same first byte): element-wise kernels may run in place, never shifted. */
#define MLXN_IN_PLACE_OR_DISJOINT(a, out, in, bytes, err, cap)                                      \
  do {                                                                                             \
    if ((a)->ptr[out] != (a)->ptr[in] && mlxn_ranges_overlap((a)->ptr[out], (bytes), (a)->ptr[in], (bytes))) \
      return mlxn_kfail(err, cap,                                                                  \
                        "slot %d (output) partly overlaps slot %d (input); threads would read "     \
                        "values others already overwrote: write in place exactly (the same view) "  \
                        "or to a separate buffer",                                                 \
                        out, in);                                                                  \
  } while (0)

/* The rule of a generated element-wise validator (see KernelSpec.validator): one thread per element
 * over n = the u32 at byte n_offset of slot params_slot; buffer slot s holds n elements of
 * elem_bytes[s] bytes; each output is in place of or disjoint from each input. */
typedef struct mlxn_elements_rule {
  uint32_t params_slot, params_bytes, n_offset;
  uint32_t inputs, outputs; /* slot masks */
  uint8_t elem_bytes[MLXN_KERNEL_SLOTS];
} mlxn_elements_rule;
int mlxn_validate_elements(const mlxn_kargs *a, const mlxn_elements_rule *r, char *err, size_t cap);

/* Defines kernel NAME's validator (declared in contracts.gen.h) as the family's function FN. */
#define MLXN_VALIDATOR(NAME, FN)                                                                   \
  int mlxn_validate_##NAME(const mlxn_kargs *a, char *err, size_t cap) { return FN(a, err, cap); }

/* Storage types of the kernels generic over f32/f16/bf16. */
typedef enum { MLXN_T_F32 = 0, MLXN_T_F16 = 1, MLXN_T_BF16 = 2 } mlxn_ftype;

static inline uint32_t mlxn_ftype_size(mlxn_ftype t) { return t == MLXN_T_F32 ? 4u : 2u; }

#endif /* MLXN_KERNEL_ARGS_H */
