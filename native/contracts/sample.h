/* What the embedding gather's validator and its CPU body share: the table formats and a row's size. */
#ifndef MLXN_CONTRACTS_SAMPLE_H
#define MLXN_CONTRACTS_SAMPLE_H

#include <stdint.h>

#include "quant_blocks.h"

/* Table formats of embed_gather_{f32,bf16,q8_0,q4_0}. */
enum { G_F32, G_BF16, G_Q8_0, G_Q4_0 };

/* Bytes of one table row of `dim` values (quantized rows are whole ggml blocks). */
static inline uint64_t gather_row_bytes(int fmt, uint32_t dim) {
  switch (fmt) {
  case G_F32: return (uint64_t)dim * 4;
  case G_BF16: return (uint64_t)dim * 2;
  case G_Q8_0: return (uint64_t)(dim / ggml_block_values(GGML_Q8_0)) * ggml_block_bytes(GGML_Q8_0);
  default: return (uint64_t)(dim / ggml_block_values(GGML_Q4_0)) * ggml_block_bytes(GGML_Q4_0);
  }
}

#endif /* MLXN_CONTRACTS_SAMPLE_H */
