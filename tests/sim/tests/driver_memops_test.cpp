// Stream memory operations, batch memory-op nodes, updates of executable graphs, and the single
// hardware queue of CUDA_DEVICE_MAX_CONNECTIONS=1.
#include "sim_test.h"

namespace {

class MemopTest : public SimTest {
 protected:
  void SetUp() override {
    SimTest::SetUp();
    ASSERT_CU(cuMemHostAlloc(reinterpret_cast<void**>(&flag_), 64, CU_MEMHOSTALLOC_PORTABLE));
    std::memset(flag_, 0, 64);
    // The test kernels' module, loaded before any stream parks: a load waits for parked streams.
    ASSERT_NE(sim_kernels::get("add_u32"), nullptr);
  }
  void TearDown() override {
    vaswapSimSetSingleQueue(0);
    vaswapSimSetMemopsSupported(1);
    cuMemFreeHost(flag_);
    SimTest::TearDown();
  }
  CUdeviceptr flag_address(size_t word = 0) const {
    return reinterpret_cast<CUdeviceptr>(flag_ + word);
  }
  uint32_t flag(size_t word = 0) const { return __atomic_load_n(flag_ + word, __ATOMIC_ACQUIRE); }
  void set_flag(uint32_t value, size_t word = 0) {
    __atomic_store_n(flag_ + word, value, __ATOMIC_RELEASE);
  }
  uint32_t* flag_ = nullptr;
};

TEST_F(MemopTest, WaitValueHoldsTheStreamUntilTheConditionHolds) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr buf = 0;
  ASSERT_CU(cuMemAlloc(&buf, 64 * sizeof(uint32_t)));
  ASSERT_CU(cuMemsetD32(buf, 7, 64));
  ASSERT_CU(cuStreamWaitValue32(s, flag_address(), 3, CU_STREAM_WAIT_VALUE_GEQ));
  auto* words = reinterpret_cast<uint32_t*>(buf);
  ASSERT_CU(sim_kernels::launch_add(s, words, words, 1, 64));
  set_flag(2);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_READY, cuStreamQuery(s)) << "2 is not >= 3";
  EXPECT_EQ(7u, words[0]);
  set_flag(3);
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(8u, words[63]);
  ASSERT_CU(cuMemFree(buf));
  ASSERT_CU(cuStreamDestroy(s));
}

