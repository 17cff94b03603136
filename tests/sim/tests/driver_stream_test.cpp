// The simulated driver's ordering model: streams are threads, events and waits are real.
#include "sim_test.h"

namespace {

class StreamTest : public SimTest {};

struct Trace {
  std::mutex mu;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  void add(int v) {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(v);
    threads.push_back(std::this_thread::get_id());
  }
};

struct Mark {
  Trace* trace;
  int value;
  static void CUDA_CB fn(void* m) {
    auto* self = static_cast<Mark*>(m);
    self->trace->add(self->value);
  }
};

TEST_F(StreamTest, OperationsRunInOrderOnAWorkerThread) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  Trace trace;
  std::vector<Mark> marks;
  for (int i = 0; i < 50; ++i) marks.push_back({&trace, i});
  for (auto& m : marks) ASSERT_CU(cuLaunchHostFunc(s, Mark::fn, &m));
  ASSERT_CU(cuStreamSynchronize(s));
  ASSERT_EQ(50u, trace.order.size());
  for (int i = 0; i < 50; ++i) EXPECT_EQ(i, trace.order[static_cast<size_t>(i)]);
  EXPECT_NE(std::this_thread::get_id(), trace.threads[0]);
  ASSERT_CU(cuStreamDestroy(s));
}

TEST_F(StreamTest, WorkIsAsynchronousUntilTheStreamDrains) {
  CUstream s = nullptr;
  CUevent done = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuEventCreate(&done, 0));
  Gate gate;
  ASSERT_CU(cuLaunchHostFunc(s, Gate::wait_fn, &gate));
  ASSERT_CU(cuEventRecord(done, s));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_READY, cuStreamQuery(s));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_READY, cuEventQuery(done));
  gate.release();
  ASSERT_CU(cuEventSynchronize(done));
  EXPECT_CU_ERR(CUDA_SUCCESS, cuStreamQuery(s));
  ASSERT_CU(cuEventDestroy(done));
  ASSERT_CU(cuStreamDestroy(s));
}

TEST_F(StreamTest, StreamWaitEventOrdersWorkAcrossStreams) {
  CUstream producer = nullptr, consumer = nullptr;
  CUevent e = nullptr;
  ASSERT_CU(cuStreamCreate(&producer, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuStreamCreate(&consumer, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
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
  ASSERT_CU(cuEventRecord(e, producer));
  ASSERT_CU(cuStreamWaitEvent(consumer, e, 0));
  auto* words = reinterpret_cast<uint32_t*>(buf);
  ASSERT_CU(sim_kernels::launch_add(consumer, words, words, 41, 64));
  ASSERT_CU(cuMemcpyDtoHAsync(out, buf, 64 * sizeof(uint32_t), consumer));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_READY, cuStreamQuery(consumer))
      << "consumer must wait for the event";
  gate.release();
  ASSERT_CU(cuStreamSynchronize(consumer));
  for (size_t i = 0; i < 64; ++i) ASSERT_EQ(42u, out[i]);
  ASSERT_CU(cuMemFreeHost(out));
  ASSERT_CU(cuMemFree(buf));
  ASSERT_CU(cuEventDestroy(e));
  ASSERT_CU(cuStreamDestroy(producer));
  ASSERT_CU(cuStreamDestroy(consumer));
}

TEST_F(StreamTest, ElapsedTimeMeasuresWorkBetweenEvents) {
  CUstream s = nullptr;
  CUevent a = nullptr, b = nullptr, untimed = nullptr;
  ASSERT_CU(cuStreamCreate(&s, 0));
  ASSERT_CU(cuEventCreate(&a, 0));
  ASSERT_CU(cuEventCreate(&b, 0));
  ASSERT_CU(cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING));
  ASSERT_CU(cuEventRecord(a, s));
  ASSERT_CU(cuLaunchHostFunc(
      s, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(30)); }, nullptr));
  ASSERT_CU(cuEventRecord(b, s));
  ASSERT_CU(cuEventRecord(untimed, s));
  ASSERT_CU(cuEventSynchronize(b));
  float ms = 0;
  ASSERT_CU(cuEventElapsedTime(&ms, a, b));
  EXPECT_GE(ms, 29.0f);
  EXPECT_LT(ms, 2000.0f);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuEventElapsedTime(&ms, a, untimed));
  ASSERT_CU(cuEventElapsedTime(&ms, b, b));  // one event as both ends
  EXPECT_EQ(ms, 0.0f);
  for (CUevent e : {a, b, untimed}) ASSERT_CU(cuEventDestroy(e));
  ASSERT_CU(cuStreamDestroy(s));
}

