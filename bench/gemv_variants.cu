// GEMV variants on CUDA (the lab behind kernels/cuda/matmul.cu's dense bf16 path): y[n] = W[n×k] (bf16) · x[k] (f32).
// Build and run on the GPU machine: nvcc -std=c++17 -O3 -arch=sm_90 -o /tmp/gemv bench/gemv_variants.cu && /tmp/gemv
// Each variant runs as a CUDA graph of 64 chained launches over 4 copies of W (so L2 cannot serve them).
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <cmath>
#include <algorithm>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

__device__ __forceinline__ float warp_sum(float v) { for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o); return v; }

// v0: the current kernel (one warp per row, two 16 B loads in flight per lane)
__global__ void v0(const float *x, const __nv_bfloat16 *w, float *y, uint32_t n_, uint32_t k) {
  uint32_t n = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (n >= n_) return;
  const uint4 *w4 = reinterpret_cast<const uint4 *>(w + (uint64_t)n * k);
  const float4 *x4 = reinterpret_cast<const float4 *>(x);
  uint32_t chunks = k / 8; float acc = 0, acc1 = 0;
  auto step = [&](uint32_t c, float &sum) {
    uint4 wv = w4[c]; float4 x0 = x4[2 * c], x1 = x4[2 * c + 1];
    const __nv_bfloat162 *p = reinterpret_cast<const __nv_bfloat162 *>(&wv);
    float2 a = __bfloat1622float2(p[0]), b = __bfloat1622float2(p[1]), cc = __bfloat1622float2(p[2]), d = __bfloat1622float2(p[3]);
    sum += x0.x * a.x + x0.y * a.y + x0.z * b.x + x0.w * b.y;
    sum += x1.x * cc.x + x1.y * cc.y + x1.z * d.x + x1.w * d.y;
  };
  uint32_t c = lane;
  for (; c + 32 < chunks; c += 64) { step(c, acc); step(c + 32, acc1); }
  if (c < chunks) step(c, acc);
  acc = warp_sum(acc + acc1);
  if (lane == 0) y[n] = acc;
}

// vR_S: each warp computes R rows over 1/S of K; a block of 4 warps covers (4/S)·R rows; x is
// loaded once per chunk and reused for the R rows; U chunks in flight per lane.
template <int R, int S, int U>
__global__ void __launch_bounds__(128) vrs(const float *x, const __nv_bfloat16 *w, float *y, uint32_t n_, uint32_t k) {
  constexpr int GROUPS = 4 / S;
  const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint32_t g = warp / S, part = warp % S;
  const uint32_t n0 = (blockIdx.x * GROUPS + g) * R;
  const uint32_t chunks = k / 8;
  const float4 *x4 = reinterpret_cast<const float4 *>(x);
  const uint4 *wr[R];
#pragma unroll
  for (int r = 0; r < R; r++) wr[r] = reinterpret_cast<const uint4 *>(w + (uint64_t)min(n0 + r, n_ - 1) * k);
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; r++) acc[r] = 0.f;
  uint32_t c = part * 32 + lane;
  const uint32_t stride = 32 * S;
  for (; c + (U - 1) * stride < chunks; c += U * stride) {
    uint4 wv[U][R]; float4 xa[U], xb[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
#pragma unroll
      for (int r = 0; r < R; r++) wv[u][r] = __ldg(&wr[r][c + u * stride]);
      xa[u] = x4[2 * (c + u * stride)]; xb[u] = x4[2 * (c + u * stride) + 1];
    }
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
      for (int r = 0; r < R; r++) {
        const __nv_bfloat162 *p = reinterpret_cast<const __nv_bfloat162 *>(&wv[u][r]);
        float2 a = __bfloat1622float2(p[0]), b = __bfloat1622float2(p[1]), cc = __bfloat1622float2(p[2]), d = __bfloat1622float2(p[3]);
        acc[r] += xa[u].x * a.x + xa[u].y * a.y + xa[u].z * b.x + xa[u].w * b.y + xb[u].x * cc.x + xb[u].y * cc.y + xb[u].z * d.x + xb[u].w * d.y;
      }
  }
  for (; c < chunks; c += stride) {
    float4 xa = x4[2 * c], xb = x4[2 * c + 1];
#pragma unroll
    for (int r = 0; r < R; r++) {
      uint4 wv = __ldg(&wr[r][c]);
      const __nv_bfloat162 *p = reinterpret_cast<const __nv_bfloat162 *>(&wv);
      float2 a = __bfloat1622float2(p[0]), b = __bfloat1622float2(p[1]), cc = __bfloat1622float2(p[2]), d = __bfloat1622float2(p[3]);
      acc[r] += xa.x * a.x + xa.y * a.y + xa.z * b.x + xa.w * b.y + xb.x * cc.x + xb.y * cc.y + xb.z * d.x + xb.w * d.y;
    }
  }
  __shared__ float part_sums[4][R];
