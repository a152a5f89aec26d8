// CUDA backend: the core's backend hooks (native/core/backend.h, through cuda_api.h) on the CUDA runtime.
//
// Memory: cudaMalloc (never managed memory), zero-filled; reads and writes copy. Execution: the
// queue thread turns a decoded command buffer into a CUDA graph — every dispatch of a concurrent
// group depends on every dispatch of the previous group (through an empty join node when that group
// is wide), so independent dispatches run concurrently and a barrier orders exactly what it must;
// on 9.0+ devices direct edges are programmatic (see build_graph). Kernels read their arguments
// from device memory, copied once per command buffer (only the span that changed), so a cached
// graph (by topology) is relaunched without per-node updates. MLXN_FLAG_NO_GRAPHS launches the kernels in
// order on the stream instead. Data-dependent kernel failures set a device fault word that the
// host checks after each command buffer; CUDA errors carry their CUDA error names.
//
// Pipelining: the core launches command buffer k+1 while k runs (mlxn_cuda_launch enqueues and
// returns; mlxn_cuda_complete waits). Each dispatch is read once, from the core's decoded command
// buffer (mlxn_dispatch), straight into its kernel's argument block. Everything the GPU or a pending
// copy may still read or write for one command buffer lives in its in-flight slot (flight_slot):
// start/stop events, fault word and its host mirror, and its own graph cache with the argument blocks those
// graphs are bound to. Each slot keeps its own cached graphs rather than sharing one graph whose
// arguments are re-uploaded per command buffer: the pinned host mirror of an argument block is read
// by the copy when the stream reaches it, so rewriting it for k+1 while k's copy is still queued
// would race; and per-slot graphs keep the fast path (a steady loop alternates slots, each seeing
// the same topology and nearly the same arguments, so no rebuilds and no per-node updates).
// Slot invariants: slots are used round-robin in launch order; the core keeps at most
// MLXN_CUDA_IN_FLIGHT launched and not completed and completes in launch order, so the slot a launch
// takes was completed (its stop event waited for) before; only the launch thread touches a slot's
// graphs and arguments, and the completion thread reads a slot only between its launch and the
// launch after its completion. All work is on one stream, so device-side order is commit order.
#include <cuda_runtime.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../../kernels/cuda/common.cuh"

#include "../mlxn.h"
#include "cuda_api.h"

static const mlxn_cuda_kernel *find_kernel(const char *name) { return mlxn_cuda_find_kernel(name); }

// The launch shape of one dispatch: what decides whether a cached graph can be reused.
struct node_shape {
  const void *func;
  dim3 grid, block;
  unsigned shared;
  uint32_t group;
  bool operator==(const node_shape &o) const {
    return func == o.func && grid.x == o.grid.x && grid.y == o.grid.y && grid.z == o.grid.z &&
           block.x == o.block.x && block.y == o.block.y && block.z == o.block.z && shared == o.shared &&
           group == o.group;
  }
};

// Kernel arguments in device memory, with a pinned host mirror. Kernels take a pointer to theirs,
// so a command buffer's arguments travel in one copy before its work, and a cached graph never
// needs per-node updates (cudaGraphExecKernelNodeSetParams cost ~0.7 µs of host time per node).
struct arg_block {
  mlxn_gpu_args *host = nullptr; // pinned; what the device copy holds once the copy has run
  mlxn_gpu_args *dev = nullptr;
  size_t cap = 0;
};

static void free_args(arg_block &b) {
  if (b.host) cudaFreeHost(b.host);
  if (b.dev) cudaFree(b.dev);
  b = arg_block{};
}

struct cached_graph {
  std::vector<node_shape> shape;
  std::vector<cudaEvent_t> events; // with dispatch timing: before and after each node
  arg_block args;                  // node i reads args.dev[i]; fixed for the graph's life
  std::vector<cudaGraphNode_t> nodes;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  uint64_t last_used = 0;
};

// What one command buffer in flight owns (see the slot invariants at the top).
struct flight_slot {
  uint32_t n = 0; // dispatches of the launched command buffer
  cudaEvent_t start = nullptr, stop = nullptr;
  unsigned int *fault = nullptr;      // device word: tag + 1 of a failed dispatch
  unsigned int *fault_host = nullptr; // pinned; the fault word copied back behind the work
  std::vector<cached_graph> cache;
  arg_block stream_args;                  // arguments of plain stream launches
  std::vector<cudaEvent_t> stream_events; // dispatch timing of plain stream launches
  const cudaEvent_t *events = nullptr;    // before/after each dispatch of the launched work, when timed
  bool anchor = false;                    // this launch recorded the pending clock anchor
  std::atomic<bool> busy{false};          // launched, not yet completed
};

