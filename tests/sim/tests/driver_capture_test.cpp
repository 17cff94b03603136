// Stream capture in the simulated driver: what is recorded, and CUDA's unsafe-call rules.
#include "sim_test.h"

namespace {

class CaptureTest : public SimTest {
 protected:
  void SetUp() override {
    SimTest::SetUp();
    ASSERT_CU(cuStreamCreate(&s_, CU_STREAM_NON_BLOCKING));
  }
  void TearDown() override {
    EXPECT_EQ(CUDA_SUCCESS, cuStreamDestroy(s_));
    SimTest::TearDown();
  }
  CUstream s_ = nullptr;
};

// cuMemAlloc (a potentially unsafe call) from a fresh thread whose capture mode is `mode`.
CUresult alloc_from_thread_in_mode(CUstreamCaptureMode mode, CUdeviceptr* p) {
  CUresult rc = CUDA_ERROR_UNKNOWN;
  std::thread other([&] {
    bind_device(0);
    CUstreamCaptureMode previous = mode;
    EXPECT_EQ(CUDA_SUCCESS, cuThreadExchangeStreamCaptureMode(&previous));
    EXPECT_EQ(CU_STREAM_CAPTURE_MODE_GLOBAL, previous) << "a thread starts in global mode";
    rc = cuMemAlloc(p, 4096);
  });
  other.join();
  return rc;
}

TEST_F(CaptureTest, CapturedWorkRunsOnlyWhenTheGraphIsLaunched) {
  CUdeviceptr buf = 0;
  ASSERT_CU(cuMemAlloc(&buf, 4096));
  ASSERT_CU(cuMemsetD32(buf, 0, 1024));
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuMemsetD32Async(buf, 7, 1024, s_));
  CUgraph g = nullptr;
  ASSERT_CU(cuStreamEndCapture(s_, &g));
  auto* words = reinterpret_cast<uint32_t*>(buf);
  EXPECT_EQ(0u, words[100]) << "capture must not execute the memset";
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, g, 0));
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(7u, words[100]);
  ASSERT_CU(cuGraphExecDestroy(exec));
  ASSERT_CU(cuGraphDestroy(g));
  ASSERT_CU(cuMemFree(buf));
}

TEST_F(CaptureTest, GraphReplaysAgainstRemappedContents) {
  ManualSlot slot;
  slot.reserve(kGran);
  CUmemGenericAllocationHandle first = slot.map_new();
  CUdeviceptr out = 0;
  ASSERT_CU(cuMemAlloc(&out, 256 * sizeof(uint32_t)));
  for (uint32_t i = 0; i < 256; ++i) slot.words()[i] = i;
  auto* dst = reinterpret_cast<uint32_t*>(out);
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(sim_kernels::launch_add(s_, dst, slot.words(), 1000, 256));
  CUgraph g = nullptr;
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuStreamEndCapture(s_, &g));
  ASSERT_CU(cuGraphInstantiate(&exec, g, 0));
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(1000u + 200u, dst[200]);

  // Offload and restore with other contents: new physical memory, same VA, same graph.
  ASSERT_CU(cuMemUnmap(slot.va, slot.bytes));
  ASSERT_CU(cuMemRelease(first));
  CUmemGenericAllocationHandle second = slot.map_new();
  for (uint32_t i = 0; i < 256; ++i) slot.words()[i] = 5 * i;
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(1000u + 5u * 200u, dst[200]);

  ASSERT_CU(cuGraphExecDestroy(exec));
  ASSERT_CU(cuGraphDestroy(g));
  ASSERT_CU(cuMemFree(out));
  ASSERT_CU(cuMemUnmap(slot.va, slot.bytes));
  ASSERT_CU(cuMemRelease(second));
  ASSERT_CU(cuMemAddressFree(slot.va, slot.bytes));
}

