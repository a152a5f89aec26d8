/*
 * The CPU kernel bodies' interface. A body mirrors a GPU compute kernel: it executes ONE threadgroup
 * (all of its threads, in a loop) and may be called concurrently for different threadgroups and for
 * other dispatches of the same concurrent group. The core has validated its arguments against the
 * kernel's contract (native/contracts) before it runs, so a body trusts them.
 */
#ifndef MLXN_CPU_KERNEL_H
#define MLXN_CPU_KERNEL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "../../native/contracts/contracts.h"

/* Runs threadgroup (gx, gy, gz); tg_scratch holds a.tg_memory bytes private to this call. Returns 0,
 * or non-zero when the dispatch failed (the command buffer then reports an error). */
typedef int (*mlxn_cpu_run)(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *tg_scratch);

/* Declares or defines the body of kernel NAME: `MLXN_CPU_KERNEL(rms_norm_f32) { ... }`. The table
 * (kernels/cpu/table.gen.c) names every described kernel's body, so a missing one fails the link. */
#define MLXN_CPU_KERNEL(NAME)                                                                      \
  int mlxn_cpu_##NAME(const mlxn_kargs *a, uint32_t gx, uint32_t gy, uint32_t gz, void *tg_scratch)

/* Defines kernel NAME's body as the family's function FN. */
#define MLXN_CPU_BODY(NAME, FN)                                                                    \
  MLXN_CPU_KERNEL(NAME) { return FN(a, gx, gy, gz, tg_scratch); }

/* Each kernel's body, indexed by kernel id (generated). */
extern const mlxn_cpu_run mlxn_cpu_runs[MLXN_KERNEL_COUNT];

/* ---- 16-bit float conversions (round to nearest even, NaN preserved) ----------------------- */

static inline float mlxn_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else { /* subnormal: normalise */
      exp = 127 - 15 + 1;
      while ((man & 0x400u) == 0) {
        man <<= 1;
        exp--;
      }
      man &= 0x3ffu;
      bits = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

static inline uint16_t mlxn_f32_to_f16(float f) {
  uint32_t x;
  __builtin_memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) /* Inf or NaN */
    return (uint16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u | ((absx >> 13) & 0x3ffu) : 0));
  if (absx >= 0x477ff000u) /* rounds to >= 65520: overflow to Inf */
    return (uint16_t)(sign | 0x7c00u);
  if (absx < 0x38800000u) { /* below the smallest normal f16: subnormal or zero */
    if (absx < 0x33000000u) return (uint16_t)sign; /* < half of the smallest subnormal */
    uint32_t e = absx >> 23;
    uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* 14..24 */
    uint32_t half = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t r = absx + 0xfffu + ((absx >> 13) & 1u); /* round to nearest even at bit 13 */
  return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

static inline float mlxn_bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

static inline uint16_t mlxn_f32_to_bf16(float f) {
  uint32_t x;
  __builtin_memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

/* Element load/store by dtype (mlxn_ftype), for kernels generic over f32/f16/bf16. */
static inline float mlxn_load(const uint8_t *base, uint64_t i, mlxn_ftype t) {
  if (t == MLXN_T_F32) {
    float v;
    __builtin_memcpy(&v, base + i * 4, 4);
    return v;
  }
  uint16_t h;
  __builtin_memcpy(&h, base + i * 2, 2);
  return t == MLXN_T_F16 ? mlxn_f16_to_f32(h) : mlxn_bf16_to_f32(h);
}

static inline void mlxn_store(uint8_t *base, uint64_t i, mlxn_ftype t, float v) {
  if (t == MLXN_T_F32) {
    __builtin_memcpy(base + i * 4, &v, 4);
    return;
  }
  uint16_t h = t == MLXN_T_F16 ? mlxn_f32_to_f16(v) : mlxn_f32_to_bf16(v);
  __builtin_memcpy(base + i * 2, &h, 2);
}

/* Rounds v through the storage type (what a store followed by a load yields). */
static inline float mlxn_round_to(float v, mlxn_ftype t) {
  if (t == MLXN_T_F32) return v;
  return t == MLXN_T_F16 ? mlxn_f16_to_f32(mlxn_f32_to_f16(v)) : mlxn_bf16_to_f32(mlxn_f32_to_bf16(v));
}

/* x · sigmoid(x): the one definition the silu, silu_mul and fused SwiGLU kernels share, so that
 * fused and unfused forms agree bit for bit. */
static inline float mlxn_silu(float x) { return x / (1.0f + expf(-x)); }

#endif /* MLXN_CPU_KERNEL_H */