// As on the H200 (bench/results/park_probe_module_h200.txt): a module load does not return while
// a stream of the device is parked on a wait-value, and meanwhile other threads' enqueues on the
// device wait for the load (vaswap's worker stayed blocked in the driver so in torch.compile's
// warm-up). Both go on once the flag is written.
TEST_F(MemopTest, AModuleLoadWaitsForAParkedStreamAndHoldsBackEnqueues) {
  CUstream s = nullptr, other = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  CUcontext context = nullptr;
  ASSERT_CU(cuCtxGetCurrent(&context));
  CUdeviceptr buf = 0;
  ASSERT_CU(cuMemAlloc(&buf, 64 * sizeof(uint32_t)));
  ASSERT_CU(cuStreamWaitValue32(s, flag_address(), 1, CU_STREAM_WAIT_VALUE_GEQ));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // s is parked
  std::atomic<bool> loaded{false}, enqueued{false};
  CUresult load_rc = CUDA_ERROR_UNKNOWN, enqueue_rc = CUDA_ERROR_UNKNOWN;
  std::thread loader([&] {
    cuCtxSetCurrent(context);
    CUmodule module = nullptr;
    load_rc = cuModuleLoadData(&module, &sim_kernels::kImage);
    loaded.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::thread enqueuer([&] {
    cuCtxSetCurrent(context);
    enqueue_rc = cuMemsetD32Async(buf, 9, 64, other);
    enqueued.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(loaded.load()) << "the load returned while s was parked";
  EXPECT_FALSE(enqueued.load()) << "another thread enqueued while the load waited";
  set_flag(1);
  loader.join();
  enqueuer.join();
  EXPECT_EQ(CUDA_SUCCESS, load_rc);
  EXPECT_EQ(CUDA_SUCCESS, enqueue_rc);
  ASSERT_CU(cuStreamSynchronize(other));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(9u, reinterpret_cast<uint32_t*>(buf)[63]);
  // Nothing parked: a load returns at once.
  CUmodule again = nullptr;
  ASSERT_CU(cuModuleLoadData(&again, &sim_kernels::kImage));
  ASSERT_CU(cuMemFree(buf));
  ASSERT_CU(cuStreamDestroy(s));
  ASSERT_CU(cuStreamDestroy(other));
}

TEST_F(MemopTest, GeqIsTheDriversCyclicComparison) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  set_flag(2);  // 2 - 0xfffffffe == 4 as int32: past it, across the wrap
  ASSERT_CU(cuStreamWaitValue32(s, flag_address(), 0xfffffffeu, CU_STREAM_WAIT_VALUE_GEQ));
  ASSERT_CU(cuStreamSynchronize(s));
  set_flag(5);
  ASSERT_CU(cuStreamWaitValue32(s, flag_address(), 5, CU_STREAM_WAIT_VALUE_EQ));
  ASSERT_CU(cuStreamWaitValue32(s, flag_address(), 4, CU_STREAM_WAIT_VALUE_AND));
  ASSERT_CU(cuStreamSynchronize(s));
  ASSERT_CU(cuStreamDestroy(s));
}

TEST_F(MemopTest, WriteValueLandsAfterTheWorkBeforeIt) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  Gate gate;
  ASSERT_CU(cuLaunchHostFunc(s, Gate::wait_fn, &gate));
  ASSERT_CU(cuStreamWriteValue32(s, flag_address(1), 42, 0));
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(0u, flag(1));
  gate.release();
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(42u, flag(1));
  ASSERT_CU(cuStreamWriteValue64(s, flag_address(2), 0x1122334455667788ull, 0));
  ASSERT_CU(cuStreamSynchronize(s));
  uint64_t wide = 0;
  std::memcpy(&wide, flag_ + 2, sizeof wide);
  EXPECT_EQ(0x1122334455667788ull, wide);
  ASSERT_CU(cuStreamDestroy(s));
}

TEST_F(MemopTest, OneStreamWaitsForAnotherThroughAFlag) {
  CUstream producer = nullptr, consumer = nullptr;
  ASSERT_CU(cuStreamCreate(&producer, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuStreamCreate(&consumer, CU_STREAM_NON_BLOCKING));
  CUdeviceptr buf = 0;
  ASSERT_CU(cuMemAlloc(&buf, 64 * sizeof(uint32_t)));
  // `out` is pinned: a copy into pageable memory returns only once it is done (CUDA's "API
  // synchronization behavior"), which here is after the gate.
  std::vector<uint32_t> ones(64, 1);
  uint32_t* out = nullptr;
  ASSERT_CU(cuMemAllocHost(reinterpret_cast<void**>(&out), 64 * sizeof(uint32_t)));
  Gate gate;
  ASSERT_CU(cuLaunchHostFunc(producer, Gate::wait_fn, &gate));
  ASSERT_CU(cuMemcpyHtoDAsync(buf, ones.data(), 64 * sizeof(uint32_t), producer));
  ASSERT_CU(cuStreamWriteValue32(producer, flag_address(), 1, 0));
  ASSERT_CU(cuStreamWaitValue32(consumer, flag_address(), 1, CU_STREAM_WAIT_VALUE_GEQ));
  auto* words = reinterpret_cast<uint32_t*>(buf);
  ASSERT_CU(sim_kernels::launch_add(consumer, words, words, 41, 64));
  ASSERT_CU(cuMemcpyDtoHAsync(out, buf, 64 * sizeof(uint32_t), consumer));
  gate.release();
  ASSERT_CU(cuStreamSynchronize(consumer));
  EXPECT_EQ(std::vector<uint32_t>(64, 42), std::vector<uint32_t>(out, out + 64));
  ASSERT_CU(cuMemFreeHost(out));
  ASSERT_CU(cuMemFree(buf));
  ASSERT_CU(cuStreamDestroy(producer));
  ASSERT_CU(cuStreamDestroy(consumer));
}

TEST_F(MemopTest, MalformedOperationsAreRefused) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamWaitValue32(s, 0, 1, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamWaitValue32(s, flag_address() + 2, 1, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamWaitValue32(s, flag_address(), 1, 7));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamWriteValue64(s, flag_address(1), 1, 0));
  ASSERT_CU(cuStreamDestroy(s));
}

TEST_F(MemopTest, WithoutSupportEveryOperationIsNotSupported) {
  vaswapSimSetMemopsSupported(0);
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_SUPPORTED, cuStreamWriteValue32(s, flag_address(), 1, 0));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_SUPPORTED, cuStreamWaitValue32(s, flag_address(), 0, 0));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(0u, flag());
  ASSERT_CU(cuStreamDestroy(s));
}

