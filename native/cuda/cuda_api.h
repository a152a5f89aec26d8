/* The CUDA side of the CUDA backend, as plain C: bridge.c (C, sees the core's structures) calls
 * these; backend.cu (CUDA C++) implements them. */
#ifndef MLXN_CUDA_API_H
#define MLXN_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MLXN_CUDA_SLOTS 12

/* One decoded dispatch. */
typedef struct mlxn_cuda_dispatch {
  const char *kernel;    /* kernel name (the address is stable: the core's static kernel table) */
  const char *signature; /* 'b' buffer, 'o' optional buffer, 'c' inline bytes, per slot */
  uint8_t *ptr[MLXN_CUDA_SLOTS]; /* buffers: device addresses; bytes: host copies */
  uint64_t len[MLXN_CUDA_SLOTS];
  uint32_t grid[3], tg[3], groups[3];
  uint32_t tg_memory, tag, group; /* group: index of its concurrent group */
  /* Out, with MLXN_FLAG_DISPATCH_TIMING: start and end on the device, ns after the command buffer's
   * start (the event before its work). */
  uint64_t start_ns, end_ns;
} mlxn_cuda_dispatch;

/* Each returns 0, or a negative MLXN_E_* code with a message in err. */
int mlxn_cuda_open(void **state, char *err, size_t cap);
void mlxn_cuda_close(void *state);
uint32_t mlxn_cuda_info(void *state, uint32_t flags, char *buf, uint32_t cap);
void *mlxn_cuda_alloc(uint64_t nbytes);
void mlxn_cuda_free(void *mem);
int mlxn_cuda_copy(uint8_t *mem, uint8_t *host, uint64_t len, int to_device, char *err, size_t cap);
int mlxn_cuda_has_kernel(const char *name);
/* Command buffers that may be launched and not yet completed at once (the core's max_in_flight). */
#define MLXN_CUDA_IN_FLIGHT 2

/* Room for the next launch's n dispatches, owned by its in-flight slot (NULL: no memory). */
mlxn_cuda_dispatch *mlxn_cuda_dispatches(void *state, uint32_t n);
/* Enqueues the n dispatches written to mlxn_cuda_dispatches (flags: MLXN_FLAG_*) and returns without
 * waiting. On success *slot is the in-flight slot to pass to mlxn_cuda_complete, exactly once, in
 * launch order; on failure *slot is -1 and nothing is left pending. */
int mlxn_cuda_launch(void *state, uint32_t flags, uint32_t n, int32_t *slot, char *err, size_t cap);
/* Waits for a launched slot: *t_start is the GPU start on the core's clock (CLOCK_MONOTONIC ns),
 * *gpu_ns the device time, and with MLXN_FLAG_DISPATCH_TIMING the slot's dispatch records get their
 * times; on a failed dispatch returns MLXN_E_EXECUTION with *failed = its index. The slot is free
 * for a later launch once this returns. */
int mlxn_cuda_complete(void *state, uint32_t flags, int32_t slot, uint64_t *t_start, uint64_t *gpu_ns,
                       uint32_t *failed, char *err, size_t cap);
/* A slot's dispatch records (valid until the slot's next launch). */
mlxn_cuda_dispatch *mlxn_cuda_slot_dispatches(void *state, int32_t slot);

#ifdef __cplusplus
}
#endif

#endif
