// Does VMM work on one thread slow DMA already running on the GPU? Times a 2 GiB pinned copy
// (H2D, then D2H) alone and while another thread repeats one kind of VMM operation on separate
// 256 MiB handles until the copy ends. The answer decides how vaswap's workers schedule driver
// calls around copies (docs/PERFORMANCE.md). Built with nvcc as bin/vmm_interference_cuda.
//
// A second table asks what an H2D copy costs when its destination pages were mapped just before
// it, with nothing running beside it: the same handles mapped again, new handles (what a restore
// gets from cuMemCreate), new handles first written by the device, and handles moved to another
// address.
//
// A third table asks the same of kernels: a compute-bound kernel (FMA chains in registers) and a
// memory-bound one (a 1 GiB read-modify-write), each launched 50 times, alone and while another
// thread repeats VMM operations on separate handles of 2 MiB (vaswap's page) and 256 MiB.
// Between graph launches vaswap's workers map and unmap while the program's kernels run; if that
// slows them, it is a cost no plan's exposed copy time shows (docs/PERFORMANCE.md).
// Every figure is the median of 5 repetitions.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "cuda_check.h"

namespace {

constexpr size_t kCopy = size_t{2} << 30;
constexpr size_t kHandle = size_t{256} << 20;

enum class Op { none, create_release, map_access_unmap, full_cycle };
const char* name(Op op) {
  switch (op) {
    case Op::none: return "nothing";
    case Op::create_release: return "cuMemCreate + cuMemRelease";
    case Op::map_access_unmap: return "cuMemMap + cuMemSetAccess + cuMemUnmap";
    case Op::full_cycle: return "create + map + access + unmap + release";
  }
  return "?";
}

struct Vmm {
  CUmemAllocationProp prop{};
  CUmemAccessDesc access{};
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle kept = 0;  // for map/unmap without create/release
};

void one(Op op, Vmm& v) {
  CUmemGenericAllocationHandle h = 0;
  switch (op) {
    case Op::none: return;
    case Op::create_release:
      CK(cuMemCreate(&h, kHandle, &v.prop, 0));
      CK(cuMemRelease(h));
      return;
    case Op::map_access_unmap:
      CK(cuMemMap(v.va, kHandle, 0, v.kept, 0));
      CK(cuMemSetAccess(v.va, kHandle, &v.access, 1));
      CK(cuMemUnmap(v.va, kHandle));
      return;
    case Op::full_cycle:
      CK(cuMemCreate(&h, kHandle, &v.prop, 0));
      CK(cuMemMap(v.va, kHandle, 0, h, 0));
      CK(cuMemSetAccess(v.va, kHandle, &v.access, 1));
      CK(cuMemUnmap(v.va, kHandle));
      CK(cuMemRelease(h));
      return;
  }
}

// Compute-bound: each thread runs `iters` dependent FMA chains in registers.
__global__ void fma_loop(float* out, int iters) {
  float a = threadIdx.x * 1e-3f, b = 1.0001f, c = 0.9999f, d = blockIdx.x * 1e-3f;
  for (int i = 0; i < iters; ++i) {
    a = fmaf(a, b, c);
    d = fmaf(d, c, b);
    b = fmaf(b, a, -d);
  }
  if (a + b + d == 42.0f) out[0] = a;  // keeps the loop
}

// Memory-bound: every element read and written once.
__global__ void stream_rw(float4* p, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    float4 v = p[i];
    v.x += 1.0f;
    v.w -= 1.0f;
    p[i] = v;
  }
}

}  // namespace