TEST_F(CaptureTest, UnsafeCallFromAnotherThreadInvalidatesAGlobalCapture) {
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUdeviceptr p = 0;
  EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
            alloc_from_thread_in_mode(CU_STREAM_CAPTURE_MODE_GLOBAL, &p));
  CUstreamCaptureStatus status{};
  ASSERT_CU(cuStreamIsCapturing(s_, &status));
  EXPECT_EQ(CU_STREAM_CAPTURE_STATUS_INVALIDATED, status);
  CUgraph g = reinterpret_cast<CUgraph>(0x1);
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(s_, &g));
  EXPECT_EQ(nullptr, g);
}

TEST_F(CaptureTest, RelaxedThreadMayMakeUnsafeCallsDuringAGlobalCapture) {
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUdeviceptr p = 0;
  EXPECT_EQ(CUDA_SUCCESS, alloc_from_thread_in_mode(CU_STREAM_CAPTURE_MODE_RELAXED, &p));
  CUgraph g = nullptr;
  ASSERT_CU(cuStreamEndCapture(s_, &g));
  ASSERT_NE(nullptr, g);
  ASSERT_CU(cuGraphDestroy(g));
  ASSERT_CU(cuMemFree(p));
}

TEST_F(CaptureTest, ThreadLocalModeIgnoresOtherThreadsCaptures) {
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUdeviceptr p = 0;
  EXPECT_EQ(CUDA_SUCCESS, alloc_from_thread_in_mode(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, &p));
  CUgraph g = nullptr;
  ASSERT_CU(cuStreamEndCapture(s_, &g));
  ASSERT_CU(cuGraphDestroy(g));
  ASSERT_CU(cuMemFree(p));
}

TEST_F(CaptureTest, CapturingThreadMayNotMakeUnsafeCallsUnlessRelaxed) {
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  CUdeviceptr p = 0;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  ASSERT_CU(cuThreadExchangeStreamCaptureMode(&mode));
  ASSERT_CU(cuMemAlloc(&p, 4096));  // as PyTorch's allocator does during capture
  ASSERT_CU(cuThreadExchangeStreamCaptureMode(&mode));
  CUgraph g = nullptr;
  ASSERT_CU(cuStreamEndCapture(s_, &g));
  ASSERT_CU(cuGraphDestroy(g));

  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  CUdeviceptr q = 0;
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuMemAlloc(&q, 4096));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(s_, &g));
  ASSERT_CU(cuMemFree(p));
}

TEST_F(CaptureTest, SynchronizingTheCapturingStreamInvalidatesTheCapture) {
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuStreamSynchronize(s_));
  CUgraph g = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(s_, &g));
}

// As measured on an H200: asking a capturing stream for its device breaks the capture;
// asking whether it is capturing does not.
TEST_F(CaptureTest, StreamGetDeviceInvalidatesTheCapture) {
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_RELAXED));
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  ASSERT_CU(cuStreamIsCapturing(s_, &status));
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CUdevice device = -1;
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuStreamGetDevice(s_, &device));
  CUgraph g = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(s_, &g));
}

// As measured on an H100 (bench/results/capture_unsafe_session52_h100.txt): a thread capturing
// in the global mode that queries another stream's finished work, or an event recorded there,
// has its capture invalidated; in relaxed mode the same queries leave it valid.
TEST_F(CaptureTest, QueriesOfOtherWorkInvalidateTheThreadsOwnCapture) {
  CUstream other = nullptr;
  ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  CUevent done = nullptr;
  ASSERT_CU(cuEventCreate(&done, CU_EVENT_DISABLE_TIMING));
  ASSERT_CU(cuEventRecord(done, other));
  ASSERT_CU(cuStreamSynchronize(other));
  CUgraph g = nullptr;
  for (const bool event : {false, true}) {
    ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                  event ? cuEventQuery(done) : cuStreamQuery(other));
    EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(s_, &g));

    ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    ASSERT_CU(cuThreadExchangeStreamCaptureMode(&mode));
    EXPECT_CU_ERR(CUDA_SUCCESS, event ? cuEventQuery(done) : cuStreamQuery(other));
    ASSERT_CU(cuThreadExchangeStreamCaptureMode(&mode));
    ASSERT_CU(cuStreamEndCapture(s_, &g));
    ASSERT_CU(cuGraphDestroy(g));
  }
  // Outside any capture, a query answers as ever.
  EXPECT_CU_ERR(CUDA_SUCCESS, cuStreamQuery(other));
  EXPECT_CU_ERR(CUDA_SUCCESS, cuEventQuery(done));
  ASSERT_CU(cuEventDestroy(done));
  ASSERT_CU(cuStreamDestroy(other));
}

