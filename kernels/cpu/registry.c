/* The CPU kernel table: every family's kernels, concatenated once at first use. */
#include <stdarg.h>
#include <stdio.h>

#include "cpu_kernel.h"

extern const mlxn_cpu_kernel mlxn_cpu_elementwise_kernels[];
extern const mlxn_cpu_kernel mlxn_cpu_norm_kernels[];
extern const mlxn_cpu_kernel mlxn_cpu_rope_kernels[];
extern const mlxn_cpu_kernel mlxn_cpu_matmul_kernels[];
extern const mlxn_cpu_kernel mlxn_cpu_attention_kernels[];
extern const mlxn_cpu_kernel mlxn_cpu_sample_kernels[];

const mlxn_cpu_kernel *const mlxn_cpu_kernel_families[] = {
    mlxn_cpu_elementwise_kernels,
    mlxn_cpu_norm_kernels,
    mlxn_cpu_rope_kernels,
    mlxn_cpu_matmul_kernels,
    mlxn_cpu_attention_kernels,
    mlxn_cpu_sample_kernels,
    0,
};

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
  for (int slot = 0; slot < MLXN_CPU_KERNEL_SLOTS; slot++)
    if ((mask >> slot) & 1u && a->ptr[slot] && (uintptr_t)a->ptr[slot] % align)
      return mlxn_kfail(err, cap,
                        "slot %d: the bound range starts at an offset that is not a multiple of %u bytes (the "
                        "size of its elements); bind it at an aligned offset",
                        slot, align);
  return 0;
}