TEST_F(MemopTest, CapturedOperationsBecomeABatchMemOpNode) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUgraph graph = nullptr;
  ASSERT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuStreamWaitValue32(s, flag_address(), 1, CU_STREAM_WAIT_VALUE_GEQ));
  ASSERT_CU(cuStreamWriteValue32(s, flag_address(1), 9, 0));
  ASSERT_CU(cuStreamEndCapture(s, &graph));
  size_t count = 0;
  ASSERT_CU(cuGraphGetNodes(graph, nullptr, &count));
  ASSERT_EQ(2u, count);
  CUgraphNode nodes[2] = {};
  ASSERT_CU(cuGraphGetNodes(graph, nodes, &count));
  CUgraphNodeType type{};
  ASSERT_CU(cuGraphNodeGetType(nodes[0], &type));
  EXPECT_EQ(CU_GRAPH_NODE_TYPE_BATCH_MEM_OP, type);
  CUDA_BATCH_MEM_OP_NODE_PARAMS p{};
  ASSERT_CU(cuGraphBatchMemOpNodeGetParams(nodes[1], &p));
  ASSERT_EQ(1u, p.count);
  EXPECT_EQ(CU_STREAM_MEM_OP_WRITE_VALUE_32, p.paramArray[0].operation);
  EXPECT_EQ(flag_address(1), p.paramArray[0].writeValue.address);
  EXPECT_EQ(9u, p.paramArray[0].writeValue.value);
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, graph, 0));
  ASSERT_CU(cuGraphLaunch(exec, s));
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(0u, flag(1)) << "the graph waits for the flag first";
  set_flag(1);
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(9u, flag(1));
  ASSERT_CU(cuGraphExecDestroy(exec));
  ASSERT_CU(cuGraphDestroy(graph));
  ASSERT_CU(cuStreamDestroy(s));
}

TEST_F(MemopTest, ExecutableMemOpNodeValuesChangeForLaterLaunchesOnly) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUgraph graph = nullptr;
  ASSERT_CU(cuGraphCreate(&graph, 0));
  CUstreamBatchMemOpParams op{};
  op.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  op.writeValue.address = flag_address(1);
  op.writeValue.value = 1;
  CUDA_BATCH_MEM_OP_NODE_PARAMS p{};
  p.count = 1;
  p.paramArray = &op;
  CUgraphNode node = nullptr;
  ASSERT_CU(cuGraphAddBatchMemOpNode(&node, graph, nullptr, 0, &p));
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, graph, 0));
  Gate gate;
  ASSERT_CU(cuLaunchHostFunc(s, Gate::wait_fn, &gate));
  ASSERT_CU(cuGraphLaunch(exec, s));  // enqueued with value 1
  op.writeValue.value = 2;
  ASSERT_CU(cuGraphExecBatchMemOpNodeSetParams(exec, node, &p));
  gate.release();
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(1u, flag(1)) << "a launch already enqueued keeps its values";
  ASSERT_CU(cuGraphLaunch(exec, s));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(2u, flag(1));
  ASSERT_CU(cuGraphExecDestroy(exec));
  ASSERT_CU(cuGraphDestroy(graph));
  ASSERT_CU(cuStreamDestroy(s));
}

