// Dependent-product chain lab: how much of the decode step's product chain is the dependency between
// kernels rather than the weight streaming, and whether a persistent kernel (one launch, a grid-wide
// barrier between products) would recover it. The chain is the decode step's products for 16 layers
// (Q/K/V 3072×2048, output 2048×2048, gate/up 11264×2048, down 2048×5632; 1.4 GB of bf16 weights, so
// L2 cannot serve them); product i+1 reads the first k of product i's outputs.
//
// Variants, all with the dense kernel's arithmetic (2 rows per warp pair, K split across the pair, the
// first 4 steps of each row staged in shared memory with cp.async), so every variant's final vector is
// bit-identical:
//   graph          a CUDA graph of one kernel per product, plain edges (full completion)
//   graph+pdl      programmatic edges on the launch-completion port (what native/cuda/backend.cu builds):
//                  a product's blocks stage their weights while its producer runs
//   persist/B      one cooperative kernel of B blocks (all resident); each block stages its first tile of
//                  product i+1 in shared memory, waits at a grid-wide barrier for product i, then computes its
//                  tiles one after another; "barriers alone" times the same kernel's barriers without the work
//
// Build and run on the GPU machine (compute capability 9.0):
//   nvcc -std=c++17 -O3 -arch=sm_90 -o /tmp/chain bench/chain_lab.cu && /tmp/chain
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));                        \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

constexpr int STAGE = 4;          // staged steps per row (a step: 64 chunks of 8 values per row)
constexpr uint32_t ROWS_PER_TILE = 4; // a block of 4 warps computes 4 outputs per tile

struct Product {
  const __nv_bfloat16 *w;
  const float *x;
  float *y;
  uint32_t n, k;
};

__host__ __device__ constexpr uint32_t tiles_of(uint32_t n) { return (n + ROWS_PER_TILE - 1) / ROWS_PER_TILE; }

struct Stage {
  uint4 v[4][STAGE][2][32]; // [warp][step][row of the pair][lane]
};

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float dot8(uint4 wv, float4 x0, float4 x1) {
  const __nv_bfloat162 *p = reinterpret_cast<const __nv_bfloat162 *>(&wv);
  float2 a = __bfloat1622float2(p[0]), b = __bfloat1622float2(p[1]);
  float2 c = __bfloat1622float2(p[2]), d = __bfloat1622float2(p[3]);
  return x0.x * a.x + x0.y * a.y + x0.z * b.x + x0.w * b.y + x1.x * c.x + x1.y * c.y + x1.z * d.x + x1.w * d.y;
}

__device__ __forceinline__ void copy_async16(void *smem, const void *gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(smem)), "l"(gmem)
               : "memory");
}

// The rows of `tile` this warp's pair owns, and where this lane starts.
struct Lane {
  const uint4 *w0, *w1;
  uint32_t row0, chunks, c;
};
__device__ __forceinline__ Lane lane_of(const Product &p, uint32_t tile) {
  const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint32_t row0 = tile * ROWS_PER_TILE + (warp / 2) * 2;
  const uint32_t r0 = min(row0, p.n - 1), r1 = min(row0 + 1, p.n - 1);
  return Lane{reinterpret_cast<const uint4 *>(p.w + (uint64_t)r0 * p.k),
              reinterpret_cast<const uint4 *>(p.w + (uint64_t)r1 * p.k), row0, p.k / 8, (warp % 2) * 32 + lane};
}

