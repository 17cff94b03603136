// The slot API (include/vaswap/vaswap.h) against a CUDA device: the simulator when built with a
// host compiler (ctest's core.* tests), a real GPU when built with nvcc (bin/core_tests_cuda).
// Every test asserts values: addresses, bytes, contents, driver-reported memory.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "vaswap/vaswap.h"
#include "vaswap_sim/kernel.h"

// ------------------------------------------------------------------------------------------------
// Kernels
// ------------------------------------------------------------------------------------------------

VSK_GLOBAL void fill_u32(uint32_t* p, uint32_t seed, uint32_t n) {
  VSK_FOR(i, n) { p[i] = (static_cast<uint32_t>(i) * 2654435761u) ^ seed; }
}
VSK_REGISTER(fill_u32)

VSK_GLOBAL void add_u32(uint32_t* p, uint32_t k, uint32_t n) {
  VSK_FOR(i, n) { p[i] += k; }
}
VSK_REGISTER(add_u32)

VSK_GLOBAL void scale_into(const uint32_t* x, uint32_t* y, uint32_t k, uint32_t n) {
  VSK_FOR(i, n) { y[i] = x[i] * k; }
}
VSK_REGISTER(scale_into)

namespace {

constexpr size_t kMiB = size_t{1} << 20;

#define CUDA_OK(expr)                                                        \
  do {                                                                       \
    const cudaError_t rc_ = (expr);                                          \
    ASSERT_EQ(rc_, cudaSuccess) << #expr << ": " << cudaGetErrorString(rc_); \
  } while (0)

#define VASWAP_OK_(expr) ASSERT_EQ((expr), VASWAP_OK) << #expr << ": " << vaswap_last_error()

uint32_t pattern(size_t i, uint32_t seed) {
  return (static_cast<uint32_t>(i) * 2654435761u) ^ seed;
}

void launch(const void* kernel, void** args, cudaStream_t stream) {
  const cudaError_t rc = cudaLaunchKernel(kernel, dim3(64), dim3(256), args, 0, stream);
  ASSERT_EQ(rc, cudaSuccess) << cudaGetErrorString(rc);
}

void fill(uint64_t va, uint32_t seed, uint32_t n, cudaStream_t stream) {
  auto* p = reinterpret_cast<uint32_t*>(va);
  void* args[] = {&p, &seed, &n};
  launch(reinterpret_cast<const void*>(fill_u32), args, stream);
}

void add(uint64_t va, uint32_t k, uint32_t n, cudaStream_t stream) {
  auto* p = reinterpret_cast<uint32_t*>(va);
  void* args[] = {&p, &k, &n};
  launch(reinterpret_cast<const void*>(add_u32), args, stream);
}

void scale(uint64_t x_va, uint64_t y_va, uint32_t k, uint32_t n, cudaStream_t stream) {
  auto* x = reinterpret_cast<const uint32_t*>(x_va);
  auto* y = reinterpret_cast<uint32_t*>(y_va);
  void* args[] = {&x, &y, &k, &n};
  launch(reinterpret_cast<const void*>(scale_into), args, stream);
}

std::vector<uint32_t> read_device(uint64_t va, size_t n) {
  std::vector<uint32_t> out(n);
  const cudaError_t rc = cudaMemcpy(out.data(), reinterpret_cast<const void*>(va),
                                    n * sizeof(uint32_t), cudaMemcpyDeviceToHost);
  EXPECT_EQ(rc, cudaSuccess) << cudaGetErrorString(rc);
  return out;
}

// Counts the elements that differ from pattern(i, seed) * mul + add, so a failure says how many.
size_t mismatches(const std::vector<uint32_t>& got, uint32_t seed, uint32_t mul, uint32_t plus) {
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += got[i] != (pattern(i, seed) + plus) * mul;
  return bad;
}

vaswap_slot_info info_of(vaswap_slot slot) {
  vaswap_slot_info info{};
  EXPECT_EQ(vaswap_slot_get_info(slot, &info), VASWAP_OK) << vaswap_last_error();
  return info;
}

// Polls until the release worker has unmapped the slot (bounded: a hang fails the test).
bool wait_released(vaswap_slot slot) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    const vaswap_slot_info info = info_of(slot);
    if (info.mapped == 0 && info.release_pending == 0) return true;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return false;
}

// A whole restore: remap and copy back, the stream waits for it, the slots adopt their pages.
// Returns the first failing status (vaswap_last_error() has its message).
vaswap_status restore(vaswap_slot* slots, void** hosts, size_t count, cudaStream_t stream) {
  vaswap_remap remap = nullptr;
  vaswap_status s = vaswap_remap_and_copy_after(slots, hosts, count, stream, &remap);
  if (s == VASWAP_OK) s = vaswap_remap_wait_on_stream(remap, stream);
  if (s == VASWAP_OK) s = vaswap_remap_adopt(remap);
  if (remap != nullptr) {
    const vaswap_status destroyed = vaswap_remap_destroy(remap);
    if (s == VASWAP_OK) s = destroyed;
  }
  return s;
}

size_t free_bytes(int device) {
  size_t free = 0, total = 0;
  EXPECT_EQ(vaswap_driver_memory_info(device, &free, &total), VASWAP_OK) << vaswap_last_error();
  return free;
}

// What the driver reports free (cuMemGetInfo) moves by a slot's own pages, within the driver's
// bookkeeping: for a mapping of 32 MiB or more it may keep or take one 2 MiB page of its page
// tables, which live in device memory and follow the address range, not the pages (seen on the
// H200, driver 580: 62 MiB came back for a 64 MiB slot). Smaller mappings move exactly. vaswap's
// own accounting (mapped_bytes, bytes_mapped) is asserted exactly beside it.
// `mapped`: the bytes of the mappings involved, when they differ from the change (pages kept).
void expect_free_change(size_t from, size_t to, int64_t change, size_t mapped = 0) {
  const size_t bytes = mapped != 0 ? mapped : static_cast<size_t>(std::llabs(change));
  const int64_t slack = bytes >= 32 * kMiB ? int64_t{2} << 20 : 0;
  const int64_t moved = static_cast<int64_t>(to) - static_cast<int64_t>(from);
  EXPECT_GE(moved, change - slack) << "free device memory moved by " << moved << ", not " << change;
  EXPECT_LE(moved, change + slack) << "free device memory moved by " << moved << ", not " << change;
}

int device_count() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

// The simulator's controls, when the driver is the simulator; nullptr on a GPU.
template <class Fn>
Fn sim_function(const char* name) {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  return driver != nullptr ? reinterpret_cast<Fn>(dlsym(driver, name)) : nullptr;
}