TEST_F(CaptureTest, ForkedStreamJoinsTheCaptureThroughAnEvent) {
  CUstream side = nullptr;
  CUevent fork = nullptr, join = nullptr;
  ASSERT_CU(cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuEventCreate(&fork, CU_EVENT_DISABLE_TIMING));
  ASSERT_CU(cuEventCreate(&join, CU_EVENT_DISABLE_TIMING));
  CUdeviceptr a = 0, b = 0;
  ASSERT_CU(cuMemAlloc(&a, 4096));
  ASSERT_CU(cuMemAlloc(&b, 4096));
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuMemsetD32Async(a, 1, 1024, s_));
  ASSERT_CU(cuEventRecord(fork, s_));
  ASSERT_CU(cuStreamWaitEvent(side, fork, 0));
  CUstreamCaptureStatus status{};
  ASSERT_CU(cuStreamIsCapturing(side, &status));
  EXPECT_EQ(CU_STREAM_CAPTURE_STATUS_ACTIVE, status);
  ASSERT_CU(cuMemsetD32Async(b, 2, 1024, side));
  ASSERT_CU(cuEventRecord(join, side));
  ASSERT_CU(cuStreamWaitEvent(s_, join, 0));
  CUgraph g = nullptr;
  ASSERT_CU(cuStreamEndCapture(s_, &g));
  ASSERT_CU(cuStreamIsCapturing(side, &status));
  EXPECT_EQ(CU_STREAM_CAPTURE_STATUS_NONE, status);
  size_t n = 0;
  ASSERT_CU(cuGraphGetNodes(g, nullptr, &n));
  ASSERT_EQ(2u, n);
  CUgraphNode nodes[2];
  ASSERT_CU(cuGraphGetNodes(g, nodes, &n));
  CUgraphNode dep = nullptr;
  size_t ndeps = 1;
  ASSERT_CU(cuGraphNodeGetDependencies(nodes[1], &dep, nullptr, &ndeps));
  ASSERT_EQ(1u, ndeps);
  EXPECT_EQ(nodes[0], dep) << "the side stream's memset depends on the fork point";
  ASSERT_CU(cuGraphDestroy(g));
  for (CUdeviceptr p : {a, b}) ASSERT_CU(cuMemFree(p));
  ASSERT_CU(cuEventDestroy(fork));
  ASSERT_CU(cuEventDestroy(join));
  ASSERT_CU(cuStreamDestroy(side));
}

TEST_F(CaptureTest, CaptureInfoReportsIdGraphAndDependencies) {
  CUdeviceptr a = 0;
  ASSERT_CU(cuMemAlloc(&a, 4096));
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuMemsetD8Async(a, 3, 4096, s_));
  CUstreamCaptureStatus status{};
  cuuint64_t id = 0;
  CUgraph graph = nullptr;
  const CUgraphNode* deps = nullptr;
  size_t ndeps = 0;
  ASSERT_CU(cuStreamGetCaptureInfo(s_, &status, &id, &graph, &deps, nullptr, &ndeps));
  EXPECT_EQ(CU_STREAM_CAPTURE_STATUS_ACTIVE, status);
  EXPECT_NE(0u, id);
  ASSERT_EQ(1u, ndeps);
  CUgraphNodeType type{};
  ASSERT_CU(cuGraphNodeGetType(deps[0], &type));
  EXPECT_EQ(CU_GRAPH_NODE_TYPE_MEMSET, type);
  CUgraph ended = nullptr;
  ASSERT_CU(cuStreamEndCapture(s_, &ended));
  EXPECT_EQ(graph, ended);
  ASSERT_CU(cuStreamGetCaptureInfo(s_, &status, &id, nullptr, nullptr, nullptr, nullptr));
  EXPECT_EQ(CU_STREAM_CAPTURE_STATUS_NONE, status);
  ASSERT_CU(cuGraphDestroy(ended));
  ASSERT_CU(cuMemFree(a));
}