TEST_F(MemopTest, ExecutableKernelParametersAndUpdates) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr a = 0, b = 0;
  ASSERT_CU(cuMemAlloc(&a, 64 * sizeof(uint32_t)));
  ASSERT_CU(cuMemAlloc(&b, 64 * sizeof(uint32_t)));
  ASSERT_CU(cuMemsetD32(a, 0, 64));
  ASSERT_CU(cuMemsetD32(b, 0, 64));
  auto kernel_params = [](uint32_t** dst, uint32_t* value, uint32_t* n, void** args) {
    args[0] = dst;
    args[1] = dst;
    args[2] = value;
    args[3] = n;
    CUDA_KERNEL_NODE_PARAMS k{};
    k.func = sim_kernels::get("add_u32");
    k.gridDimX = k.gridDimY = k.gridDimZ = 1;
    k.blockDimX = 128;
    k.blockDimY = k.blockDimZ = 1;
    k.kernelParams = args;
    return k;
  };
  uint32_t* dst = reinterpret_cast<uint32_t*>(a);
  uint32_t value = 1, n = 64;
  void* args[4] = {};
  CUDA_KERNEL_NODE_PARAMS k = kernel_params(&dst, &value, &n, args);
  CUgraph graph = nullptr;
  CUgraphNode node = nullptr;
  ASSERT_CU(cuGraphCreate(&graph, 0));
  ASSERT_CU(cuGraphAddKernelNode(&node, graph, nullptr, 0, &k));
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, graph, 0));
  ASSERT_CU(cuGraphLaunch(exec, s));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(1u, reinterpret_cast<uint32_t*>(a)[5]);
  // The executable now adds to b.
  dst = reinterpret_cast<uint32_t*>(b);
  ASSERT_CU(cuGraphExecKernelNodeSetParams(exec, node, &k));
  ASSERT_CU(cuGraphLaunch(exec, s));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(1u, reinterpret_cast<uint32_t*>(a)[5]);
  EXPECT_EQ(1u, reinterpret_cast<uint32_t*>(b)[5]);
  // A whole new graph of the same shape, adding 10 to a.
  dst = reinterpret_cast<uint32_t*>(a);
  value = 10;
  CUgraph other = nullptr;
  CUgraphNode other_node = nullptr;
  ASSERT_CU(cuGraphCreate(&other, 0));
  ASSERT_CU(cuGraphAddKernelNode(&other_node, other, nullptr, 0, &k));
  CUgraphExecUpdateResultInfo info{};
  ASSERT_CU(cuGraphExecUpdate(exec, other, &info));
  EXPECT_EQ(CU_GRAPH_EXEC_UPDATE_SUCCESS, info.result);
  ASSERT_CU(cuGraphLaunch(exec, s));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(11u, reinterpret_cast<uint32_t*>(a)[5]);
  // Another shape is refused, and the executable keeps what it had.
  CUgraphNode extra = nullptr;
  ASSERT_CU(cuGraphAddEmptyNode(&extra, other, nullptr, 0));
  EXPECT_CU_ERR(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, cuGraphExecUpdate(exec, other, &info));
  EXPECT_EQ(CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, info.result);
  ASSERT_CU(cuGraphLaunch(exec, s));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(21u, reinterpret_cast<uint32_t*>(a)[5]);
  ASSERT_CU(cuGraphExecDestroy(exec));
  ASSERT_CU(cuGraphDestroy(graph));
  ASSERT_CU(cuGraphDestroy(other));
  ASSERT_CU(cuMemFree(a));
  ASSERT_CU(cuMemFree(b));
  ASSERT_CU(cuStreamDestroy(s));
}

