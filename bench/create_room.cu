// Probe: on a GPU the program has all but filled, how much of what cuMemGetInfo reports free can
// cuMemCreate still have? On an H100 left 24 MiB, a 2 MiB cuMemCreate for a slot failed out of
// memory where cuMemGetInfo said there was room (bench/results/gpu_checks_session53_84fc099_
// h100.md); the simulator models that as VASWAP_SIM_CREATE_HOLDBACK (docs/SIMULATOR.md). This
// sizes it.
//
// For each LEFT (MiB): cuMemAlloc until cuMemGetInfo reports about LEFT free; then cuMemCreate one
// granule at a time until it fails, and after that one cuMemAlloc of a granule. Printed per LEFT:
// free before, what cuMemCreate got, the difference (the holdback), the code it failed with, and
// whether cuMemAlloc still got a granule. Everything is freed before the next LEFT.
// Usage: create_room_cuda [LEFT_MIB...]      (default: 256 64 24 8)
#include <cuda.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "probe_check.h"

namespace {

constexpr size_t kMiB = size_t{1} << 20;

}  // namespace

int main(int argc, char** argv) {
  std::vector<size_t> lefts;
  for (int i = 1; i < argc; ++i) lefts.push_back(std::strtoull(argv[i], nullptr, 10));
  if (lefts.empty()) lefts = {256, 64, 24, 8};
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CK(start_device0(&dev, &ctx));
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t granule = 0;
  CK(cuMemGetAllocationGranularity(&granule, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  std::printf("granule %zu KiB\n", granule >> 10);
  std::printf("%8s %12s %14s %12s %26s %16s\n", "left", "free MiB", "created MiB", "held back",
              "cuMemCreate failed with", "cuMemAlloc then");
  for (const size_t left : lefts) {
    std::vector<CUdeviceptr> fill;
    size_t free_bytes = 0, total = 0;
    CK(cuMemGetInfo(&free_bytes, &total));
    // Big pieces first, then smaller ones, until about LEFT is free.
    for (size_t piece = size_t{1} << 30; piece >= granule;) {
      CK(cuMemGetInfo(&free_bytes, &total));
      if (free_bytes <= left * kMiB + piece / 2 || free_bytes < left * kMiB + piece) {
        piece /= 2;
        continue;
      }
      CUdeviceptr p = 0;
      if (cuMemAlloc(&p, piece) != CUDA_SUCCESS) {
        piece /= 2;
        continue;
      }
      fill.push_back(p);
    }
    CK(cuMemGetInfo(&free_bytes, &total));
    std::vector<CUmemGenericAllocationHandle> handles;
    CUresult failed = CUDA_SUCCESS;
    for (;;) {
      CUmemGenericAllocationHandle h = 0;
      failed = cuMemCreate(&h, granule, &prop, 0);
      if (failed != CUDA_SUCCESS) break;
      handles.push_back(h);
    }
    const size_t created = handles.size() * granule;
    CUdeviceptr after = 0;
    const CUresult alloc = cuMemAlloc(&after, granule);
    std::printf("%8zu %12.1f %14.1f %12.1f %26s %16s\n", left,
                static_cast<double>(free_bytes) / kMiB, static_cast<double>(created) / kMiB,
                (static_cast<double>(free_bytes) - static_cast<double>(created)) / kMiB,
                result_name(failed).c_str(), result_name(alloc).c_str());
    if (alloc == CUDA_SUCCESS) CK(cuMemFree(after));
    for (CUmemGenericAllocationHandle h : handles) CK(cuMemRelease(h));
    for (CUdeviceptr p : fill) CK(cuMemFree(p));
  }
  CK(cuDevicePrimaryCtxRelease(dev));
  return 0;
}
