// Graph analysis (core/observe/graph_scan.h) on the simulator: the regions a captured graph
// references, read from kernel parameters (by cuFuncGetParamInfo), packed `extra` buffers, memcpy
// and memset nodes, and child graphs; and what it must not count.
#include <cuda.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "../sim/tests/sim_test.h"
#include "base/driver.h"
#include "observe/graph_scan.h"
#include "observe/registry.h"

namespace vaswap {
namespace {

class GraphScanTest : public SimTest {
 protected:
  void SetUp() override {
    SimTest::SetUp();
    std::string error;
    driver_ = load_driver(&error);
    ASSERT_NE(nullptr, driver_) << error;
    ASSERT_CU(cuStreamCreate(&s_, CU_STREAM_NON_BLOCKING));
    for (CUdeviceptr* p : {&a_, &b_, &c_, &unregistered_}) ASSERT_CU(cuMemAlloc(p, kBytes));
    for (CUdeviceptr p : {a_, b_, c_}) {
      ASSERT_TRUE(
          registry_.insert({p, kBytes, 0, RegionKind::driver_malloc, {}, nullptr}, nullptr));
    }
  }
  void TearDown() override {
    for (CUdeviceptr p : {a_, b_, c_, unregistered_}) cuMemFree(p);
    cuStreamDestroy(s_);
    SimTest::TearDown();
  }
  CUgraph capture(const std::function<void()>& body) {
    CUgraph g = nullptr;
    EXPECT_EQ(CUDA_SUCCESS, cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_RELAXED));
    body();
    EXPECT_EQ(CUDA_SUCCESS, cuStreamEndCapture(s_, &g));
    return g;
  }
  std::vector<uintptr_t> bases(const GraphScan& scan) {
    std::vector<uintptr_t> out;
    for (const Region& r : scan.regions) out.push_back(r.base);
    return out;
  }

  static constexpr size_t kBytes = 1 << 20;
  const Driver* driver_ = nullptr;
  RegionRegistry registry_;
  CUstream s_ = nullptr;
  CUdeviceptr a_ = 0, b_ = 0, c_ = 0, unregistered_ = 0;
};

TEST_F(GraphScanTest, KernelParametersNameTheirRegionsAndInteriorPointersCount) {
  CUdeviceptr dst = b_ + 4096;  // interior pointer into b
  CUdeviceptr src = a_;
  uint32_t value = 1, n = 16;
  void* params[] = {&dst, &src, &value, &n};
  CUgraph g = capture([&] {
    ASSERT_CU(
        cuLaunchKernel(sim_kernels::get("add_u32"), 1, 1, 1, 32, 1, 1, 0, s_, params, nullptr));
  });
  const GraphScan scan = scan_graph(*driver_, g, registry_);
  EXPECT_EQ(1u, scan.nodes);
  EXPECT_EQ(1u, scan.kernel_nodes);
  EXPECT_EQ(0u, scan.extra_buffers);
  EXPECT_EQ((std::vector<uintptr_t>{std::min(a_, b_), std::max(a_, b_)}), bases(scan));
  ASSERT_CU(cuGraphDestroy(g));
}

TEST_F(GraphScanTest, PackedExtraBufferIsScannedAsCublasLaunchesAre) {
  struct alignas(8) Packed {
    CUdeviceptr dst, src;
    uint32_t value, n;
  } packed{c_, unregistered_, 5, 16};
  size_t packed_bytes = sizeof(packed);
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE,
                   &packed_bytes, CU_LAUNCH_PARAM_END};
  CUgraph g = capture([&] {
    ASSERT_CU(
        cuLaunchKernel(sim_kernels::get("add_u32"), 1, 1, 1, 32, 1, 1, 0, s_, nullptr, extra));
  });
  const GraphScan scan = scan_graph(*driver_, g, registry_);
  EXPECT_EQ(1u, scan.extra_buffers);
  // c is registered; the unregistered allocation is not a region, so it is not a reference.
  EXPECT_EQ((std::vector<uintptr_t>{c_}), bases(scan));
  ASSERT_CU(cuGraphDestroy(g));
}

TEST_F(GraphScanTest, ScalarsThatLookLikeNoAddressAreNotReferences) {
  CUdeviceptr dst = unregistered_, src = unregistered_;
  uint32_t value = 0, n = 0;
  void* params[] = {&dst, &src, &value, &n};
  CUgraph g = capture([&] {
    ASSERT_CU(
        cuLaunchKernel(sim_kernels::get("add_u32"), 1, 1, 1, 32, 1, 1, 0, s_, params, nullptr));
  });
  EXPECT_TRUE(scan_graph(*driver_, g, registry_).regions.empty());
  ASSERT_CU(cuGraphDestroy(g));
}

TEST_F(GraphScanTest, MemcpyMemsetAndChildGraphsAreFollowed) {
  CUgraph child = capture([&] { ASSERT_CU(cuMemsetD32Async(c_, 7, 16, s_)); });
  CUgraph parent = capture([&] { ASSERT_CU(cuMemcpyDtoDAsync(b_, a_, 4096, s_)); });
  CUgraphNode node = nullptr;
  ASSERT_CU(cuGraphAddChildGraphNode(&node, parent, nullptr, 0, child));
  const GraphScan scan = scan_graph(*driver_, parent, registry_);
  EXPECT_EQ(1u, scan.memcpy_nodes);
  EXPECT_EQ(1u, scan.memset_nodes);
  EXPECT_EQ(1u, scan.child_graphs);
  EXPECT_EQ(3u, scan.nodes);
  std::vector<uintptr_t> want = {a_, b_, c_};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(want, bases(scan));
  ASSERT_CU(cuGraphDestroy(parent));
  ASSERT_CU(cuGraphDestroy(child));
}

}  // namespace
}  // namespace vaswap
