// Shared prelude of the MSL kernels (concatenated first). Slots follow the kernel contracts; every
// kernel also receives the dispatch's thread grid (buffer 28), its tag (29) and the device fault
// word (30). bf16 travels as ushort with exact round-to-nearest-even conversions, like the CPU.
#include <metal_stdlib>
using namespace metal;

#define MLXN_ARGS_TAIL                                                                              \
  constant uint3 &grid [[buffer(28)]], constant uint &tag [[buffer(29)]],                          \
  device atomic_uint *fault_word [[buffer(30)]], uint3 gid [[threadgroup_position_in_grid]],        \
  uint3 lid [[thread_position_in_threadgroup]], uint3 tpg [[threads_per_threadgroup]],              \
  uint3 ngroups [[threadgroups_per_grid]]

inline float bf16_to_f32(ushort h) { return as_type<float>(uint(h) << 16); }
inline ushort f32_to_bf16(float f) {
  uint x = as_type<uint>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return ushort((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return ushort(x >> 16);
}

// Element access by storage type: float, half, or bf16 (ushort).
inline float ld(device const float *p, ulong i) { return p[i]; }
inline float ld(device const half *p, ulong i) { return float(p[i]); }
inline float ld(device const ushort *p, ulong i) { return bf16_to_f32(p[i]); }
inline void st(device float *p, ulong i, float v) { p[i] = v; }
inline void st(device half *p, ulong i, float v) { p[i] = half(v); }
inline void st(device ushort *p, ulong i, float v) { p[i] = f32_to_bf16(v); }
inline float round_to(float v, device const float *) { return v; }
inline float round_to(float v, device const half *) { return float(half(v)); }
inline float round_to(float v, device const ushort *) { return bf16_to_f32(f32_to_bf16(v)); }

inline void report_fault(device atomic_uint *fault_word, uint tag) {
  uint expected = 0;
  atomic_compare_exchange_weak_explicit(fault_word, &expected, tag + 1, memory_order_relaxed, memory_order_relaxed);
}

// Deterministic tree reductions over the threadgroup's x threads (a power of two).
inline float tg_sum(float v, threadgroup float *sh, uint i, uint n) {
  sh[i] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint s = n / 2; s > 0; s >>= 1) {
    if (i < s) sh[i] += sh[i + s];
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  float r = sh[0];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return r;
}
inline float tg_max(float v, threadgroup float *sh, uint i, uint n) {
  sh[i] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint s = n / 2; s > 0; s >>= 1) {
    if (i < s) sh[i] = max(sh[i], sh[i + s]);
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  float r = sh[0];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return r;
}

// x · sigmoid(x): shared by silu, silu_mul and the matmul SwiGLU epilogue (bit-equal forms).
inline float silu(float x) { return x / (1.0f + precise::exp(-x)); }
