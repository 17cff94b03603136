// Graph node queries in the simulated driver: what vaswap's graph scan will read.
#include <dlfcn.h>

#include "sim_test.h"

namespace {

class GraphTest : public SimTest {
 protected:
  void SetUp() override {
    SimTest::SetUp();
    ASSERT_CU(cuStreamCreate(&s_, CU_STREAM_NON_BLOCKING));
    ASSERT_CU(cuMemAlloc(&a_, 1024));
    ASSERT_CU(cuMemAlloc(&b_, 1024));
  }
  void TearDown() override {
    EXPECT_EQ(CUDA_SUCCESS, cuMemFree(a_));
    EXPECT_EQ(CUDA_SUCCESS, cuMemFree(b_));
    EXPECT_EQ(CUDA_SUCCESS, cuStreamDestroy(s_));
    SimTest::TearDown();
  }
  // Captures whatever `body` enqueues on s_ and returns the graph's single node.
  template <class Body>
  CUgraphNode capture_one(Body body, CUgraph* graph) {
    EXPECT_EQ(CUDA_SUCCESS, cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
    body();
    EXPECT_EQ(CUDA_SUCCESS, cuStreamEndCapture(s_, graph));
    CUgraphNode node = nullptr;
    size_t n = 1;
    EXPECT_EQ(CUDA_SUCCESS, cuGraphGetNodes(*graph, &node, &n));
    EXPECT_EQ(1u, n);
    return node;
  }
  CUstream s_ = nullptr;
  CUdeviceptr a_ = 0, b_ = 0;
};

TEST_F(GraphTest, ParamInfoFollowsTheKernelAbiLayout) {
  CUfunction f = sim_kernels::get("abi_probe");
  const size_t expected_offset[] = {0, 8, 16, 24};
  const size_t expected_size[] = {1, 8, 4, 8};
  for (size_t i = 0; i < 4; ++i) {
    size_t offset = 0, bytes = 0;
    ASSERT_CU(cuFuncGetParamInfo(f, i, &offset, &bytes));
    EXPECT_EQ(expected_offset[i], offset) << "param " << i;
    EXPECT_EQ(expected_size[i], bytes) << "param " << i;
  }
  size_t offset = 0, bytes = 0;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuFuncGetParamInfo(f, 4, &offset, &bytes));
  const char* name = nullptr;
  ASSERT_CU(cuFuncGetName(&name, f));
  EXPECT_STREQ("abi_probe", name);
}

TEST_F(GraphTest, KernelNodeReportsKernelParamsWhenLaunchedWithThem) {
  auto* dst = reinterpret_cast<uint32_t*>(a_);
  auto* src = reinterpret_cast<uint32_t*>(b_);
  CUgraph g = nullptr;
  CUgraphNode node =
      capture_one([&] { ASSERT_CU(sim_kernels::launch_add(s_, dst, src, 9, 256)); }, &g);
  CUgraphNodeType type{};
  ASSERT_CU(cuGraphNodeGetType(node, &type));
  ASSERT_EQ(CU_GRAPH_NODE_TYPE_KERNEL, type);
  CUDA_KERNEL_NODE_PARAMS p{};
  ASSERT_CU(cuGraphKernelNodeGetParams(node, &p));
  EXPECT_EQ(sim_kernels::get("add_u32"), p.func);
  EXPECT_EQ(nullptr, p.extra);
  ASSERT_NE(nullptr, p.kernelParams);
  EXPECT_EQ(a_, *static_cast<CUdeviceptr*>(p.kernelParams[0]));
  EXPECT_EQ(b_, *static_cast<CUdeviceptr*>(p.kernelParams[1]));
  EXPECT_EQ(9u, *static_cast<uint32_t*>(p.kernelParams[2]));
  EXPECT_EQ(128u, p.blockDimX);
  ASSERT_CU(cuGraphDestroy(g));
}

TEST_F(GraphTest, KernelNodeReportsThePackedExtraBufferWhenLaunchedWithOne) {
  struct alignas(8) Packed {
    CUdeviceptr dst, src;
    uint32_t value, n;
  } packed{a_, b_, 77, 256};
  size_t packed_bytes = sizeof(packed);
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE,
                   &packed_bytes, CU_LAUNCH_PARAM_END};
  CUgraph g = nullptr;
  CUgraphNode node = capture_one(
      [&] {
        ASSERT_CU(
            cuLaunchKernel(sim_kernels::get("add_u32"), 1, 1, 1, 32, 1, 1, 0, s_, nullptr, extra));
      },
      &g);
  packed.value = 0;  // the node holds its own copy
  CUDA_KERNEL_NODE_PARAMS p{};
  ASSERT_CU(cuGraphKernelNodeGetParams(node, &p));
  EXPECT_EQ(nullptr, p.kernelParams);
  ASSERT_NE(nullptr, p.extra);
  ASSERT_EQ(CU_LAUNCH_PARAM_BUFFER_POINTER, p.extra[0]);
  ASSERT_EQ(CU_LAUNCH_PARAM_BUFFER_SIZE, p.extra[2]);
  EXPECT_EQ(24u, *static_cast<size_t*>(p.extra[3]));
  const auto* buffer = static_cast<const char*>(p.extra[1]);
  CUdeviceptr dst = 0, src = 0;
  uint32_t value = 0;
  std::memcpy(&dst, buffer + 0, 8);
  std::memcpy(&src, buffer + 8, 8);
  std::memcpy(&value, buffer + 16, 4);
  EXPECT_EQ(a_, dst);
  EXPECT_EQ(b_, src);
  EXPECT_EQ(77u, value);

  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, g, 0));
  ASSERT_CU(cuMemsetD32(b_, 1, 256));
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(78u, reinterpret_cast<uint32_t*>(a_)[255]);
  ASSERT_CU(cuGraphExecDestroy(exec));
  ASSERT_CU(cuGraphDestroy(g));
}

