/* The kernel contracts the core checks every dispatch against (name, slot signature, validation,
 * threadgroup-memory rule): the one place where the core reaches native/contracts. */
#ifndef MLXN_CORE_CONTRACT_H
#define MLXN_CORE_CONTRACT_H

#include <stddef.h>

#include "backend.h"

/* Calls add(c) for every contract, always in the same order (pipeline handles number them). */
static inline void mlxn_contracts_each(void (*add)(const mlxn_contract *c)) {
  const mlxn_contract *c;
  for (uint32_t id = 0; (c = mlxn_contract_at(id)) != NULL; id++) add(c);
}

/* Non-zero, with the reason in why, when the contract refuses the dispatch's arguments. */
static inline int mlxn_contract_refuses(const mlxn_contract *c, const mlxn_kernel_args *args, char *why, size_t cap) {
  return c->validate(args, why, cap);
}

#endif /* MLXN_CORE_CONTRACT_H */
