// Kernels that probe the emulator's Metal semantics (run by metal_emu/tests/semantics.c, checked by
// tests/metal_emu_test.ts against expectations written from Metal's specification).
#include <metal_stdlib>
#include <metal_simdgroup_matrix>
using namespace metal;

// Eight results per thread: SIMD-group reductions, shuffles, broadcast and scan over the live lanes.
kernel void simd_ops(device float *out [[buffer(0)]], uint tid [[thread_index_in_threadgroup]],
                     uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]],
                     uint nsg [[simdgroups_per_threadgroup]]) {
  device float *o = out + tid * 8;
  o[0] = simd_sum(float(lane + 1));
  o[1] = float(simd_shuffle_down(lane, ushort(3)));
  o[2] = float(simd_shuffle_up(lane, ushort(5)));
  o[3] = float(simd_shuffle_xor(lane, ushort(7)));
  o[4] = float(simd_broadcast(lane * 10u, ushort(9)));
  o[5] = float(simd_prefix_exclusive_sum(1u));
  o[6] = float(simd_max(lane * (sg + 1)));
  o[7] = float(nsg);
}

// Reductions and scans over a partial SIMD-group (a threadgroup of 40: lanes 0-7 of the second).
kernel void simd_partial(device float *out [[buffer(0)]], uint tid [[thread_index_in_threadgroup]],
                         uint lane [[thread_index_in_simdgroup]], uint nsg [[simdgroups_per_threadgroup]]) {
  device float *o = out + tid * 4;
  o[0] = simd_sum(float(lane + 1));
  o[1] = float(simd_prefix_inclusive_sum(lane));
  o[2] = float(simd_min(31u - lane));
  o[3] = float(nsg);
}

// Odd lanes leave before the reduction: the sum covers the even lanes only. (The attribute form of
// the kernel qualifier.)
[[kernel]] void simd_inactive(device float *out [[buffer(0)]], uint tid [[thread_index_in_threadgroup]],
                          uint lane [[thread_index_in_simdgroup]]) {
  out[tid] = -1.0f;
  if (lane % 2 == 1) return;
  out[tid] = simd_sum(float(lane));
}

// Every thread reads its neighbour's value after a barrier.
kernel void barrier_neighbour(device uint *out [[buffer(0)]], threadgroup uint *sh [[threadgroup(0)]],
                              uint tid [[thread_index_in_threadgroup]], uint n [[threads_per_threadgroup]]) {
  sh[tid] = tid * 3u;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tid] = sh[(tid + 1) % n];
}

// Only some threads reach the barrier: a GPU hangs or misbehaves; the emulator reports it.
kernel void barrier_divergent(device uint *out [[buffer(0)]], threadgroup uint *sh [[threadgroup(0)]],
                              uint tid [[thread_index_in_threadgroup]]) {
  sh[tid] = tid;
  if (tid < 5) threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tid] = sh[0];
}

// Lanes of one SIMD-group at different SIMD-group functions.
kernel void simd_divergent(device float *out [[buffer(0)]], uint lane [[thread_index_in_simdgroup]]) {
  out[lane] = lane < 16 ? simd_sum(1.0f) : simd_max(2.0f);
}

// Every thread writes the same threadgroup word: the winner depends on the schedule.
kernel void tg_race(device uint *out [[buffer(0)]], threadgroup uint *sh [[threadgroup(0)]],
                    uint tid [[thread_index_in_threadgroup]]) {
  sh[0] = tid;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tid] = sh[0];
}

// Reads threadgroup memory nobody wrote.
kernel void tg_uninit(device uint *out [[buffer(0)]], threadgroup uint *sh [[threadgroup(0)]],
                      uint tid [[thread_index_in_threadgroup]]) {
  out[tid] = sh[tid];
}

// half arithmetic rounds to half after each operation; vector constructors convert element-wise.
kernel void numerics(device float *out [[buffer(0)]], device const half *hin [[buffer(1)]],
                     uint tid [[thread_index_in_threadgroup]]) {
  if (tid != 0) return;
  half a = hin[0], b = hin[1];
  out[0] = float(a + b);
  int4 iv = int4(1, -2, 3, 40000);
  float4 fv = float4(iv);
  out[1] = fv.x;
  out[2] = fv.y;
  out[3] = fv.w;
  float2 sw = float4(1.0f, 2.0f, 3.0f, 4.0f).wy;
  out[4] = sw.x;
  out[5] = float(as_type<uint>(1.0f) >> 23);
}

// A threadgroup array and scalar declared in the kernel body (one per threadgroup), read after a
// barrier, and a program-scope constant table.
constant float weights[4] = {0.5f, 1.0f, 2.0f, 4.0f};
kernel void tg_variables(device float *out [[buffer(0)]], uint tid [[thread_index_in_threadgroup]],
                         uint n [[threads_per_threadgroup]]) {
  threadgroup float partial[64];
  threadgroup uint count;
  if (tid == 0) count = 7;
  partial[tid] = float(tid) * weights[tid % 4];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (tid == 0) {
    float s = 0.0f;
    for (uint i = 0; i < n; i++) s += partial[i];
    out[0] = s + float(count);
  }
  out[tid + 1] = partial[(tid + 1) % n];
}

// A sample of the other builtins: rotation, geometric, integer, vector max, numeric_limits.
kernel void builtins(device float *out [[buffer(0)]], uint tid [[thread_index_in_threadgroup]],
                     uint lane [[thread_index_in_simdgroup]]) {
  device float *o = out + tid * 4;
  o[0] = float(simd_shuffle_rotate_down(lane, ushort(3)));
  o[1] = dot(float4(1.0f, 2.0f, 3.0f, 4.0f), float4(float(lane)));
  o[2] = float(popcount(lane) + clz(lane + 1u));
  o[3] = max(float2(float(lane), 5.0f), float2(3.0f, float(lane))).x + float(numeric_limits<uint>::max() == 0xffffffffu) +
         (numeric_limits<float>::infinity() > 1e38f ? 100.0f : 0.0f);
}

// C = A · B for 16×16 matrices with one SIMD-group: A staged through threadgroup memory, B read from
// device memory transposed, 8×8 tiles accumulated with simdgroup_multiply_accumulate.
kernel void simd_matrix(device float *c [[buffer(0)]], device const float *bt [[buffer(1)]],
                        threadgroup float *a [[threadgroup(0)]], uint lane [[thread_index_in_simdgroup]]) {
  for (uint i = lane; i < 256; i += 32) a[i] = float(i % 7) - 3.0f;
  simdgroup_barrier(mem_flags::mem_threadgroup);
  for (uint ti = 0; ti < 2; ti++)
    for (uint tj = 0; tj < 2; tj++) {
      simdgroup_float8x8 acc = make_filled_simdgroup_matrix<float, 8, 8>(0.5f);
      for (uint tk = 0; tk < 2; tk++) {
        simdgroup_float8x8 ma, mb;
        simdgroup_load(ma, a, 16, ulong2(tk * 8, ti * 8));
        simdgroup_load(mb, bt, 16, ulong2(tk * 8, tj * 8), true);
        simdgroup_multiply_accumulate(acc, ma, mb, acc);
      }
      simdgroup_store(acc, c, 16, ulong2(tj * 8, ti * 8));
    }
}
