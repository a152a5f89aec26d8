/*
 * The ggml block formats: one block holds `values` consecutive weights of a row in `bytes` bytes.
 * Shared by the validators (native/contracts), the CPU bodies (kernels/cpu) and the CUDA bodies
 * (kernels/cuda), which must agree on every size they derive from these.
 */
#ifndef MLXN_QUANT_BLOCKS_H
#define MLXN_QUANT_BLOCKS_H

#include <stdint.h>

/* The numbering is the order the kernels were added in; nothing outside C stores it. */
typedef enum {
  GGML_Q4_0 = 0,
  GGML_Q8_0 = 1,
  GGML_Q6_K = 2,
  GGML_Q4_1 = 3,
  GGML_Q5_0 = 4,
  GGML_Q5_1 = 5,
  GGML_Q4_K = 6,
  GGML_Q5_K = 7,
} ggml_fmt;

/* Every format as X(lower, UPPER), for code instantiated once per format (validators, bodies). */
#define MLXN_GGML_FORMATS(X)                                                                       \
  X(q4_0, Q4_0) X(q8_0, Q8_0) X(q6_k, Q6_K) X(q4_1, Q4_1) X(q5_0, Q5_0) X(q5_1, Q5_1) X(q4_k, Q4_K) X(q5_k, Q5_K)

/* Compiled as C for the validators and CPU bodies, and for device code by the CUDA bodies. */
#ifdef __CUDACC__
#define MLXN_QB_FN __host__ __device__ constexpr
#else
#define MLXN_QB_FN static inline
#endif

/* Weights per block of format f. */
MLXN_QB_FN uint32_t ggml_block_values(int f) { return f == GGML_Q6_K || f == GGML_Q4_K || f == GGML_Q5_K ? 256 : 32; }

/* Bytes per block of format f. */
MLXN_QB_FN uint32_t ggml_block_bytes(int f) {
  return f == GGML_Q4_0   ? 18
         : f == GGML_Q8_0 ? 34
         : f == GGML_Q6_K ? 210
         : f == GGML_Q4_1 ? 20
         : f == GGML_Q5_0 ? 22
         : f == GGML_Q5_1 ? 24
         : f == GGML_Q4_K ? 144
                          : 176;
}

#endif /* MLXN_QUANT_BLOCKS_H */