class Slots : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device_count() == 0) GTEST_SKIP() << "no CUDA device";
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    for (vaswap_slot slot : slots_) vaswap_slot_destroy(slot);
    for (void* host : hosts_) vaswap_host_free(host);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  vaswap_slot make_slot(size_t bytes, int device = 0) {
    vaswap_slot slot = nullptr;
    EXPECT_EQ(vaswap_slot_create(device, bytes, &slot), VASWAP_OK) << vaswap_last_error();
    slots_.push_back(slot);
    return slot;
  }
  void* make_host(size_t bytes) {
    void* host = nullptr;
    EXPECT_EQ(vaswap_host_alloc(bytes, &host), VASWAP_OK) << vaswap_last_error();
    hosts_.push_back(host);
    return host;
  }
  void forget(vaswap_slot slot) { slots_.erase(std::find(slots_.begin(), slots_.end(), slot)); }

  cudaStream_t stream_ = nullptr;
  std::vector<vaswap_slot> slots_;
  std::vector<void*> hosts_;
};

// ------------------------------------------------------------------------------------------------
// Construction
// ------------------------------------------------------------------------------------------------

TEST_F(Slots, CreateMapsOneGranularityRoundedHandle) {
  const size_t before = free_bytes(0);
  vaswap_slot slot = make_slot(5 * kMiB);
  const vaswap_slot_info info = info_of(slot);
  EXPECT_NE(info.va, 0u);
  EXPECT_EQ(info.va % (2 * kMiB), 0u);
  EXPECT_EQ(info.bytes, 5 * kMiB);
  EXPECT_EQ(info.mapped_bytes, 6 * kMiB);  // 2 MiB granularity, one handle
  EXPECT_EQ(info.mapped, 1);
  expect_free_change(before, free_bytes(0), -6 * int64_t{kMiB});
  fill(info.va, 7, 5 * kMiB / 4, stream_);
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_EQ(mismatches(read_device(info.va, 5 * kMiB / 4), 7, 1, 0), 0u);
}

TEST_F(Slots, StridedExtentCoversTheLastElement) {
  const int64_t shape[] = {4, 8};
  const int64_t strides[] = {16, 1};
  vaswap_slot slot = nullptr;
  VASWAP_OK_(vaswap_slot_create_strided(0, 2, shape, strides, 4, &slot));
  slots_.push_back(slot);
  EXPECT_EQ(info_of(slot).bytes, (3u * 16u + 7u + 1u) * 4u);
  vaswap_slot contiguous = nullptr;
  VASWAP_OK_(vaswap_slot_create_strided(0, 2, shape, nullptr, 2, &contiguous));
  slots_.push_back(contiguous);
  EXPECT_EQ(info_of(contiguous).bytes, 4u * 8u * 2u);
}

TEST_F(Slots, DestroyReturnsPagesAndAddress) {
  const size_t before = free_bytes(0);
  vaswap_slot slot = make_slot(64 * kMiB);
  expect_free_change(before, free_bytes(0), -64 * int64_t{kMiB});
  forget(slot);
  VASWAP_OK_(vaswap_slot_destroy(slot));
  expect_free_change(before, free_bytes(0), 0);
  vaswap_slot_info info{};
  EXPECT_EQ(vaswap_slot_get_info(slot, &info), VASWAP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(vaswap_last_error()).find("not a live vaswap slot"), std::string::npos);
}

// ------------------------------------------------------------------------------------------------
// Offload and restore
// ------------------------------------------------------------------------------------------------

TEST_F(Slots, OffloadReturnsPagesToTheDriver) {
  vaswap_slot slot = make_slot(64 * kMiB);
  void* host = make_host(64 * kMiB);
  const uint64_t va = info_of(slot).va;
  fill(va, 11, 16 * kMiB, stream_);
  const size_t mapped_free = free_bytes(0);
  VASWAP_OK_(vaswap_offload_after(&slot, &host, 1, stream_));
  ASSERT_TRUE(wait_released(slot));
  expect_free_change(mapped_free, free_bytes(0), 64 * int64_t{kMiB});
  EXPECT_EQ(info_of(slot).mapped, 0);
  // The host copy holds the bytes the slot held.
  const auto* copy = static_cast<const uint32_t*>(host);
  size_t bad = 0;
  for (size_t i = 0; i < 16 * kMiB; ++i) bad += copy[i] != pattern(i, 11);
  EXPECT_EQ(bad, 0u);
}

TEST_F(Slots, AddressStableAcrossOffloadRemapAndDeferredCopy) {
  const uint32_t n = 8 * kMiB / 4;
  vaswap_slot slot = make_slot(8 * kMiB);
  void* host = make_host(8 * kMiB);
  const uint64_t va = info_of(slot).va;
  fill(va, 3, n, stream_);

  VASWAP_OK_(vaswap_offload_after(&slot, &host, 1, stream_));
  ASSERT_TRUE(wait_released(slot));
  EXPECT_EQ(info_of(slot).va, va);

  VASWAP_OK_(restore(&slot, &host, 1, stream_));
  EXPECT_EQ(info_of(slot).va, va);
  EXPECT_EQ(info_of(slot).mapped, 1);
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_EQ(mismatches(read_device(va, n), 3, 1, 0), 0u);

  VASWAP_OK_(vaswap_offload_after(&slot, &host, 1, stream_));
  vaswap_remap remap = nullptr;
  VASWAP_OK_(vaswap_remap_deferred_after(&slot, &host, 1, stream_, &remap));
  VASWAP_OK_(vaswap_remap_launch_h2d(remap, 0, stream_));
  VASWAP_OK_(vaswap_remap_wait_slot_on_stream(remap, 0, stream_));
  VASWAP_OK_(vaswap_remap_adopt(remap));
  VASWAP_OK_(vaswap_remap_destroy(remap));
  EXPECT_EQ(info_of(slot).va, va);
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_EQ(mismatches(read_device(va, n), 3, 1, 0), 0u);
}