struct cuda_state {
  int ordinal = 0;
  cudaDeviceProp prop{};
  cudaStream_t stream = nullptr;
  flight_slot slots[MLXN_CUDA_IN_FLIGHT];
  uint32_t flags = 0;     // the device's MLXN_FLAG_*
  uint32_t next_slot = 0; // launch thread only
  // GPU-to-host clock: anchors[anchor_cur] completed at host time anchor_host (CLOCK_MONOTONIC ns);
  // a GPU event's host time is anchor_host + its elapsed time after that anchor. Elapsed times are
  // floats in ms, so the anchor moves forward about once a second: a launch records the other
  // anchor event (anchor_pending) and the completion of that launch moves anchor_cur to it.
  cudaEvent_t anchors[2] = {nullptr, nullptr};
  std::atomic<int> anchor_cur{0};
  std::atomic<bool> anchor_pending{false};
  uint64_t anchor_host = 0; // the completion thread's, except while nothing is in flight
  uint64_t anchor_launch_host = 0; // launch thread only
  uint64_t uses = 0;
  uint64_t graph_builds = 0, graph_reuses = 0, node_updates = 0; // node_updates: nodes whose arguments changed
  // Host time of the queue thread per phase, ns: packing arguments, building or updating graphs,
  // launching (cudaGraphLaunch / cudaLaunchKernel). For finding where submit cost goes.
  uint64_t pack_ns = 0, graph_ns = 0, launch_ns = 0;
  bool pdl = false; // programmatic dependent launch in graphs (compute capability 9.0+)
  // Launch thread's work arrays, kept between command buffers (no allocation in steady state).
  std::vector<node_shape> shape;
  std::vector<mlxn_gpu_args> args;
};

static const size_t CACHE_SIZE = 8;

// The core's clock (mlxn_now_ns): command-buffer times are on it.
static uint64_t host_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t now_ns() {
  return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

static int cuda_error(cudaError_t e, const char *what, char *err, size_t cap) {
  snprintf(err, cap, "%s failed: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
  return e == cudaErrorMemoryAllocation ? MLXN_E_OUT_OF_MEMORY : MLXN_E_DEVICE;
}

extern "C" int32_t mlxn_cuda_open(void **state, uint32_t flags, char *err, size_t cap) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    snprintf(err, cap, "no CUDA device: %s", e == cudaSuccess ? "none found" : cudaGetErrorName(e));
    return MLXN_E_DEVICE;
  }
  cuda_state *s = new cuda_state();
  s->flags = flags;
  e = cudaSetDevice(0);
  if (e == cudaSuccess) e = cudaGetDeviceProperties(&s->prop, 0);
  if (e == cudaSuccess) e = cudaStreamCreate(&s->stream);
  for (int i = 0; i < 2 && e == cudaSuccess; i++) e = cudaEventCreate(&s->anchors[i]);
  for (flight_slot &f : s->slots) {
    if (e == cudaSuccess) e = cudaEventCreate(&f.start);
    if (e == cudaSuccess) e = cudaEventCreate(&f.stop);
    if (e == cudaSuccess) e = cudaMalloc(reinterpret_cast<void **>(&f.fault), sizeof(unsigned int));
    if (e == cudaSuccess) e = cudaMemset(f.fault, 0, sizeof(unsigned int));
    if (e == cudaSuccess) e = cudaMallocHost(reinterpret_cast<void **>(&f.fault_host), sizeof(unsigned int));
    if (e == cudaSuccess) *f.fault_host = 0;
    if (e == cudaSuccess) f.cache.reserve(CACHE_SIZE);
  }
  if (e == cudaSuccess) e = cudaEventRecord(s->anchors[0], s->stream);
  if (e == cudaSuccess) e = cudaEventSynchronize(s->anchors[0]);
  if (e != cudaSuccess) {
    int rc = cuda_error(e, "opening the CUDA device", err, cap);
    mlxn_cuda_close(s);
    return rc;
  }
  s->anchor_host = s->anchor_launch_host = host_ns(); // the stream was idle: the anchor just completed
  s->pdl = s->prop.major >= 9;
  *state = s;
  return 0;
}