TEST_F(StreamTest, LegacyStreamWaitsForBlockingStreamsButNotNonBlockingOnes) {
  CUstream blocking = nullptr, non_blocking = nullptr;
  ASSERT_CU(cuStreamCreate(&blocking, 0));
  ASSERT_CU(cuStreamCreate(&non_blocking, CU_STREAM_NON_BLOCKING));
  Gate gate;
  Trace trace;
  Mark legacy_mark{&trace, 1}, free_mark{&trace, 2};
  ASSERT_CU(cuLaunchHostFunc(blocking, Gate::wait_fn, &gate));
  ASSERT_CU(cuLaunchHostFunc(CU_STREAM_LEGACY, Mark::fn, &legacy_mark));
  ASSERT_CU(cuLaunchHostFunc(non_blocking, Mark::fn, &free_mark));
  ASSERT_CU(cuStreamSynchronize(non_blocking));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_READY, cuStreamQuery(CU_STREAM_LEGACY));
  gate.release();
  ASSERT_CU(cuStreamSynchronize(CU_STREAM_LEGACY));
  ASSERT_EQ((std::vector<int>{2, 1}), trace.order);
  ASSERT_CU(cuStreamDestroy(blocking));
  ASSERT_CU(cuStreamDestroy(non_blocking));
}

TEST_F(StreamTest, PerThreadStreamsDifferBetweenThreads) {
  Trace trace;
  Mark m1{&trace, 1}, m2{&trace, 2};
  ASSERT_CU(cuLaunchHostFunc(CU_STREAM_PER_THREAD, Mark::fn, &m1));
  ASSERT_CU(cuStreamSynchronize(CU_STREAM_PER_THREAD));
  std::thread other([&] {
    bind_device(0);
    EXPECT_EQ(CUDA_SUCCESS, cuLaunchHostFunc(CU_STREAM_PER_THREAD, Mark::fn, &m2));
    EXPECT_EQ(CUDA_SUCCESS, cuStreamSynchronize(CU_STREAM_PER_THREAD));
  });
  other.join();
  ASSERT_EQ(2u, trace.threads.size());
  EXPECT_NE(trace.threads[0], trace.threads[1]);
  unsigned long long id_here = 0, id_legacy = 0;
  ASSERT_CU(cuStreamGetId(CU_STREAM_PER_THREAD, &id_here));
  ASSERT_CU(cuStreamGetId(CU_STREAM_LEGACY, &id_legacy));
  EXPECT_NE(id_here, id_legacy);
}

TEST_F(StreamTest, HostFunctionsMayNotCallCuda) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, 0));
  struct Result {
    CUresult rc = CUDA_SUCCESS;
  } result;
  // Read before the launch: the host function may run at once.
  const unsigned long long violations_before = vaswapSimHostFnViolations();
  ASSERT_CU(cuLaunchHostFunc(
      s,
      [](void* r) {
        CUdeviceptr p = 0;
        static_cast<Result*>(r)->rc = cuMemAlloc(&p, 4096);
      },
      &result));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(CUDA_ERROR_NOT_PERMITTED, result.rc);
  EXPECT_EQ(vaswapSimHostFnViolations() - violations_before, 1u);  // counted for vaswap's tests
  ASSERT_CU(cuStreamDestroy(s));
}

