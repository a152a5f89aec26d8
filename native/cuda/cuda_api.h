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
/* Room for n dispatches, owned by the device state and reused by the next call (NULL: no memory). */
mlxn_cuda_dispatch *mlxn_cuda_dispatches(void *state, uint32_t n);
/* Runs n dispatches (flags: MLXN_FLAG_*), waits, reports device time; on a failed dispatch returns
 * MLXN_E_EXECUTION with *failed = its index. */
int mlxn_cuda_run(void *state, uint32_t flags, mlxn_cuda_dispatch *d, uint32_t n, uint64_t *gpu_ns,
                  uint32_t *failed, char *err, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