// Destroys a graph's CUDA objects (its argument block stays).
static void destroy_graph(cached_graph &g) {
  if (g.exec) cudaGraphExecDestroy(g.exec);
  if (g.graph) cudaGraphDestroy(g.graph);
  g.exec = nullptr;
  g.graph = nullptr;
  for (cudaEvent_t e : g.events) cudaEventDestroy(e);
  g.events.clear();
}

static void drop_graph(cached_graph &g) {
  destroy_graph(g);
  free_args(g.args);
}

extern "C" void mlxn_cuda_close(void *state) {
  cuda_state *s = static_cast<cuda_state *>(state);
  if (!s) return;
  cudaSetDevice(s->ordinal);
  if (s->stream) cudaStreamSynchronize(s->stream); // the core completed everything; belt and braces
  for (flight_slot &f : s->slots) {
    for (cached_graph &g : f.cache) drop_graph(g);
    for (cudaEvent_t e : f.stream_events) cudaEventDestroy(e);
    free_args(f.stream_args);
    if (f.fault) cudaFree(f.fault);
    if (f.fault_host) cudaFreeHost(f.fault_host);
    if (f.start) cudaEventDestroy(f.start);
    if (f.stop) cudaEventDestroy(f.stop);
  }
  for (cudaEvent_t e : s->anchors)
    if (e) cudaEventDestroy(e);
  if (s->stream) cudaStreamDestroy(s->stream);
  delete s;
}

extern "C" uint32_t mlxn_cuda_info(void *state, char *buf, uint32_t cap) {
  cuda_state *s = static_cast<cuda_state *>(state);
  const uint32_t flags = s->flags;
  return (uint32_t)snprintf(
      buf, cap,
      "\"name\":\"%s\",\"computeCapability\":\"%d.%d\",\"memoryBytes\":%zu,"
      "\"unifiedMemory\":false,\"cudaGraphs\":%s,\"cudaPdl\":%s,\"perDispatchTiming\":true,"
      "\"graphBuilds\":%llu,\"graphReuses\":%llu,\"nodeUpdates\":%llu,\"hostPackNs\":%llu,"
      "\"hostGraphNs\":%llu,\"hostLaunchNs\":%llu",
      s->prop.name, s->prop.major, s->prop.minor, s->prop.totalGlobalMem,
      (flags & MLXN_FLAG_NO_GRAPHS) ? "false" : "true",
      !(flags & MLXN_FLAG_NO_GRAPHS) && !(flags & MLXN_FLAG_NO_PDL) && s->pdl ? "true" : "false",
      (unsigned long long)s->graph_builds,
      (unsigned long long)s->graph_reuses, (unsigned long long)s->node_updates, (unsigned long long)s->pack_ns,
      (unsigned long long)s->graph_ns, (unsigned long long)s->launch_ns);
}

extern "C" void *mlxn_cuda_alloc(void *state, uint64_t nbytes, void **object) {
  (void)state;
  (void)object;
  void *p = nullptr;
  if (cudaMalloc(&p, nbytes) != cudaSuccess) return nullptr;
  if (cudaMemset(p, 0, nbytes) != cudaSuccess) { // zero-filled, like every backend
    cudaFree(p);
    return nullptr;
  }
  return p;
}

extern "C" void mlxn_cuda_free(void *state, void *mem, void *object) {
  (void)state;
  (void)object;
  cudaFree(mem);
}

extern "C" int32_t mlxn_cuda_copy(void *state, uint8_t *mem, uint8_t *host, uint64_t len, int to_device, char *err,
                                  size_t cap) {
  (void)state;
  // Plain cudaMemcpy orders after the work already queued on the (blocking) stream.
  cudaError_t e = to_device ? cudaMemcpy(mem, host, len, cudaMemcpyHostToDevice)
                            : cudaMemcpy(host, mem, len, cudaMemcpyDeviceToHost);
  return e == cudaSuccess ? 0 : cuda_error(e, to_device ? "buffer write" : "buffer read", err, cap);
}