int main() {
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  CUcontext ctx = nullptr;
  CK(cuCtxGetCurrent(&ctx));
  Vmm v;
  v.prop = device_pages(0);
  v.access = read_write(v.prop);
  CK(cuMemAddressReserve(&v.va, kHandle, 0, 0, 0));
  CK(cuMemCreate(&v.kept, kHandle, &v.prop, 0));

  void* device = nullptr;
  void* host = nullptr;
  CK(cudaMalloc(&device, kCopy));
  CK(cudaHostAlloc(&host, kCopy, cudaHostAllocPortable));
  CK(cudaMemset(device, 1, kCopy));
  std::memset(host, 2, kCopy);
  cudaStream_t stream = nullptr;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start = nullptr, stop = nullptr;
  CK(cudaEventCreate(&start));
  CK(cudaEventCreate(&stop));

  std::printf(
      "| copy | concurrent VMM work (256 MiB handles) | ops during copy | GB/s | vs alone |\n");
  std::printf("|---|---|---:|---:|---:|\n");
  for (cudaMemcpyKind kind : {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost}) {
    double alone = 0;
    for (Op op : {Op::none, Op::none, Op::create_release, Op::map_access_unmap, Op::full_cycle}) {
      std::vector<std::pair<double, int>> reps;
      for (int rep = 0; rep < 5; ++rep) {
        CK(cudaEventRecord(start, stream));
        CK(kind == cudaMemcpyHostToDevice ? cudaMemcpyAsync(device, host, kCopy, kind, stream)
                                          : cudaMemcpyAsync(host, device, kCopy, kind, stream));
        CK(cudaEventRecord(stop, stream));
        int ops = 0;
        std::thread worker([&] {
          CK(cuCtxSetCurrent(ctx));
          while (cudaEventQuery(stop) == cudaErrorNotReady) {
            if (op == Op::none) {
              std::this_thread::sleep_for(std::chrono::microseconds(50));
              continue;
            }
            one(op, v);
            ++ops;
          }
        });
        worker.join();
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, start, stop));
        reps.emplace_back(static_cast<double>(kCopy) / 1e9 / (ms / 1e3), ops);
      }
      std::sort(reps.begin(), reps.end());
      const double best_gbps = reps[reps.size() / 2].first;
      const int best_ops = reps[reps.size() / 2].second;
      if (op == Op::none) alone = best_gbps;
      std::printf("| %s | %s | %d | %.2f | %.1f%% |\n",
                  kind == cudaMemcpyHostToDevice ? "H2D" : "D2H", name(op), best_ops, best_gbps,
                  100.0 * best_gbps / alone);
    }
  }

  // H2D into freshly mapped pages, nothing beside it.
  constexpr int kHandles = static_cast<int>(kCopy / kHandle);
  CUdeviceptr base = 0, other = 0;
  CK(cuMemAddressReserve(&base, kCopy, 0, 0, 0));
  CK(cuMemAddressReserve(&other, kCopy, 0, 0, 0));
  std::vector<CUmemGenericAllocationHandle> handles(kHandles);
  auto map_all = [&](CUdeviceptr at) {
    for (int i = 0; i < kHandles; ++i) {
      CK(cuMemMap(at + i * kHandle, kHandle, 0, handles[i], 0));
      CK(cuMemSetAccess(at + i * kHandle, kHandle, &v.access, 1));
    }
  };
  auto unmap_all = [&](CUdeviceptr at) {
    for (int i = 0; i < kHandles; ++i) CK(cuMemUnmap(at + i * kHandle, kHandle));
  };
  for (auto& h : handles) CK(cuMemCreate(&h, kHandle, &v.prop, 0));
  map_all(base);
  CUdeviceptr at = base;
  auto timed_h2d = [&] {
    CK(cudaDeviceSynchronize());
    CK(cudaEventRecord(start, stream));
    CK(cudaMemcpyAsync(reinterpret_cast<void*>(at), host, kCopy, cudaMemcpyHostToDevice, stream));
    CK(cudaEventRecord(stop, stream));
    CK(cudaEventSynchronize(stop));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, start, stop));
    return static_cast<double>(kCopy) / 1e9 / (ms / 1e3);
  };
  timed_h2d();  // first touch of these pages
  const char* const kFresh[] = {
      "pages mapped long ago and written before",
      "the same handles unmapped and mapped again",
      "new handles (cuMemCreate; the old ones released)",
      "new handles, then a device memset over them",
      "the same handles moved to another address",
  };
  std::printf("\n| H2D of %zu MiB into 8 x 256 MiB handles | GB/s | vs pages mapped long ago |\n",
              kCopy >> 20);
  std::printf("|---|---:|---:|\n");
  double settled = 0;
  // Pages mapped long ago are measured first and again last: the order must not decide.
  for (const int fresh : {0, 1, 2, 3, 4, 0}) {
    std::vector<double> reps;
    for (int rep = 0; rep < 5; ++rep) {
      if (fresh == 1) {
        unmap_all(at);
        map_all(at);
      } else if (fresh == 2 || fresh == 3) {
        unmap_all(at);
        for (auto& h : handles) {
          CK(cuMemRelease(h));
          CK(cuMemCreate(&h, kHandle, &v.prop, 0));
        }
        map_all(at);
        if (fresh == 3) CK(cudaMemsetAsync(reinterpret_cast<void*>(at), 0, kCopy, stream));
      } else if (fresh == 4) {
        unmap_all(at);
        at = at == base ? other : base;
        map_all(at);
      }
      reps.push_back(timed_h2d());
    }
    std::sort(reps.begin(), reps.end());
    const double gbps = reps[reps.size() / 2];
    if (fresh == 0 && settled == 0) settled = gbps;
    std::printf("| %s | %.2f | %.1f%% |\n", kFresh[fresh], gbps, 100.0 * gbps / settled);
  }
  unmap_all(at);
  for (auto& h : handles) CK(cuMemRelease(h));

  // Kernels while another thread makes VMM calls on handles the kernels never touch.
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  constexpr size_t kRw = size_t{1} << 30;
  float4* rw = nullptr;
  CK(cudaMalloc(&rw, kRw));
  CK(cudaMemset(rw, 0, kRw));
  float* sink = nullptr;
  CK(cudaMalloc(&sink, sizeof(float)));
  constexpr size_t kPage = size_t{2} << 20;
  Vmm small = v;  // the same properties; a 2 MiB reservation and handle of its own
  CK(cuMemAddressReserve(&small.va, kPage, 0, 0, 0));
  CK(cuMemCreate(&small.kept, kPage, &small.prop, 0));
  auto small_cycle = [&](bool create) {
    CUmemGenericAllocationHandle h = small.kept;
    if (create) CK(cuMemCreate(&h, kPage, &small.prop, 0));
    CK(cuMemMap(small.va, kPage, 0, h, 0));
    CK(cuMemSetAccess(small.va, kPage, &small.access, 1));
    CK(cuMemUnmap(small.va, kPage));
    if (create) CK(cuMemRelease(h));
  };
  enum class Load { none, map_2m, cycle_2m, map_256m, cycle_256m };
  const char* const kLoad[] = {
      "nothing", "2 MiB: map + access + unmap", "2 MiB: create + map + access + unmap + release",
      "256 MiB: map + access + unmap", "256 MiB: create + map + access + unmap + release"};
  std::printf(
      "\n| kernel (50 launches) | concurrent VMM work | VMM ops during them | ms | vs alone |\n");
  std::printf("|---|---|---:|---:|---:|\n");
  for (const bool compute : {true, false}) {
    constexpr int kLaunches = 50;
    auto enqueue = [&] {
      for (int i = 0; i < kLaunches; ++i) {
        if (compute) {
          fma_loop<<<sms * 4, 256, 0, stream>>>(sink, 20000);
        } else {
          stream_rw<<<sms * 8, 256, 0, stream>>>(rw, kRw / sizeof(float4));
        }
      }
    };
    enqueue();  // warm: loads the kernel, settles clocks
    CK(cudaStreamSynchronize(stream));
    double alone = 0;
    // Alone first and again last: the order must not decide.
    for (Load load :
         {Load::none, Load::map_2m, Load::cycle_2m, Load::map_256m, Load::cycle_256m, Load::none}) {
      std::vector<std::pair<double, int>> reps;
      for (int rep = 0; rep < 5; ++rep) {
        CK(cudaStreamSynchronize(stream));
        CK(cudaEventRecord(start, stream));
        enqueue();
        CK(cudaEventRecord(stop, stream));
        int ops = 0;
        std::thread worker([&] {
          CK(cuCtxSetCurrent(ctx));
          while (cudaEventQuery(stop) == cudaErrorNotReady) {
            switch (load) {
              case Load::none: std::this_thread::sleep_for(std::chrono::microseconds(50)); continue;
              case Load::map_2m: small_cycle(false); break;
              case Load::cycle_2m: small_cycle(true); break;
              case Load::map_256m: one(Op::map_access_unmap, v); break;
              case Load::cycle_256m: one(Op::full_cycle, v); break;
            }
            ++ops;
          }
        });
        worker.join();
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, start, stop));
        reps.emplace_back(static_cast<double>(ms), ops);
      }
      std::sort(reps.begin(), reps.end());
      const double ms = reps[reps.size() / 2].first;
      if (load == Load::none && alone == 0) alone = ms;
      std::printf("| %s | %s | %d | %.2f | %+.1f%% |\n",
                  compute ? "compute-bound (FMA)" : "memory-bound (1 GiB read + write)",
                  kLoad[static_cast<int>(load)], reps[reps.size() / 2].second, ms,
                  100.0 * (ms / alone - 1.0));
    }
  }
  return 0;
}