__device__ __forceinline__ void stage_tile(const Product &p, uint32_t tile, Stage &st) {
  const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  Lane l = lane_of(p, tile);
#pragma unroll
  for (int j = 0; j < STAGE; j++) {
    const uint32_t cj = l.c + j * 64;
    if (cj < l.chunks) {
      copy_async16(&st.v[warp][j][0][lane], l.w0 + cj);
      copy_async16(&st.v[warp][j][1][lane], l.w1 + cj);
    }
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// Computes `tile` of product p (its staged steps from `st` when `staged`). COHERENT: x was written by
// other blocks of the same kernel, so it is read through L2.
template <bool COHERENT>
__device__ __forceinline__ void compute_tile(const Product &p, uint32_t tile, const Stage &st, bool staged,
                                             float (*partial)[2]) {
  const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  Lane l = lane_of(p, tile);
  const float4 *x4 = reinterpret_cast<const float4 *>(p.x);
  auto ldx = [&](uint32_t i) { return COHERENT ? __ldcg(x4 + i) : x4[i]; };
  float acc0 = 0.0f, acc1 = 0.0f;
  uint32_t c = l.c;
  auto pair_step = [&](uint4 a0, uint4 b0, uint4 a1, uint4 b1) {
    const uint32_t d = c + 64;
    float4 xc0 = ldx(2 * c), xc1 = ldx(2 * c + 1), xd0 = ldx(2 * d), xd1 = ldx(2 * d + 1);
    acc0 += dot8(a0, xc0, xc1) + dot8(b0, xd0, xd1);
    acc1 += dot8(a1, xc0, xc1) + dot8(b1, xd0, xd1);
    c += 128;
  };
  if (staged) {
    asm volatile("cp.async.wait_all;" ::: "memory");
#pragma unroll
    for (int j = 0; j < STAGE; j += 2)
      if (c + 64 < l.chunks) pair_step(st.v[warp][j][0][lane], st.v[warp][j + 1][0][lane], st.v[warp][j][1][lane],
                                       st.v[warp][j + 1][1][lane]);
  }
  while (c + 64 < l.chunks) pair_step(__ldg(l.w0 + c), __ldg(l.w0 + c + 64), __ldg(l.w1 + c), __ldg(l.w1 + c + 64));
  if (c < l.chunks) {
    float4 x0 = ldx(2 * c), x1 = ldx(2 * c + 1);
    acc0 += dot8(__ldg(l.w0 + c), x0, x1);
    acc1 += dot8(__ldg(l.w1 + c), x0, x1);
  }
  acc0 = warp_sum(acc0);
  acc1 = warp_sum(acc1);
  if (lane == 0) {
    partial[warp][0] = acc0;
    partial[warp][1] = acc1;
  }
  __syncthreads();
  if (warp % 2 == 0 && lane < 2 && l.row0 + lane < p.n) p.y[l.row0 + lane] = partial[warp][lane] + partial[warp + 1][lane];
  __syncthreads(); // partial and the stage are reused by the next tile
}

// One product per launch: block b computes tile b.
__global__ void __launch_bounds__(128) k_product(Product p) {
  __shared__ Stage st;
  __shared__ float partial[4][2];
  stage_tile(p, blockIdx.x, st);
  asm volatile("griddepcontrol.wait;" ::: "memory"); // returns at once without a programmatic edge
  compute_tile<false>(p, blockIdx.x, st, true, partial);
}

// The whole chain in one launch. A grid-wide barrier (arrival counter + generation word) separates
// the products; before waiting, each block stages its first tile of the next product.
__device__ unsigned int g_arrived, g_generation, g_timed_out;

__device__ __forceinline__ void grid_barrier(unsigned int blocks, unsigned int &generation) {
  __threadfence(); // every thread's outputs are visible device-wide before its block arrives
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned int gen = generation;
    if (atomicAdd(&g_arrived, 1u) == blocks - 1) {
      g_arrived = 0;
      __threadfence();
      atomicExch(&g_generation, gen + 1);
    } else {
      const long long t0 = clock64();
      while (*reinterpret_cast<volatile unsigned int *>(&g_generation) == gen) {
        if (clock64() - t0 > 4000000000ll) { // ~2 s: report instead of hanging
          g_timed_out = 1;
          break;
        }
      }
    }
    __threadfence();
  }
  generation++;
  __syncthreads();
}

__global__ void __launch_bounds__(128) k_persistent(const Product *products, uint32_t count, unsigned int gen0) {
  __shared__ Stage st;
  __shared__ float partial[4][2];
  unsigned int generation = gen0;
  const uint32_t blocks = gridDim.x;
  if (blockIdx.x < tiles_of(products[0].n)) stage_tile(products[0], blockIdx.x, st);
  for (uint32_t i = 0; i < count; i++) {
    const Product p = products[i];
    const uint32_t tiles = tiles_of(p.n);
    if (i > 0) grid_barrier(blocks, generation); // product i-1's outputs are this product's input
    for (uint32_t t = blockIdx.x; t < tiles; t += blocks)
      compute_tile<true>(p, t, st, t == blockIdx.x, partial);
    if (i + 1 < count && blockIdx.x < tiles_of(products[i + 1].n))
      stage_tile(products[i + 1], blockIdx.x, st);
  }
}

// Only the barriers of the persistent kernel: what the chain's count - 1 grid-wide waits cost alone.
__global__ void __launch_bounds__(128) k_barriers(uint32_t count, unsigned int gen0) {
  unsigned int generation = gen0;
  for (uint32_t i = 1; i < count; i++) grid_barrier(gridDim.x, generation);
}

int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);
  int dev = 0;
  CK(cudaSetDevice(dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  const uint32_t layer_shapes[4][2] = {{3072, 2048}, {2048, 2048}, {11264, 2048}, {2048, 5632}}; // n, k
  const int layers = 16, count = layers * 4;
  size_t bytes = 0;
  std::vector<__nv_bfloat16 *> weights(count);
  for (int i = 0; i < count; i++) {
    const uint32_t n = layer_shapes[i % 4][0], k = layer_shapes[i % 4][1];
    std::vector<__nv_bfloat16> h((size_t)n * k);
    uint32_t s = 12345u + i;
    for (auto &v : h) {
      s = s * 1664525u + 1013904223u;
      v = __float2bfloat16(((s >> 9) / 8388608.0f - 0.5f) / 32.0f);
    }
    CK(cudaMalloc(&weights[i], h.size() * 2));
    CK(cudaMemcpy(weights[i], h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    bytes += h.size() * 2;
  }
  // Activations: x0, then one output per product (11264 floats covers every n).
  std::vector<float *> act(count + 1);
  for (auto &a : act) CK(cudaMalloc(&a, 11264 * 4));
  std::vector<float> x0(11264);
  for (size_t i = 0; i < x0.size(); i++) x0[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
  CK(cudaMemcpy(act[0], x0.data(), x0.size() * 4, cudaMemcpyHostToDevice));
  std::vector<Product> prods(count);
  for (int i = 0; i < count; i++)
    prods[i] = Product{weights[i], act[i], act[i + 1], layer_shapes[i % 4][0], layer_shapes[i % 4][1]};
  Product *dprods;
  CK(cudaMalloc(&dprods, count * sizeof(Product)));
  CK(cudaMemcpy(dprods, prods.data(), count * sizeof(Product), cudaMemcpyHostToDevice));
  printf("%s: %d SMs; chain of %d products (16 layers of Q/K/V, output, gate/up, down), %.2f GB of weights\n",
         prop.name, prop.multiProcessorCount, count, bytes / 1e9);

  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> reference;
  auto report = [&](const char *name, auto launch) {
    std::vector<float> times;
    for (int r = 0; r < 25; r++) {
      CK(cudaMemset(act[count], 0, 11264 * 4));
      CK(cudaEventRecord(e0, stream));
      launch();
      CK(cudaEventRecord(e1, stream));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (r >= 5) times.push_back(ms * 1000.0f);
    }
    std::sort(times.begin(), times.end());
    std::vector<float> out(layer_shapes[3][0]);
    CK(cudaMemcpy(out.data(), act[count], out.size() * 4, cudaMemcpyDeviceToHost));
    bool same = true;
    if (reference.empty()) reference = out;
    else same = std::equal(out.begin(), out.end(), reference.begin());
    unsigned int timed_out = 0;
    CK(cudaMemcpyFromSymbol(&timed_out, g_timed_out, sizeof timed_out));
    if (timed_out) {
      printf("  %s: a grid barrier timed out\n", name);
      timed_out = 0; // the next variant reports its own
      CK(cudaMemcpyToSymbol(g_timed_out, &timed_out, sizeof timed_out));
    }
    const float best = times.front(), median = times[times.size() / 2];
    printf("  %-12s best %7.1f us  median %7.1f us  = %5.2f us per product, %5.2f TB/s  %s\n", name, best, median,
           best / count, bytes / (best * 1e-6) / 1e12, same ? "same result" : "RESULT DIFFERS");
  };

  // Graphs of one kernel per product, plain or programmatic edges.
  for (int pdl = 0; pdl < 2; pdl++) {
    cudaGraph_t graph;
    CK(cudaGraphCreate(&graph, 0));
    cudaGraphNode_t prev = nullptr;
    for (int i = 0; i < count; i++) {
      cudaKernelNodeParams kp{};
      void *args[] = {&prods[i]};
      kp.func = (void *)k_product;
      kp.gridDim = dim3(tiles_of(prods[i].n));
      kp.blockDim = dim3(128);
      kp.kernelParams = args;
      cudaGraphNode_t node;
      CK(cudaGraphAddKernelNode(&node, graph, nullptr, 0, &kp));
      if (prev) {
        cudaGraphEdgeData edge{};
        if (pdl) {
          edge.from_port = cudaGraphKernelNodePortLaunchCompletion;
          edge.type = cudaGraphDependencyTypeProgrammatic;
        }
        CK(cudaGraphAddDependencies(graph, &prev, &node, &edge, 1));
      }
      prev = node;
    }
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    report(pdl ? "graph+pdl" : "graph", [&] { CK(cudaGraphLaunch(exec, stream)); });
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
  }

  // The persistent kernel: as many blocks as fit at once (a cooperative launch guarantees it).
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_persistent, 128, 0));
  unsigned int generation = 0; // the barrier's generation word keeps counting across launches
  for (int fraction : {1, 2, 4}) {
    const uint32_t blocks = (uint32_t)(per_sm * prop.multiProcessorCount / fraction);
    uint32_t n = (uint32_t)count;
    char name[32];
    snprintf(name, sizeof name, "persist/%u", blocks);
    report(name, [&] {
      void *args[] = {&dprods, &n, &generation};
      CK(cudaLaunchCooperativeKernel((void *)k_persistent, dim3(blocks), dim3(128), args, 0, stream));
      generation += (unsigned int)count - 1;
    });
    float best = 1e9f;
    for (int r = 0; r < 20; r++) {
      void *args[] = {&n, &generation};
      CK(cudaEventRecord(e0, stream));
      CK(cudaLaunchCooperativeKernel((void *)k_barriers, dim3(blocks), dim3(128), args, 0, stream));
      CK(cudaEventRecord(e1, stream));
      CK(cudaEventSynchronize(e1));
      generation += (unsigned int)count - 1;
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      best = std::min(best, ms * 1000.0f);
    }
    printf("  %-12s barriers alone: %.2f us per barrier\n", name, best / (count - 1));
  }
  return 0;
}
