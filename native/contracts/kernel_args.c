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