#pragma unroll
  for (int r = 0; r < R; r++) { float v = warp_sum(acc[r]); if (lane == 0) part_sums[warp][r] = v; }
  if (S > 1) __syncthreads();
  if (part == 0 && lane < R) {
    float v = 0;
#pragma unroll
    for (int s = 0; s < S; s++) v += part_sums[g * S + s][lane];
    if (n0 + lane < n_) y[n0 + lane] = v;
  }
}

// pers<R, U>: persistent grid-stride form: as many blocks as fit on the GPU at once; each warp takes
// R rows at a time (x reused across them, U steps in flight) and strides over the row groups.
template <int R, int U>
__global__ void __launch_bounds__(128) pers(const float *x, const __nv_bfloat16 *w, float *y, uint32_t n_, uint32_t k) {
  const uint32_t lane = threadIdx.x & 31, chunks = k / 8;
  const float4 *x4 = reinterpret_cast<const float4 *>(x);
  for (uint32_t rg = blockIdx.x * 4 + (threadIdx.x >> 5); rg * R < n_; rg += gridDim.x * 4) {
    const uint32_t n0 = rg * R;
    const uint4 *wr[R];
#pragma unroll
    for (int r = 0; r < R; r++) wr[r] = reinterpret_cast<const uint4 *>(w + (uint64_t)min(n0 + r, n_ - 1) * k);
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.f;
    uint32_t c = lane;
    for (; c + (U - 1) * 32 < chunks; c += U * 32) {
      uint4 wv[U][R]; float4 xa[U], xb[U];
#pragma unroll
      for (int u = 0; u < U; u++) {
#pragma unroll
        for (int r = 0; r < R; r++) wv[u][r] = __ldg(&wr[r][c + u * 32]);
        xa[u] = x4[2 * (c + u * 32)]; xb[u] = x4[2 * (c + u * 32) + 1];
      }
#pragma unroll
      for (int u = 0; u < U; u++)
#pragma unroll
        for (int r = 0; r < R; r++) {
          const __nv_bfloat162 *p = reinterpret_cast<const __nv_bfloat162 *>(&wv[u][r]);
          float2 a = __bfloat1622float2(p[0]), b = __bfloat1622float2(p[1]), cc = __bfloat1622float2(p[2]), d = __bfloat1622float2(p[3]);
          acc[r] += xa[u].x * a.x + xa[u].y * a.y + xa[u].z * b.x + xa[u].w * b.y + xb[u].x * cc.x + xb[u].y * cc.y + xb[u].z * d.x + xb[u].w * d.y;
        }
    }
    for (; c < chunks; c += 32) {
      float4 xa = x4[2 * c], xb = x4[2 * c + 1];
#pragma unroll
      for (int r = 0; r < R; r++) {
        uint4 wv = __ldg(&wr[r][c]);
        const __nv_bfloat162 *p = reinterpret_cast<const __nv_bfloat162 *>(&wv);
        float2 a = __bfloat1622float2(p[0]), b = __bfloat1622float2(p[1]), cc = __bfloat1622float2(p[2]), d = __bfloat1622float2(p[3]);
        acc[r] += xa.x * a.x + xa.y * a.y + xa.z * b.x + xa.w * b.y + xb.x * cc.x + xb.y * cc.y + xb.z * d.x + xb.w * d.y;
      }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
      float v = warp_sum(acc[r]);
      if (lane == 0 && n0 + r < n_) y[n0 + r] = v;
    }
  }
}

typedef void (*kfn)(const float *, const __nv_bfloat16 *, float *, uint32_t, uint32_t);
struct Var { const char *name; kfn f; int rows_per_block; bool persistent = false; };

