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