// CUDA_DEVICE_MAX_CONNECTIONS=1, measured on the H200: a copy on another stream stays queued
// behind a stream parked on a wait-value until the flag is written.
TEST_F(MemopTest, OneQueueHoldsOtherStreamsBehindAWait) {
  CUstream parked = nullptr, copier = nullptr;
  ASSERT_CU(cuStreamCreate(&parked, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuStreamCreate(&copier, CU_STREAM_NON_BLOCKING));
  CUdeviceptr buf = 0;
  ASSERT_CU(cuMemAlloc(&buf, 4096));
  std::vector<uint32_t> host(1024, 5);
  for (int single : {0, 1}) {
    vaswapSimSetSingleQueue(single);
    set_flag(0);
    ASSERT_CU(cuMemsetD32(buf, 0, 1024));
    ASSERT_CU(cuStreamWaitValue32(parked, flag_address(), 1, CU_STREAM_WAIT_VALUE_GEQ));
    ASSERT_CU(cuMemcpyHtoDAsync(buf, host.data(), 4096, copier));
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    const CUresult copied = cuStreamQuery(copier);
    if (single == 1) {
      EXPECT_CU_ERR(CUDA_ERROR_NOT_READY, copied) << "one queue: the copy waits behind the wait";
    } else {
      EXPECT_CU_ERR(CUDA_SUCCESS, copied) << "a queue per stream: the copy is independent";
    }
    set_flag(1);
    ASSERT_CU(cuStreamSynchronize(parked));
    ASSERT_CU(cuStreamSynchronize(copier));
    EXPECT_EQ(5u, reinterpret_cast<uint32_t*>(buf)[1023]);
  }
  ASSERT_CU(cuMemFree(buf));
  ASSERT_CU(cuStreamDestroy(parked));
  ASSERT_CU(cuStreamDestroy(copier));
}

// As on the H200 (bench/results/launch_unmapped_h200.txt): a copy or memset is checked against its
// addresses when it is enqueued or captured, so one into a reserved, unmapped address fails even
// when the stream would map it in time; a graph's copy and memset nodes are not checked at launch
// and run correctly once the pages are mapped before them.
TEST_F(MemopTest, CopiesAreCheckedAtEnqueueGraphNodesWhenTheyRun) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  ManualSlot src, dst;
  src.reserve(kGran);
  dst.reserve(kGran);
  const CUmemGenericAllocationHandle src_pages = src.map_new();
  for (uint32_t i = 0; i < kGran / 4; ++i) src.words()[i] = 0x5000u + i;

  // Unmapped: every enqueued form and a capture fail, and nothing was queued.
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoDAsync(dst.va, src.va, kGran, s));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoDAsync(src.va, dst.va, kGran, s));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoD(dst.va, src.words(), 64));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemsetD32Async(dst.va + 64, 1, 4, s));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemsetD8(dst.va, 1, 1));
  // A span that runs past the mapped pages of a reservation is refused as well.
  ManualSlot wide;
  wide.reserve(2 * kGran);
  CUmemGenericAllocationHandle half = 0;
  const CUmemAllocationProp prop = device_prop();
  const CUmemAccessDesc access = rw_access();
  ASSERT_CU(cuMemCreate(&half, kGran, &prop, 0));
  ASSERT_CU(cuMemMap(wide.va, kGran, 0, half, 0));
  ASSERT_CU(cuMemSetAccess(wide.va, kGran, &access, 1));
  EXPECT_EQ(CUDA_SUCCESS, cuMemsetD8Async(wide.va, 1, kGran, s));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemsetD8Async(wide.va, 1, kGran + 1, s));
  CUgraph graph = nullptr;
  ASSERT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoDAsync(dst.va, src.va, kGran, s));
  cuStreamEndCapture(s, &graph);
  if (graph != nullptr) cuGraphDestroy(graph);
  graph = nullptr;

  // Captured while mapped, launched while not: the launch succeeds and the nodes run after the
  // flag, by which time the pages are back.
  CUmemGenericAllocationHandle pages = dst.map_new();
  ASSERT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  ASSERT_CU(cuMemsetD8Async(dst.va + kGran / 2, 3, kGran / 2, s));
  ASSERT_CU(cuMemcpyDtoDAsync(dst.va, src.va, kGran / 2, s));
  ASSERT_CU(cuStreamEndCapture(s, &graph));
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, graph, 0));
  ASSERT_CU(cuMemUnmap(dst.va, dst.bytes));
  ASSERT_CU(cuMemRelease(pages));
  ASSERT_CU(cuStreamWaitValue32(s, flag_address(), 1, CU_STREAM_WAIT_VALUE_GEQ));
  ASSERT_CU(cuGraphLaunch(exec, s));
  pages = dst.map_new();
  set_flag(1);
  ASSERT_CU(cuStreamSynchronize(s));
  for (uint32_t i = 0; i < kGran / 8; ++i) ASSERT_EQ(0x5000u + i, dst.words()[i]) << "word " << i;
  EXPECT_EQ(0x03030303u, dst.words()[kGran / 4 - 1]);

  ASSERT_CU(cuGraphExecDestroy(exec));
  ASSERT_CU(cuGraphDestroy(graph));
  ASSERT_CU(cuMemUnmap(dst.va, dst.bytes));
  ASSERT_CU(cuMemRelease(pages));
  ASSERT_CU(cuMemUnmap(src.va, src.bytes));
  ASSERT_CU(cuMemRelease(src_pages));
  ASSERT_CU(cuMemUnmap(wide.va, kGran));
  ASSERT_CU(cuMemRelease(half));
  for (ManualSlot* m : {&src, &dst, &wide}) ASSERT_CU(cuMemAddressFree(m->va, m->bytes));
  ASSERT_CU(cuStreamDestroy(s));
}

}  // namespace