TEST_F(GraphTest, MemcpyNodeReportsItsAddressesAndKinds) {
  std::vector<uint32_t> host(64, 3);
  CUgraph g = nullptr;
  CUgraphNode node =
      capture_one([&] { ASSERT_CU(cuMemcpyHtoDAsync(a_, host.data(), 256, s_)); }, &g);
  CUDA_MEMCPY3D c{};
  ASSERT_CU(cuGraphMemcpyNodeGetParams(node, &c));
  EXPECT_EQ(CU_MEMORYTYPE_HOST, c.srcMemoryType);
  EXPECT_EQ(host.data(), c.srcHost);
  EXPECT_EQ(CU_MEMORYTYPE_DEVICE, c.dstMemoryType);
  EXPECT_EQ(a_, c.dstDevice);
  EXPECT_EQ(256u, c.WidthInBytes);
  ASSERT_CU(cuGraphDestroy(g));
}

TEST_F(GraphTest, MemsetNodeReportsItsParams) {
  CUgraph g = nullptr;
  CUgraphNode node = capture_one([&] { ASSERT_CU(cuMemsetD32Async(b_, 0xABCD, 100, s_)); }, &g);
  CUDA_MEMSET_NODE_PARAMS m{};
  ASSERT_CU(cuGraphMemsetNodeGetParams(node, &m));
  EXPECT_EQ(b_, m.dst);
  EXPECT_EQ(0xABCDu, m.value);
  EXPECT_EQ(4u, m.elementSize);
  EXPECT_EQ(100u, m.width);
  ASSERT_CU(cuGraphDestroy(g));
}

TEST_F(GraphTest, ChildGraphNodeExposesACopyOfItsGraph) {
  CUgraph child = nullptr, parent = nullptr;
  ASSERT_CU(cuGraphCreate(&child, 0));
  CUDA_MEMSET_NODE_PARAMS m{};
  m.dst = a_;
  m.value = 5;
  m.elementSize = 4;
  m.width = 256;
  m.height = 1;
  CUgraphNode memset_node = nullptr, child_node = nullptr;
  ASSERT_CU(cuGraphAddMemsetNode(&memset_node, child, nullptr, 0, &m, nullptr));
  ASSERT_CU(cuGraphCreate(&parent, 0));
  ASSERT_CU(cuGraphAddChildGraphNode(&child_node, parent, nullptr, 0, child));
  ASSERT_CU(cuGraphDestroy(child));  // the parent holds its own copy
  CUgraph embedded = nullptr;
  ASSERT_CU(cuGraphChildGraphNodeGetGraph(child_node, &embedded));
  CUgraphNode inner = nullptr;
  size_t n = 1;
  ASSERT_CU(cuGraphGetNodes(embedded, &inner, &n));
  ASSERT_EQ(1u, n);
  CUDA_MEMSET_NODE_PARAMS got{};
  ASSERT_CU(cuGraphMemsetNodeGetParams(inner, &got));
  EXPECT_EQ(a_, got.dst);
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, parent, 0));
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(5u, reinterpret_cast<uint32_t*>(a_)[255]);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphDestroy(embedded))
      << "the embedded graph belongs to its node";
  ASSERT_CU(cuGraphExecDestroy(exec));
  ASSERT_CU(cuGraphDestroy(parent));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphGetNodes(embedded, nullptr, &n))
      << "the embedded graph's handle dies with its parent";
}

