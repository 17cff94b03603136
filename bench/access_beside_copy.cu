// How long do a restore's VMM calls take while one of vaswap's copies runs on another stream? In
// the per-layer PyTorch job's H200 traces a restore's cuMemSetAccess took 0.7-0.9 ms (median per
// run) when a D2H was in flight and 40-100 us otherwise, an H2D in flight or not
// (bench/results/access_beside_copy_h200.md). Each such map is on its restore's path.
//
// Table 1 asks the same outside vaswap: a 1 GiB copy between pinned host memory and VMM-mapped
// device pages runs on one stream while the host thread, every 200 us until the copy ends, maps a
// handle at another address (cuMemMap), enables access to it (cuMemSetAccess) and unmaps it
// (cuMemUnmap), each call timed. Beside: nothing, an H2D, a D2H as one copy, the same D2H in
// pieces of 64, 16 and 4 MiB, a D2H enqueued behind a wait-value that has not begun (as
// residency.d2h_gate holds one; 40 calls, then the flag is written), and the D2H made by a kernel
// (its threads store to the pinned host memory through its device pointer, 16 bytes each: no copy
// engine) with 16 and 132 blocks. The handle is 128 MiB (a PyTorch pool segment's size) and, beside
// a D2H, also 2 MiB.
//
// Table 2 asks what keeping maps away from D2Hs would cost the D2H side: 8 copies of 128 MiB one
// after another (as one stream issues an eviction's burst), against the same with the host
// issuing each copy only once the one before has ended and a 128 MiB handle has been mapped
// (access enabled) and unmapped in between.
//
// Per case: 5 rounds; medians (and the 90th percentile of cuMemSetAccess) over every call that
// began and ended with the copy running; the copies' speed is the median round's.
// Built with nvcc as bin/access_beside_copy_cuda.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cuda_check.h"

namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kCopy = size_t{1} << 30;
constexpr int kRounds = 5;

using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double p90(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, (v.size() * 9 + 9) / 10 - 1)];
}

__global__ void store_to_host(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    dst[i] = src[i];
  }
}

enum class Beside { nothing, h2d, d2h, parked_d2h, kernel };

struct Case {
  const char* name;
  Beside beside;
  size_t piece;   // D2H: 0 one copy; kernel: the blocks
  size_t handle;  // the handle mapped beside
};

struct Probe {
  CUmemAllocationProp prop{};
  CUmemAccessDesc access{};
  CUdeviceptr big = 0;
  void* host = nullptr;
  CUdeviceptr host_dev = 0;
  CUstream stream = nullptr;
  CUevent start = nullptr, end = nullptr;
  uint32_t* flag = nullptr;  // pinned, for the parked case's wait-value
  CUdeviceptr flag_dev = 0;
};

// One map, access and unmap of `handle` at `va`, timed.
void cycle(const Probe& p, CUdeviceptr va, size_t bytes, CUmemGenericAllocationHandle handle,
           double* map_us, double* access_us, double* unmap_us) {
  auto t0 = Clock::now();
  CK(cuMemMap(va, bytes, 0, handle, 0));
  *map_us = us_since(t0);
  t0 = Clock::now();
  CK(cuMemSetAccess(va, bytes, &p.access, 1));
  *access_us = us_since(t0);
  t0 = Clock::now();
  CK(cuMemUnmap(va, bytes));
  *unmap_us = us_since(t0);
}

}  // namespace

