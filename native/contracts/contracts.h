/*
 * Kernel contracts: for every kernel described in kernels/spec/kernels.ts, its slot signature, the
 * validator every backend's dispatches pass through, and its threadgroup-memory rule. The table and
 * the ids are generated (contracts.gen.{h,c}); the validators are written per family beside them.
 */
#ifndef MLXN_CONTRACTS_H
#define MLXN_CONTRACTS_H

#include "contracts.gen.h"
#include "kernel_args.h"

typedef struct mlxn_contract {
  uint32_t id; /* enum mlxn_kernel_id */
  const char *name;
  /* One character per slot: 'b' buffer, 'o' optional buffer, 'c' inline bytes. */
  const char *signature;
  /* Writes a reason into err and returns non-zero when the arguments are unusable: every argument
   * set it accepts keeps every backend's body inside the bound slices. */
  int (*validate)(const mlxn_kargs *a, char *err, size_t cap);
  /* Threadgroup memory the kernel reduces through: at least this many f32 per thread at index 0. */
  uint32_t tg_floats_per_thread;
  /* Bit i set: buffer slot i is read (access read or readwrite) / written (write or readwrite). The
   * decoder's automatic barriers derive a dispatch's accesses from these. */
  uint32_t reads, writes;
} mlxn_contract;

/* Contract `id` (0 <= id < MLXN_KERNEL_COUNT), or NULL past the end: the core's one way in. */
const mlxn_contract *mlxn_contract_at(uint32_t id);

#endif /* MLXN_CONTRACTS_H */