// The planner's counters reach vaswap_get_stats. libvaswap.so's hooks see this test's graph
// launches: four of one graph are three identical periods and the start of a fourth
// (schedule.learning_steps), so one plan comes into force. The graph uses no slot of the
// preload's (vaswap_slot_create's slots are the caller's), so nothing is offloaded.
TEST_F(Slots, PlannerCountersReachTheStats) {
  const uint32_t n = 1024;
  vaswap_slot slot = make_slot(2 * kMiB);
  const uint64_t a = info_of(slot).va;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
  add(a, 1, n, stream_);
  CUDA_OK(cudaStreamEndCapture(stream_, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  vaswap_stats before{};
  VASWAP_OK_(vaswap_get_stats(&before));
  for (int i = 0; i < 4; ++i) CUDA_OK(cudaGraphLaunch(exec, stream_));
  CUDA_OK(cudaStreamSynchronize(stream_));
  vaswap_stats after{};
  VASWAP_OK_(vaswap_get_stats(&after));
  EXPECT_EQ(after.graph_launches_seen - before.graph_launches_seen, 4u);
  EXPECT_EQ(after.plans - before.plans, 1u);
  EXPECT_EQ(after.regions_offloaded, before.regions_offloaded);
  EXPECT_EQ(after.planned_offloads, before.planned_offloads);
  EXPECT_EQ(after.on_demand_restores, before.on_demand_restores);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// Two slots offloaded and restored together 100 times around a graph captured once against
// their addresses. The graph adds 1 to A and writes B = 3 * A on every replay.
TEST_F(Slots, GraphReplayAcrossHundredReleaseRemapCycles) {
  const uint32_t n = 4 * kMiB / 4;
  vaswap_slot slots[2] = {make_slot(4 * kMiB), make_slot(4 * kMiB)};
  void* hosts[2] = {make_host(4 * kMiB), make_host(4 * kMiB)};
  const uint64_t a = info_of(slots[0]).va;
  const uint64_t b = info_of(slots[1]).va;
  fill(a, 5, n, stream_);
  CUDA_OK(cudaStreamSynchronize(stream_));

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
  add(a, 1, n, stream_);
  scale(a, b, 3, n, stream_);
  CUDA_OK(cudaStreamEndCapture(stream_, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

  const auto violations = sim_function<unsigned long long (*)()>("vaswapSimHostFnViolations");
  const unsigned long long violations_before = violations != nullptr ? violations() : 0;
  vaswap_stats before{};
  VASWAP_OK_(vaswap_get_stats(&before));
  for (int cycle = 1; cycle <= 100; ++cycle) {
    CUDA_OK(cudaGraphLaunch(exec, stream_));
    // The caller's own D2H burst, then one release callback after it.
    for (int i = 0; i < 2; ++i) {
      CUDA_OK(cudaMemcpyAsync(hosts[i], reinterpret_cast<void*>(info_of(slots[i]).va), 4 * kMiB,
                              cudaMemcpyDeviceToHost, stream_));
    }
    VASWAP_OK_(vaswap_release_after(slots, 2, stream_));
    VASWAP_OK_(restore(slots, hosts, 2, stream_));
    ASSERT_EQ(info_of(slots[0]).va, a);
    ASSERT_EQ(info_of(slots[1]).va, b);
    if (cycle % 25 == 0) {
      CUDA_OK(cudaStreamSynchronize(stream_));
      ASSERT_EQ(mismatches(read_device(a, n), 5, 1, static_cast<uint32_t>(cycle)), 0u) << cycle;
      ASSERT_EQ(mismatches(read_device(b, n), 5, 3, static_cast<uint32_t>(cycle)), 0u) << cycle;
    }
  }
  CUDA_OK(cudaStreamSynchronize(stream_));
  vaswap_stats after{};
  VASWAP_OK_(vaswap_get_stats(&after));
  EXPECT_EQ(after.releases - before.releases, 200u);
  EXPECT_EQ(after.remaps - before.remaps, 200u);
  EXPECT_EQ(after.errors, before.errors);
  if (violations != nullptr) {
    EXPECT_EQ(violations(), violations_before);  // no CUDA call was made in a host callback
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// Invariant 5: while this thread captures in global mode, vaswap's workers release and remap a
// slot (VMM calls, which are capture-unsafe). They run in relaxed mode, so the capture survives.
TEST_F(Slots, WorkersDoNotBreakAGlobalCapture) {
  const uint32_t n = 2 * kMiB / 4;
  vaswap_slot slot = make_slot(2 * kMiB);
  void* host = make_host(2 * kMiB);
  const uint64_t va = info_of(slot).va;
  fill(va, 31, n, stream_);
  CUDA_OK(cudaStreamSynchronize(stream_));
  VASWAP_OK_(vaswap_workers_init(0));
  cudaStream_t side = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));

  CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
  add(va, 1, n, stream_);
  VASWAP_OK_(vaswap_offload_after(&slot, &host, 1, side));
  ASSERT_TRUE(wait_released(slot));
  vaswap_remap remap = nullptr;
  VASWAP_OK_(vaswap_remap_and_copy_after(&slot, &host, 1, side, &remap));
  VASWAP_OK_(vaswap_remap_wait_on_stream(remap, side));
  VASWAP_OK_(vaswap_remap_adopt(remap));
  cudaGraph_t graph = nullptr;
  CUDA_OK(cudaStreamEndCapture(stream_, &graph));  // not invalidated
  VASWAP_OK_(vaswap_remap_destroy(remap));

  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaStreamSynchronize(side));
  CUDA_OK(cudaGraphLaunch(exec, stream_));
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_EQ(mismatches(read_device(va, n), 31, 1, 1), 0u);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  CUDA_OK(cudaStreamDestroy(side));
}

TEST_F(Slots, DeferredRemapCopiesOnlyWhenLaunched) {
  const uint32_t n = 4 * kMiB / 4;
  vaswap_slot slot = make_slot(4 * kMiB);
  void* host = make_host(4 * kMiB);
  const uint64_t va = info_of(slot).va;
  fill(va, 9, n, stream_);
  VASWAP_OK_(vaswap_offload_after(&slot, &host, 1, stream_));

  vaswap_remap remap = nullptr;
  VASWAP_OK_(vaswap_remap_deferred_after(&slot, &host, 1, stream_, &remap));
  // Mapped, but no H2D: a try-wait finds nothing submitted, and what we write stays.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  auto remapped = [&] {
    const vaswap_slot_info info = info_of(slot);
    return info.mapped == 1 && info.release_pending == 0;  // the new pages, not the old ones
  };
  while (!remapped() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  ASSERT_TRUE(remapped());
  EXPECT_EQ(vaswap_remap_try_wait_on_stream(remap, stream_), VASWAP_ERROR_NOT_READY);
  fill(va, 1234, n, stream_);
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_EQ(mismatches(read_device(va, n), 1234, 1, 0), 0u);
  vaswap_stats stats{};
  VASWAP_OK_(vaswap_get_stats(&stats));
  const uint64_t restored_before = stats.bytes_restored;

  // The H2D goes on its own stream; the compute stream waits on the slot's event, then reads.
  cudaStream_t copy_stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
  VASWAP_OK_(vaswap_remap_launch_h2d(remap, 0, copy_stream));
  VASWAP_OK_(vaswap_remap_wait_slot_submitted(remap, 0));
  EXPECT_EQ(vaswap_remap_launch_h2d(remap, 0, copy_stream), VASWAP_ERROR_INVALID_STATE);
  VASWAP_OK_(vaswap_remap_wait_slot_on_stream(remap, 0, stream_));
  add(va, 100, n, stream_);
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_EQ(mismatches(read_device(va, n), 9, 1, 100), 0u);
  VASWAP_OK_(vaswap_remap_adopt(remap));
  VASWAP_OK_(vaswap_remap_destroy(remap));  // drains the copy's completion callback
  VASWAP_OK_(vaswap_get_stats(&stats));
  EXPECT_EQ(stats.bytes_restored - restored_before, 4 * kMiB);
  CUDA_OK(cudaStreamDestroy(copy_stream));
}

TEST_F(Slots, RemapOnlyMapsWithoutCopy) {
  vaswap_slot slot = make_slot(2 * kMiB);
  VASWAP_OK_(vaswap_slot_unmap_and_release(slot));
  const size_t released_free = free_bytes(0);
  vaswap_remap remap = nullptr;
  VASWAP_OK_(vaswap_remap_after(&slot, 1, stream_, &remap));
  VASWAP_OK_(vaswap_remap_wait_on_stream(remap, stream_));
  VASWAP_OK_(vaswap_remap_adopt(remap));
  VASWAP_OK_(vaswap_remap_destroy(remap));
  expect_free_change(released_free, free_bytes(0), -2 * int64_t{kMiB});
  const uint64_t va = info_of(slot).va;
  fill(va, 77, 2 * kMiB / 4, stream_);
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_EQ(mismatches(read_device(va, 2 * kMiB / 4), 77, 1, 0), 0u);
}

// Page reuse (vaswap_set_page_reuse): an offload keeps the handle, the next remap of that size maps
// it. The driver's free memory shows it: kept pages stay allocated, and the remaps that take them
// allocate nothing.
struct PageReuse {
  explicit PageReuse(uint64_t bytes) { EXPECT_EQ(vaswap_set_page_reuse(bytes), VASWAP_OK); }
  ~PageReuse() { EXPECT_EQ(vaswap_set_page_reuse(0), VASWAP_OK); }
  PageReuse(const PageReuse&) = delete;
  PageReuse& operator=(const PageReuse&) = delete;
};

TEST_F(Slots, KeptPagesServeTheNextRemapOfTheSameSize) {
  const uint32_t n = 32 * kMiB / 4;
  vaswap_slot slots[2] = {make_slot(32 * kMiB), make_slot(32 * kMiB)};
  void* hosts[2] = {make_host(32 * kMiB), make_host(32 * kMiB)};
  fill(info_of(slots[0]).va, 51, n, stream_);
  fill(info_of(slots[1]).va, 52, n, stream_);
  CUDA_OK(cudaStreamSynchronize(stream_));
  const size_t mapped_free = free_bytes(0);
  {
    PageReuse reuse(64 * kMiB);
    VASWAP_OK_(vaswap_offload_after(slots, hosts, 2, stream_));
    ASSERT_TRUE(wait_released(slots[0]));
    ASSERT_TRUE(wait_released(slots[1]));
    EXPECT_EQ(info_of(slots[0]).mapped, 0);
    // Kept, not given back: released, the 64 MiB would show in the driver's free memory.
    expect_free_change(mapped_free, free_bytes(0), 0, 64 * kMiB);
    // Restored in the other order: each takes a kept handle of its size; none is created.
    VASWAP_OK_(restore(&slots[1], &hosts[1], 1, stream_));
    VASWAP_OK_(restore(&slots[0], &hosts[0], 1, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    expect_free_change(mapped_free, free_bytes(0), 0, 64 * kMiB);
    EXPECT_EQ(mismatches(read_device(info_of(slots[0]).va, n), 51, 1, 0), 0u);
    EXPECT_EQ(mismatches(read_device(info_of(slots[1]).va, n), 52, 1, 0), 0u);
    // Over the limit the rest goes back: 32 MiB kept of a 64 MiB offload with a 32 MiB limit.
    VASWAP_OK_(vaswap_set_page_reuse(32 * kMiB));
    VASWAP_OK_(vaswap_offload_after(slots, hosts, 2, stream_));
    ASSERT_TRUE(wait_released(slots[0]));
    ASSERT_TRUE(wait_released(slots[1]));
    expect_free_change(mapped_free, free_bytes(0), 32 * int64_t{kMiB}, 64 * kMiB);
  }
  // The limit back at 0 releases what was kept.
  expect_free_change(mapped_free, free_bytes(0), 64 * int64_t{kMiB});
  VASWAP_OK_(restore(slots, hosts, 2, stream_));
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_EQ(mismatches(read_device(info_of(slots[0]).va, n), 51, 1, 0), 0u);
  EXPECT_EQ(mismatches(read_device(info_of(slots[1]).va, n), 52, 1, 0), 0u);
}

TEST_F(Slots, KeptPagesOfAnotherSizeAreNotReusedAndAreNotKeptByDestroy) {
  vaswap_slot big = make_slot(8 * kMiB);
  vaswap_slot small = make_slot(4 * kMiB);
  void* host = make_host(8 * kMiB);
  PageReuse reuse(64 * kMiB);
  VASWAP_OK_(vaswap_offload_after(&big, &host, 1, stream_));
  ASSERT_TRUE(wait_released(big));
  const size_t kept_free = free_bytes(0);
  // A 4 MiB slot cannot take the 8 MiB handle: its remap creates one.
  VASWAP_OK_(vaswap_slot_unmap_and_release(small));
  const size_t small_kept_free = free_bytes(0);
  expect_free_change(kept_free, small_kept_free, 0);  // kept too
  VASWAP_OK_(vaswap_slot_create_and_remap(small));
  expect_free_change(small_kept_free, free_bytes(0), 0);  // took its own kept 4 MiB back
  // A destroyed slot's pages go back to the driver even while reuse is on.
  forget(small);
  VASWAP_OK_(vaswap_slot_destroy(small));
  expect_free_change(small_kept_free, free_bytes(0), 4 * int64_t{kMiB});
}

TEST_F(Slots, KeptPagesGiveWayWhenTheDeviceIsFull) {
  const auto inject =
      sim_function<int (*)(const char*, unsigned long long, int)>("vaswapSimInjectFault");
  if (inject == nullptr) GTEST_SKIP() << "needs the simulator's fault injection";
  const uint32_t n = 4 * kMiB / 4;
  vaswap_slot kept = make_slot(8 * kMiB);
  vaswap_slot other = make_slot(4 * kMiB);
  void* hosts[2] = {make_host(8 * kMiB), make_host(4 * kMiB)};
  fill(info_of(other).va, 61, n, stream_);
  PageReuse reuse(8 * kMiB);  // room for the 8 MiB handle only
  VASWAP_OK_(vaswap_offload_after(&kept, &hosts[0], 1, stream_));
  ASSERT_TRUE(wait_released(kept));
  VASWAP_OK_(vaswap_offload_after(&other, &hosts[1], 1, stream_));
  ASSERT_TRUE(wait_released(other));
  const size_t before = free_bytes(0);
  // The 4 MiB restore needs a new handle and the device says it is full: the kept 8 MiB go back
  // and the creation is tried again.
  ASSERT_EQ(inject("cuMemCreate", 1, 2 /* CUDA_ERROR_OUT_OF_MEMORY */), 0);
  VASWAP_OK_(restore(&other, &hosts[1], 1, stream_));
  CUDA_OK(cudaStreamSynchronize(stream_));
  expect_free_change(before, free_bytes(0), 4 * int64_t{kMiB});  // +8 released, -4 mapped
  EXPECT_EQ(mismatches(read_device(info_of(other).va, n), 61, 1, 0), 0u);
}

TEST_F(Slots, AdoptedPagesSurviveRemapDestroy) {
  vaswap_slot slots[2] = {make_slot(2 * kMiB), make_slot(2 * kMiB)};
  for (vaswap_slot slot : slots) VASWAP_OK_(vaswap_slot_unmap_and_release(slot));
  vaswap_remap adopted = nullptr, discarded = nullptr;
  VASWAP_OK_(vaswap_remap_after(&slots[0], 1, stream_, &adopted));
  VASWAP_OK_(vaswap_remap_after(&slots[1], 1, stream_, &discarded));
  VASWAP_OK_(vaswap_remap_adopt(adopted));
  VASWAP_OK_(vaswap_remap_wait_slot_submitted(discarded, 0));
  EXPECT_EQ(info_of(slots[1]).mapped, 1);
  const size_t mapped_free = free_bytes(0);
  VASWAP_OK_(vaswap_remap_destroy(adopted));
  VASWAP_OK_(vaswap_remap_destroy(discarded));
  EXPECT_EQ(info_of(slots[0]).mapped, 1);
  EXPECT_EQ(info_of(slots[1]).mapped, 0);
  EXPECT_EQ(info_of(slots[1]).remap_pending, 0);
  expect_free_change(mapped_free, free_bytes(0), 2 * int64_t{kMiB});
}

TEST_F(Slots, SynchronousFallbacksKeepTheAddress) {
  vaswap_slot slot = make_slot(4 * kMiB);
  const uint64_t va = info_of(slot).va;
  const size_t mapped_free = free_bytes(0);
  VASWAP_OK_(vaswap_slot_unmap_and_release(slot));
  expect_free_change(mapped_free, free_bytes(0), 4 * int64_t{kMiB});
  EXPECT_EQ(vaswap_slot_unmap_and_release(slot), VASWAP_ERROR_INVALID_STATE);
  VASWAP_OK_(vaswap_slot_create_and_remap(slot));
  EXPECT_EQ(free_bytes(0), mapped_free);
  EXPECT_EQ(info_of(slot).va, va);
  EXPECT_EQ(vaswap_slot_create_and_remap(slot), VASWAP_ERROR_INVALID_STATE);
}

// ------------------------------------------------------------------------------------------------
// A touch of a released slot faults (the address is reserved, nothing is mapped)
// ------------------------------------------------------------------------------------------------

constexpr int kIllegalAddressExit = 3;

void touch_released_slot() {
  vaswap_slot slot = nullptr;
  if (vaswap_slot_create(0, 2 * kMiB, &slot) != VASWAP_OK) std::exit(10);
  if (vaswap_slot_unmap_and_release(slot) != VASWAP_OK) std::exit(11);
  vaswap_slot_info info{};
  vaswap_slot_get_info(slot, &info);
  fill(info.va, 1, 16, nullptr);
  const cudaError_t rc = cudaDeviceSynchronize();
  std::exit(rc == cudaErrorIllegalAddress ? kIllegalAddressExit : 12);
}

#if defined(__CUDACC__)
bool faulted(int status) { return ::testing::ExitedWithCode(kIllegalAddressExit)(status); }
constexpr const char* kFaultMessage = "";
#elif defined(__SANITIZE_ADDRESS__)
// AddressSanitizer catches the simulator's SIGSEGV, reports it (as a SEGV, or as a stack overflow
// when the address lies next to a thread's stack) and exits with status 1.
bool faulted(int status) { return ::testing::ExitedWithCode(1)(status); }
constexpr const char* kFaultMessage = "AddressSanitizer: (SEGV|stack-overflow) on address";
#else
bool faulted(int status) { return ::testing::KilledBySignal(SIGSEGV)(status); }
constexpr const char* kFaultMessage = "";
#endif

TEST(SlotsDeathTest, TouchAfterReleaseFaults) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device";
  EXPECT_EXIT(touch_released_slot(), faulted, kFaultMessage);
}

// ------------------------------------------------------------------------------------------------
// Every submission check rejects bad input with its own status and message
// ------------------------------------------------------------------------------------------------

class Rejects : public Slots {
 protected:
  void expect(vaswap_status got, vaswap_status want, const char* message) {
    EXPECT_EQ(got, want) << vaswap_status_name(got) << ": " << vaswap_last_error();
    EXPECT_NE(std::string(vaswap_last_error()).find(message), std::string::npos)
        << "message: " << vaswap_last_error();
  }
};

TEST_F(Rejects, EmptyBatch) {
  vaswap_slot slot = make_slot(2 * kMiB);
  expect(vaswap_release_after(&slot, 0, stream_), VASWAP_ERROR_INVALID_ARGUMENT, "batch is empty");
}

TEST_F(Rejects, DuplicateSlot) {
  vaswap_slot slot = make_slot(2 * kMiB);
  VASWAP_OK_(vaswap_slot_unmap_and_release(slot));
  vaswap_slot twice[2] = {slot, slot};
  vaswap_remap remap = nullptr;
  expect(vaswap_remap_after(twice, 2, stream_, &remap), VASWAP_ERROR_INVALID_ARGUMENT,
         "appears twice in the batch (slots[0] and slots[1])");
  EXPECT_EQ(remap, nullptr);
}

TEST_F(Rejects, DestroyedSlot) {
  vaswap_slot slot = make_slot(2 * kMiB);
  forget(slot);
  VASWAP_OK_(vaswap_slot_destroy(slot));
  expect(vaswap_release_after(&slot, 1, stream_), VASWAP_ERROR_INVALID_ARGUMENT,
         "is not a live vaswap slot");
}

TEST_F(Rejects, RemapAlreadyInFlight) {
  vaswap_slot slot = make_slot(2 * kMiB);
  VASWAP_OK_(vaswap_slot_unmap_and_release(slot));
  vaswap_remap first = nullptr, second = nullptr;
  VASWAP_OK_(vaswap_remap_after(&slot, 1, stream_, &first));
  expect(vaswap_remap_after(&slot, 1, stream_, &second), VASWAP_ERROR_INVALID_STATE,
         "already has a remap in flight");
  VASWAP_OK_(vaswap_remap_adopt(first));
  VASWAP_OK_(vaswap_remap_destroy(first));
}

TEST_F(Rejects, MappedSlotWithoutPendingRelease) {
  vaswap_slot slot = make_slot(2 * kMiB);
  void* host = make_host(2 * kMiB);
  vaswap_remap remap = nullptr;
  expect(vaswap_remap_and_copy_after(&slot, &host, 1, stream_, &remap), VASWAP_ERROR_INVALID_STATE,
         "still mapped and has no release pending");
  // With the release queued first, the same remap is accepted and runs after it.
  VASWAP_OK_(vaswap_offload_after(&slot, &host, 1, stream_));
  VASWAP_OK_(vaswap_remap_and_copy_after(&slot, &host, 1, stream_, &remap));
  VASWAP_OK_(vaswap_remap_adopt(remap));
  VASWAP_OK_(vaswap_remap_destroy(remap));
  EXPECT_EQ(info_of(slot).mapped, 1);
}

TEST_F(Rejects, PageableHostBuffer) {
  vaswap_slot slot = make_slot(2 * kMiB);
  std::vector<char> pageable(2 * kMiB);
  void* host = pageable.data();
  expect(vaswap_offload_after(&slot, &host, 1, stream_), VASWAP_ERROR_HOST_BUFFER,
         "is not pinned host memory");
  EXPECT_EQ(info_of(slot).release_pending, 0);  // nothing was queued
  EXPECT_EQ(info_of(slot).mapped, 1);
}

TEST_F(Rejects, HostBufferNotAtOffsetZero) {
  vaswap_slot slot = make_slot(2 * kMiB);
  void* host = static_cast<char*>(make_host(4 * kMiB)) + 4096;
  VASWAP_OK_(vaswap_slot_unmap_and_release(slot));
  vaswap_remap remap = nullptr;
  expect(vaswap_remap_and_copy_after(&slot, &host, 1, stream_, &remap), VASWAP_ERROR_HOST_BUFFER,
         "lies 4096 bytes into its pinned allocation");
  EXPECT_EQ(info_of(slot).remap_pending, 0);
}

TEST_F(Rejects, HostBufferTooSmall) {
  vaswap_slot slot = make_slot(8 * kMiB);
  void* host = make_host(2 * kMiB);
  VASWAP_OK_(vaswap_slot_unmap_and_release(slot));
  vaswap_remap remap = nullptr;
  expect(vaswap_remap_deferred_after(&slot, &host, 1, stream_, &remap), VASWAP_ERROR_HOST_BUFFER,
         "holds 2 MiB but slot");
}

TEST_F(Rejects, NullHostBuffer) {
  vaswap_slot slot = make_slot(2 * kMiB);
  void* host = nullptr;
  expect(vaswap_offload_after(&slot, &host, 1, stream_), VASWAP_ERROR_HOST_BUFFER, "is NULL");
}

// Holds a stream at a host function until open() (which a test must call before it ends).
class Gate {
 public:
  void close_on(cudaStream_t stream) {
    ASSERT_EQ(cudaLaunchHostFunc(stream, &Gate::wait, this), cudaSuccess);
  }
  void open() { open_.store(true); }

 private:
  static void CUDART_CB wait(void* self) {
    while (!static_cast<Gate*>(self)->open_.load()) std::this_thread::yield();
  }
  std::atomic<bool> open_{false};
};

TEST_F(Rejects, ReleaseOfReleasedSlot) {
  vaswap_slot slot = make_slot(2 * kMiB);
  Gate gate;
  gate.close_on(stream_);  // the release stays pending until the gate opens
  VASWAP_OK_(vaswap_release_after(&slot, 1, stream_));
  expect(vaswap_release_after(&slot, 1, stream_), VASWAP_ERROR_INVALID_STATE,
         "already has a release pending");
  gate.open();
  ASSERT_TRUE(wait_released(slot));
  expect(vaswap_release_after(&slot, 1, stream_), VASWAP_ERROR_INVALID_STATE, "is not mapped");
}

TEST_F(Rejects, CapturingStream) {
  vaswap_slot slot = make_slot(2 * kMiB);
  CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  expect(vaswap_release_after(&slot, 1, stream_), VASWAP_ERROR_CAPTURING, "is capturing a graph");
  cudaGraph_t graph = nullptr;
  CUDA_OK(cudaStreamEndCapture(stream_, &graph));
  EXPECT_EQ(info_of(slot).release_pending, 0);
  cudaGraphDestroy(graph);
}

// Destroying a slot, or a remap whose pages nobody adopted, synchronizes the device, which would
// invalidate a capture open on any thread (measured on the H200): both are refused while one is
// open, nothing is lost, and both succeed once it has ended. The capture goes through vaswap's
// hooks (this program links the library that exports them).
TEST_F(Rejects, DestroyWhileACaptureIsOpen) {
  vaswap_slot slot = make_slot(2 * kMiB), remapped = make_slot(2 * kMiB);
  VASWAP_OK_(vaswap_slot_unmap_and_release(remapped));
  vaswap_remap remap = nullptr;
  VASWAP_OK_(vaswap_remap_after(&remapped, 1, stream_, &remap));
  VASWAP_OK_(vaswap_remap_wait_slot_submitted(remap, 0));
  cudaStream_t capturing = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&capturing, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeThreadLocal));
  fill(info_of(slot).va, 5, 16, capturing);
  expect(vaswap_remap_destroy(remap), VASWAP_ERROR_INVALID_STATE, "after the capture ends");
  EXPECT_EQ(info_of(remapped).mapped, 1);
  expect(vaswap_slot_destroy(slot), VASWAP_ERROR_INVALID_STATE, "after the capture ends");
  EXPECT_EQ(info_of(slot).mapped, 1);
  cudaGraph_t graph = nullptr;
  CUDA_OK(cudaStreamEndCapture(capturing, &graph));  // not invalidated
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaGraphLaunch(exec, capturing));
  CUDA_OK(cudaStreamSynchronize(capturing));
  EXPECT_EQ(mismatches(read_device(info_of(slot).va, 16), 5, 1, 0), 0u);
  VASWAP_OK_(vaswap_remap_destroy(remap));
  EXPECT_EQ(info_of(remapped).mapped, 0);
  VASWAP_OK_(vaswap_slot_destroy(slot));
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(capturing));
}

TEST_F(Rejects, UnknownDevice) {
  vaswap_slot slot = nullptr;
  expect(vaswap_slot_create(device_count(), 2 * kMiB, &slot), VASWAP_ERROR_INVALID_ARGUMENT,
         "does not exist");
  expect(vaswap_slot_create(0, 0, &slot), VASWAP_ERROR_INVALID_ARGUMENT, "bytes must be > 0");
}

// ------------------------------------------------------------------------------------------------
// Two devices: resources on the slot's device; a mixed batch is rejected
// ------------------------------------------------------------------------------------------------

class TwoDevices : public Rejects {
 protected:
  void SetUp() override {
    if (device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
    Rejects::SetUp();
    CUDA_OK(cudaSetDevice(1));
    CUDA_OK(cudaStreamCreateWithFlags(&stream1_, cudaStreamNonBlocking));
    CUDA_OK(cudaSetDevice(0));
  }
  void TearDown() override {
    if (stream1_ != nullptr) cudaStreamDestroy(stream1_);
    Rejects::TearDown();
  }
  cudaStream_t stream1_ = nullptr;
};

TEST_F(TwoDevices, MixedBatchRejected) {
  vaswap_slot slots[2] = {make_slot(2 * kMiB, 0), make_slot(2 * kMiB, 1)};
  expect(vaswap_release_after(slots, 2, stream_), VASWAP_ERROR_DEVICE_MISMATCH,
         "the batch mixes devices");
  EXPECT_EQ(info_of(slots[0]).release_pending, 0);
}

TEST_F(TwoDevices, StreamOfAnotherDeviceRejected) {
  vaswap_slot slot = make_slot(2 * kMiB, 1);
  expect(vaswap_release_after(&slot, 1, stream_), VASWAP_ERROR_DEVICE_MISMATCH,
         "pass a stream of device 1");
}

// The current device stays 0 throughout: every event vaswap records must be made on device 1 (an
// event recorded on another device's stream fails, on the simulator as on a GPU).
TEST_F(TwoDevices, SlotOnSecondDeviceRoundTrips) {
  const uint32_t n = 4 * kMiB / 4;
  vaswap_slot slot = make_slot(4 * kMiB, 1);
  void* host = make_host(4 * kMiB);
  const vaswap_slot_info info = info_of(slot);
  EXPECT_EQ(info.device, 1);
  vaswap_stats before{};
  VASWAP_OK_(vaswap_get_stats(&before));
  const uint64_t errors_before = before.errors;
  const size_t free1 = free_bytes(1);
  const size_t free0 = free_bytes(0);
  CUDA_OK(cudaSetDevice(1));
  fill(info.va, 21, n, stream1_);
  CUDA_OK(cudaSetDevice(0));
  VASWAP_OK_(vaswap_offload_after(&slot, &host, 1, stream1_));
  ASSERT_TRUE(wait_released(slot));
  expect_free_change(free1, free_bytes(1), 4 * int64_t{kMiB});
  EXPECT_EQ(free_bytes(0), free0);
  vaswap_remap remap = nullptr;
  VASWAP_OK_(vaswap_remap_and_copy_after(&slot, &host, 1, stream1_, &remap));
  expect(vaswap_remap_wait_on_stream(remap, stream_), VASWAP_ERROR_DEVICE_MISMATCH,
         "belongs to device 0");
  VASWAP_OK_(vaswap_remap_wait_on_stream(remap, stream1_));
  VASWAP_OK_(vaswap_remap_adopt(remap));
  VASWAP_OK_(vaswap_remap_destroy(remap));
  CUDA_OK(cudaStreamSynchronize(stream1_));
  int current = -1;
  CUDA_OK(cudaGetDevice(&current));
  EXPECT_EQ(current, 0);
  CUDA_OK(cudaSetDevice(1));
  EXPECT_EQ(mismatches(read_device(info.va, n), 21, 1, 0), 0u);
  CUDA_OK(cudaSetDevice(0));
  vaswap_stats after{};
  VASWAP_OK_(vaswap_get_stats(&after));
  EXPECT_EQ(after.errors, errors_before);
}

// ------------------------------------------------------------------------------------------------
// Failures lose nothing (simulator: needs fault injection)
// ------------------------------------------------------------------------------------------------

TEST_F(Slots, FailedRemapKeepsTheHostCopyAndCanBeRetried) {
  const auto inject =
      sim_function<int (*)(const char*, unsigned long long, int)>("vaswapSimInjectFault");
  if (inject == nullptr) GTEST_SKIP() << "needs the simulator's fault injection";
  const uint32_t n = 2 * kMiB / 4;
  vaswap_slot slot = make_slot(2 * kMiB);
  void* host = make_host(2 * kMiB);
  const uint64_t va = info_of(slot).va;
  fill(va, 42, n, stream_);
  VASWAP_OK_(vaswap_offload_after(&slot, &host, 1, stream_));
  ASSERT_TRUE(wait_released(slot));
  ASSERT_EQ(inject("cuMemCreate", 1, 2 /* CUDA_ERROR_OUT_OF_MEMORY */), 0);
  vaswap_remap remap = nullptr;
  VASWAP_OK_(vaswap_remap_and_copy_after(&slot, &host, 1, stream_, &remap));
  EXPECT_EQ(vaswap_remap_adopt(remap), VASWAP_ERROR_CUDA);
  const std::string message = vaswap_last_error();
  EXPECT_NE(message.find("cuMemCreate failed with CUDA_ERROR_OUT_OF_MEMORY"), std::string::npos)
      << message;
  EXPECT_NE(message.find("slot " + std::to_string(info_of(slot).id)), std::string::npos) << message;
  EXPECT_NE(message.find("the host copy is untouched"), std::string::npos) << message;
  VASWAP_OK_(vaswap_remap_destroy(remap));
  EXPECT_EQ(info_of(slot).mapped, 0);
  VASWAP_OK_(restore(&slot, &host, 1, stream_));
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_EQ(info_of(slot).va, va);
  EXPECT_EQ(mismatches(read_device(va, n), 42, 1, 0), 0u);
}

TEST_F(Slots, FailedReleaseKeepsPagesAndIsReported) {
  const auto inject =
      sim_function<int (*)(const char*, unsigned long long, int)>("vaswapSimInjectFault");
  if (inject == nullptr) GTEST_SKIP() << "needs the simulator's fault injection";
  const uint32_t n = 2 * kMiB / 4;
  vaswap_slot slot = make_slot(2 * kMiB);
  const uint64_t va = info_of(slot).va;
  fill(va, 8, n, stream_);
  CUDA_OK(cudaStreamSynchronize(stream_));
  ASSERT_EQ(inject("cuMemUnmap", 1, 1 /* CUDA_ERROR_INVALID_VALUE */), 0);
  VASWAP_OK_(vaswap_release_after(&slot, 1, stream_));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (info_of(slot).release_pending == 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  EXPECT_EQ(info_of(slot).mapped, 1);
  EXPECT_EQ(mismatches(read_device(va, n), 8, 1, 0), 0u);
  // The next call on the slot reports the worker's failure once.
  EXPECT_EQ(vaswap_release_after(&slot, 1, stream_), VASWAP_ERROR_CUDA);
  EXPECT_NE(std::string(vaswap_last_error()).find("cuMemUnmap failed"), std::string::npos)
      << vaswap_last_error();
  VASWAP_OK_(vaswap_release_after(&slot, 1, stream_));
  EXPECT_TRUE(wait_released(slot));
}

// ------------------------------------------------------------------------------------------------
// Host pool, serial switch, trace
// ------------------------------------------------------------------------------------------------

TEST_F(Slots, HostPoolReusesFreedBuffers) {
  // 37 MiB rounds to a 38 MiB class that no other test uses, so the pool holds none yet.
  void* first = nullptr;
  VASWAP_OK_(vaswap_host_alloc(37 * kMiB, &first));
  vaswap_stats before{};
  VASWAP_OK_(vaswap_get_stats(&before));
  VASWAP_OK_(vaswap_host_free(first));
  void* second = nullptr;
  VASWAP_OK_(vaswap_host_alloc(38 * kMiB, &second));  // the same class
  EXPECT_EQ(second, first);
  vaswap_stats after{};
  VASWAP_OK_(vaswap_get_stats(&after));
  EXPECT_EQ(after.host_bytes_pinned, before.host_bytes_pinned);  // nothing newly pinned
  EXPECT_EQ(after.host_bytes_in_use, before.host_bytes_in_use);
  VASWAP_OK_(vaswap_host_free(second));
  EXPECT_EQ(vaswap_host_free(second), VASWAP_ERROR_INVALID_ARGUMENT);
}

TEST_F(Slots, ParallelDriverCallsWhenSerialIsOff) {
  VASWAP_OK_(vaswap_set_serial_driver_calls(0));
  const uint32_t n = 2 * kMiB / 4;
  vaswap_slot slots[4] = {make_slot(2 * kMiB), make_slot(2 * kMiB), make_slot(2 * kMiB),
                          make_slot(2 * kMiB)};
  void* hosts[4] = {make_host(2 * kMiB), make_host(2 * kMiB), make_host(2 * kMiB),
                    make_host(2 * kMiB)};
  for (int i = 0; i < 4; ++i) fill(info_of(slots[i]).va, 100 + i, n, stream_);
  std::vector<std::thread> threads;
  std::vector<vaswap_status> results(4, VASWAP_ERROR_INVALID_STATE);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      vaswap_status s = vaswap_offload_after(&slots[i], &hosts[i], 1, stream_);
      if (s == VASWAP_OK) s = restore(&slots[i], &hosts[i], 1, stream_);
      results[static_cast<size_t>(i)] = s;
    });
  }
  for (std::thread& t : threads) t.join();
  VASWAP_OK_(vaswap_set_serial_driver_calls(1));
  CUDA_OK(cudaStreamSynchronize(stream_));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(results[static_cast<size_t>(i)], VASWAP_OK) << i;
    EXPECT_EQ(mismatches(read_device(info_of(slots[i]).va, n), 100 + i, 1, 0), 0u) << i;
  }
}

