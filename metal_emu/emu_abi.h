/* What the C++ that metal_emu/msl_front.ts generates from the MSL shares with the emulator's
 * runtime: the kernel table and the thread-position values a kernel's attributes select. Plain C
 * types only: the generated C++ is compiled without system headers. */
#ifndef MLXN_EMU_ABI_H
#define MLXN_EMU_ABI_H

/* Thread-position attributes, in the order of the per-thread value table. */
enum {
  MLXN_EMU_THREAD_POSITION_IN_GRID,
  MLXN_EMU_THREADGROUP_POSITION_IN_GRID,
  MLXN_EMU_THREAD_POSITION_IN_THREADGROUP,
  MLXN_EMU_THREADS_PER_THREADGROUP,
  MLXN_EMU_THREADGROUPS_PER_GRID,
  MLXN_EMU_THREADS_PER_GRID,
  MLXN_EMU_THREAD_INDEX_IN_THREADGROUP,
  MLXN_EMU_SIMDGROUP_INDEX_IN_THREADGROUP,
  MLXN_EMU_THREAD_INDEX_IN_SIMDGROUP,
  MLXN_EMU_THREADS_PER_SIMDGROUP,
  MLXN_EMU_SIMDGROUPS_PER_THREADGROUP,
  MLXN_EMU_THREAD_EXECUTION_WIDTH,
  MLXN_EMU_POSITION_COUNT
};

/* Argument slots as Metal numbers them ([[buffer(n)]] and [[threadgroup(n)]], n < 31). */
#define MLXN_EMU_SLOTS 31

typedef void (*mlxn_emu_entry)(void *const *buffers, void *const *tg_memory, const unsigned (*pos)[3]);

typedef struct mlxn_emu_kernel {
  const char *name;
  mlxn_emu_entry entry;
  unsigned buffers;     /* bit n: the kernel declares [[buffer(n)]] */
  unsigned tg_slots;    /* bit n: the kernel declares [[threadgroup(n)]] */
} mlxn_emu_kernel;

/* The compiled MSL's kernels, terminated by a NULL name (generated). */
#ifdef __cplusplus
extern "C" const mlxn_emu_kernel mlxn_emu_kernels[];
#else
extern const mlxn_emu_kernel mlxn_emu_kernels[];
#endif

#endif
