/*
 * What the matrix products' validators (native/contracts/matmul.c) and CPU and CUDA bodies share,
 * under short names: the work split of a threadgroup and the dense kernels' mode word (generated
 * MLXN_MATMUL_* constants), and the ggml block formats. The parameter blocks are the generated
 * mlxn_params_dense, _affine, _affine_general, _affine_gather, _ggml and _ggml_id.
 */
#ifndef MLXN_MATMUL_H
#define MLXN_MATMUL_H

#include "contracts.gen.h"
#include "quant_blocks.h"

#define MM_OUTS MLXN_MATMUL_OUTS
#define MM_OUTS_FAST MLXN_MATMUL_OUTS_FAST
#define MM_OUTS_SWIGLU MLXN_MATMUL_OUTS_SWIGLU
#define MM_EPILOGUE_MASK MLXN_MATMUL_EPILOGUE_MASK
#define MM_MODE_CONSTANT_WEIGHTS MLXN_MATMUL_MODE_CONSTANT_WEIGHTS
enum { EPI_NONE = MLXN_MATMUL_EPILOGUE_NONE, EPI_RESIDUAL = MLXN_MATMUL_EPILOGUE_RESIDUAL, EPI_SWIGLU = MLXN_MATMUL_EPILOGUE_SWIGLU };

#endif /* MLXN_MATMUL_H */
