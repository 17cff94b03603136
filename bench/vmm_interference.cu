// Does VMM work on one thread slow DMA already running on the GPU? Times a 2 GiB pinned copy
// (H2D, then D2H) alone and while another thread repeats one kind of VMM operation on separate
// 256 MiB handles until the copy ends. The answer decides how vaswap's workers schedule driver
// calls around copies (docs/PERFORMANCE.md). Built with nvcc as bin/vmm_interference_cuda.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace {

#define CK(expr)                                                               \
  do {                                                                         \
    const auto rc_ = (expr);                                                   \
    if (static_cast<int>(rc_) != 0) {                                          \
      std::fprintf(stderr, "%s:%d %s failed: %d\n", __FILE__, __LINE__, #expr, \
                   static_cast<int>(rc_));                                     \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

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

}  // namespace

int main() {
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  CUcontext ctx = nullptr;
  CK(cuCtxGetCurrent(&ctx));
  Vmm v;
  v.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  v.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  v.prop.location.id = 0;
  v.access.location = v.prop.location;
  v.access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
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
      double best_gbps = 0;
      int best_ops = 0;
      for (int rep = 0; rep < 3; ++rep) {
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
        const double gbps = static_cast<double>(kCopy) / 1e9 / (ms / 1e3);
        if (gbps > best_gbps) {
          best_gbps = gbps;
          best_ops = ops;
        }
      }
      if (op == Op::none) alone = best_gbps;
      std::printf("| %s | %s | %d | %.2f | %.1f%% |\n",
                  kind == cudaMemcpyHostToDevice ? "H2D" : "D2H", name(op), best_ops, best_gbps,
                  100.0 * best_gbps / alone);
    }
  }
  return 0;
}