int main() {
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));

  Probe p;
  p.prop = device_pages(0);
  p.access = read_write(p.prop);

  // The copy's device side: 1 GiB of VMM pages, as a slot is.
  CUmemGenericAllocationHandle big_handle = 0;
  CK(cuMemAddressReserve(&p.big, kCopy, 0, 0, 0));
  CK(cuMemCreate(&big_handle, kCopy, &p.prop, 0));
  CK(cuMemMap(p.big, kCopy, 0, big_handle, 0));
  CK(cuMemSetAccess(p.big, kCopy, &p.access, 1));
  CK(cuMemsetD8(p.big, 7, kCopy));
  CK(cuMemHostAlloc(&p.host, kCopy, CU_MEMHOSTALLOC_DEVICEMAP));
  CK(cuMemHostGetDevicePointer(&p.host_dev, p.host, 0));
  CK(cuMemHostAlloc(reinterpret_cast<void**>(&p.flag), sizeof(uint32_t),
                    CU_MEMHOSTALLOC_DEVICEMAP));
  CK(cuMemHostGetDevicePointer(&p.flag_dev, p.flag, 0));

  // The handles mapped and unmapped beside it.
  constexpr size_t kLarge = 128 * kMiB, kSmall = 2 * kMiB;
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle large = 0, small = 0;
  CK(cuMemAddressReserve(&va, kLarge, 0, 0, 0));
  CK(cuMemCreate(&large, kLarge, &p.prop, 0));
  CK(cuMemCreate(&small, kSmall, &p.prop, 0));

  CK(cuStreamCreate(&p.stream, CU_STREAM_NON_BLOCKING));
  CK(cuEventCreate(&p.start, CU_EVENT_DEFAULT));
  CK(cuEventCreate(&p.end, CU_EVENT_DEFAULT));

  const Case cases[] = {
      {"nothing", Beside::nothing, 0, kLarge},
      {"H2D, one copy", Beside::h2d, 0, kLarge},
      {"D2H, one copy", Beside::d2h, 0, kLarge},
      {"D2H, one copy (2 MiB handle)", Beside::d2h, 0, kSmall},
      {"D2H in 64 MiB pieces", Beside::d2h, 64 * kMiB, kLarge},
      {"D2H in 16 MiB pieces", Beside::d2h, 16 * kMiB, kLarge},
      {"D2H in 4 MiB pieces", Beside::d2h, 4 * kMiB, kLarge},
      {"D2H enqueued behind a wait-value, not begun", Beside::parked_d2h, 0, kLarge},
      {"D2H by a kernel, 16 blocks", Beside::kernel, 16, kLarge},
      {"D2H by a kernel, 132 blocks", Beside::kernel, 132, kLarge},
  };
  std::printf(
      "| beside the calls (1 GiB, pinned host, VMM device pages) | handle | cuMemMap "
      "us | cuMemSetAccess us (median, p90) | cuMemUnmap us | calls | copy GB/s |\n");
  std::printf("|---|---:|---:|---|---:|---:|---:|\n");
  for (const Case& c : cases) {
    // Parked: the calls run while the D2H waits behind a wait-value (as residency.d2h_gate holds
    // one), then the flag is written and the copy runs alone.
    const bool parked = c.beside == Beside::parked_d2h;
    const bool copy = c.beside != Beside::nothing && !parked;
    std::vector<double> map_us, access_us, unmap_us, gbps;
    for (int round = 0; round < kRounds; ++round) {
      CK(cuCtxSynchronize());
      if (parked) {
        *p.flag = 0;
        CK(cuStreamWaitValue32(p.stream, p.flag_dev, 1, CU_STREAM_WAIT_VALUE_GEQ));
        CK(cuMemcpyDtoHAsync(p.host, p.big, kCopy, p.stream));
      }
      if (copy) {
        CK(cuEventRecord(p.start, p.stream));
        if (c.beside == Beside::kernel) {
          const uint4* src = reinterpret_cast<const uint4*>(p.big);
          uint4* dst = reinterpret_cast<uint4*>(p.host_dev);
          store_to_host<<<static_cast<unsigned>(c.piece), 1024, 0, p.stream>>>(
              src, dst, kCopy / sizeof(uint4));
          CK(cudaGetLastError());
        } else {
          const size_t piece = c.piece == 0 ? kCopy : c.piece;
          for (size_t at = 0; at < kCopy; at += piece) {
            const size_t n = std::min(piece, kCopy - at);
            char* h = static_cast<char*>(p.host) + at;
            if (c.beside == Beside::d2h) {
              CK(cuMemcpyDtoHAsync(h, p.big + at, n, p.stream));
            } else {
              CK(cuMemcpyHtoDAsync(p.big + at, h, n, p.stream));
            }
          }
        }
        CK(cuEventRecord(p.end, p.stream));
      }
      const CUmemGenericAllocationHandle handle = c.handle == kLarge ? large : small;
      for (int i = 0; copy ? cuStreamQuery(p.stream) == CUDA_ERROR_NOT_READY : i < 40; ++i) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        double m = 0, a = 0, u = 0;
        cycle(p, va, c.handle, handle, &m, &a, &u);
        if (!copy || cuStreamQuery(p.stream) == CUDA_ERROR_NOT_READY) {
          map_us.push_back(m);
          access_us.push_back(a);
          unmap_us.push_back(u);
        }
      }
      if (parked) {
        __atomic_store_n(p.flag, 1u, __ATOMIC_RELEASE);
        CK(cuStreamSynchronize(p.stream));
      }
      if (copy) {
        CK(cuStreamSynchronize(p.stream));
        float ms = 0;
        CK(cuEventElapsedTime(&ms, p.start, p.end));
        gbps.push_back(static_cast<double>(kCopy) / (static_cast<double>(ms) * 1e6));
      }
    }
    const std::string speed = copy ? std::to_string(median(gbps)).substr(0, 5) : "-";
    std::printf("| %s | %zu MiB | %.0f | %.0f, %.0f | %.0f | %zu | %s |\n", c.name, c.handle / kMiB,
                median(map_us), median(access_us), p90(access_us), median(unmap_us),
                access_us.size(), speed.c_str());
  }

  // Table 2: 8 D2H copies of 128 MiB back to back, against one at a time with a map between.
  std::printf(
      "\n| 8 D2H copies of 128 MiB | total ms (median of %d) | GB/s | cuMemSetAccess us "
      "(median) |\n|---|---:|---:|---:|\n",
      kRounds);
  constexpr int kCopies = 8;
  for (const bool gated : {false, true}) {
    std::vector<double> total_ms, access_us;
    for (int round = 0; round < kRounds; ++round) {
      CK(cuCtxSynchronize());
      const auto t0 = Clock::now();
      for (int k = 0; k < kCopies; ++k) {
        const size_t at = static_cast<size_t>(k) * kLarge;
        CK(cuMemcpyDtoHAsync(static_cast<char*>(p.host) + at, p.big + at, kLarge, p.stream));
        if (gated) {
          while (cuStreamQuery(p.stream) == CUDA_ERROR_NOT_READY) {
          }
          double m = 0, a = 0, u = 0;
          cycle(p, va, kLarge, large, &m, &a, &u);
          access_us.push_back(a);
        }
      }
      CK(cuStreamSynchronize(p.stream));
      total_ms.push_back(us_since(t0) / 1e3);
    }
    const double ms = median(total_ms);
    std::printf("| %s | %.2f | %.1f | %s |\n",
                gated ? "one at a time, a map + access + unmap of 128 MiB between" : "back to back",
                ms, static_cast<double>(kCopies * kLarge) / (ms * 1e6),
                gated ? std::to_string(static_cast<int>(median(access_us))).c_str() : "-");
  }

  CK(cuMemUnmap(p.big, kCopy));
  CK(cuMemRelease(big_handle));
  CK(cuMemRelease(large));
  CK(cuMemRelease(small));
  CK(cuMemAddressFree(p.big, kCopy));
  CK(cuMemAddressFree(va, kLarge));
  CK(cuMemFreeHost(p.host));
  CK(cuMemFreeHost(p.flag));
  return 0;
}
