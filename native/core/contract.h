/* The kernel contracts the core checks every dispatch against (name, slot signature, validation):
 * the one place where the core reaches them. Until they move out of kernels/cpu, they are that
 * table's entries; nothing else of kernels/cpu is used by the core or handed to a backend. */
#ifndef MLXN_CORE_CONTRACT_H
#define MLXN_CORE_CONTRACT_H

#include <stddef.h>

#include "../../kernels/cpu/cpu_kernel.h"
#include "backend.h"

typedef mlxn_cpu_kernel mlxn_contract;

/* Calls add(c) for every contract, always in the same order (pipeline handles number them). */
static inline void mlxn_contracts_each(void (*add)(const mlxn_contract *c)) {
  for (const mlxn_cpu_kernel *const *f = mlxn_cpu_kernel_families; *f; f++)
    for (const mlxn_cpu_kernel *k = *f; k->name; k++) add(k);
}

/* The contract's arguments are the dispatch's, field for field. */
_Static_assert(MLXN_CPU_KERNEL_SLOTS == MLXN_KERNEL_SLOTS, "one slot limit for contracts and backends");
_Static_assert(sizeof(mlxn_kargs) == sizeof(mlxn_kernel_args) &&
                   offsetof(mlxn_kargs, len) == offsetof(mlxn_kernel_args, len) &&
                   offsetof(mlxn_kargs, grid) == offsetof(mlxn_kernel_args, grid) &&
                   offsetof(mlxn_kargs, tg) == offsetof(mlxn_kernel_args, tg) &&
                   offsetof(mlxn_kargs, groups) == offsetof(mlxn_kernel_args, groups) &&
                   offsetof(mlxn_kargs, tg_memory) == offsetof(mlxn_kernel_args, tg_memory),
               "mlxn_kargs and mlxn_kernel_args have one layout");

/* Non-zero, with the reason in why, when the contract refuses the dispatch's arguments. validate()
 * reads them as its own type, of the layout asserted above; it is compiled in its own translation
 * units (no LTO), only reads, and the core never reads them as mlxn_kargs. A copy instead cost the
 * decoder ~10% per dispatch. The cast goes once mlxn_kargs is mlxn_kernel_args itself. */
static inline int mlxn_contract_refuses(const mlxn_contract *c, const mlxn_kernel_args *args, char *why, size_t cap) {
  return c->validate((const mlxn_kargs *)(const void *)args, why, cap);
}

#endif /* MLXN_CORE_CONTRACT_H */