TEST_F(StreamTest, EventsRecordOnlyOnStreamsOfTheirDevice) {
  CUevent on_device0 = nullptr;
  ASSERT_CU(cuEventCreate(&on_device0, 0));
  bind_device(1);
  CUstream s1 = nullptr;
  ASSERT_CU(cuStreamCreate(&s1, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuEventRecord(on_device0, s1));
  CUevent on_device1 = nullptr;
  ASSERT_CU(cuEventCreate(&on_device1, 0));
  ASSERT_CU(cuEventRecord(on_device1, s1));
  ASSERT_CU(cuEventSynchronize(on_device1));
  ASSERT_CU(cuStreamDestroy(s1));
  ASSERT_CU(cuEventDestroy(on_device1));
  bind_device(0);
  ASSERT_CU(cuEventDestroy(on_device0));
}

TEST_F(StreamTest, SynchronousCopiesAndMemsetsMoveBytes) {
  CUdeviceptr a = 0, b = 0;
  ASSERT_CU(cuMemAlloc(&a, 4096));
  ASSERT_CU(cuMemAlloc(&b, 4096));
  ASSERT_CU(cuMemsetD32(a, 0xDEADBEEFu, 1024));
  ASSERT_CU(cuMemcpyDtoD(b, a, 4096));
  std::vector<uint32_t> host(1024);
  ASSERT_CU(cuMemcpyDtoH(host.data(), b, 4096));
  for (uint32_t v : host) ASSERT_EQ(0xDEADBEEFu, v);
  ASSERT_CU(cuMemsetD8(a, 0x11, 4096));
  ASSERT_CU(cuMemcpy(reinterpret_cast<CUdeviceptr>(host.data()), a, 4096));
  for (uint32_t v : host) ASSERT_EQ(0x11111111u, v);
  ASSERT_CU(cuMemFree(a));
  ASSERT_CU(cuMemFree(b));
}

TEST_F(StreamTest, CallsBeforeInitAndWithoutContextFail) {
  std::thread other([] {
    CUdeviceptr p = 0;
    EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, cuMemAlloc(&p, 4096));  // no context on this thread
  });
  other.join();
}

// The "device" fault: the armed kernel does not run, its error becomes sticky on that device, and
// nothing after it runs there (a host function enqueued behind it never fires), while operations
// still retire so synchronization returns the error instead of hanging.
TEST_F(StreamTest, ADeviceFaultIsStickyAndStopsTheDevice) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr buf = 0;
  ASSERT_CU(cuMemAlloc(&buf, 4 * sizeof(uint32_t)));
  ASSERT_CU(cuMemsetD32(buf, 5, 4));
  auto* p = reinterpret_cast<uint32_t*>(buf);
  ASSERT_CU(sim_kernels::launch_add(s, p, p, 1, 4));  // runs: 6
  ASSERT_CU(cuStreamSynchronize(s));
  ASSERT_EQ(0, vaswapSimInjectFault("device", 2, CUDA_ERROR_ILLEGAL_ADDRESS));
  Gate gate;  // holds the stream until everything below is enqueued
  ASSERT_CU(cuLaunchHostFunc(s, Gate::wait_fn, &gate));
  ASSERT_CU(sim_kernels::launch_add(s, p, p, 10, 4));   // 16
  ASSERT_CU(sim_kernels::launch_add(s, p, p, 100, 4));  // faults: does not run
  Trace trace;
  Mark mark{&trace, 1};
  ASSERT_CU(cuLaunchHostFunc(s, Mark::fn, &mark));
  gate.release();
  EXPECT_CU_ERR(CUDA_ERROR_ILLEGAL_ADDRESS, cuStreamSynchronize(s));
  EXPECT_TRUE(trace.order.empty()) << "a host function ran after the device faulted";
  CUdeviceptr other = 0;
  EXPECT_CU_ERR(CUDA_ERROR_ILLEGAL_ADDRESS, cuMemAlloc(&other, 4096));
  EXPECT_CU_ERR(CUDA_ERROR_ILLEGAL_ADDRESS, cuCtxSynchronize());
  // Device memory is host memory here: the kernel before the fault ran, the faulting one did not.
  EXPECT_EQ(16u, p[0]);
  vaswapSimClearFaults();
  ASSERT_CU(cuCtxSynchronize());
  ASSERT_CU(cuMemFree(buf));
  ASSERT_CU(cuStreamDestroy(s));
}