// This backend's object for a kernel: its entry in the CUDA kernel tables (mlxn_dispatch.kernel).
extern "C" const void *mlxn_cuda_kernel_of(void *state, const mlxn_contract *contract) {
  (void)state;
  return find_kernel(contract->name);
}

// The outcome of running one command buffer.
struct run_status {
  int code = 0;
  char *err;
  size_t cap;
};

static bool cuda_ok(cudaError_t e, run_status &st, const char *what) {
  if (e == cudaSuccess) return true;
  if (st.code == 0) {
    st.code = MLXN_E_EXECUTION;
    snprintf(st.err, st.cap, "%s failed: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
  }
  return false;
}

static_assert(MLXN_GPU_SLOTS == MLXN_KERNEL_SLOTS, "a GPU argument block holds every slot a kernel may declare");

// Packs a decoded dispatch into the kernel's argument block (the one read of the dispatch).
static bool pack_args(const mlxn_dispatch &d, const flight_slot &f, mlxn_gpu_args &g, run_status &st) {
  memset(&g, 0, sizeof g); // unused slots and padding compare equal between command buffers
  const mlxn_kernel_args &a = d.args;
  uint32_t used = 0;
  for (uint32_t i = 0; d.contract->signature[i] && i < MLXN_GPU_SLOTS; i++) {
    g.len[i] = a.len[i];
    if (d.contract->signature[i] == 'c') {
      uint32_t n = (uint32_t)a.len[i], at = (used + 15u) & ~15u;
      if (at + n > MLXN_GPU_BYTES) {
        st.code = MLXN_E_UNSUPPORTED;
        snprintf(st.err, st.cap, "kernel %s: more than %d bytes of inline constants", d.contract->name, MLXN_GPU_BYTES);
        return false;
      }
      memcpy(g.bytes + at, a.ptr[i], n);
      g.boff[i] = at;
      used = at + n;
    } else {
      g.ptr[i] = reinterpret_cast<unsigned long long>(a.ptr[i]);
    }
  }
  for (int i = 0; i < 3; i++) {
    g.grid[i] = a.grid[i];
    g.tg[i] = a.tg[i];
    g.groups[i] = a.groups[i];
  }
  g.tag = d.tag;
  g.fault = reinterpret_cast<unsigned long long>(f.fault);
  return true;
}

static node_shape shape_of(const mlxn_dispatch &d) {
  const mlxn_cuda_kernel *k = static_cast<const mlxn_cuda_kernel *>(d.kernel); // never NULL: see mlxn_cuda_kernel_of
  const mlxn_kernel_args &a = d.args;
  unsigned threads = a.tg[0] * a.tg[1] * a.tg[2];
  unsigned shared = a.tg_memory;
  if (k->shared_floats_per_thread) { // the kernel reduces through shared memory: make sure it fits
    unsigned need = threads * 4u * (unsigned)k->shared_floats_per_thread;
    if (shared < need) shared = need;
  }
  return node_shape{k->func, dim3(a.groups[0], a.groups[1], a.groups[2]), dim3(a.tg[0], a.tg[1], a.tg[2]), shared,
                    d.group};
}

// A kernel's one parameter (its arguments' device address) and the parameter array pointing at it;
// must live until the launch or node creation that reads them returns.
struct kernel_param {
  const mlxn_gpu_args *args;
  void *array[1];
};

// Launch parameters of a dispatch whose arguments are at device address `args`.
static cudaKernelNodeParams node_params(const node_shape &sh, const mlxn_gpu_args *args, kernel_param *kp) {
  cudaKernelNodeParams p{};
  p.func = const_cast<void *>(sh.func);
  p.gridDim = sh.grid;
  p.blockDim = sh.block;
  p.sharedMemBytes = sh.shared;
  kp->args = args;
  kp->array[0] = &kp->args;
  p.kernelParams = kp->array;
  return p;
}

// Room for n arguments (contents not kept when it grows).
static bool reserve_args(arg_block &b, size_t n, run_status &cb) {
  if (b.cap >= n) return true;
  free_args(b);
  if (!cuda_ok(cudaMallocHost(reinterpret_cast<void **>(&b.host), n * sizeof(mlxn_gpu_args)), cb, "cudaMallocHost") ||
      !cuda_ok(cudaMalloc(reinterpret_cast<void **>(&b.dev), n * sizeof(mlxn_gpu_args)), cb, "cudaMalloc")) {
    free_args(b);
    return false;
  }
  b.cap = n;
  return true;
}

// Queues the copy of arguments [lo, hi) to the device (on the stream, so before the work after it).
static bool upload_args(cuda_state *s, const arg_block &b, size_t lo, size_t hi, run_status &cb) {
  if (lo >= hi) return true;
  return cuda_ok(cudaMemcpyAsync(b.dev + lo, b.host + lo, (hi - lo) * sizeof(mlxn_gpu_args), cudaMemcpyHostToDevice,
                                 s->stream),
                 cb, "copying kernel arguments");
}

// A barrier after a group of at most this many dispatches links every dispatch of the next group
// straight to each of them; a wider group first joins in an empty node (fewer edges).
static const size_t DIRECT_EDGE_LIMIT = 8;

// Makes `n` timing events (appended to `events`).
static bool make_events(std::vector<cudaEvent_t> &events, size_t n, run_status &cb) {
  while (events.size() < n) {
    cudaEvent_t e;
    if (!cuda_ok(cudaEventCreate(&e), cb, "cudaEventCreate")) return false;
    events.push_back(e);
  }
  return true;
}

// Builds and instantiates a graph for this topology. With `pdl`, direct barrier edges are
// programmatic: a dependent kernel may launch once all blocks of its producers have started, and
// waits in-kernel (kernel_args) for their completion. That hides the launch latency of each
// dependent step; the order and visibility of memory are those of a full dependency. With `timing`,
// each kernel node sits between two event-record nodes, and the next group depends on the "after"
// events (so a dependent dispatch's start is never recorded before its producer's end); no
// programmatic edges then.
static bool build_graph(cached_graph &g, bool pdl, bool timing, run_status &cb) {
  if (!cuda_ok(cudaGraphCreate(&g.graph, 0), cb, "cudaGraphCreate")) return false;
  g.nodes.assign(g.shape.size(), nullptr);
  if (timing && !make_events(g.events, 2 * g.shape.size(), cb)) return false;
  pdl = pdl && !timing;
  cudaGraphEdgeData early{};
  early.from_port = cudaGraphKernelNodePortLaunchCompletion;
  early.type = cudaGraphDependencyTypeProgrammatic;
  std::vector<cudaGraphNode_t> prev, cur; // the previous and the current concurrent group
  std::vector<cudaGraphEdgeData> edges;
  cudaGraphNode_t join = nullptr;
  bool direct = false;
  for (size_t i = 0; i < g.shape.size(); i++) {
    if (i > 0 && g.shape[i].group != g.shape[i - 1].group) { // a barrier
      prev.swap(cur);
      cur.clear();
      direct = prev.size() <= DIRECT_EDGE_LIMIT;
      if (!direct && !cuda_ok(cudaGraphAddEmptyNode(&join, g.graph, prev.data(), prev.size()), cb,
                              "cudaGraphAddEmptyNode"))
        return false;
    }
    kernel_param kp;
    cudaKernelNodeParams p = node_params(g.shape[i], g.args.dev + i, &kp);
    const cudaGraphNode_t *deps = prev.empty() ? nullptr : direct ? prev.data() : &join;
    size_t ndeps = prev.empty() ? 0 : direct ? prev.size() : 1;
    cudaGraphNode_t before = nullptr, after = nullptr;
    if (timing) { // the "before" event takes the kernel's dependencies; the kernel follows it
      if (!cuda_ok(cudaGraphAddEventRecordNode(&before, g.graph, deps, ndeps, g.events[2 * i]), cb,
                   "cudaGraphAddEventRecordNode"))
        return false;
      deps = &before;
      ndeps = 1;
    }
    if (!cuda_ok(cudaGraphAddKernelNode(&g.nodes[i], g.graph, nullptr, 0, &p), cb, "cudaGraphAddKernelNode"))
      return false;
    if (ndeps > 0) {
      std::vector<cudaGraphNode_t> to(ndeps, g.nodes[i]);
      edges.assign(ndeps, pdl && direct ? early : cudaGraphEdgeData{});
      if (!cuda_ok(cudaGraphAddDependencies(g.graph, deps, to.data(), edges.data(), ndeps), cb,
                   "cudaGraphAddDependencies"))
        return false;
    }
    if (timing && !cuda_ok(cudaGraphAddEventRecordNode(&after, g.graph, &g.nodes[i], 1, g.events[2 * i + 1]), cb,
                           "cudaGraphAddEventRecordNode"))
      return false;
    cur.push_back(timing ? after : g.nodes[i]);
  }
  return cuda_ok(cudaGraphInstantiate(&g.exec, g.graph, 0), cb, "cudaGraphInstantiate");
}

// The executable graph for this command buffer: a cached one of the same topology, or a new one,
// with the command buffer's arguments in its host mirror. Sets [*lo, *hi) to the arguments that
// must be copied to the device. NULL on failure (cb holds the error).
static cached_graph *graph_for(cuda_state *s, flight_slot &f, uint32_t flags, run_status &cb,
                               const std::vector<node_shape> &shape, const std::vector<mlxn_gpu_args> &args,
                               size_t *lo, size_t *hi) {
  for (cached_graph &g : f.cache) {
    if (!g.exec || g.shape.size() != shape.size() || !(g.shape == shape)) continue;
    // Same topology: the nodes stay; the arguments that changed are copied (one span).
    *lo = shape.size();
    *hi = 0;
    for (size_t i = 0; i < shape.size(); i++) {
      if (memcmp(&g.args.host[i], &args[i], sizeof(mlxn_gpu_args)) == 0) continue;
      g.args.host[i] = args[i];
      if (i < *lo) *lo = i;
      *hi = i + 1;
      s->node_updates++;
    }
    s->graph_reuses++;
    return &g;
  }
  cached_graph *slot = nullptr;
  if (f.cache.size() < CACHE_SIZE) {
    f.cache.emplace_back();
    slot = &f.cache.back();
  } else { // evict the least recently used (of this slot: none of its graphs is in flight)
    slot = &f.cache[0];
    for (cached_graph &g : f.cache)
      if (g.last_used < slot->last_used) slot = &g;
    drop_graph(*slot);
  }
  slot->shape = shape;
  if (!reserve_args(slot->args, shape.size(), cb)) {
    slot->shape.clear();
    return nullptr;
  }
  memcpy(slot->args.host, args.data(), args.size() * sizeof(mlxn_gpu_args));
  *lo = 0;
  *hi = shape.size();
  bool pdl = s->pdl && !(flags & MLXN_FLAG_NO_PDL), timing = (flags & MLXN_FLAG_DISPATCH_TIMING) != 0;
  if (!build_graph(*slot, pdl, timing, cb) && pdl) { // programmatic edges refused: build plain ones from now on
    destroy_graph(*slot);
    cb.code = 0;
    s->pdl = false;
    build_graph(*slot, false, timing, cb);
  }
  if (cb.code != 0) {
    drop_graph(*slot);
    slot->shape.clear();
    return nullptr;
  }
  s->graph_builds++;
  return slot;
}

// Runs the command buffer as a graph; returns it (for its timing events), or NULL on failure.
static cached_graph *run_graph(cuda_state *s, flight_slot &f, uint32_t flags, run_status &cb,
                               const std::vector<node_shape> &shape, const std::vector<mlxn_gpu_args> &args) {
  uint64_t t = now_ns();
  size_t lo = 0, hi = 0;
  cached_graph *g = graph_for(s, f, flags, cb, shape, args, &lo, &hi);
  uint64_t t_launch = now_ns();
  s->graph_ns += t_launch - t;
  if (!g) return nullptr;
  g->last_used = ++s->uses;
  // Device time starts here: finding or building the graph above is host work; the argument copy
  // is part of running the command buffer.
  if (cuda_ok(cudaEventRecord(f.start, s->stream), cb, "cudaEventRecord") && upload_args(s, g->args, lo, hi, cb))
    cuda_ok(cudaGraphLaunch(g->exec, s->stream), cb, "cudaGraphLaunch");
  s->launch_ns += now_ns() - t_launch;
  return g;
}

// Enqueues the slot's n dispatches d and the events and fault copy behind them. Returns the first
// error; the caller then waits for the stream (nothing left pending).
static int launch_slot(cuda_state *s, flight_slot &f, const mlxn_dispatch *d, uint32_t flags, run_status &st) {
  const uint32_t n = f.n;
  std::vector<node_shape> &shape = s->shape;
  std::vector<mlxn_gpu_args> &args = s->args;
  f.events = nullptr;
  try {
    shape.resize(n);
    args.resize(n);
  } catch (...) {
    st.code = MLXN_E_OUT_OF_MEMORY;
    snprintf(st.err, st.cap, "out of memory while launching the command buffer");
    return st.code;
  }
  uint64_t t_pack = now_ns();
  for (uint32_t i = 0; i < n; i++) {
    if (!pack_args(d[i], f, args[i], st)) return st.code;
    shape[i] = shape_of(d[i]);
  }
  s->pack_ns += now_ns() - t_pack;
  // Move the clock anchor forward about once a second (see cuda_state), before this slot's start.
  uint64_t now = host_ns();
  if (now - s->anchor_launch_host > 1000000000ull) {
    bool idle = true; // nothing in flight: the completion thread is not using the anchor
    for (const flight_slot &o : s->slots) idle = idle && !o.busy.load(std::memory_order_acquire);
    if (idle) { // the stream is (all but) empty: an anchor waited for now is exact to a few µs
      int cur = s->anchor_cur.load(std::memory_order_relaxed);
      if (!cuda_ok(cudaEventRecord(s->anchors[cur], s->stream), st, "cudaEventRecord") ||
          !cuda_ok(cudaEventSynchronize(s->anchors[cur]), st, "cudaEventSynchronize"))
        return st.code;
      s->anchor_host = s->anchor_launch_host = host_ns();
    } else if (!s->anchor_pending.load(std::memory_order_acquire)) { // resolved when this slot completes
      int next = 1 - s->anchor_cur.load(std::memory_order_relaxed);
      if (!cuda_ok(cudaEventRecord(s->anchors[next], s->stream), st, "cudaEventRecord")) return st.code;
      f.anchor = true;
      s->anchor_launch_host = now;
      s->anchor_pending.store(true, std::memory_order_release);
    }
  }
  if (n == 0 || (flags & MLXN_FLAG_NO_GRAPHS)) {
    if (!cuda_ok(cudaEventRecord(f.start, s->stream), st, "cudaEventRecord")) return st.code;
  }
  const bool timing = (flags & MLXN_FLAG_DISPATCH_TIMING) != 0;
  if (n > 0) {
    if (flags & MLXN_FLAG_NO_GRAPHS) { // plain in-order launches: every dispatch serialised
      if (timing && !make_events(f.stream_events, 2 * (size_t)n, st)) return st.code;
      if (!reserve_args(f.stream_args, n, st)) return st.code;
      memcpy(f.stream_args.host, args.data(), n * sizeof(mlxn_gpu_args));
      uint64_t t = now_ns();
      upload_args(s, f.stream_args, 0, n, st);
      for (uint32_t i = 0; i < n && st.code == 0; i++) {
        kernel_param kp;
        cudaKernelNodeParams p = node_params(shape[i], f.stream_args.dev + i, &kp);
        if (timing) cuda_ok(cudaEventRecord(f.stream_events[2 * i], s->stream), st, "cudaEventRecord");
        cuda_ok(cudaLaunchKernel(p.func, p.gridDim, p.blockDim, p.kernelParams, p.sharedMemBytes, s->stream), st,
                "cudaLaunchKernel");
        if (timing) cuda_ok(cudaEventRecord(f.stream_events[2 * i + 1], s->stream), st, "cudaEventRecord");
      }
      s->launch_ns += now_ns() - t;
      if (timing) f.events = f.stream_events.data();
    } else {
      cached_graph *g = run_graph(s, f, flags, st, shape, args);
      if (g && timing) f.events = g->events.data();
    }
  }
  if (st.code != 0) return st.code;
  // The fault word comes back behind the work on the same stream: reading it needs no device-wide
  // synchronisation (a plain cudaMemcpy would also wait for the command buffers launched after).
  if (cuda_ok(cudaMemcpyAsync(f.fault_host, f.fault, sizeof(unsigned int), cudaMemcpyDeviceToHost, s->stream), st,
              "copying the fault word"))
    cuda_ok(cudaEventRecord(f.stop, s->stream), st, "cudaEventRecord");
  return st.code;
}

extern "C" void mlxn_cuda_launch(void *state, mlxn_command *cmd) {
  cuda_state *s = static_cast<cuda_state *>(state);
  run_status st;
  st.err = cmd->error;
  st.cap = sizeof cmd->error;
  cmd->backend_slot = -1;
  cudaSetDevice(s->ordinal);
  flight_slot &f = s->slots[s->next_slot];
  if (f.busy.load(std::memory_order_acquire)) { // the core broke its bound: refuse rather than race
    cmd->t_start = cmd->t_end = host_ns();
    mlxn_command_fail(cmd, MLXN_E_STATE, "internal error: CUDA in-flight slot %u is still in use", s->next_slot);
    return;
  }
  f.n = cmd->n_dispatches;
  if (launch_slot(s, f, cmd->dispatches, s->flags, st) != 0) {
    // Nothing may stay pending on this slot's memory: wait for what was enqueued, and give the
    // clock anchor back if this launch had taken it.
    cudaStreamSynchronize(s->stream);
    if (f.anchor) {
      f.anchor = false;
      s->anchor_pending.store(false, std::memory_order_release);
    }
    *f.fault_host = 0;
    cudaMemset(f.fault, 0, sizeof(unsigned int));
    cmd->t_start = cmd->t_end = host_ns();
    cmd->error_code = st.code; // its message is in cmd->error already
    return;
  }
  f.busy.store(true, std::memory_order_release);
  cmd->backend_slot = (int32_t)s->next_slot;
  s->next_slot = (s->next_slot + 1) % MLXN_CUDA_IN_FLIGHT;
}

extern "C" void mlxn_cuda_complete(void *state, mlxn_command *cmd) {
  cuda_state *s = static_cast<cuda_state *>(state);
  flight_slot &f = s->slots[cmd->backend_slot];
  run_status st;
  st.err = cmd->error;
  st.cap = sizeof cmd->error;
  uint64_t gpu_ns = 0, t_start = 0;
  cudaSetDevice(s->ordinal);
  const uint32_t n = f.n;
  mlxn_dispatch *d = cmd->dispatches;
  cuda_ok(cudaEventSynchronize(f.stop), st, "executing the command buffer");
  uint64_t done = host_ns();
  float ms = 0.0f;
  if (st.code == 0 && cudaEventElapsedTime(&ms, f.start, f.stop) == cudaSuccess) gpu_ns = (uint64_t)(ms * 1e6);
  // The GPU start on the host clock (fallback: the end as seen now, less the device time).
  int cur = s->anchor_cur.load(std::memory_order_relaxed);
  float since = 0.0f;
  if (st.code == 0 && cudaEventElapsedTime(&since, s->anchors[cur], f.start) == cudaSuccess && since >= 0.0f)
    t_start = s->anchor_host + (uint64_t)((double)since * 1e6);
  else
    t_start = done - gpu_ns;
  if (f.anchor) { // this launch recorded the next anchor, which completed before f.start
    float step = 0.0f;
    if (cudaEventElapsedTime(&step, s->anchors[cur], s->anchors[1 - cur]) == cudaSuccess && step >= 0.0f) {
      s->anchor_host += (uint64_t)((double)step * 1e6);
      s->anchor_cur.store(1 - cur, std::memory_order_relaxed);
    }
    f.anchor = false;
    s->anchor_pending.store(false, std::memory_order_release);
  }
  if (st.code == 0 && (s->flags & MLXN_FLAG_DISPATCH_TIMING) && f.events) {
    for (uint32_t i = 0; i < n; i++) {
      float a = 0.0f, b = 0.0f;
      cudaEventElapsedTime(&a, f.start, f.events[2 * i]);
      cudaEventElapsedTime(&b, f.start, f.events[2 * i + 1]);
      d[i].t_start = t_start + (uint64_t)(a * 1e6);
      d[i].t_end = t_start + (uint64_t)(b * 1e6);
    }
  }
  if (st.code != 0) cmd->error_code = st.code; // its message is in cmd->error already
  unsigned int fault = st.code == 0 ? *f.fault_host : 0;
  if (fault != 0) {
    *f.fault_host = 0;
    // On the stream, so ordered before this slot's next use (launched only after this returns).
    cudaMemsetAsync(f.fault, 0, sizeof fault, s->stream);
    mlxn_command_fault(cmd, fault);
  }
  cmd->t_start = t_start;
  cmd->t_end = t_start + gpu_ns;
  cmd->backend_slot = -1;
  f.busy.store(false, std::memory_order_release);
}
