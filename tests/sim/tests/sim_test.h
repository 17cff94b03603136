// Shared helpers for the simulator's tests. Tests run with VASWAP_SIM_DEVICES=2 and
// VASWAP_SIM_DEVICE_MEMORY=1GiB,512MiB (set by CTest).
#pragma once

#include <cuda.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "vaswap_sim/abi.h"

inline const char* cu_name(CUresult rc) {
  const char* name = nullptr;
  return cuGetErrorName(rc, &name) == CUDA_SUCCESS ? name : "unknown CUresult";
}

#define ASSERT_CU(call) ASSERT_EQ(CUDA_SUCCESS, (call)) << #call
#define EXPECT_CU_ERR(expected, call) EXPECT_EQ((expected), (call)) << #call

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kGran = 2 * kMiB;

// Makes device `dev`'s primary context current on the calling thread.
inline void bind_device(int dev = 0) {
  ASSERT_EQ(CUDA_SUCCESS, cuInit(0));
  CUcontext ctx = nullptr;
  ASSERT_EQ(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&ctx, dev));
  ASSERT_EQ(CUDA_SUCCESS, cuCtxSetCurrent(ctx));
}

class SimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    bind_device(0);
    vaswapSimClearFaults();
  }
  void TearDown() override {
    vaswapSimClearFaults();
    vaswapSimSetStreamBytes(0);
  }
};

inline CUmemAllocationProp device_prop(int dev = 0) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = dev;
  return p;
}

inline CUmemAccessDesc rw_access(int dev = 0) {
  CUmemAccessDesc d{};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = dev;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return d;
}

// A one-shot gate a host function can block on, to hold a stream busy.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  void wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [this] { return open; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
    cv.notify_all();
  }
  static void CUDA_CB wait_fn(void* g) { static_cast<Gate*>(g)->wait(); }
};

// Kernels for driver-level tests, in a hand-built simulator image (what cuModuleLoadData takes).
namespace sim_kernels {

// add_u32(uint32_t* dst, const uint32_t* src, uint32_t value, uint32_t n): dst[i] = src[i] + value
inline void add_u32_entry(const void* args, const vaswap_sim_dims*) {
  uint32_t* dst;
  const uint32_t* src;
  uint32_t value, n;
  std::memcpy(&dst, static_cast<const char*>(args) + 0, 8);
  std::memcpy(&src, static_cast<const char*>(args) + 8, 8);
  std::memcpy(&value, static_cast<const char*>(args) + 16, 4);
  std::memcpy(&n, static_cast<const char*>(args) + 20, 4);
  for (uint32_t i = 0; i < n; ++i) dst[i] = src[i] + value;
}
inline const uint32_t kAddOffsets[] = {0, 8, 16, 20};
inline const uint32_t kAddSizes[] = {8, 8, 4, 4};

// abi_probe(char, double, int, void*): parameters at 0, 8, 16, 24; the body does nothing.
inline void abi_probe_entry(const void*, const vaswap_sim_dims*) {}
inline const uint32_t kProbeOffsets[] = {0, 8, 16, 24};
inline const uint32_t kProbeSizes[] = {1, 8, 4, 8};

inline const vaswap_sim_kernel_desc kKernels[] = {
    {"add_u32", &add_u32_entry, 4, kAddOffsets, kAddSizes, 24},
    {"abi_probe", &abi_probe_entry, 4, kProbeOffsets, kProbeSizes, 32},
};
inline const vaswap_sim_image kImage = {VASWAP_SIM_IMAGE_MAGIC, VASWAP_SIM_IMAGE_VERSION, 2,
                                        kKernels};

inline CUfunction get(const char* name) {
  static CUmodule module = [] {
    CUmodule m = nullptr;
    EXPECT_EQ(CUDA_SUCCESS, cuModuleLoadData(&m, &kImage));
    return m;
  }();
  CUfunction f = nullptr;
  EXPECT_EQ(CUDA_SUCCESS, cuModuleGetFunction(&f, module, name));
  return f;
}

inline CUresult launch_add(CUstream s, uint32_t* dst, const uint32_t* src, uint32_t value,
                           uint32_t n) {
  void* args[] = {&dst, &src, &value, &n};
  return cuLaunchKernel(get("add_u32"), 1, 1, 1, 128, 1, 1, 0, s, args, nullptr);
}

}  // namespace sim_kernels

// A captured graph of a memset (0 in the graph) followed by a copy that depends on it, its
// executable, and both nodes' parameters as the graph holds them.
struct SetThenCopy {
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  CUgraphNode nodes[2] = {};  // the memset, the copy
  CUDA_MEMSET_NODE_PARAMS set{};
  CUDA_MEMCPY3D copy{};
  void capture(CUstream s, CUdeviceptr set_dst, uint8_t value, size_t set_bytes, CUdeviceptr dst,
               CUdeviceptr src, size_t copy_bytes) {
    ASSERT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    ASSERT_CU(cuMemsetD8Async(set_dst, value, set_bytes, s));
    ASSERT_CU(cuMemcpyDtoDAsync(dst, src, copy_bytes, s));
    ASSERT_CU(cuStreamEndCapture(s, &graph));
    ASSERT_CU(cuGraphInstantiate(&exec, graph, 0));
    size_t count = 2;
    ASSERT_CU(cuGraphGetNodes(graph, nodes, &count));
    ASSERT_EQ(2u, count);
    ASSERT_CU(cuGraphMemsetNodeGetParams(nodes[0], &set));
    ASSERT_CU(cuGraphMemcpyNodeGetParams(nodes[1], &copy));
  }
  void destroy() {
    ASSERT_CU(cuGraphExecDestroy(exec));
    ASSERT_CU(cuGraphDestroy(graph));
  }
};

// A fixed-VA slot built by hand from the VMM calls: reserve once, map and unmap handles under it.
struct ManualSlot {
  CUdeviceptr va = 0;
  size_t bytes = 0;
  void reserve(size_t b) {
    bytes = b;
    ASSERT_CU(cuMemAddressReserve(&va, bytes, 0, 0, 0));
  }
  CUmemGenericAllocationHandle map_new(int dev = 0) {
    CUmemGenericAllocationHandle h = 0;
    const CUmemAllocationProp prop = device_prop(dev);
    const CUmemAccessDesc access = rw_access(dev);
    EXPECT_EQ(CUDA_SUCCESS, cuMemCreate(&h, bytes, &prop, 0));
    EXPECT_EQ(CUDA_SUCCESS, cuMemMap(va, bytes, 0, h, 0));
    EXPECT_EQ(CUDA_SUCCESS, cuMemSetAccess(va, bytes, &access, 1));
    return h;
  }
  uint32_t* words() const { return reinterpret_cast<uint32_t*>(va); }
};
