// A driver-API program that asks cuGetProcAddress for CUDA 12.8's revision of cuMemcpyBatchAsync
// (a failure index before the stream) and calls it with that signature. Under vaswap on a driver
// older than the revision vaswap wraps (VASWAP_SIM_DRIVER_VERSION=12080 on the simulator), the
// answer must be the driver's own function, not vaswap's wrapper of CUDA 13's 8-argument form.
// Prints "batch v1: ok" and exits 0 when the copy arrived.
#include <cuda.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult*);
GetProcAddress g_get = nullptr;

template <class Fn>
Fn resolve(const char* name, int version) {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (g_get(name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS ||
      fn == nullptr) {
    std::fprintf(stderr, "batch_probe: the driver has no %s at version %d\n", name, version);
    return nullptr;
  }
  return reinterpret_cast<Fn>(fn);
}

#define CHECK(call)                                                                       \
  do {                                                                                    \
    const CUresult rc_ = (call);                                                          \
    if (rc_ != CUDA_SUCCESS) {                                                            \
      std::fprintf(stderr, "batch_probe: %s failed: %d\n", #call, static_cast<int>(rc_)); \
      return 1;                                                                           \
    }                                                                                     \
  } while (0)

}  // namespace

int main() {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver == nullptr) {
    std::fprintf(stderr, "batch_probe: %s\n", dlerror());
    return 1;
  }
  g_get = reinterpret_cast<GetProcAddress>(dlsym(driver, "cuGetProcAddress_v2"));
  if (g_get == nullptr) return 1;
  auto init = resolve<CUresult (*)(unsigned)>("cuInit", 2000);
  auto get_version = resolve<CUresult (*)(int*)>("cuDriverGetVersion", 2020);
  auto retain = resolve<CUresult (*)(CUcontext*, CUdevice)>("cuDevicePrimaryCtxRetain", 7000);
  auto set_current = resolve<CUresult (*)(CUcontext)>("cuCtxSetCurrent", 4000);
  auto alloc = resolve<CUresult (*)(CUdeviceptr*, size_t)>("cuMemAlloc", 3020);
  auto memset8 = resolve<CUresult (*)(CUdeviceptr, unsigned char, size_t)>("cuMemsetD8", 3020);
  auto to_host = resolve<CUresult (*)(void*, CUdeviceptr, size_t)>("cuMemcpyDtoH", 3020);
  auto stream_create = resolve<CUresult (*)(CUstream*, unsigned)>("cuStreamCreate", 2000);
  auto stream_sync = resolve<CUresult (*)(CUstream)>("cuStreamSynchronize", 2000);
  using BatchV1 = CUresult (*)(CUdeviceptr*, CUdeviceptr*, size_t*, size_t, CUmemcpyAttributes*,
                               size_t*, size_t, size_t*, CUstream);
  auto batch = resolve<BatchV1>("cuMemcpyBatchAsync", 12080);
  if (!init || !get_version || !retain || !set_current || !alloc || !memset8 || !to_host ||
      !stream_create || !stream_sync || !batch) {
    return 1;
  }
  CHECK(init(0));
  int version = 0;
  CHECK(get_version(&version));
  CUcontext context = nullptr;
  CHECK(retain(&context, 0));
  CHECK(set_current(context));
  CUdeviceptr a = 0, b = 0;
  CHECK(alloc(&a, 4096));
  CHECK(alloc(&b, 4096));
  CHECK(memset8(a, 0x3c, 4096));
  CHECK(memset8(b, 0, 4096));
  CUstream stream = nullptr;
  CHECK(stream_create(&stream, CU_STREAM_NON_BLOCKING));
  CUdeviceptr dsts[] = {b};
  CUdeviceptr srcs[] = {a};
  size_t sizes[] = {4096};
  CUmemcpyAttributes attrs{};
  attrs.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  size_t index = 0, failed = 0;
  CHECK(batch(dsts, srcs, sizes, 1, &attrs, &index, 1, &failed, stream));
  CHECK(stream_sync(stream));
  std::vector<unsigned char> host(4096, 0);
  CHECK(to_host(host.data(), b, host.size()));
  for (unsigned char c : host) {
    if (c != 0x3c) {
      std::fprintf(stderr, "batch_probe: the copy did not arrive\n");
      return 1;
    }
  }
  std::printf("batch v1: ok (driver %d)\n", version);
  return 0;
}