TEST_F(GraphTest, ExecutableGraphIsASnapshotAtInstantiation) {
  CUgraph g = nullptr;
  capture_one([&] { ASSERT_CU(cuMemsetD32Async(a_, 11, 256, s_)); }, &g);
  CUgraphExec exec = nullptr;
  CUDA_GRAPH_INSTANTIATE_PARAMS params{};
  ASSERT_CU(cuGraphInstantiateWithParams(&exec, g, &params));
  EXPECT_EQ(CUDA_GRAPH_INSTANTIATE_SUCCESS, params.result_out);
  ASSERT_CU(cuGraphDestroy(g));
  ASSERT_CU(cuGraphLaunch(exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(11u, reinterpret_cast<uint32_t*>(a_)[0]);
  ASSERT_CU(cuGraphExecDestroy(exec));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphLaunch(exec, s_));
}

// -----------------------------------------------------------------------------------------------
// cuGetProcAddress
// -----------------------------------------------------------------------------------------------

void* driver_symbol(const char* name) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  EXPECT_NE(nullptr, lib);
  void* sym = dlsym(lib, name);
  dlclose(lib);
  return sym;
}

TEST(ProcAddressTest, ReturnsTheNewestRevisionForTheAskedVersion) {
  ASSERT_CU(cuInit(0));
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  ASSERT_CU(cuGetProcAddress("cuMemAlloc", &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_EQ(CU_GET_PROC_ADDRESS_SUCCESS, status);
  EXPECT_EQ(driver_symbol("cuMemAlloc_v2"), fn);
  ASSERT_CU(cuGetProcAddress("cuGetProcAddress", &fn, 13000, 0, &status));
  EXPECT_EQ(driver_symbol("cuGetProcAddress_v2"), fn);
  ASSERT_CU(cuGetProcAddress("cuGetProcAddress", &fn, 11030, 0, &status));
  EXPECT_EQ(driver_symbol("cuGetProcAddress"), fn) << "the pre-12.0 four-argument ABI";
}

// CUDA 13.0 gave cuCtxSynchronize and cuCtxGetDevice context-taking revisions at version 13000
// while cuda.h kept the old declarations: a caller must ask for the version it calls.
TEST(ProcAddressTest, Cuda13RevisionsTakeAContext) {
  bind_device(1);
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  ASSERT_CU(cuGetProcAddress("cuCtxGetDevice", &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_EQ(driver_symbol("cuCtxGetDevice_v2"), fn);
  CUcontext ctx0 = nullptr;
  ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx0, 0));
  CUdevice device = -1;
  ASSERT_CU(reinterpret_cast<CUresult (*)(CUdevice*, CUcontext)>(fn)(&device, ctx0));
  EXPECT_EQ(device, 0) << "the named context's device, not the current one";
  ASSERT_CU(cuGetProcAddress("cuCtxSynchronize", &fn, 12090, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_EQ(driver_symbol("cuCtxSynchronize"), fn);
  ASSERT_CU(cuGetProcAddress("cuCtxSynchronize", &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_EQ(driver_symbol("cuCtxSynchronize_v2"), fn);
  auto* sync = reinterpret_cast<CUresult (*)(CUcontext)>(fn);
  EXPECT_CU_ERR(CUDA_ERROR_CONTEXT_IS_DESTROYED, sync(reinterpret_cast<CUcontext>(0x1234)));
  ASSERT_CU(sync(nullptr));
  bind_device(0);
}

// As driver 580 answers (bench/results/procaddr_ptds_h100.txt): success, no function, and the
// status says why.
TEST(ProcAddressTest, TooOldAVersionIsReportedAsSuch) {
  ASSERT_CU(cuInit(0));
  void* fn = reinterpret_cast<void*>(0x1);
  CUdriverProcAddressQueryResult status{};
  ASSERT_CU(cuGetProcAddress("cuStreamGetCaptureInfo", &fn, 12000, 0, &status));
  EXPECT_EQ(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, status);
  EXPECT_EQ(nullptr, fn);
}

TEST(ProcAddressTest, PerThreadTwinsBeginAtCuda7) {
  ASSERT_CU(cuInit(0));
  void* fn = reinterpret_cast<void*>(0x1);
  CUdriverProcAddressQueryResult status{};
  ASSERT_CU(cuGetProcAddress("cuMemcpyHtoD", &fn, 3020,
                             CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status));
  EXPECT_EQ(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, status);
  EXPECT_EQ(nullptr, fn);
  ASSERT_CU(cuGetProcAddress("cuMemcpyHtoD", &fn, 7000,
                             CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status));
  EXPECT_EQ(CU_GET_PROC_ADDRESS_SUCCESS, status);
  EXPECT_EQ(driver_symbol("cuMemcpyHtoD_v2_ptds"), fn);
  ASSERT_CU(
      cuGetProcAddress("cuMemcpyHtoD", &fn, 3020, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status));
  EXPECT_EQ(driver_symbol("cuMemcpyHtoD_v2"), fn);
}

TEST(ProcAddressTest, UnknownSymbolIsNotFound) {
  ASSERT_CU(cuInit(0));
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  EXPECT_CU_ERR(CUDA_ERROR_NOT_FOUND, cuGetProcAddress("cuNoSuchThing", &fn, 13000, 0, &status));
  EXPECT_EQ(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, status);
  EXPECT_CU_ERR(CUDA_ERROR_NOT_FOUND, cuGetProcAddress("cuMemAlloc_v2", &fn, 13000, 0, &status))
      << "lookups take base names, as NVIDIA's driver does";
}

TEST(ProcAddressTest, PerThreadFlagSelectsThePtszTwin) {
  ASSERT_CU(cuInit(0));
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  ASSERT_CU(cuGetProcAddress("cuLaunchKernel", &fn, 13000,
                             CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status));
  EXPECT_EQ(driver_symbol("cuLaunchKernel_ptsz"), fn);
  ASSERT_CU(cuGetProcAddress("cuMemcpyHtoD", &fn, 13000,
                             CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status));
  EXPECT_EQ(driver_symbol("cuMemcpyHtoD_v2_ptds"), fn);
  ASSERT_CU(
      cuGetProcAddress("cuLaunchKernel", &fn, 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status));
  EXPECT_EQ(driver_symbol("cuLaunchKernel"), fn);
  ASSERT_CU(cuGetProcAddress("cuMemCreate", &fn, 13000,
                             CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status));
  EXPECT_EQ(driver_symbol("cuMemCreate"), fn) << "calls without a stream have no twin";
}

TEST(ProcAddressTest, ResolvedFunctionIsTheOneThatRuns) {
  bind_device(0);
  using MemAlloc = CUresult (*)(CUdeviceptr*, size_t);
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  ASSERT_CU(cuGetProcAddress("cuMemAlloc", &fn, 13000, 0, &status));
  ASSERT_EQ(0, vaswapSimInjectFault("cuMemAlloc_v2", 1, CUDA_ERROR_OUT_OF_MEMORY));
  CUdeviceptr p = 0;
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, reinterpret_cast<MemAlloc>(fn)(&p, 4096))
      << "the fault armed on cuMemAlloc_v2 fires through the resolved pointer";
  ASSERT_EQ(CUDA_SUCCESS, reinterpret_cast<MemAlloc>(fn)(&p, 4096));
  unsigned type = 0;
  ASSERT_CU(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p));
  EXPECT_EQ(unsigned(CU_MEMORYTYPE_DEVICE), type);
  ASSERT_CU(cuMemFree(p));
}

}  // namespace

// "Each launch is ordered behind both any previous work in hStream and any previous launches of
// hGraphExec" (cuGraphLaunch): launches of one executable on two streams in turn, with no event
// between them, add one each, in order.
TEST_F(GraphTest, LaunchesOfOneExecutableAreOrderedAcrossStreams) {
  constexpr uint32_t kN = 1u << 20;
  CUdeviceptr buf = 0;
  ASSERT_CU(cuMemAlloc(&buf, kN * sizeof(uint32_t)));
  ASSERT_CU(cuMemsetD32(buf, 0, kN));
  auto* words = reinterpret_cast<uint32_t*>(buf);
  ASSERT_CU(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  for (int k = 0; k < 4; ++k) ASSERT_CU(sim_kernels::launch_add(s_, words, words, 1, kN));
  CUgraph g = nullptr;
  ASSERT_CU(cuStreamEndCapture(s_, &g));
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, g, 0));
  CUstream other = nullptr;
  ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  constexpr int kLaunches = 16;
  for (int i = 0; i < kLaunches; ++i) ASSERT_CU(cuGraphLaunch(exec, i % 2 == 0 ? s_ : other));
  ASSERT_CU(cuStreamSynchronize(s_));
  ASSERT_CU(cuStreamSynchronize(other));
  size_t wrong = 0;
  for (uint32_t i = 0; i < kN; ++i) wrong += words[i] != 4u * kLaunches;
  EXPECT_EQ(0u, wrong) << "words[0] = " << words[0];
  ASSERT_CU(cuStreamDestroy(other));
  ASSERT_CU(cuGraphExecDestroy(exec));
  ASSERT_CU(cuGraphDestroy(g));
  ASSERT_CU(cuMemFree(buf));
}

// A node given new parameters in the executable keeps its place: the nodes that depend on it
// depend on its replacement (changing both a node and then its dependent runs both, in order).
// cuGraphNodeSetEnabled: a disabled node does nothing (the memset's bytes stay as they were) and
// its dependents still run after it; enabled again, it runs again. Only kernel, memcpy and
// memset nodes can be disabled; a node of another graph is refused.
TEST_F(GraphTest, ADisabledNodeIsAnEmptyNodeUntilEnabledAgain) {
  constexpr size_t kBytes = 4096;
  CUdeviceptr a = 0, b = 0;
  ASSERT_CU(cuMemAlloc(&a, kBytes));
  ASSERT_CU(cuMemAlloc(&b, kBytes));
  ASSERT_CU(cuMemsetD8(a, 3, kBytes));
  SetThenCopy g;
  g.capture(s_, a, 9, kBytes, b, a, kBytes);
  unsigned enabled = 7;
  ASSERT_CU(cuGraphNodeGetEnabled(g.exec, g.nodes[0], &enabled));
  EXPECT_EQ(1u, enabled);
  ASSERT_CU(cuGraphNodeSetEnabled(g.exec, g.nodes[0], 0));
  ASSERT_CU(cuGraphNodeGetEnabled(g.exec, g.nodes[0], &enabled));
  EXPECT_EQ(0u, enabled);
  ASSERT_CU(cuGraphLaunch(g.exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  const auto* got = reinterpret_cast<const uint8_t*>(b);
  EXPECT_EQ(3, got[0]) << "the memset ran while disabled";
  EXPECT_EQ(3, got[kBytes - 1]) << "the copy after it did not run";
  ASSERT_CU(cuGraphNodeSetEnabled(g.exec, g.nodes[0], 1));
  ASSERT_CU(cuGraphLaunch(g.exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(9, got[0]);
  EXPECT_EQ(9, got[kBytes - 1]);

  // Another kind of node, and a node the executable was not made from.
  CUgraph other = nullptr;
  ASSERT_CU(cuGraphCreate(&other, 0));
  CUgraphNode empty = nullptr;
  ASSERT_CU(cuGraphAddEmptyNode(&empty, other, nullptr, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphNodeSetEnabled(g.exec, empty, 0));
  CUgraphExec empty_exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&empty_exec, other, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphNodeSetEnabled(empty_exec, empty, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphNodeGetEnabled(empty_exec, empty, &enabled));
  ASSERT_CU(cuGraphExecDestroy(empty_exec));
  ASSERT_CU(cuGraphDestroy(other));
  g.destroy();
  ASSERT_CU(cuMemFree(a));
  ASSERT_CU(cuMemFree(b));
}

TEST_F(GraphTest, ANodeGivenNewParametersKeepsItsDependents) {
  constexpr size_t kBytes = 4096;
  CUdeviceptr a = 0, b = 0;
  ASSERT_CU(cuMemAlloc(&a, kBytes));
  ASSERT_CU(cuMemAlloc(&b, kBytes));
  SetThenCopy g;
  g.capture(s_, a, 1, kBytes, b, a, kBytes);
  g.set.value = 7;
  ASSERT_CU(cuGraphExecMemsetNodeSetParams(g.exec, g.nodes[0], &g.set, nullptr));
  g.copy.WidthInBytes = kBytes / 2;
  ASSERT_CU(cuGraphExecMemcpyNodeSetParams(g.exec, g.nodes[1], &g.copy, nullptr));
  ASSERT_CU(cuMemsetD8(b, 0, kBytes));
  ASSERT_CU(cuGraphLaunch(g.exec, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  const auto* got = reinterpret_cast<const uint8_t*>(b);
  EXPECT_EQ(7, got[0]);
  EXPECT_EQ(7, got[kBytes / 2 - 1]);
  EXPECT_EQ(0, got[kBytes / 2]) << "the copy's new width";
  g.destroy();
  ASSERT_CU(cuMemFree(a));
  ASSERT_CU(cuMemFree(b));
}