TEST_F(CaptureTest, EndingAGlobalCaptureFromAnotherThreadIsRejected) {
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUresult rc = CUDA_SUCCESS;
  std::thread other([&] {
    bind_device(0);
    CUgraph g = nullptr;
    rc = cuStreamEndCapture(s_, &g);
  });
  other.join();
  EXPECT_EQ(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, rc);
  CUgraph g = nullptr;
  ASSERT_CU(cuStreamEndCapture(s_, &g));
  ASSERT_CU(cuGraphDestroy(g));
}

TEST_F(CaptureTest, LegacyStreamCannotBeCaptured) {
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                cuStreamBeginCapture(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL));
}

}  // namespace

// As on a GPU (bench/results/launch_unmapped_h100.txt): a graph's copy and memset nodes are
// checked against their addresses when the graph is instantiated and when an executable's node is
// given new parameters, not when the executable is updated or launched.
// A graph built node by node: a copy or memset node added, or a graph's node given new
// parameters, is checked as a captured one is (the driver refuses a captured copy into unmapped
// pages: DESIGN.md section 7). A refused call changes nothing; an accepted change runs.
TEST_F(CaptureTest, CopyAndMemsetNodesAddedOrChangedAreCheckedAsCapturedOnesAre) {
  ManualSlot slot;
  slot.reserve(kGran);
  CUmemGenericAllocationHandle pages = slot.map_new();
  CUdeviceptr other = 0;
  ASSERT_CU(cuMemAlloc(&other, kGran));
  ASSERT_CU(cuMemsetD8(other, 0x21, kGran));
  CUgraph g = nullptr;
  ASSERT_CU(cuGraphCreate(&g, 0));
  CUDA_MEMSET_NODE_PARAMS set{};
  set.dst = slot.va;
  set.value = 0x42;
  set.elementSize = 1;
  set.width = kGran;
  set.height = 1;
  CUDA_MEMCPY3D copy{};
  copy.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  copy.srcDevice = other;
  copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  copy.dstDevice = slot.va;
  copy.WidthInBytes = kGran / 2;
  copy.Height = 1;
  copy.Depth = 1;
  CUgraphNode set_node = nullptr, copy_node = nullptr;
  ASSERT_CU(cuGraphAddMemsetNode(&set_node, g, nullptr, 0, &set, nullptr));
  ASSERT_CU(cuGraphAddMemcpyNode(&copy_node, g, &set_node, 1, &copy, nullptr));

  ASSERT_CU(cuMemUnmap(slot.va, slot.bytes));
  CUgraphNode refused = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuGraphAddMemsetNode(&refused, g, nullptr, 0, &set, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuGraphAddMemcpyNode(&refused, g, nullptr, 0, &copy, nullptr));
  set.value = 0x43;
  copy.WidthInBytes = kGran / 4;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphMemsetNodeSetParams(set_node, &set));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphMemcpyNodeSetParams(copy_node, &copy));
  size_t count = 0;
  ASSERT_CU(cuGraphGetNodes(g, nullptr, &count));
  EXPECT_EQ(2u, count);
  CUDA_MEMSET_NODE_PARAMS kept{};
  ASSERT_CU(cuGraphMemsetNodeGetParams(set_node, &kept));
  EXPECT_EQ(0x42u, kept.value);

  ASSERT_CU(cuMemRelease(pages));
  pages = slot.map_new();
  ASSERT_CU(cuGraphMemsetNodeSetParams(set_node, &set));
  ASSERT_CU(cuGraphMemcpyNodeSetParams(copy_node, &copy));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphMemsetNodeSetParams(copy_node, &set));
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, g, 0));
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  const auto* bytes = reinterpret_cast<const uint8_t*>(slot.va);
  EXPECT_EQ(0x21, bytes[kGran / 4 - 1]);  // copied: the new width
  EXPECT_EQ(0x43, bytes[kGran / 4]);      // set: the new value
  EXPECT_EQ(0x43, bytes[kGran - 1]);

  ASSERT_CU(cuGraphExecDestroy(exec));
  ASSERT_CU(cuGraphDestroy(g));
  ASSERT_CU(cuMemFree(other));
  ASSERT_CU(cuMemUnmap(slot.va, slot.bytes));
  ASSERT_CU(cuMemRelease(pages));
  ASSERT_CU(cuMemAddressFree(slot.va, slot.bytes));
}