// The "copy_stall" fault holds one copy for the armed milliseconds; the bytes still arrive.
TEST_F(StreamTest, AStalledCopyArrivesLate) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr buf = 0;
  ASSERT_CU(cuMemAlloc(&buf, 64));
  std::vector<char> host(64, 'x'), back(64, 0);
  ASSERT_EQ(0, vaswapSimInjectFault("copy_stall", 1, 300));
  const auto start = std::chrono::steady_clock::now();
  ASSERT_CU(cuMemcpyHtoDAsync(buf, host.data(), 64, s));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_READY, cuStreamQuery(s));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(300));
  ASSERT_CU(cuMemcpyDtoH(back.data(), buf, 64));
  EXPECT_EQ(host, back);
  ASSERT_CU(cuMemFree(buf));
  ASSERT_CU(cuStreamDestroy(s));
}

// As CUDA documents and the H200 showed (bench/results/stall_dump_h200.md): a copy into pageable
// memory returns only once it is done, so it waits for the stream's earlier work; a large one
// from pageable memory waits for that work before it starts; a small one returns at once.
TEST_F(StreamTest, CopiesWithPageableMemoryWaitForTheirStream) {
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  constexpr size_t kLarge = 1u << 20;
  CUdeviceptr buf = 0;
  ASSERT_CU(cuMemAlloc(&buf, kLarge));
  std::vector<char> small(4096, 's'), large(kLarge, 'l'), back(kLarge, 0);
  Gate gate;
  ASSERT_CU(cuLaunchHostFunc(s, Gate::wait_fn, &gate));
  std::atomic<int> returned{0};
  std::thread copier([&] {
    EXPECT_EQ(CUDA_SUCCESS, cuMemcpyHtoDAsync(buf, small.data(), small.size(), s));
    returned = 1;
    EXPECT_EQ(CUDA_SUCCESS, cuMemcpyHtoDAsync(buf, large.data(), kLarge, s));
    returned = 2;
    EXPECT_EQ(CUDA_SUCCESS, cuMemcpyDtoHAsync(back.data(), buf, kLarge, s));
    returned = 3;
  });
  // The small copy returns (within 10 s, however loaded the machine), then the large one waits
  // for the gate: still waiting 50 ms later.
  for (int i = 0; i < 10000 && returned.load() < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(1, returned.load()) << "the small copy returned, the large one waits for the gate";
  gate.release();
  copier.join();
  EXPECT_EQ(3, returned.load());
  // The copy into pageable memory returned once done: its data is there without a synchronize.
  EXPECT_EQ(large, back);
  ASSERT_CU(cuMemFree(buf));
  ASSERT_CU(cuStreamDestroy(s));
}

// VASWAP_SIM_STREAM_BYTES / vaswapSimSetStreamBytes: a stream holds device memory until it is
// destroyed, and one the device cannot hold is refused as out of memory, as on a GPU left too
// little.
TEST_F(StreamTest, StreamsHoldDeviceMemoryWhenAskedAndFailOutOfMemory) {
  bind_device(1);  // 512 MiB
  const unsigned long long before = vaswapSimPhysicalBytes(1);
  vaswapSimSetStreamBytes(200ull << 20);
  CUstream a = nullptr, b = nullptr, c = nullptr;
  ASSERT_CU(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  EXPECT_EQ(before + (400ull << 20), vaswapSimPhysicalBytes(1));
  EXPECT_CU_ERR(CUDA_ERROR_OUT_OF_MEMORY, cuStreamCreate(&c, CU_STREAM_NON_BLOCKING));
  EXPECT_EQ(nullptr, c);
  ASSERT_CU(cuStreamDestroy(a));
  EXPECT_EQ(before + (200ull << 20), vaswapSimPhysicalBytes(1));
  ASSERT_CU(cuStreamCreate(&c, CU_STREAM_NON_BLOCKING));
  vaswapSimSetStreamBytes(0);
  ASSERT_CU(cuStreamDestroy(b));
  ASSERT_CU(cuStreamDestroy(c));  // holds what it was made with
  EXPECT_EQ(before, vaswapSimPhysicalBytes(1));
  bind_device(0);
}

}  // namespace
