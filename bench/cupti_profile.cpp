// Per-kernel device time of any CUDA process, through CUPTI's activity API, as an injection library
// (the GPU machine has no Nsight Systems). Build and use on the GPU machine:
//
//   nvcc -std=c++17 -O2 -shared -Xcompiler -fPIC -o build/cupti_profile.so bench/cupti_profile.cpp -lcupti
//   CUDA_INJECTION64_PATH=$PWD/build/cupti_profile.so deno run -A examples/decode.ts …
//
// At exit it prints, per kernel (demangled), the launches, total and mean device time, sorted by
// total, plus the busy time (union of kernel intervals) against the span from first start to last
// end: the difference is time the GPU spent between kernels. The first MLXN_CUPTI_SKIP (a fraction,
// default 0.3) of the kernels, in start order, are left out as warm-up.
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Interval {
  uint64_t start, end;
  const std::string *kernel;
};

std::mutex mu;
std::vector<Interval> intervals;
std::map<std::string, std::string> demangled;

const std::string &pretty(const char *name) {
  auto it = demangled.find(name);
  if (it != demangled.end()) return it->second;
  int status = 0;
  char *d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : name;
  free(d);
  // "void k_matmul<2>(mlxn_gpu_args)" -> "k_matmul<2>"
  if (s.rfind("void ", 0) == 0) s = s.substr(5);
  size_t paren = s.find('(');
  if (paren != std::string::npos) s = s.substr(0, paren);
  return demangled.emplace(name, s).first->second;
}

void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  *size = 8 << 20;
  *buffer = static_cast<uint8_t *>(aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t *buffer, size_t, size_t valid) {
  CUpti_Activity *record = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    auto *k = reinterpret_cast<CUpti_ActivityKernel10 *>(record);
    intervals.push_back({k->start, k->end, &pretty(k->name)});
  }
  free(buffer);
}

void report() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(mu);
  if (intervals.empty()) return;
  const char *skip_env = getenv("MLXN_CUPTI_SKIP");
  double skip = skip_env ? atof(skip_env) : 0.3;
  std::sort(intervals.begin(), intervals.end(), [](auto &a, auto &b) { return a.start < b.start; });
  size_t first_kept = std::min(intervals.size() - 1, (size_t)(skip * (double)intervals.size()));
  uint64_t t0 = intervals[first_kept].start, busy = 0, cur_s = 0, cur_e = 0, first = 0, last = 0;
  size_t n = 0;
  std::map<std::string, std::pair<uint64_t, uint64_t>> per_kernel; // name -> (launches, total ns)
  for (const Interval &iv : intervals) {
    if (iv.start < t0) continue;
    auto &e = per_kernel[*iv.kernel];
    e.first++;
    e.second += iv.end - iv.start;
    if (n++ == 0) first = cur_s = iv.start, cur_e = iv.end;
    else if (iv.start > cur_e) busy += cur_e - cur_s, cur_s = iv.start, cur_e = iv.end;
    else cur_e = std::max(cur_e, iv.end);
    last = std::max(last, iv.end);
  }
  busy += cur_e - cur_s;
  std::vector<std::pair<std::string, std::pair<uint64_t, uint64_t>>> rows(per_kernel.begin(), per_kernel.end());
  std::sort(rows.begin(), rows.end(), [](auto &a, auto &b) { return a.second.second > b.second.second; });
  fprintf(stderr, "\ncupti: %zu kernels after the first %zu (warm-up); busy %.3f ms of a %.3f ms span\n", n,
          first_kept, busy / 1e6, (last - first) / 1e6);
  fprintf(stderr, "cupti: %-48s %9s %12s %10s\n", "kernel", "launches", "total ms", "mean us");
  for (auto &r : rows)
    fprintf(stderr, "cupti: %-48s %9llu %12.3f %10.2f\n", r.first.c_str(), (unsigned long long)r.second.first,
            r.second.second / 1e6, r.second.second / 1e3 / r.second.first);
}

} // namespace

extern "C" int InitializeInjection(void) {
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) return 0;
  if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) return 0;
  atexit(report);
  return 1;
}