// Lines of `text` that contain every one of `parts`.
size_t count_lines_with(const std::string& text, std::initializer_list<std::string> parts) {
  size_t count = 0, at = 0;
  while (at < text.size()) {
    const size_t end = std::min(text.find('\n', at), text.size());
    const std::string line = text.substr(at, end - at);
    bool all = true;
    for (const std::string& part : parts) all = all && line.find(part) != std::string::npos;
    count += all ? 1 : 0;
    at = end + 1;
  }
  return count;
}

TEST_F(Slots, TraceRecordsEveryTransitionWithBytes) {
  const std::string path = ::testing::TempDir() + "vaswap_trace_%p.jsonl";
  VASWAP_OK_(vaswap_trace_open(path.c_str()));
  vaswap_slot slot = make_slot(6 * kMiB);
  void* host = make_host(6 * kMiB);
  const vaswap_slot_info info = info_of(slot);
  VASWAP_OK_(vaswap_offload_after(&slot, &host, 1, stream_));
  vaswap_remap remap = nullptr;
  VASWAP_OK_(vaswap_remap_and_copy_after(&slot, &host, 1, stream_, &remap));
  VASWAP_OK_(vaswap_remap_adopt(remap));
  VASWAP_OK_(vaswap_remap_destroy(remap));
  VASWAP_OK_(vaswap_trace_close());
  std::string file = path;
  file.replace(file.find("%p"), 2, std::to_string(getpid()));
  std::ifstream in(file);
  ASSERT_TRUE(in.good()) << file;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string id = "\"slot\":" + std::to_string(info.id) + ",";
  const std::string bytes = "\"bytes\":" + std::to_string(6 * kMiB);
  EXPECT_EQ(count_lines_with(text, {"\"ev\":\"trace_begin\"", "\"version\":1"}), 1u);
  EXPECT_EQ(count_lines_with(text, {"\"ev\":\"slot_create\"", id}), 1u);
  EXPECT_EQ(count_lines_with(text, {"\"ev\":\"release_queued\"", "\"d2h_bytes\":6291456"}), 1u);
  EXPECT_EQ(count_lines_with(text, {"\"ev\":\"d2h\"", id, bytes}), 1u);
  EXPECT_EQ(count_lines_with(text, {"\"ev\":\"release\"", id}), 1u);
  EXPECT_EQ(count_lines_with(text, {"\"ev\":\"remap_queued\"", "\"kind\":\"copy\""}), 1u);
  EXPECT_EQ(count_lines_with(text, {"\"ev\":\"remap\"", id}), 1u);
  EXPECT_EQ(count_lines_with(text, {"\"ev\":\"h2d\"", id, bytes}), 1u);
  EXPECT_EQ(count_lines_with(text, {"\"ev\":\"adopt\"", id}), 1u);
  EXPECT_EQ(count_lines_with(text, {"\"ev\":\"trace_end\""}), 1u);
  std::remove(file.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // Death tests re-execute the binary: a forked child would inherit a CUDA context and threads.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  return RUN_ALL_TESTS();
}
