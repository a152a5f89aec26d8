/* Metal's execution model for one threadgroup on one CPU thread: every thread of the group is a
 * fiber with its own stack; a fiber runs until it finishes, reaches threadgroup_barrier (released
 * when every live thread of the group has reached one) or a simd_* operation (released when every
 * live lane of its 32-lane SIMD-group has deposited its value). The order in which ready fibers run
 * is fixed, so a dispatch is deterministic. */
#ifndef MLXN_EMU_RUNTIME_H
#define MLXN_EMU_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "emu_abi.h"

#define MLXN_EMU_SIMD_WIDTH 32u

/* What one threadgroup executes: the kernel, its bindings and the dispatch geometry. */
typedef struct mlxn_emu_launch {
  const mlxn_emu_kernel *kernel;
  void *buffers[MLXN_EMU_SLOTS];
  uint32_t tg[3];     /* threads per threadgroup */
  uint32_t groups[3]; /* threadgroups per grid */
  uint32_t tg_memory; /* bytes of threadgroup memory at index 0 */
} mlxn_emu_launch;

typedef struct mlxn_emu_worker mlxn_emu_worker;

/* A worker: fiber stacks and exchange buffers for up to max_threads threads per group. NULL when
 * out of memory. */
mlxn_emu_worker *mlxn_emu_worker_new(uint32_t max_threads);
void mlxn_emu_worker_free(mlxn_emu_worker *w);

/* Scheduling orders of a group's ready fibers (the checker compares both). */
enum { MLXN_EMU_ORDER_FORWARD = 0, MLXN_EMU_ORDER_REVERSE = 1 };

/* Runs threadgroup (gx, gy, gz) of a launch on the calling thread; tg_fill is the byte the group's
 * threadgroup memory starts as (Metal leaves it undefined). Returns 0, or -1 with a reason in err
 * (a barrier not every thread reaches, divergent simd_* operations). */
int mlxn_emu_run_group(mlxn_emu_worker *w, const mlxn_emu_launch *l, uint32_t gx, uint32_t gy, uint32_t gz,
                       int order, uint8_t tg_fill, char *err, size_t cap);

#endif