int main() {
  uint32_t shapes[][2] = {{2048, 2048}, {3072, 2048}, {11264, 2048}, {5632, 2048}, {2048, 5632}, {32000, 2048}};
  Var vars[] = {
    {"v0 (current)", v0, 4},
    {"R1 S1 U4", vrs<1, 1, 4>, 4}, {"R2 S1 U2", vrs<2, 1, 2>, 8}, {"R2 S1 U4", vrs<2, 1, 4>, 8},
    {"R4 S1 U2", vrs<4, 1, 2>, 16}, {"R4 S1 U1", vrs<4, 1, 1>, 16},
    {"R2 S2 U2", vrs<2, 2, 2>, 4}, {"R4 S2 U2", vrs<4, 2, 2>, 8}, {"R1 S2 U4", vrs<1, 2, 4>, 2},
    {"R2 S4 U2", vrs<2, 4, 2>, 2}, {"R4 S4 U2", vrs<4, 4, 2>, 4}, {"R1 S4 U4", vrs<1, 4, 4>, 1},
    {"pers R1 U4", pers<1, 4>, 4, true}, {"pers R2 U2", pers<2, 2>, 8, true}, {"pers R2 U4", pers<2, 4>, 8, true},
    {"pers R4 U2", pers<4, 2>, 16, true}, {"pers R1 U8", pers<1, 8>, 4, true},
  };
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaStream_t st; CK(cudaStreamCreate(&st));
  for (auto &s : shapes) {
    uint32_t n = s[0], k = s[1];
    std::vector<__nv_bfloat16> hw((size_t)n * k); std::vector<float> hx(k);
    for (size_t i = 0; i < hw.size(); i++) hw[i] = __float2bfloat16(((i * 2654435761u) >> 20 & 255) / 256.f - 0.5f);
    for (uint32_t i = 0; i < k; i++) hx[i] = sinf(i * 0.37f);
    // 4 copies of W so chained launches cannot be served from L2 (50 MB) for the small shapes
    const int COPIES = 4;
    __nv_bfloat16 *w; float *x, *y, *yref;
    CK(cudaMalloc(&w, hw.size() * 2 * COPIES)); CK(cudaMalloc(&x, k * 4)); CK(cudaMalloc(&y, n * 4)); CK(cudaMalloc(&yref, n * 4));
    for (int c = 0; c < COPIES; c++) CK(cudaMemcpy(w + (size_t)c * hw.size(), hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(x, hx.data(), k * 4, cudaMemcpyHostToDevice));
    v0<<<(n + 3) / 4, 128>>>(x, w, yref, n, k); CK(cudaDeviceSynchronize());
    std::vector<float> r1(n), r2(n); CK(cudaMemcpy(r1.data(), yref, n * 4, cudaMemcpyDeviceToHost));
    printf("shape %u x %u (%.1f MB)\n", n, k, n * (double)k * 2 / 1e6);
    for (auto &v : vars) {
      const int L = 64;
      cudaGraph_t g; cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      int blocks = (n + v.rows_per_block - 1) / v.rows_per_block;
      if (v.persistent) {
        int per_sm = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, v.f, 128, 0));
        blocks = std::min(blocks, per_sm * sms);
      }
      for (int i = 0; i < L; i++) v.f<<<blocks, 128, 0, st>>>(x, w + (size_t)(i % COPIES) * hw.size(), y, n, k);
      CK(cudaStreamEndCapture(st, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
      cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
      float best = 1e9;
      for (int rep = 0; rep < 10; rep++) {
        cudaEventRecord(e0, st); CK(cudaGraphLaunch(ge, st)); cudaEventRecord(e1, st); CK(cudaEventSynchronize(e1));
        float ms; cudaEventElapsedTime(&ms, e0, e1); if (ms < best) best = ms;
      }
      CK(cudaMemcpy(r2.data(), y, n * 4, cudaMemcpyDeviceToHost));
      double md = 0; for (uint32_t i = 0; i < n; i++) md = fmax(md, fabs(r1[i] - r2[i]));
      double us = best * 1000 / L;
      printf("  %-14s %8.2f us  %7.0f GB/s  maxdiff %.2e\n", v.name, us, n * (double)k * 2 / us / 1e3, md);
      cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
    }
    cudaFree(w); cudaFree(x); cudaFree(y); cudaFree(yref);
  }
}