TEST_F(CaptureTest, CopyAndMemsetNodesAreCheckedAtInstantiationAndAtNewParameters) {
  ManualSlot slot;
  slot.reserve(2 * kGran);
  CUmemGenericAllocationHandle pages = slot.map_new();
  CUdeviceptr other = 0;
  ASSERT_CU(cuMemAlloc(&other, kGran));
  ASSERT_CU(cuMemsetD8(other, 0x21, kGran));
  SetThenCopy captured;
  captured.capture(s_, slot.va, 0x42, kGran, slot.va + kGran, other, kGran);
  const CUgraph g = captured.graph;
  const CUgraphExec exec = captured.exec;
  const CUgraphNode* nodes = captured.nodes;
  const CUDA_MEMSET_NODE_PARAMS& set = captured.set;
  const CUDA_MEMCPY3D& copy = captured.copy;

  ASSERT_CU(cuMemUnmap(slot.va, slot.bytes));
  CUgraphExec again = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphInstantiate(&again, g, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuGraphExecMemsetNodeSetParams(exec, nodes[0], &set, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuGraphExecMemcpyNodeSetParams(exec, nodes[1], &copy, nullptr));
  CUgraphExecUpdateResultInfo info{};
  EXPECT_CU_ERR(CUDA_SUCCESS, cuGraphExecUpdate(exec, g, &info));

  // One granule of pages mapped at each of the reservation's granules (as vaswap's placeholder
  // is) passes the checks; the launch then runs on the slot's own pages, mapped again.
  CUmemGenericAllocationHandle one = 0;
  const CUmemAllocationProp prop = device_prop(0);
  const CUmemAccessDesc access = rw_access(0);
  ASSERT_CU(cuMemCreate(&one, kGran, &prop, 0));
  ASSERT_CU(cuMemMap(slot.va, kGran, 0, one, 0));
  ASSERT_CU(cuMemMap(slot.va + kGran, kGran, 0, one, 0));
  ASSERT_CU(cuMemSetAccess(slot.va, 2 * kGran, &access, 1));
  ASSERT_CU(cuGraphInstantiate(&again, g, 0));
  ASSERT_CU(cuMemUnmap(slot.va, kGran));
  ASSERT_CU(cuMemUnmap(slot.va + kGran, kGran));
  ASSERT_CU(cuMemRelease(one));
  ASSERT_CU(cuMemRelease(pages));
  pages = slot.map_new();
  ASSERT_CU(cuGraphLaunch(again, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  const auto* bytes = reinterpret_cast<const uint8_t*>(slot.va);
  EXPECT_EQ(0x42, bytes[100]);
  EXPECT_EQ(0x21, bytes[kGran + 100]);

  ASSERT_CU(cuGraphExecDestroy(again));
  captured.destroy();
  ASSERT_CU(cuMemFree(other));
  ASSERT_CU(cuMemUnmap(slot.va, slot.bytes));
  ASSERT_CU(cuMemRelease(pages));
  ASSERT_CU(cuMemAddressFree(slot.va, slot.bytes));
}
