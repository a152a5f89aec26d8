/* The CUDA C++ side of the CUDA backend (backend.cu), as plain C: bridge.c puts these in the core's
 * backend table. They take the core's plain data (core/backend.h) directly. */
#ifndef MLXN_CUDA_API_H
#define MLXN_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

#include "../core/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Command buffers that may be launched and not yet completed at once (the core's max_in_flight). */
#define MLXN_CUDA_IN_FLIGHT 2

/* The backend hooks (see mlxn_backend_ops), named after them. */
int32_t mlxn_cuda_open(void **state, uint32_t flags, char *err, size_t cap);
void mlxn_cuda_close(void *state);
uint32_t mlxn_cuda_info(void *state, char *buf, uint32_t cap);
const void *mlxn_cuda_kernel_of(void *state, const mlxn_contract *contract);
void *mlxn_cuda_alloc(void *state, uint64_t nbytes, void **object);
void mlxn_cuda_free(void *state, void *mem, void *object);
int32_t mlxn_cuda_copy(void *state, uint8_t *mem, uint8_t *host, uint64_t len, int to_device, char *err, size_t cap);
/* Enqueues cmd's dispatches and returns without waiting. On success cmd->backend_slot is the
 * in-flight slot that mlxn_cuda_complete takes, exactly once, in launch order; on failure it stays
 * -1, cmd holds the error and nothing is left pending. */
void mlxn_cuda_launch(void *state, mlxn_command *cmd);
/* Waits for a launched command buffer: its start on the core's clock and its device time, with
 * MLXN_FLAG_DISPATCH_TIMING each dispatch's times, and a failed dispatch's error. The slot is free
 * for a later launch once this returns. */
void mlxn_cuda_complete(void *state, mlxn_command *cmd);

#ifdef __cplusplus
}
#endif

#endif
