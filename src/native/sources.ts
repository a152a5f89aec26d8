/**
 * The native library's sources and compiler flags, shared by the JSR build entry (build.ts) and
 * checked against the Makefile by tests/build_test.ts.
 *
 * @module
 */

/** Sources of the CPU backend, relative to the package root (headers first). */
export const CPU_SOURCES: readonly string[] = [
  "native/mlxn.h",
  "native/core/internal.h",
  "kernels/cpu/cpu_kernel.h",
  "native/core/device.c",
  "native/core/queue.c",
  "native/core/stream.c",
  "native/cpu/backend.c",
  "kernels/cpu/attention.c",
  "kernels/cpu/elementwise.c",
  "kernels/cpu/matmul.c",
  "kernels/cpu/norm.c",
  "kernels/cpu/registry.c",
  "kernels/cpu/rope.c",
  "kernels/cpu/sample.c",
];

/** C flags of the CPU backend (the Makefile's CFLAGS_COMMON). */
export const CPU_CFLAGS: readonly string[] = [
  "-std=c11",
  "-O2",
  "-fPIC",
  "-pthread",
  "-Wall",
  "-Wextra",
  "-Wno-unused-parameter",
  "-ffp-contract=off",
  "-fvisibility=hidden",
  "-D_POSIX_C_SOURCE=200809L",
];