namespace {

// What a rewritten graph needs of the driver (core/transform/graph_rewrite.h): a clone whose
// nodes are found by the original's, edges added afterwards, and a wait node that does not hold
// back the branches beside it.
class GraphEditTest : public MemopTest {
 protected:
  void SetUp() override {
    MemopTest::SetUp();
    ASSERT_CU(cuStreamCreate(&s_, CU_STREAM_NON_BLOCKING));
    ASSERT_CU(cuGraphCreate(&graph_, 0));
  }
  void TearDown() override {
    EXPECT_EQ(CUDA_SUCCESS, cuGraphDestroy(graph_));
    EXPECT_EQ(CUDA_SUCCESS, cuStreamDestroy(s_));
    MemopTest::TearDown();
  }
  CUgraphNode add_write(CUgraph graph, size_t word, uint32_t value,
                        std::vector<CUgraphNode> deps = {}) {
    CUstreamBatchMemOpParams op{};
    op.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    op.writeValue.address = flag_address(word);
    op.writeValue.value = value;
    return add_ops(graph, {op}, deps);
  }
  CUgraphNode add_wait(CUgraph graph, size_t word, uint32_t value,
                       std::vector<CUgraphNode> deps = {}) {
    CUstreamBatchMemOpParams op{};
    op.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    op.waitValue.address = flag_address(word);
    op.waitValue.value = value;
    op.waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
    return add_ops(graph, {op}, deps);
  }
  CUgraphNode add_ops(CUgraph graph, std::vector<CUstreamBatchMemOpParams> ops,
                      const std::vector<CUgraphNode>& deps) {
    CUDA_BATCH_MEM_OP_NODE_PARAMS p{};
    p.count = static_cast<unsigned>(ops.size());
    p.paramArray = ops.data();
    CUgraphNode node = nullptr;
    EXPECT_EQ(CUDA_SUCCESS, cuGraphAddBatchMemOpNode(&node, graph, deps.data(), deps.size(), &p));
    return node;
  }
  // Launches graph_ on s_ and waits at most 2 s: false if it did not finish.
  bool run() {
    CUgraphExec exec = nullptr;
    EXPECT_EQ(CUDA_SUCCESS, cuGraphInstantiate(&exec, graph_, 0));
    EXPECT_EQ(CUDA_SUCCESS, cuGraphLaunch(exec, s_));
    for (int i = 0; i < 2000; ++i) {
      if (cuStreamQuery(s_) == CUDA_SUCCESS) {
        EXPECT_EQ(CUDA_SUCCESS, cuGraphExecDestroy(exec));
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }
  CUstream s_ = nullptr;
  CUgraph graph_ = nullptr;
};

TEST_F(GraphEditTest, ACloneHasItsOwnNodesFoundByTheOriginals) {
  CUgraph graph = graph_;
  const CUgraphNode a = add_write(graph, 0, 1);
  const CUgraphNode b = add_write(graph, 1, 2, {a});
  CUgraph clone = nullptr;
  ASSERT_CU(cuGraphClone(&clone, graph));
  CUgraphNode a2 = nullptr, b2 = nullptr;
  ASSERT_CU(cuGraphNodeFindInClone(&a2, a, clone));
  ASSERT_CU(cuGraphNodeFindInClone(&b2, b, clone));
  EXPECT_NE(a, a2);
  EXPECT_NE(b, b2);
  CUgraphNode dep = nullptr;
  size_t count = 1;
  ASSERT_CU(cuGraphNodeGetDependencies(b2, &dep, nullptr, &count));
  ASSERT_EQ(1u, count);
  EXPECT_EQ(a2, dep) << "the clone's edges join the clone's nodes";
  CUgraphNode none = nullptr;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuGraphNodeFindInClone(&none, a2, clone))
      << "a node of the clone is not an original";
  // Editing the clone leaves the original as it was.
  add_write(clone, 2, 3, {b2});
  size_t nodes = 0;
  ASSERT_CU(cuGraphGetNodes(graph, nullptr, &nodes));
  EXPECT_EQ(2u, nodes);
  ASSERT_CU(cuGraphGetNodes(clone, nullptr, &nodes));
  EXPECT_EQ(3u, nodes);
  ASSERT_CU(cuGraphDestroy(clone));
}

TEST_F(GraphEditTest, AnEdgeAddedLaterOrdersTheLaunch) {
  // Two writes to one word, listed first-then-second; the edge added later runs them the other
  // way round, so the first one's value stays.
  const CUgraphNode first = add_write(graph_, 0, 1);
  const CUgraphNode second = add_write(graph_, 0, 2);
  ASSERT_CU(cuGraphAddDependencies(graph_, &second, &first, nullptr, 1));
  ASSERT_TRUE(run());
  EXPECT_EQ(1u, flag(0));
  CUgraphNode dep = nullptr;
  size_t count = 1;
  ASSERT_CU(cuGraphNodeGetDependencies(first, &dep, nullptr, &count));
  EXPECT_EQ(second, dep);
}

TEST_F(GraphEditTest, EdgesThatWouldMakeACycleOrRepeatOrCrossGraphsAreRefused) {
  CUgraph graph = graph_, other = nullptr;
  ASSERT_CU(cuGraphCreate(&other, 0));
  const CUgraphNode a = add_write(graph, 0, 1);
  const CUgraphNode b = add_write(graph, 1, 1, {a});
  const CUgraphNode c = add_write(graph, 2, 1, {b});
  const CUgraphNode elsewhere = add_write(other, 0, 1);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuGraphAddDependencies(graph, &c, &a, nullptr, 1));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuGraphAddDependencies(graph, &a, &b, nullptr, 1));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuGraphAddDependencies(graph, &a, &elsewhere, nullptr, 1));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuGraphAddDependencies(graph, &a, &a, nullptr, 1));
  // Nothing was added by the refused calls: a still has no dependencies.
  size_t count = 0;
  ASSERT_CU(cuGraphNodeGetDependencies(a, nullptr, nullptr, &count));
  EXPECT_EQ(0u, count);
  ASSERT_CU(cuGraphDestroy(other));
}

TEST_F(GraphEditTest, AWaitNodeDoesNotHoldBackTheBranchesBesideIt) {
  // Listed first, a wait for word 0; beside it (no edge between them) the write it waits for,
  // and after the wait a write of word 1. On a GPU the branches run side by side; here too.
  const CUgraphNode wait = add_wait(graph_, 0, 7);
  add_write(graph_, 0, 7);
  add_write(graph_, 1, 9, {wait});
  ASSERT_TRUE(run()) << "the wait held back the write it waits for";
  EXPECT_EQ(9u, flag(1));
}

}  // namespace
