/* The out-of-line parts of the validator checks (kernel_args.h): formatting the reasons. */
#include <stdarg.h>
#include <stdio.h>

#include "kernel_args.h"

int mlxn_kfail(char *err, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, cap, fmt, ap);
  va_end(ap);
  return 1;
}

int mlxn_need_tg_fail(const mlxn_kargs *a, uint32_t x, const char *why, char *err, size_t cap) {
  return mlxn_kfail(err, cap, "threadgroup must be (%u, 1, 1): %s; got (%u, %u, %u)", x, why, a->tg[0], a->tg[1],
                    a->tg[2]);
}

int mlxn_need_dims_fail(const mlxn_kargs *a, int dims, char *err, size_t cap) {
  return mlxn_kfail(err, cap,
                    "the kernel's work runs along %s only: the grid and the threadgroup must be 1 along %s; "
                    "got grid (%u, %u, %u) threads, threadgroup (%u, %u, %u)",
                    dims == 1 ? "x" : "x and y", dims == 1 ? "y and z" : "z", a->grid[0], a->grid[1], a->grid[2],
                    a->tg[0], a->tg[1], a->tg[2]);
}

int mlxn_need_row_tg_fail(const mlxn_kargs *a, const char *op, char *err, size_t cap) {
  uint32_t x = a->tg[0];
  if ((x & (x - 1)) || a->tg[1] != 1 || a->tg[2] != 1)
    return mlxn_kfail(err, cap,
                      "threadgroup must be (2^k, 1, 1), a power of two wide: one row per threadgroup, "
                      "reduced by a tree over its threads; got (%u, %u, %u); use %s",
                      a->tg[0], a->tg[1], a->tg[2], op);
  return mlxn_kfail(err, cap,
                    "threadgroup memory must hold one f32 per thread: at least %llu bytes for a "
                    "threadgroup of %u, got %u; use %s",
                    (unsigned long long)x * 4, x, a->tg_memory, op);
}

int mlxn_need_grid_fail(const mlxn_kargs *a, int dim, uint64_t need, const char *what, char *err, size_t cap) {
  return mlxn_kfail(err, cap, "grid dimension %d has %u threads but needs %llu, one per %s", dim, a->grid[dim],
                    (unsigned long long)need, what);
}

int mlxn_need_buf_fail(const mlxn_kargs *a, int slot, uint64_t need, char *err, size_t cap) {
  if (need == MLXN_SIZE_OVERFLOW)
    return mlxn_kfail(err, cap,
                      "slot %d: the size these constants and this grid describe overflows 64 bits; "
                      "pass the real shape (each extent as allocated) and a grid that matches it",
                      slot);
  return mlxn_kfail(err, cap, "slot %d: bound slice has %llu bytes, kernel needs %llu; bind a larger buffer or "
                    "fix the shape constants", slot, (unsigned long long)a->len[slot], (unsigned long long)need);
}

int mlxn_need_align_fail(const mlxn_kargs *a, uint32_t mask, uint32_t align, char *err, size_t cap) {
  for (int slot = 0; slot < MLXN_KERNEL_SLOTS; slot++)
    if ((mask >> slot) & 1u && a->ptr[slot] && (uintptr_t)a->ptr[slot] % align)
      return mlxn_kfail(err, cap,
                        "slot %d: the bound range starts at an offset that is not a multiple of %u bytes (the "
                        "size of its elements); bind it at an aligned offset",
                        slot, align);
  return 0;
}

int mlxn_validate_elements(const mlxn_kargs *a, const mlxn_elements_rule *r, char *err, size_t cap) {
  MLXN_NEED_BYTES(a, (int)r->params_slot, r->params_bytes, err, cap);
  uint32_t n; /* the field `n` of the block, at the offset its generated layout gives (the rule) */
  __builtin_memcpy(&n, a->ptr[r->params_slot] + r->n_offset, sizeof n);
  if (mlxn_need_grid(a, 0, n, "element (n)", err, cap)) return 1;
  uint64_t bytes[MLXN_KERNEL_SLOTS] = {0};
  uint32_t buffers = r->inputs | r->outputs;
  for (int s = 0; s < MLXN_KERNEL_SLOTS; s++) {
    if (!((buffers >> s) & 1u)) continue;
    bytes[s] = MLXN_SIZE(n, r->elem_bytes[s]);
    MLXN_NEED_BUF(a, s, bytes[s], err, cap);
  }
  for (int s = 0; s < MLXN_KERNEL_SLOTS; s++)
    if ((buffers >> s) & 1u) MLXN_NEED_ALIGN(a, 1u << s, r->elem_bytes[s], err, cap);
  for (int o = 0; o < MLXN_KERNEL_SLOTS; o++) {
    if (!((r->outputs >> o) & 1u)) continue;
    for (int i = 0; i < MLXN_KERNEL_SLOTS; i++) {
      if (!((r->inputs >> i) & 1u) || a->ptr[o] == a->ptr[i]) continue;
      if (mlxn_ranges_overlap(a->ptr[o], bytes[o], a->ptr[i], bytes[i]))
        return mlxn_kfail(err, cap,
                          "slot %d (output) partly overlaps slot %d (input); threads would read values others "
                          "already overwrote: write in place exactly (the same view) or to a separate buffer",
                          o, i);
    }
  }
  return 0;
}
