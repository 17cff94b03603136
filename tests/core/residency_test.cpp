// Residency (core/plan/residency.h) on the simulator: lazy backing, the budget, which slot is
// evicted, the program's own out-of-memory, launches that cannot fit, the host-pool limit, the
// device and host handshakes, and the watchdog. Each test drives residency as the preload's hooks
// do: acquire() before the work, used() after it, and checks real state: what the slots hold (every
// word), whether their pages are mapped, and what the simulated device has physically.
#include <cuda.h>
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "../sim/tests/sim_test.h"
#include "base/capture_gate.h"
#include "base/driver.h"
#include "base/errors.h"
#include "base/trace.h"
#include "plan/copy_test.h"
#include "plan/inside.h"
#include "plan/residency.h"
#include "slots/engine.h"
#include "transform/copy_graph.h"

namespace vaswap {
namespace {

constexpr size_t kPage = 2u << 20;  // one VMM granule: each test slot is one page

// The simulated device keeps one page of its free memory back from every allocation while this
// lives (vaswapSimSetHoldback), as an H100 kept about 2.2 MiB
// (bench/results/create_room_session54_h100.txt).
struct HoldBack {
  HoldBack() { vaswapSimSetHoldback(kPage); }
  ~HoldBack() { vaswapSimSetHoldback(0); }
  HoldBack(const HoldBack&) = delete;
  HoldBack& operator=(const HoldBack&) = delete;
};
constexpr uint32_t kWords = kPage / sizeof(uint32_t);

class ResidencyTest : public SimTest {
 protected:
  void SetUp() override {
    SimTest::SetUp();
    // The test kernels, loaded before any stream parks: a load waits for parked streams (as on the
    // H200), and nothing here settles before it as the preload's hooks do.
    ASSERT_NE(sim_kernels::get("add_u32"), nullptr);
    configure(4 * kPage);
    ASSERT_CU(cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING));
  }
  void TearDown() override {
    for (Slot* slot : slots_) {
      residency::forget(slot);
      engine().destroy_slot(slot);
    }
    cuStreamDestroy(stream_);
    for (auto& [device, stream] : device_streams_) cuStreamDestroy(stream);
    SimTest::TearDown();
  }
  static void configure(uint64_t budget, uint64_t host_limit = 0,
                        residency::Handshake handshake = residency::Handshake::host,
                        uint64_t reserve = 0) {
    residency::Settings s;
    s.budget_bytes = budget;
    s.reserve_bytes = reserve;
    s.host_limit_bytes = host_limit;
    s.handshake = handshake;
    s.wait_limit_ns = 5000000000;
    residency::configure(s);
  }
  // For the tests that end in a named error: a budget of one page and a wait limit of 0.3 s.
  static void configure_briefly(residency::Handshake handshake) {
    residency::Settings s;
    s.budget_bytes = 1 * kPage;
    s.handshake = handshake;
    s.wait_limit_ns = 300000000;  // 0.3 s
    residency::configure(s);
  }
  // A slot as the preload makes one during a capture: its address, no pages.
  Slot* make_slot(int device = 0) {
    Slot* slot = engine().create_slot(device, kPage, /*intercepted=*/true, /*backed=*/false);
    residency::adopt(slot, false);
    slots_.push_back(slot);
    return slot;
  }
  bool mapped(Slot* slot) { return engine().info(slot).mapped == 1; }
  // Work on the stream that uses `slots`, as the hooks do: acquire, enqueue, used. Copies and
  // memsets (the default) need their pages mapped when they are enqueued.
  CUresult use(const std::vector<Slot*>& slots, const std::function<void()>& work,
               std::string* message = nullptr,
               residency::Checked checked = residency::Checked::when_enqueued) {
    residency::Acquired acquired;
    std::string why;
    const CUresult rc =
        residency::acquire(slots, stream_, "a test launch", &acquired, &why, checked);
    if (message != nullptr) *message = why;
    if (rc != CUDA_SUCCESS) return rc;
    work();
    residency::used(acquired);
    return CUDA_SUCCESS;
  }
  // Fills a slot with a pattern of its own, on the stream.
  void fill(Slot* slot, uint32_t seed) {
    ASSERT_EQ(CUDA_SUCCESS,
              use({slot}, [&] { ASSERT_CU(cuMemsetD32Async(slot->va, seed, kWords, stream_)); }));
  }
  // Reads a slot back (after making it resident) and checks every word.
  void expect_holds(Slot* slot, uint32_t seed) {
    std::vector<uint32_t> host(kWords, 0);
    ASSERT_EQ(CUDA_SUCCESS, use({slot}, [&] {
                ASSERT_CU(cuMemcpyDtoHAsync(host.data(), slot->va, kPage, stream_));
              }));
    ASSERT_CU(cuStreamSynchronize(stream_));
    const auto wrong =
        std::count_if(host.begin(), host.end(), [seed](uint32_t w) { return w != seed; });
    EXPECT_EQ(wrong, 0) << "slot " << slot->id << " lost " << wrong << " words of " << kWords;
  }
  // A capture's copy whose slot the device never gives pages (the tests below, per handshake;
  // `evicted`: the slot holds data, away in host memory, rather than never having had pages).
  void refuses_a_captures_copy_whose_pages_never_come(bool evicted);
  // A trace for this test alone, open from now; read_reuse() closes it and reads it back.
  std::string open_trace(const char* name) {
    std::string path =
        ::testing::TempDir() + "/residency_" + name + "_" + std::to_string(::getpid()) + ".jsonl";
    std::remove(path.c_str());
    std::string error;
    EXPECT_TRUE(trace::open(path, &error)) << error;
    return path;
  }
  // What the trace says of page reuse: maps (`remap`) and those that took a kept handle; releases
  // and those that kept theirs, and the first release's line.
  struct Reuse {
    int remaps = 0, reused = 0, releases = 0, kept = 0;
    std::string first_release;
  };
  static Reuse read_reuse(const std::string& path) {
    trace::close();
    Reuse r;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      const bool kept = line.find("\"kept\":true") != std::string::npos;
      if (line.find("\"ev\":\"remap\"") != std::string::npos) {
        ++r.remaps;
        r.reused += line.find("\"reused\":true") != std::string::npos ? 1 : 0;
      } else if (line.find("\"ev\":\"release\"") != std::string::npos) {
        if (r.releases++ == 0) r.first_release = line;
        r.kept += kept ? 1 : 0;
      }
    }
    std::remove(path.c_str());
    return r;
  }
  // Waits until the slots' pages are as given (the unmapper works on its own thread).
  void wait_mapped(const std::vector<Slot*>& slots, bool want) {
    for (int i = 0; i < 2000; ++i) {
      bool all = true;
      for (Slot* slot : slots) all = all && mapped(slot) == want;
      if (all) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ADD_FAILURE() << "slots did not reach mapped=" << want;
  }

  // Two slots under a budget of one page, filled in turn: the first leaves for the second.
  std::pair<Slot*, Slot*> one_evicted(uint32_t first_seed, uint32_t second_seed,
                                      residency::Handshake handshake = residency::Handshake::host) {
    configure(1 * kPage, 0, handshake);
    Slot* first = make_slot();
    Slot* second = make_slot();
    fill(first, first_seed);
    fill(second, second_seed);
    return {first, second};
  }

  // Runs `body` on device `device` with a stream of its own as stream_; the slots it made are
  // freed at its end (as the program's free does), and device 0 is current again.
  // Runs `body` with `device` bound and stream_ a stream of its own (made once per test and
  // device); slots made there stay for the rest of the test. Device 0 is bound again after.
  void with_device(int device, const std::function<void()>& body) {
    bind_device(device);
    CUstream& stream = device_streams_[device];
    if (stream == nullptr) {
      ASSERT_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    }
    std::swap(stream, stream_);
    body();
    std::swap(stream, stream_);
    bind_device(0);
  }
  void on_device(int device, const std::function<void()>& body) {
    bind_device(device);
    CUstream stream = nullptr;
    ASSERT_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    std::swap(stream, stream_);
    const size_t before = slots_.size();
    body();
    for (size_t i = slots_.size(); i-- > before;) {
      residency::forget(slots_[i]);
      engine().destroy_slot(slots_[i]);
    }
    slots_.resize(before);
    std::swap(stream, stream_);
    ASSERT_CU(cuStreamDestroy(stream));
    bind_device(0);
  }

  CUstream stream_ = nullptr;
  std::vector<Slot*> slots_;
  std::map<int, CUstream> device_streams_;  // with_device's, one per device for the test
};

TEST_F(ResidencyTest, ASlotGetsPagesAtItsFirstUseNotBefore) {
  const unsigned long long before = vaswapSimPhysicalBytes(0);
  Slot* slot = make_slot();
  EXPECT_FALSE(mapped(slot));
  EXPECT_EQ(vaswapSimPhysicalBytes(0), before) << "a reserved slot holds no memory";
  fill(slot, 7);
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_TRUE(mapped(slot));
  EXPECT_EQ(vaswapSimPhysicalBytes(0), before + kPage);
  expect_holds(slot, 7);
}

// A device the program has all but filled may have no room for vaswap's two copy streams, made at
// its first slot: it then gets no slots (the preload passes its allocations through), said by
// name, instead of ending the process. The stream made before the failure is gone again, and the
// answer holds for later allocations for a second; then the streams are tried again. Device 1
// (64 MiB, main() below; fresh, as each test runs in a process of its own) holds one stream of
// 40 MiB, not two.
TEST_F(ResidencyTest, ADeviceWithoutRoomForTheCopyStreamsGetsNoSlots) {
  Slot* first = make_slot();  // device 0 is started before streams cost anything
  fill(first, 3);
  ASSERT_CU(cuStreamSynchronize(stream_));
  const unsigned long long before = vaswapSimPhysicalBytes(1);
  vaswapSimSetStreamBytes(40ull << 20);
  std::string why;
  EXPECT_FALSE(residency::can_hold_slots(1, &why));
  EXPECT_NE(why.find("cuStreamCreate failed with CUDA_ERROR_OUT_OF_MEMORY"), std::string::npos)
      << why;
  EXPECT_NE(why.find("copy streams on device 1"), std::string::npos) << why;
  EXPECT_EQ(before, vaswapSimPhysicalBytes(1)) << "the first copy stream was not destroyed";
  vaswapSimSetStreamBytes(0);
  std::string again;
  EXPECT_FALSE(residency::can_hold_slots(1, &again)) << "tried again at once";
  EXPECT_EQ(why, again);
  std::string none;
  EXPECT_TRUE(residency::can_hold_slots(0, &none)) << none;
  EXPECT_TRUE(none.empty()) << none;
  expect_holds(first, 3);
  // A second later the streams are tried again, and now fit: device 1 gets slots.
  std::this_thread::sleep_for(std::chrono::milliseconds(1050));
  std::string later;
  EXPECT_TRUE(residency::can_hold_slots(1, &later)) << later;
  EXPECT_TRUE(later.empty()) << later;
  Slot* on_one = make_slot(1);
  with_device(1, [&] {
    fill(on_one, 9);
    expect_holds(on_one, 9);
  });
}

// A graph instantiated while a device vaswap never started is current (the automatic inside
// mode, the auto budget) starts nothing there: no copy streams (a page each here), no threads.
// It is weighed against device 0's budget, the only device that holds slots: no pressure there,
// nothing rewritten; the program's own allocation leaving device 0 less room than its slots'
// pages, the same question from device 1 says yes. Before, it asked device 1's budget and
// started device 1, a GPU that held no slot. Each device's slots are weighed against its own room:
// device 1's slots beside device 0's exceed device 0's room, but each device's fit its own, and
// nothing is rewritten (weighed together, every graph was scanned a second time).
TEST_F(ResidencyTest, AnInstantiationStartsNoDevice) {
  configure(0);  // the auto budget
  inside::configure(inside::Settings{});
  Slot* first = make_slot();
  fill(first, 3);
  ASSERT_CU(cuStreamSynchronize(stream_));
  vaswapSimSetStreamBytes(kPage);
  with_device(1, [] {});  // the test's own stream there, before counting
  const unsigned long long before = vaswapSimPhysicalBytes(1);
  EXPECT_EQ(kPage, before);
  with_device(1, [&] { EXPECT_FALSE(inside::enabled()); });
  EXPECT_EQ(before, vaswapSimPhysicalBytes(1)) << "device 1 was started";
  ASSERT_EQ(1u, residency::started_budgets().size());
  const uint64_t room = residency::started_budgets().at(0).limit;
  EXPECT_GE(room, kPage);
  EXPECT_LE(room, 64ull << 20);  // the device (main() below)
  vaswapSimSetStreamBytes(0);
  // Device 0 filled but for four pages: its room is those less the 2 MiB no allocation gets
  // (Engine::allocatable), and the slot's page: four.
  size_t free_bytes = 0, total = 0;
  ASSERT_CU(cuMemGetInfo(&free_bytes, &total));
  CUdeviceptr own = 0;
  ASSERT_CU(cuMemAlloc(&own, free_bytes - 4 * kPage));
  EXPECT_EQ(4 * kPage, residency::started_budgets().at(0).limit);
  // Six slots on device 1 (its room some 60 MiB): seven pages of slots in all, more than device
  // 0's four, and each device's within its own.
  std::string why;
  ASSERT_TRUE(residency::can_hold_slots(1, &why)) << why;
  for (int i = 0; i < 6; ++i) make_slot(1);
  EXPECT_EQ(7 * kPage, engine().slot_bytes());
  EXPECT_EQ(6 * kPage, engine().slot_bytes(1));
  const std::map<int, residency::Budget> both = residency::started_budgets();
  ASSERT_EQ(2u, both.size());
  EXPECT_GT(both.at(1).limit, 6 * kPage);
  EXPECT_FALSE(inside::enabled());
  with_device(1, [&] { EXPECT_FALSE(inside::enabled()); });
  // Five more on device 0: six pages of slots there, more than its room.
  for (int i = 0; i < 5; ++i) make_slot();
  EXPECT_EQ(6 * kPage, engine().slot_bytes(0));
  EXPECT_TRUE(inside::enabled());
  with_device(1, [&] { EXPECT_TRUE(inside::enabled()); });
  ASSERT_CU(cuMemFree(own));
  expect_holds(first, 3);
}

// A thread vaswap cannot start (the process's thread limit; here the simulator's "vaswap_thread"
// fault, which throws std::system_error as std::thread does) at a device's start: the device
// gets no slots for now, named, as when its copy streams cannot be made; before, the error left
// the program's cudaMalloc and ended the process. The fault hits the second of its threads, so the
// first (the mover) was running: it returns, and the device's copy streams (2 MiB each here) are
// destroyed. A second later all of them start, and the device's slots are evicted and restored
// with their data.
TEST_F(ResidencyTest, ADeviceWhoseThreadsCannotStartGetsNoSlotsUntilTheyCan) {
  Slot* first = make_slot();
  fill(first, 3);
  ASSERT_CU(cuStreamSynchronize(stream_));
  const unsigned long long before = vaswapSimPhysicalBytes(1);
  vaswapSimSetStreamBytes(kPage);
  ASSERT_EQ(0, vaswapSimInjectFault("vaswap_thread", 2, EAGAIN));
  std::string why;
  EXPECT_FALSE(residency::can_hold_slots(1, &why));
  EXPECT_EQ(before, vaswapSimPhysicalBytes(1)) << "the copy streams were not destroyed";
  vaswapSimSetStreamBytes(0);
  EXPECT_NE(why.find("vaswap's threads for device 1 could not be started"), std::string::npos)
      << why;
  EXPECT_NE(why.find("a fault the simulator injected"), std::string::npos) << why;
  std::string again;
  EXPECT_FALSE(residency::can_hold_slots(1, &again)) << "tried again at once";
  EXPECT_EQ(why, again);
  // A graph instantiated while device 1 is current (the automatic inside mode, auto budget) is
  // weighed against the started devices' budgets, device 0's alone; before, the lookup asked
  // device 1's, started the device, could not, and ended the process.
  inside::configure(inside::Settings{});
  with_device(1, [&] { EXPECT_FALSE(inside::enabled()); });
  EXPECT_EQ(1u, residency::started_budgets().size());
  expect_holds(first, 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(1050));
  configure(1 * kPage);  // one page: each fill on device 1 evicts the other slot
  std::string later;
  EXPECT_TRUE(residency::can_hold_slots(1, &later)) << later;
  const uint64_t evictions = residency::stats().evictions;
  const uint64_t restores = residency::stats().restores;
  Slot* a = make_slot(1);
  Slot* b = make_slot(1);
  with_device(1, [&] {
    fill(a, 5);
    fill(b, 6);
    expect_holds(a, 5);
    expect_holds(b, 6);
  });
  EXPECT_GE(residency::stats().evictions, evictions + 2);
  EXPECT_GE(residency::stats().restores, restores + 2);
}

// The device handshake needs the watchdog (a wait on the device past residency.wait_limit becomes
// a named error): where its thread cannot start, the device takes the host handshake, and the data
// comes back the same. The fault hits the fifth thread device 1 starts: after its four, the
// watchdog (no device before it took the device handshake).
TEST_F(ResidencyTest, WithoutAWatchdogThreadTheDeviceTakesTheHostHandshake) {
  configure(1 * kPage, 0, residency::Handshake::automatic);
  ASSERT_EQ(0, vaswapSimInjectFault("vaswap_thread", 5, EAGAIN));
  Slot* a = make_slot(1);
  Slot* b = make_slot(1);
  with_device(1, [&] {
    fill(a, 21);
    fill(b, 22);
    residency::Acquired acquired;
    std::string message;
    ASSERT_EQ(CUDA_SUCCESS, residency::acquire({a}, stream_, "a test launch", &acquired, &message));
    EXPECT_TRUE(acquired.host_waited) << "the device handshake without a watchdog";
    residency::used(acquired);
    expect_holds(a, 21);
    expect_holds(b, 22);
  });
  EXPECT_FALSE(residency::stats().device_handshake);
}

// A failed driver call's Error carries the driver's code as well as the message: the mover acts on
// the code (a capture's restore that keeps failing out of memory is given up), not on the text.
TEST_F(ResidencyTest, AFailedMapCarriesTheDriversCode) {
  Slot* slot = engine().create_slot(0, kPage, /*intercepted=*/true, /*backed=*/false);
  slots_.push_back(slot);
  const std::vector<std::pair<int, CUresult>> faults = {{2, CUDA_ERROR_OUT_OF_MEMORY},
                                                        {1, CUDA_ERROR_INVALID_VALUE}};
  engine().trim_spares(0, 0);  // no kept handle to map instead, none to give back and try again
  for (const auto& [code, expected] : faults) {
    ASSERT_EQ(vaswapSimInjectFault("cuMemCreate", 1, code), 0);
    try {
      engine().back(slot, std::nullopt);
      ADD_FAILURE() << "back() succeeded with cuMemCreate failing";
    } catch (const Error& error) {
      EXPECT_EQ(error.status(), VASWAP_ERROR_CUDA);
      EXPECT_EQ(error.driver_result(), expected) << error.what();
      EXPECT_NE(std::string(error.what())
                    .find(std::string("cuMemCreate failed with ") + cuda_error_name(expected)),
                std::string::npos)
          << error.what();
    }
    EXPECT_FALSE(mapped(slot));
  }
  vaswapSimClearFaults();
  engine().back(slot, std::nullopt);
  EXPECT_TRUE(mapped(slot));
  EXPECT_EQ(Error(VASWAP_ERROR_INVALID_STATE, "no driver call").driver_result(), CUDA_SUCCESS);
}

TEST_F(ResidencyTest, SlotsStayWithinTheBudgetAndKeepTheirData) {
  configure(3 * kPage);
  std::vector<Slot*> slots;
  for (uint32_t i = 0; i < 6; ++i) {
    slots.push_back(make_slot());
    fill(slots.back(), 100 + i);
    ASSERT_CU(cuStreamSynchronize(stream_));
    uint64_t held = 0;
    for (Slot* s : slots) held += mapped(s) ? kPage : 0;
    EXPECT_LE(held, 3 * kPage) << "after slot " << i;
  }
  for (uint32_t i = 0; i < 6; ++i) expect_holds(slots[i], 100 + i);
  EXPECT_LE(residency::stats().peak_resident, 3 * kPage);
  EXPECT_GE(residency::stats().evictions, 3u);
}

// A copy recorded into a capture names a slot whose map keeps failing out of memory while the
// device reports room (it keeps back all it reports free, more than vaswap leaves out), with
// nothing in flight or queued that could give pages back: the mover gives the restore up after
// its third failed map, the slot goes back where it was (without pages, or away with its data),
// and the copy is refused at once with out-of-memory, naming the failed call, far inside
// residency.wait_limit. Once the program frees memory, the same slot is backed (its data back)
// and keeps what is written to it. Under the device handshake the restore went ahead (a wait on
// the restore stream), could not be given up, and the process was ended after the limit.
// (inside_test.sh reaches this path only in some runs; these are its deterministic tests.)
void ResidencyTest::refuses_a_captures_copy_whose_pages_never_come(bool evicted) {
  Slot* slot = make_slot();
  if (evicted) {
    fill(slot, 55);
    ASSERT_CU(cuStreamSynchronize(stream_));
    residency::evict({slot}, "plan");
    wait_mapped({slot}, false);
  }
  engine().trim_spares(0, 0);  // no kept handle the map could take instead
  size_t free = 0, total = 0;
  ASSERT_CU(cuMemGetInfo(&free, &total));
  const std::optional<uint64_t> room = engine().allocatable_now(0);
  ASSERT_TRUE(room);
  const uint64_t left_out = free - *room;  // what vaswap leaves out of the device's room already
  CUdeviceptr held = 0;
  ASSERT_CU(cuMemAlloc(&held, free - left_out - 8 * kPage));  // 8 pages of room for slots
  ASSERT_CU(cuMemGetInfo(&free, &total));
  vaswapSimSetHoldback(free);  // every page reported free, none that an allocation gets
  const residency::Stats before = residency::stats();
  std::string message;
  residency::Acquired acquired;
  const auto begun = std::chrono::steady_clock::now();
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY,
            residency::back_for_capture({slot}, stream_, &acquired, &message));
  EXPECT_LT(std::chrono::steady_clock::now() - begun, std::chrono::seconds(2))
      << "the copy waited for pages that never came";
  EXPECT_NE(message.find("names slot " + std::to_string(slot->id)), std::string::npos) << message;
  EXPECT_NE(message.find("whose pages the device could not give (cuMemCreate failed with "
                         "CUDA_ERROR_OUT_OF_MEMORY"),
            std::string::npos)
      << message;
  EXPECT_TRUE(acquired.slots.empty()) << "a refused copy holds no slot";
  EXPECT_FALSE(mapped(slot));
  EXPECT_EQ(residency::stats().first_maps, before.first_maps) << "no map took place";
  EXPECT_EQ(residency::stats().restores, before.restores) << "no restore took place";
  EXPECT_EQ(residency::stats().oom_launches, before.oom_launches + 1);
  EXPECT_EQ(residency::stats().host_path_restores, before.host_path_restores)
      << "a capture's restore is not one the device handshake had to leave to the host";
  // The program frees memory (what the message asks for): the same slot is backed for the next
  // copy, with its data, and holds what is written to it.
  vaswapSimSetHoldback(0);
  ASSERT_CU(cuMemFree(held));
  message.clear();
  ASSERT_EQ(CUDA_SUCCESS, residency::back_for_capture({slot}, stream_, &acquired, &message))
      << message;
  EXPECT_TRUE(mapped(slot));
  residency::used(acquired);
  if (evicted) expect_holds(slot, 55);
  fill(slot, 77);
  expect_holds(slot, 77);
}

// Whether nothing in this process has used device 1 yet (its primary context is not active): the
// engine tests below need its first look there.
bool device_one_untouched() {
  if (cuInit(0) != CUDA_SUCCESS) return false;
  unsigned flags = 0;
  int active = -1;
  return cuDevicePrimaryCtxGetState(1, &flags, &active) == CUDA_SUCCESS && active == 0;
}

// The engine's first look at a device retains its primary context. Where the look fails after
// that (the granularity query), the retain goes back: residency looks again a second later, and
// each failed look held one more retain before.
TEST(EngineDevice, AFailedFirstLookGivesTheContextBack) {
  if (!device_one_untouched())
    GTEST_SKIP() << "device 1's context is in use already in this process";
  vaswapSimClearFaults();
  ASSERT_EQ(0, vaswapSimInjectFault("cuMemGetAllocationGranularity", 1, CUDA_ERROR_UNKNOWN));
  bool thrown = false;
  size_t free_bytes = 0, total_bytes = 0;
  try {
    engine().memory_info(1, &free_bytes, &total_bytes);  // the engine's first look at device 1
  } catch (const Error& e) {
    thrown = true;
    EXPECT_NE(std::string(e.what()).find("cuMemGetAllocationGranularity"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(thrown);
  unsigned flags = 0;
  int active = -1;
  ASSERT_CU(cuDevicePrimaryCtxGetState(1, &flags, &active));
  EXPECT_EQ(0, active) << "the failed look kept the context retained";
  engine().memory_info(1, &free_bytes, &total_bytes);  // looked at again: no fault now
  size_t device_total = 0;
  ASSERT_CU(cuDeviceTotalMem(&device_total, 1));
  EXPECT_EQ(device_total, total_bytes);
  ASSERT_CU(cuDevicePrimaryCtxGetState(1, &flags, &active));
  EXPECT_EQ(1, active);
}

// The engine's workers for the C API (init_workers): where one of their threads cannot be started,
// the call throws, and the next one starts what is missing with the streams made the first time.
// Before, each retry made both streams again (2 MiB each here) and left the earlier ones.
TEST(EngineDevice, WorkersThatCouldNotStartAreStartedLaterWithTheSameStreams) {
  if (!device_one_untouched())
    GTEST_SKIP() << "device 1's context is in use already in this process";
  struct Reset {
    ~Reset() {
      vaswapSimSetStreamBytes(0);
      vaswapSimClearFaults();
    }
  } reset;
  size_t free_bytes = 0, total_bytes = 0;
  engine().memory_info(1, &free_bytes, &total_bytes);  // the engine has device 1, no workers
  vaswapSimClearFaults();
  vaswapSimSetStreamBytes(kPage);
  const unsigned long long before = vaswapSimPhysicalBytes(1);
  ASSERT_EQ(0, vaswapSimInjectFault("vaswap_thread", 2, EAGAIN));  // the second worker's thread
  EXPECT_THROW(engine().init_workers(1), std::system_error);
  const unsigned long long made = vaswapSimPhysicalBytes(1);
  EXPECT_EQ(made - before, 2 * kPage) << "the copy and launch streams";
  ASSERT_NO_THROW(engine().init_workers(1));
  EXPECT_EQ(vaswapSimPhysicalBytes(1), made) << "the streams were made again";
  ASSERT_NO_THROW(engine().init_workers(1));
  EXPECT_EQ(vaswapSimPhysicalBytes(1), made);
}

// Every slot takes a handshake flag from pinned host memory, 1024 flags to a chunk. Where the host
// can pin no more, a slot whose flag would need a new chunk is refused with the driver's error (the
// preload then passes the program's allocation through) and residency keeps nothing of it; before,
// the process was ended from the program's cudaMalloc. For a second after, slots are refused at
// once, and can_hold_slots refuses them before one is made unless a freed slot's flag is there to
// take; then, memory can be pinned again, and slots are adopted and hold their data.
TEST_F(ResidencyTest, ASlotWithNoPinnedMemoryForItsFlagIsRefusedAndLeavesNothing) {
  struct Reset {
    ~Reset() { vaswapSimSetPinnedLimit(~0ULL); }
  } reset;
  Slot* first = make_slot();  // the device is started, with its flags
  fill(first, 11);
  vaswapSimSetPinnedLimit(vaswapSimPinnedBytes());
  Slot* refused = nullptr;
  std::string why;
  const char* call = nullptr;
  size_t adopted = 0;
  // The flags pinned so far serve at most a few chunks' worth of slots before one is refused.
  for (; adopted < size_t{8} * 1024 && refused == nullptr; ++adopted) {
    Slot* slot = engine().create_slot(0, kPage, /*intercepted=*/true, /*backed=*/false);
    try {
      residency::adopt(slot, false);
      slots_.push_back(slot);
    } catch (const Error& e) {
      refused = slot;
      why = e.what();
      call = e.driver_call();
    }
  }
  ASSERT_NE(refused, nullptr) << "no adoption needed a new chunk of flags in " << adopted;
  EXPECT_NE(call, nullptr);
  if (call != nullptr) {
    EXPECT_STREQ(call, "cuMemHostAlloc");
  }
  EXPECT_NE(why.find("CUDA_ERROR_OUT_OF_MEMORY"), std::string::npos) << why;
  EXPECT_NE(why.find("handshake flags on device 0"), std::string::npos) << why;
  EXPECT_FALSE(refused->managed) << "residency kept a slot it refused";
  // The next slot within a second is refused at once, not after the pinning's retries (each
  // selected allocation would wait them, holding every launch back).
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(residency::adopt(refused, false), Error);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
  // The preload asks before it makes a slot: refused there, for the flags, so no address is
  // reserved and freed for each selected allocation meanwhile.
  std::string refusal;
  residency::NoSlots cause = residency::NoSlots::device;
  EXPECT_FALSE(residency::can_hold_slots(0, &refusal, &cause));
  EXPECT_EQ(cause, residency::NoSlots::flags);
  EXPECT_NE(refusal.find("cuMemHostAlloc"), std::string::npos) << refusal;
  // A flag given back by a freed slot serves the next one: the device is asked again.
  ASSERT_NE(slots_.back(), first) << "no slot adopted before the refusal";
  Slot* freed = slots_.back();
  slots_.pop_back();
  residency::forget(freed);
  engine().destroy_slot(freed, /*device_idle_for_it=*/true);
  std::string none;
  EXPECT_TRUE(residency::can_hold_slots(0, &none)) << none;
  residency::adopt(refused, false);
  slots_.push_back(refused);
  EXPECT_TRUE(refused->managed);
  EXPECT_FALSE(residency::can_hold_slots(0, &refusal, &cause)) << "the freed flag is taken";
  EXPECT_EQ(cause, residency::NoSlots::flags);
  // The slots adopted before it and the first one still work.
  expect_holds(first, 11);
  vaswapSimSetPinnedLimit(~0ULL);
  std::this_thread::sleep_for(std::chrono::milliseconds(1050));  // pinning is tried again
  EXPECT_TRUE(residency::can_hold_slots(0, &none)) << none;
  Slot* later = make_slot();
  fill(later, 22);
  expect_holds(later, 22);
  expect_holds(first, 11);
}

// One slot per test: another resident slot would be evicted to give the restore its pages.
TEST_F(ResidencyTest, ACapturesCopyWhosePagesNeverComeIsRefusedAtOnce) {
  refuses_a_captures_copy_whose_pages_never_come(false);
}

TEST_F(ResidencyTest, ACapturesCopyOfAnEvictedSlotWhosePagesNeverComeIsRefusedAtOnce) {
  refuses_a_captures_copy_whose_pages_never_come(true);
}

TEST_F(ResidencyTest, ACapturesCopyWhosePagesNeverComeIsRefusedAtOnceUnderTheDeviceHandshake) {
  configure(4 * kPage, 0, residency::Handshake::device);
  refuses_a_captures_copy_whose_pages_never_come(false);
}

TEST_F(ResidencyTest, ACapturesCopyOfAnEvictedSlotIsRefusedAtOnceUnderTheDeviceHandshake) {
  configure(4 * kPage, 0, residency::Handshake::device);
  refuses_a_captures_copy_whose_pages_never_come(true);
}

// Copies recorded into captures need their slots mapped while the capture runs; more of them than
// the budget holds make room by evicting slots whose last uses are closed already (nothing is
// recorded on a stream: it may be capturing). Each is mapped again at its first real use.
TEST_F(ResidencyTest, CapturedCopiesBeyondTheBudgetEvictEarlierOnes) {
  configure(2 * kPage);
  std::vector<Slot*> slots;
  for (int i = 0; i < 4; ++i) {
    slots.push_back(make_slot());
    std::string message;
    residency::Acquired held;
    ASSERT_EQ(CUDA_SUCCESS, residency::back_for_capture({slots.back()}, stream_, &held, &message))
        << message;
    EXPECT_TRUE(mapped(slots.back()));
    EXPECT_EQ(held.slots, std::vector<Slot*>{slots.back()});
    residency::used(held);  // the copy is recorded
  }
  wait_mapped({slots[0], slots[1]}, false);
  for (int i = 0; i < 4; ++i) fill(slots[static_cast<size_t>(i)], 60 + i);
  for (int i = 0; i < 4; ++i) expect_holds(slots[static_cast<size_t>(i)], 60 + i);
}

// A capture begins on a stream where a slot was just used (its mark still open). The preload closes
// that mark before the capture begins; while the capture is open, a launch on another stream
// evicts the slot, and its eviction waits for the use (not for a record inside the graph, which
// would never complete). The slot's data survives, and the graph holds no stray node.
TEST_F(ResidencyTest, AnEvictionDuringACaptureWaitsForUsesBeforeIt) {
  configure(1 * kPage);
  Slot* a = make_slot();
  fill(a, 71);  // a's use on stream_: its mark is open
  residency::capture_beginning(stream_);
  ASSERT_CU(cuStreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_RELAXED));
  capture_gate::beginning();
  CUstream other = nullptr;
  ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  Slot* b = make_slot();
  residency::Acquired acquired;
  std::string message;
  ASSERT_EQ(CUDA_SUCCESS, residency::acquire({b}, other, "a launch on another stream", &acquired,
                                             &message, residency::Checked::when_enqueued))
      << message;
  ASSERT_CU(cuMemsetD32Async(b->va, 72, kWords, other));
  residency::used(acquired);
  wait_mapped({a}, false);  // a left during the capture
  CUgraph graph = nullptr;
  ASSERT_CU(cuStreamEndCapture(stream_, &graph));
  capture_gate::closed();
  size_t nodes = 1;
  ASSERT_CU(cuGraphGetNodes(graph, nullptr, &nodes));
  EXPECT_EQ(nodes, 0u) << "vaswap recorded into the application's capture";
  ASSERT_CU(cuGraphDestroy(graph));
  residency::stream_gone(other);  // as the hook does before the real destroy
  ASSERT_CU(cuStreamDestroy(other));
  expect_holds(a, 71);
  expect_holds(b, 72);
}

// The auto budget: slots grow into everything the device has free (a job that fits evicts
// nothing, whatever the reserve), and once they must evict, they go down to the reserve below
// it, leaving that much to the program's own allocations.
TEST_F(ResidencyTest, TheAutoBudgetUsesTheWholeDeviceAndLeavesTheReserveUnderPressure) {
  configure(0, 0, residency::Handshake::host, /*reserve=*/4 * kPage);
  // Leave 6 pages on the device that allocations can have, and one more that cuMemGetInfo
  // reports free and no allocation gets, as on an H100.
  const HoldBack held_back;
  size_t free = 0, total = 0;
  ASSERT_CU(cuMemGetInfo(&free, &total));
  CUdeviceptr held = 0;
  ASSERT_CU(cuMemAlloc(&held, free - 7 * kPage));
  const uint64_t before = residency::stats().evictions;
  std::vector<Slot*> slots;
  for (uint32_t i = 0; i < 6; ++i) {
    slots.push_back(make_slot());
    fill(slots.back(), 50 + i);
  }
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_EQ(residency::stats().evictions - before, 0u) << "six pages fit the six free";
  for (Slot* s : slots) EXPECT_TRUE(mapped(s));
  // A seventh: the device is full. Evictions bring the slots to 6 - 4 = 2 pages, the new one
  // included: five leave.
  slots.push_back(make_slot());
  fill(slots.back(), 56);
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_EQ(residency::stats().evictions - before, 5u);
  wait_mapped({slots[0], slots[1], slots[2], slots[3], slots[4]}, false);
  ASSERT_CU(cuMemGetInfo(&free, &total));
  EXPECT_EQ(free, 5 * kPage) << "the reserve is free for the program, beside the page held back";
  for (uint32_t i = 0; i < 7; ++i) expect_holds(slots[i], 50 + i);
  ASSERT_CU(cuMemFree(held));
}

// A device that keeps back more of its reported free memory than the one page vaswap leaves out
// (three pages here): the first map refused with room reported teaches the engine the amount, and
// every room read from then on leaves it out (the budget, and Engine::allocatable, which a
// capture's copy, a placeholder and the program's allocations beside rewritten graphs read).
// Before, the budget counted two pages that never came; the learned figure lived in residency,
// and the engine's room for the others still counted them.
TEST_F(ResidencyTest, WhatTheDeviceKeepsBackIsLearnedOnceForEveryRoom) {
  configure(0, 0, residency::Handshake::device, /*reserve=*/1 * kPage);
  vaswapSimSetHoldback(3 * kPage);
  size_t free = 0, total = 0;
  ASSERT_CU(cuMemGetInfo(&free, &total));
  CUdeviceptr held = 0;
  ASSERT_CU(cuMemAlloc(&held, free - 7 * kPage));  // 7 reported free, 4 that maps can have
  ASSERT_EQ(engine().allocatable_now(0), std::optional<uint64_t>(6 * kPage)) << "one page left out";
  std::vector<Slot*> slots;
  for (uint32_t i = 0; i < 6; ++i) {
    slots.push_back(make_slot());
    fill(slots.back(), 90 + i);
  }
  ASSERT_CU(cuStreamSynchronize(stream_));
  ASSERT_CU(cuMemGetInfo(&free, &total));
  // The fifth map failed with 3 pages reported free: 3 pages are left out from then on, and
  // the slots keep to the 4 pages maps can have, less the reserve.
  EXPECT_EQ(engine().allocatable(0, free), free > 3 * kPage ? free - 3 * kPage : 0);
  EXPECT_EQ(engine().allocatable(0, 10 * kPage), 7 * kPage);
  EXPECT_LE(residency::budget(0).limit, 4 * kPage);
  for (uint32_t i = 0; i < 6; ++i) expect_holds(slots[i], 90 + i);
  // The reads restored slots and evicted others; their pages go back on the mover's thread, which
  // moves the mark (and holds it empty meanwhile). Nothing else gives memory back after this.
  residency::wait_settled(slots);
  // Learned from a reading only where nothing went back to the driver since before the failed
  // map; a smaller figure changes nothing.
  std::optional<uint64_t> mark = engine().given_back_mark();
  ASSERT_TRUE(mark);
  {
    const Engine::GivingBack giving_back(engine());  // as the hooks hold around a program's free
    EXPECT_FALSE(engine().given_back_mark()) << "no mark while memory is going back";
    ASSERT_CU(cuMemFree(held));
  }
  EXPECT_FALSE(engine().learn_held_back(0, kPage, *mark, free).learned)
      << "the program's free, not the device, explains the room";
  EXPECT_EQ(engine().allocatable(0, 10 * kPage), 7 * kPage);
  mark = engine().given_back_mark();
  ASSERT_TRUE(mark);
  ASSERT_CU(cuMemGetInfo(&free, &total));
  // 3 pages reported free again; a 2-page map refused shows 2 pages kept back, fewer than the 3
  // learned: nothing changes.
  ASSERT_CU(cuMemAlloc(&held, free - 3 * kPage));
  ASSERT_CU(cuMemGetInfo(&free, &total));
  EXPECT_FALSE(engine().learn_held_back(0, 2 * kPage, *mark, free).learned);
  EXPECT_EQ(engine().allocatable(0, 10 * kPage), 7 * kPage);
  // A free vaswap does not see (a stream-ordered free's pool releasing, another process) between
  // the readings around a failed map: the smaller reading, from before it, teaches nothing. (It
  // once made the figure all the device reported free, up to 64 MiB.)
  const size_t before_free = free;
  ASSERT_CU(cuMemFree(held));
  ASSERT_CU(cuMemGetInfo(&free, &total));
  EXPECT_FALSE(engine().learn_held_back(0, kPage, *mark, before_free).learned);
  EXPECT_EQ(engine().allocatable(0, 10 * kPage), 7 * kPage);
  // Room reported before and after a refused map: the device keeps all of it back, learned (at
  // most 64 MiB).
  const Engine::HeldBack grown = engine().learn_held_back(0, kPage, *mark, free);
  EXPECT_TRUE(grown.learned);
  EXPECT_FALSE(grown.first);
  EXPECT_EQ(grown.bytes, std::min<uint64_t>(free, kHeldBackMax));  // all it reported, at most
  EXPECT_EQ(engine().allocatable(0, grown.bytes + kPage), kPage);
  vaswapSimSetHoldback(0);
}

// Under pressure (the auto budget: slots fill the device, then leave down to its target), an
// eviction made for a slot of its size hands its handle to that slot's map instead of releasing
// it: the map takes a kept handle (a copy into it runs at the link's speed on the H200) and the
// device holds no more than it did. Before, evictions over the target always released theirs, and
// the capacity runs on the H200 reused 5% of their handles.
TEST_F(ResidencyTest, AnEvictionForASlotOfItsSizeHandsItsPagesOver) {
  const std::string path = open_trace("handoff");
  configure(0, 0, residency::Handshake::host, /*reserve=*/4 * kPage);
  const HoldBack held_back;  // one page reported free that no allocation gets, as on an H100
  size_t free = 0, total = 0;
  ASSERT_CU(cuMemGetInfo(&free, &total));
  CUdeviceptr held = 0;
  ASSERT_CU(cuMemAlloc(&held, free - 7 * kPage));
  std::vector<Slot*> slots;
  for (uint32_t i = 0; i < 7; ++i) {  // the seventh finds the device full: five leave
    // The six first uses done before the seventh's: the evictions' copies then run in the order
    // they were decided, the hand-off's first. (Otherwise a later victim's copy may end first, as
    // the unmapper lets it, and its unmap frees the page the seventh slot maps instead, skipping
    // the hand-off as it should: under load that happened about once in 25 runs.)
    if (i == 6) {
      ASSERT_CU(cuStreamSynchronize(stream_));
    }
    slots.push_back(make_slot());
    fill(slots.back(), 70 + i);
  }
  ASSERT_CU(cuStreamSynchronize(stream_));
  wait_mapped({slots[0], slots[1], slots[2], slots[3], slots[4]}, false);
  ASSERT_CU(cuMemGetInfo(&free, &total));
  EXPECT_EQ(free, 5 * kPage) << "the reserve is free for the program, beside the page held back";
  for (uint32_t i = 0; i < 7; ++i) expect_holds(slots[i], 70 + i);
  const Reuse r = read_reuse(path);
  // The first eviction for the seventh slot unmaps while slots hold 6 pages against a target of
  // 2: only a hand-off keeps its handle then. Later ones may be kept by the budget's own rule.
  EXPECT_NE(r.first_release.find("\"kept\":true"), std::string::npos) << r.first_release;
  EXPECT_GE(r.reused, 1) << "no map took a handed-over handle";
  EXPECT_LE(r.reused, r.kept);
  ASSERT_CU(cuMemFree(held));
}

TEST_F(ResidencyTest, WithoutAScheduleTheLeastRecentlyUsedLeaves) {
  configure(2 * kPage);
  Slot* a = make_slot();
  Slot* b = make_slot();
  Slot* c = make_slot();
  fill(a, 1);
  fill(b, 2);
  fill(a, 3);  // a is now the more recent
  fill(c, 4);  // room for c: b goes
  ASSERT_CU(cuStreamSynchronize(stream_));
  wait_mapped({b}, false);
  EXPECT_TRUE(mapped(a));
  EXPECT_TRUE(mapped(c));
  expect_holds(b, 2);
}

TEST_F(ResidencyTest, WithAScheduleTheFarthestNextUseLeaves) {
  configure(2 * kPage);
  Slot* a = make_slot();
  Slot* b = make_slot();
  Slot* c = make_slot();
  // The period: a, b, c, a. At position 2 (c), a is needed next (position 3), b only at 1 of the
  // next period: b leaves although a was used first.
  residency::set_schedule({{a}, {b}, {c}, {a}});
  residency::at_position(0);
  fill(a, 1);
  residency::at_position(1);
  fill(b, 2);
  residency::at_position(2);
  fill(c, 3);
  ASSERT_CU(cuStreamSynchronize(stream_));
  wait_mapped({b}, false);
  EXPECT_TRUE(mapped(a));
  residency::set_schedule({});
  expect_holds(b, 2);
}

TEST_F(ResidencyTest, ALaunchThatCannotFitGetsOutOfMemoryAndNothingRuns) {
  configure(2 * kPage);
  Slot* a = make_slot();
  Slot* b = make_slot();
  Slot* c = make_slot();
  fill(a, 5);
  std::string message;
  bool ran = false;
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, use(
                                          {a, b, c}, [&] { ran = true; }, &message));
  EXPECT_FALSE(ran);
  EXPECT_NE(message.find("needs 6 MiB of slots on device 0 at once, more than the residency "
                         "budget of 4 MiB"),
            std::string::npos)
      << message;
  expect_holds(a, 5);
  EXPECT_GE(residency::stats().oom_launches, 1u);
}

// Over the limit with nothing more to evict (here: room lent to a rewritten graph's executor),
// a launch whose slots all have their pages needs no room and goes ahead; one that needs pages is
// refused by name.
TEST_F(ResidencyTest, ALaunchThatNeedsNoRoomGoesAheadOverTheLimit) {
  configure(2 * kPage);
  Slot* a = make_slot();
  Slot* b = make_slot();
  Slot* lent_slot = make_slot();  // never used: lent without pages
  Slot* c = make_slot();
  fill(a, 21);
  fill(b, 22);
  std::vector<residency::Lent> lent;
  ASSERT_TRUE(residency::lend({lent_slot}, 2 * kPage, &lent));  // held now: 4 pages of 2
  bool ran = false;
  std::string message;
  EXPECT_EQ(CUDA_SUCCESS, use(
                              {a}, [&] { ran = true; }, &message))
      << message;
  EXPECT_TRUE(ran);
  // What could leave for it did (b, not a), though a and the lent room still hold 3 pages.
  wait_mapped({b}, false);
  EXPECT_TRUE(mapped(a));
  // c has no pages and no room can be made for it: refused, nothing run.
  ran = false;
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, use(
                                          {a, c}, [&] { ran = true; }, &message));
  EXPECT_FALSE(ran);
  EXPECT_NE(message.find("needs 2 MiB more of slots on device 0"), std::string::npos) << message;
  EXPECT_NE(message.find("4 MiB lent to the executor"), std::string::npos) << message;
  engine().back(lent_slot, std::nullopt);  // the executor maps a lent slot before giving it back
  residency::take_back(0, {lent_slot}, 2 * kPage);
  expect_holds(a, 21);
  expect_holds(b, 22);
}

// A rewritten graph's executor with no launch queued parks the part of its reserve it has no
// pages for: other launches may have that room meanwhile (nothing of theirs is evicted for it),
// and taking it again before the graph's next launch evicts down to the budget. Without the
// park, the launch below evicts a (the reserve held the room); before unpark made room, the
// executor's maps found the pages taken (the demo's --graph pair).
TEST_F(ResidencyTest, AParkedReserveIsRoomForOtherLaunchesUntilItIsTakenAgain) {
  configure(3 * kPage);
  Slot* a = make_slot();
  Slot* b = make_slot();
  Slot* lent_slot = make_slot();  // never used: lent without pages
  fill(a, 41);
  std::vector<residency::Lent> lent;
  ASSERT_TRUE(residency::lend({lent_slot}, 2 * kPage, &lent));  // held now: 3 pages of 3
  EXPECT_EQ(2 * kPage, residency::others(0).lent);
  residency::park(0, 2 * kPage);
  EXPECT_EQ(2 * kPage, residency::others(0).lent) << "a parked reserve is still the graph's";
  fill(b, 42);  // 2 pages of 3 counted: nothing leaves
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_TRUE(mapped(a));
  EXPECT_TRUE(mapped(b));
  EXPECT_EQ(0u, residency::stats().evictions) << "the parked room was evicted for";
  residency::unpark(0, 2 * kPage, /*make_room=*/true);  // 4 counted: one of them leaves
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (mapped(a) && mapped(b) && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_NE(mapped(a), mapped(b)) << "taking the reserve again evicted none, or both";
  EXPECT_EQ(1u, residency::stats().evictions);
  engine().back(lent_slot, std::nullopt);  // the executor maps a lent slot before giving it back
  residency::take_back(0, {lent_slot}, 2 * kPage);
  EXPECT_EQ(0u, residency::others(0).lent);
  expect_holds(a, 41);
  expect_holds(b, 42);
}

TEST_F(ResidencyTest, TheHostPoolLimitRefusesAnEvictionByName) {
  configure(1 * kPage, /*host_limit=*/kPage);
  Slot* a = make_slot();
  Slot* b = make_slot();
  Slot* c = make_slot();
  fill(a, 1);
  fill(b, 2);  // a leaves: its one page of host copy is the limit
  std::string message;
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, use(
                                          {c}, [] {}, &message));
  EXPECT_NE(message.find("host_pool.limit (2 MiB) is reached"), std::string::npos) << message;
  expect_holds(b, 2);
  configure(1 * kPage, /*host_limit=*/2 * kPage);  // room for b's copy: a can come back
  expect_holds(a, 1);
}

TEST_F(ResidencyTest, TheProgramsOwnOutOfMemoryGetsPagesBack) {
  configure(4 * kPage);
  Slot* a = make_slot();
  Slot* b = make_slot();
  fill(a, 1);
  fill(b, 2);
  ASSERT_CU(cuStreamSynchronize(stream_));
  const unsigned long long before = vaswapSimPhysicalBytes(0);
  EXPECT_EQ(residency::make_room(0, 3 * kPage), 2 * kPage);
  EXPECT_FALSE(mapped(a));
  EXPECT_FALSE(mapped(b));
  EXPECT_EQ(vaswapSimPhysicalBytes(0), before - 2 * kPage);
  expect_holds(a, 1);
  expect_holds(b, 2);
}

// What the program's out-of-memory gets back leaves the reserve free after its allocation: on the
// H200, a kernel's first launch right after such an allocation failed for want of memory when
// only the allocation's bytes came back (its module is loaded into device memory then).
TEST_F(ResidencyTest, TheProgramsOutOfMemoryLeavesTheReserveFree) {
  configure(4 * kPage, 0, residency::Handshake::host, /*reserve=*/1 * kPage);
  Slot* a = make_slot();
  Slot* b = make_slot();
  Slot* c = make_slot();
  fill(a, 21);
  fill(b, 22);
  fill(c, 23);
  ASSERT_CU(cuStreamSynchronize(stream_));
  const unsigned long long before = vaswapSimPhysicalBytes(0);
  // One page for the allocation and one for the reserve: the two least recently used leave.
  EXPECT_EQ(residency::make_room(0, 1 * kPage), 2 * kPage);
  EXPECT_FALSE(mapped(a));
  EXPECT_FALSE(mapped(b));
  EXPECT_TRUE(mapped(c));
  EXPECT_EQ(vaswapSimPhysicalBytes(0), before - 2 * kPage);
  expect_holds(a, 21);
  expect_holds(b, 22);
  expect_holds(c, 23);
}

// Page reuse under residency: an eviction keeps its handle, and the next restore of that size maps
// it instead of a new one (its copy then runs at the link's speed on the H200). Kept handles count
// within the budget: what the device holds for slots, mapped or kept, never exceeds it. The trace
// says which maps reused a kept handle.
TEST_F(ResidencyTest, EvictedPagesAreKeptForTheNextRestoreWithinTheBudget) {
  const std::string path = open_trace("reuse");
  configure(2 * kPage);
  const unsigned long long base = vaswapSimPhysicalBytes(0);
  std::vector<Slot*> slots;
  for (uint32_t i = 0; i < 4; ++i) slots.push_back(make_slot());
  for (int round = 0; round < 3; ++round) {
    for (uint32_t i = 0; i < 4; ++i) {
      if (round == 0) {
        fill(slots[i], 300 + i);
      } else {
        expect_holds(slots[i], 300 + i);
      }
      ASSERT_CU(cuStreamSynchronize(stream_));
      EXPECT_LE(vaswapSimPhysicalBytes(0) - base, 2 * kPage) << "round " << round << " slot " << i;
    }
  }
  const Reuse r = read_reuse(path);
  EXPECT_GE(r.kept, 8) << "evictions keep their handles";
  EXPECT_GE(r.reused, 8) << "of " << r.remaps << " maps, few took a kept handle";
  EXPECT_GE(residency::stats().evictions, 8u);
}

// The program's own out-of-memory takes kept handles first (nothing to copy), and pages evicted
// for it are not kept.
TEST_F(ResidencyTest, TheProgramsOutOfMemoryReleasesKeptPagesFirst) {
  configure(1 * kPage);
  Slot* a = make_slot();
  Slot* b = make_slot();
  fill(a, 11);
  fill(b, 12);  // a leaves; its handle is kept, within the one-page budget only once b's is
  ASSERT_CU(cuStreamSynchronize(stream_));
  wait_mapped({a}, false);
  const unsigned long long before = vaswapSimPhysicalBytes(0);
  const uint64_t kept = engine().spare_bytes(0);
  // Asks for more than the kept bytes: b is evicted too, and its handle goes back as well.
  EXPECT_EQ(residency::make_room(0, kept + kPage), kept + kPage);
  EXPECT_FALSE(mapped(b));
  EXPECT_EQ(engine().spare_bytes(0), 0u);
  EXPECT_EQ(vaswapSimPhysicalBytes(0), before - kept - kPage);
  expect_holds(a, 11);
  expect_holds(b, 12);
}

// The device handshake (asked for; device 6, started with it): a slot comes back for a kernel,
// the stream is parked on its flag until the restore lands, and the host goes on (a kernel's
// addresses are checked only when it runs).
TEST_F(ResidencyTest, TheStreamWaitsOnTheDeviceAndTheHostDoesNot) {
  on_device(6, [&] {
    configure(1 * kPage, 0, residency::Handshake::device);
    Slot* a = make_slot(6);
    Slot* b = make_slot(6);
    fill(a, 11);
    fill(b, 12);  // a leaves
    residency::Acquired acquired;
    std::string message;
    ASSERT_EQ(CUDA_SUCCESS, residency::acquire({a}, stream_, "a test launch", &acquired, &message));
    EXPECT_FALSE(acquired.host_waited);
    EXPECT_EQ(acquired.waits, 1u);
    EXPECT_EQ(acquired.demanded, 1u);
    auto* words = reinterpret_cast<uint32_t*>(a->va);
    ASSERT_CU(sim_kernels::launch_add(stream_, words, words, 1, kWords));
    residency::used(acquired);
    ASSERT_CU(cuStreamSynchronize(stream_));
    expect_holds(a, 12);
    expect_holds(b, 12);
    EXPECT_TRUE(residency::stats().device_handshake);
  });
}

// First-time work under the device handshake (a kernel's or a graph's first launch loads or
// uploads it, which on the H200 hangs while a stream is parked): settle() waits on the host until
// the parked stream's restore lands, here held back 300 ms by a stalled copy, and returns at once
// when nothing is parked.
TEST_F(ResidencyTest, FirstTimeWorkWaitsUntilNoStreamIsParked) {
  on_device(6, [&] {
    configure(1 * kPage, 0, residency::Handshake::device);
    Slot* a = make_slot(6);
    Slot* b = make_slot(6);
    fill(a, 21);
    fill(b, 22);  // a leaves
    ASSERT_CU(cuStreamSynchronize(stream_));
    EXPECT_TRUE(residency::parks_streams());
    std::string why;
    // (a's first eviction made its copy graphs, first-time work too: it may have waited for b's
    // first map to land, so the count is read before each settle.)
    const uint64_t quiet = residency::stats().settle_waits;
    EXPECT_EQ(residency::settle("nothing parked", &why), CUDA_SUCCESS) << why;
    EXPECT_EQ(residency::stats().settle_waits, quiet);
    ASSERT_EQ(vaswapSimInjectFault("copy_stall", 1, 300), 0);
    residency::Acquired acquired;
    std::string message;
    const auto start = std::chrono::steady_clock::now();
    ASSERT_EQ(CUDA_SUCCESS, residency::acquire({a}, stream_, "a test launch", &acquired, &message));
    EXPECT_FALSE(acquired.host_waited);  // the stream is parked; the host went on
    const uint64_t before = residency::stats().settle_waits;
    EXPECT_EQ(residency::settle("a first launch", &why), CUDA_SUCCESS) << why;
    const double waited_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    EXPECT_GE(waited_ms, 250.0) << "settle returned before the stalled restore landed";
    EXPECT_EQ(residency::stats().settle_waits, before + 1);
    EXPECT_TRUE(mapped(a));
    auto* words = reinterpret_cast<uint32_t*>(a->va);
    ASSERT_CU(sim_kernels::launch_add(stream_, words, words, 1, kWords));
    residency::used(acquired);
    ASSERT_CU(cuStreamSynchronize(stream_));
    expect_holds(a, 22);
  });
}

// While first-time work waits in settle() for parked streams, other threads' restores park nothing
// new: they take the host path, so the parks drain however busy the other threads are (four
// threads capturing and launching on the H200 kept some stream parked past the wait limit). Here
// the settle waits for a's restore, whose room is held back 300 ms (c's eviction copy stalls); b's
// restore, decided meanwhile on another stream, takes the host path, and every slot holds its
// data after.
TEST_F(ResidencyTest, RestoresParkNothingWhileFirstTimeWorkSettles) {
  on_device(6, [&] {
    configure(1 * kPage, 0, residency::Handshake::device);
    Slot* a = make_slot(6);
    Slot* b = make_slot(6);
    Slot* c = make_slot(6);
    fill(a, 71);
    fill(b, 72);  // a leaves
    fill(c, 73);  // b leaves
    ASSERT_CU(cuStreamSynchronize(stream_));
    wait_mapped({a, b}, false);
    ASSERT_EQ(vaswapSimInjectFault("copy_stall", 1, 300), 0);  // the next copy: c's D2H
    residency::Acquired acquired;
    std::string message;
    ASSERT_EQ(CUDA_SUCCESS, residency::acquire({a}, stream_, "a test launch", &acquired, &message));
    EXPECT_FALSE(acquired.host_waited);  // stream_ is parked on a's restore
    residency::used(acquired);           // enqueued (nothing reads a here): a is not pinned
    std::string why;
    CUresult settled = CUDA_ERROR_UNKNOWN;
    double settled_ms = 0;
    std::thread first_time([&] {
      const auto start = std::chrono::steady_clock::now();
      settled = residency::settle("a first launch", &why);
      settled_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the settle is waiting
    const uint64_t before = residency::stats().host_path_restores;
    CUstream other = nullptr;
    ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    residency::Acquired for_b;
    ASSERT_EQ(CUDA_SUCCESS,
              residency::acquire({b}, other, "another thread's launch", &for_b, &message))
        << message;
    EXPECT_EQ(residency::stats().host_path_restores, before + 1)
        << "b's restore parked a stream while first-time work waited for none to be";
    residency::used(for_b);
    first_time.join();
    EXPECT_EQ(settled, CUDA_SUCCESS) << why;
    EXPECT_GE(settled_ms, 200.0) << "the settle did not wait for a's restore";
    EXPECT_LT(settled_ms, 2000.0);
    ASSERT_CU(cuStreamSynchronize(other));
    ASSERT_CU(cuStreamSynchronize(stream_));
    residency::stream_gone(other);
    ASSERT_CU(cuStreamDestroy(other));
    expect_holds(a, 71);
    expect_holds(b, 72);
    expect_holds(c, 73);
  });
}

// A settle that lets first-time work go (a module load, an instantiation, a first launch) can hold
// a Quiet until that work is done: meanwhile a restore parks no stream (it takes the host path),
// so no other thread parks one between the settle and the load, which on the H200 would wait for
// it. Once released, restores park streams again.
TEST_F(ResidencyTest, NoStreamIsParkedWhileSettledWorkRuns) {
  on_device(6, [&] {
    configure(2 * kPage, 0, residency::Handshake::device);
    Slot* a = make_slot(6);
    Slot* b = make_slot(6);
    Slot* c = make_slot(6);
    fill(a, 81);
    fill(b, 82);
    fill(c, 83);  // a leaves
    ASSERT_CU(cuStreamSynchronize(stream_));
    wait_mapped({a}, false);
    std::string why;
    residency::Quiet quiet;
    ASSERT_EQ(residency::settle("a module load", &why, &quiet), CUDA_SUCCESS) << why;
    EXPECT_TRUE(quiet.held());
    const uint64_t before = residency::stats().host_path_restores;
    std::string message;
    residency::Acquired for_a;  // b, the least recently used, leaves
    ASSERT_EQ(CUDA_SUCCESS,
              residency::acquire({a}, stream_, "a launch during the load", &for_a, &message))
        << message;
    EXPECT_EQ(residency::stats().host_path_restores, before + 1)
        << "a's restore parked a stream while settled first-time work held a Quiet";
    residency::used(for_a);
    quiet.release();
    EXPECT_FALSE(quiet.held());
    ASSERT_CU(cuStreamSynchronize(stream_));
    wait_mapped({b}, false);
    residency::Acquired for_b;  // c leaves; b's restore parks the stream again
    ASSERT_EQ(CUDA_SUCCESS,
              residency::acquire({b}, stream_, "a launch after the load", &for_b, &message))
        << message;
    EXPECT_EQ(residency::stats().host_path_restores, before + 1);
    EXPECT_FALSE(for_b.host_waited);
    EXPECT_EQ(for_b.waits, 1u);
    residency::used(for_b);
    ASSERT_CU(cuStreamSynchronize(stream_));
    expect_holds(b, 82);
    expect_holds(a, 81);
    expect_holds(c, 83);
  });
}

// A slot's copy graphs are first-time work too (instantiating one while a stream was parked spun in
// the H200's driver, holding a lock the mover needed): made at its first eviction, before that
// batch parks anything, once streams parked by earlier batches have landed. Here a's restore
// parks stream_ and is held back 300 ms (b's eviction copy stalls); then another thread's launch
// of d evicts c for the first time, and waits (settle_waits) until a's restore has landed. Every
// slot holds its data after, and c comes back through its graphs (no host-path restore).
TEST_F(ResidencyTest, AFirstEvictionMakesItsCopyGraphsOnceNoStreamIsParked) {
  on_device(6, [&] {
    configure(2 * kPage, 0, residency::Handshake::device);
    Slot* a = make_slot(6);
    Slot* b = make_slot(6);
    Slot* c = make_slot(6);
    Slot* d = make_slot(6);
    fill(a, 91);
    fill(b, 92);
    fill(c, 93);  // a leaves (its graphs made with nothing parked)
    ASSERT_CU(cuStreamSynchronize(stream_));
    wait_mapped({a}, false);
    ASSERT_EQ(vaswapSimInjectFault("copy_stall", 1, 300), 0);  // the next copy: b's D2H
    std::string message;
    residency::Acquired for_a;  // b leaves; a's restore waits for b's copy, stalled
    ASSERT_EQ(CUDA_SUCCESS, residency::acquire({a}, stream_, "a launch", &for_a, &message))
        << message;
    EXPECT_FALSE(for_a.host_waited);  // stream_ is parked on a's restore
    residency::used(for_a);
    const uint64_t waits = residency::stats().settle_waits;
    const uint64_t host_path = residency::stats().host_path_restores;
    CUstream other = nullptr;
    ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    const auto start = std::chrono::steady_clock::now();
    residency::Acquired for_d;  // c leaves for the first time, with data: its graphs first
    ASSERT_EQ(CUDA_SUCCESS, residency::acquire({d}, other, "another launch", &for_d, &message))
        << message;
    const double took_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(residency::stats().settle_waits, waits + 1)
        << "c's copy graphs were made while stream_ was parked";
    EXPECT_GE(took_ms, 200.0) << "the first eviction did not wait for a's restore";
    EXPECT_LT(took_ms, 5000.0);
    residency::used(for_d);
    ASSERT_CU(cuStreamSynchronize(other));
    ASSERT_CU(cuStreamSynchronize(stream_));
    expect_holds(a, 91);
    expect_holds(b, 92);
    expect_holds(c, 93);  // brought back through the graphs made at its first eviction
    EXPECT_EQ(residency::stats().host_path_restores, host_path);
    residency::stream_gone(other);
    ASSERT_CU(cuStreamDestroy(other));
  });
}

// A copy or memset is checked against its addresses when it is enqueued (as on the H200): the
// acquire for one returns only once the slot's pages are mapped again, and the copy, enqueued at
// once, reads the data back in full.
TEST_F(ResidencyTest, ACopyIsEnqueuedOnlyOnceItsPagesAreMapped) {
  auto [a, b] = one_evicted(13, 14);
  wait_mapped({a}, false);
  residency::Acquired acquired;
  std::string message;
  ASSERT_EQ(CUDA_SUCCESS, residency::acquire({a}, stream_, "a test copy", &acquired, &message,
                                             residency::Checked::when_enqueued));
  EXPECT_TRUE(mapped(a)) << "the copy is enqueued next: its address must be mapped now";
  EXPECT_EQ(acquired.demanded, 1u);
  std::vector<uint32_t> host(kWords, 0);
  ASSERT_CU(cuMemcpyDtoHAsync(host.data(), a->va, kPage, stream_));
  residency::used(acquired);
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_EQ(std::count(host.begin(), host.end(), 13u), static_cast<long>(kWords));
  EXPECT_FALSE(mapped(b)) << "b left for a (a budget of one page)";
}

// The default (auto) is the device handshake where it can work (device 6): the thread does not
// wait for the restore. Where it cannot, the host handshake stands in: device 1 has no stream
// memory operations, device 2 one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1); there the thread
// waits for the restore's submission, the stream for its event. The data comes back the same.
TEST_F(ResidencyTest, TheDefaultIsTheDeviceHandshakeAndTheHostOneWhereItCannotWork) {
  for (int device : {6, 1, 2}) {
    on_device(device, [&] {
      configure(1 * kPage, 0, residency::Handshake::automatic);
      if (device == 1) vaswapSimSetMemopsSupported(0);
      if (device == 2) setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1", 1);
      Slot* a = make_slot(device);
      vaswapSimSetMemopsSupported(1);
      unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
      Slot* b = make_slot(device);
      fill(a, 21);
      fill(b, 22);
      residency::Acquired acquired;
      std::string message;
      ASSERT_EQ(CUDA_SUCCESS,
                residency::acquire({a}, stream_, "a test launch", &acquired, &message));
      EXPECT_EQ(acquired.host_waited, device != 6) << "device " << device;
      EXPECT_EQ(acquired.waits, 1u);
      residency::used(acquired);
      expect_holds(a, 21);
      expect_holds(b, 22);
    });
  }
  EXPECT_TRUE(residency::stats().device_handshake);
}

// The device handshake and eager copies (the driver checks their addresses when they are
// enqueued): a copy into a slot whose pages are still to come waits for them once, and is made
// as a graph of its one node then. The same copy later, the slot away again and its eviction held
// (its last use behind a closed gate), is launched as that graph: the thread does not wait, the
// stream waits for the restore, and the slot ends up holding what was copied.
TEST_F(ResidencyTest, AnEagerCopyThatWaitedForPagesGoesAheadAsAGraphNextTime) {
  on_device(6, [&] {
    configure(2 * kPage, 0, residency::Handshake::device);
    Slot* a = make_slot(6);
    Slot* b = make_slot(6);
    Slot* c = make_slot(6);
    fill(a, 61);
    fill(b, 62);
    fill(c, 63);  // a leaves for c
    ASSERT_CU(cuStreamSynchronize(stream_));
    residency::EagerShape shape;
    shape.dst = a->va;
    shape.src = c->va;
    shape.count = kPage;
    const auto copy = [&](bool substitute_expected) {
      // b's last use waits behind a closed gate: b's eviction, which makes room for a, cannot end
      // before it opens.
      Gate gate;
      ASSERT_CU(cuLaunchHostFunc(stream_, Gate::wait_fn, &gate));
      ASSERT_EQ(CUDA_SUCCESS,
                use({b}, [&] { ASSERT_CU(cuMemsetD32Async(b->va, 66, kWords, stream_)); }));
      std::thread opener([&gate] {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        gate.release();
      });
      residency::Acquired acquired;
      std::string message;
      const CUresult rc = residency::acquire({a, c}, stream_, "a test copy", &acquired, &message,
                                             residency::Checked::when_enqueued, &shape);
      opener.join();
      ASSERT_EQ(CUDA_SUCCESS, rc) << message;
      EXPECT_EQ(acquired.substitute != nullptr, substitute_expected);
      if (acquired.substitute != nullptr) {
        ASSERT_CU(cuGraphLaunch(acquired.substitute, acquired.stream));
      } else {
        ASSERT_CU(cuMemcpyDtoDAsync(a->va, c->va, kPage, stream_));
      }
      residency::used(acquired);
      ASSERT_CU(cuStreamSynchronize(stream_));
    };
    const uint64_t before = residency::stats().map_waits;
    copy(false);  // waits for a's pages (b leaves): the graph is made
    EXPECT_EQ(residency::stats().map_waits, before + 1);
    expect_holds(a, 63);
    fill(b, 64);  // c leaves
    fill(c, 65);  // a leaves
    ASSERT_CU(cuStreamSynchronize(stream_));
    wait_mapped({a}, false);
    const uint64_t waits = residency::stats().map_waits;
    copy(true);
    EXPECT_EQ(residency::stats().map_waits, waits) << "the second copy waited for pages";
    expect_holds(a, 65);
    expect_holds(c, 65);
    expect_holds(b, 66);
  });
}

// The device handshake, asked for where it cannot work, is a named error before any slot is used:
// without stream memory operations (device 4), and with one hardware queue (device 5).
TEST_F(ResidencyTest, TheDeviceHandshakeWhereItCannotWorkIsANamedError) {
  EXPECT_EXIT(
      {
        bind_device(4);
        configure(1 * kPage, 0, residency::Handshake::device);
        vaswapSimSetMemopsSupported(0);
        make_slot(4);
        std::exit(0);
      },
      ::testing::ExitedWithCode(70),
      "residency.handshake is device, but stream memory operations are not available");
  EXPECT_EXIT(
      {
        bind_device(5);
        configure(1 * kPage, 0, residency::Handshake::device);
        setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1", 1);
        make_slot(5);
        std::exit(0);
      },
      ::testing::ExitedWithCode(70),
      "residency.handshake is device, but CUDA_DEVICE_MAX_CONNECTIONS=1");
}

// Slots on two devices, driven from one thread: each device's budget, streams and events are its
// own (DESIGN.md invariant 6).
TEST_F(ResidencyTest, TwoDevicesFromOneThreadKeepTheirOwnBudgets) {
  configure(1 * kPage);
  Slot* a0 = make_slot(0);
  Slot* b0 = make_slot(0);
  fill(a0, 31);
  bind_device(3);
  CUstream other = nullptr;
  ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  std::swap(other, stream_);
  Slot* a3 = make_slot(3);
  Slot* b3 = make_slot(3);
  fill(a3, 41);
  fill(b3, 42);  // a3 leaves device 3; nothing of device 0 moves
  std::swap(other, stream_);
  bind_device(0);
  fill(b0, 32);  // a0 leaves device 0
  expect_holds(a0, 31);
  std::swap(other, stream_);
  bind_device(3);
  expect_holds(a3, 41);
  expect_holds(b3, 42);
  std::swap(other, stream_);
  bind_device(0);
  ASSERT_CU(cuStreamDestroy(other));
  expect_holds(b0, 32);
}

// An eviction's copy that does not end is named, and whether it began: a stalled copy engine (the
// copy began) reads differently from a stream held back before the copy (it never began), which
// is what the device handshake's stall on the H200 needs told apart.
TEST_F(ResidencyTest, AStalledEvictionCopySaysWhetherItBegan) {
  EXPECT_EXIT(
      {
        configure_briefly(residency::Handshake::host);
        Slot* a = make_slot();
        fill(a, 1);
        ASSERT_CU(cuStreamSynchronize(stream_));
        vaswapSimInjectFault("copy_stall", 1, 5000);  // the next copy to run: a's D2H
        residency::evict({a}, "plan");                // no restore waits for its room: one watchdog
        std::this_thread::sleep_for(std::chrono::seconds(5));
        std::exit(0);
      },
      ::testing::ExitedWithCode(70), "D2H copy did not complete \\(it began\\)");
}

// A restore of a slot whose eviction has not unmapped yet calls the eviction off: the slot keeps
// its pages and its data, nothing is copied either way, and the launch that needs it does not wait
// for the eviction's device work (here its last use, held behind a closed gate on the stream for
// 2 s). Before, the restore waited for the eviction's D2H, unmap, a new map and an H2D, and the
// application's thread for all of it (issue 14: "submission waits for the same slot's release").
TEST_F(ResidencyTest, ARestoreBeforeTheUnmapCallsTheEvictionOff) {
  configure(4 * kPage);
  Slot* a = make_slot();
  fill(a, 41);
  Gate gate;
  ASSERT_CU(cuLaunchHostFunc(stream_, Gate::wait_fn, &gate));  // a's last use stays running
  residency::evict({a}, "plan");
  const vaswap_stats before = engine().stats();
  std::thread opener([&gate] {
    std::this_thread::sleep_for(std::chrono::seconds(2));
    gate.release();
  });
  const auto start = std::chrono::steady_clock::now();
  residency::Acquired acquired;
  std::string message;
  const CUresult rc = residency::acquire({a}, stream_, "a test launch", &acquired, &message);
  const double waited_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (rc == CUDA_SUCCESS) residency::used(acquired);
  opener.join();
  ASSERT_EQ(CUDA_SUCCESS, rc) << message;
  EXPECT_LT(waited_ms, 1000.0) << "the launch waited for the eviction's last use";
  EXPECT_EQ(residency::stats().reclaims, 1u);
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_TRUE(mapped(a));
  expect_holds(a, 41);
  const vaswap_stats after = engine().stats();
  EXPECT_EQ(after.bytes_offloaded, before.bytes_offloaded) << "the eviction's D2H ran";
  EXPECT_EQ(after.bytes_restored, before.bytes_restored) << "the slot was copied back";
}

// The program enabled device 0's access to device 3's memory (cudaDeviceEnablePeerAccess): its
// kernels may dereference device 3's slots, which no copy hook sees. Every slot of device 3 gets
// device 0's access: one mapped now, one away now (at its next map), and one made later.
TEST_F(ResidencyTest, PeerAccessEnabledReachesEverySlotOfThePeer) {
  configure(2 * kPage);
  Slot *a3 = nullptr, *b3 = nullptr, *c3 = nullptr;
  with_device(3, [&] {
    a3 = make_slot(3);
    b3 = make_slot(3);
    fill(a3, 71);
    fill(b3, 72);
    residency::evict({b3}, "plan");  // b3 is away when access is given
    ASSERT_CU(cuStreamSynchronize(stream_));
    wait_mapped({b3}, false);
  });
  CUdeviceptr plain = 0;  // device 0's own memory
  ASSERT_CU(cuMemAlloc(&plain, kPage));
  // Device 0's stream reads a3 directly, as its kernels would once peer access is on.
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoDAsync(plain, a3->va, kPage, stream_))
      << "device 0 reached device 3's slot before any access was given";
  EXPECT_EQ(engine().grant_device_access(3, 0), 1u) << "a3 mapped now; b3 away";
  ASSERT_CU(cuMemcpyDtoDAsync(plain, a3->va, kPage, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  with_device(3, [&] {
    expect_holds(b3, 72);  // b3 comes back: mapped with device 0's access
    c3 = engine().create_slot(3, kPage, /*intercepted=*/true, /*backed=*/true);
    ASSERT_CU(cuMemsetD32(c3->va, 73, kWords));
  });
  std::vector<uint32_t> host(kWords, 0);
  for (const auto& [slot, seed] : {std::pair<Slot*, uint32_t>{b3, 72}, {c3, 73}}) {
    ASSERT_CU(cuMemcpyDtoDAsync(plain, slot->va, kPage, stream_));
    ASSERT_CU(cuStreamSynchronize(stream_));
    ASSERT_CU(cuMemcpyDtoH(host.data(), plain, kPage));
    EXPECT_EQ(std::count(host.begin(), host.end(), seed), static_cast<long>(kWords));
  }
  engine().destroy_slot(c3);
  ASSERT_CU(cuMemFree(plain));
}

// The plan's moves at one position name slots of every device it planned (one plan per device):
// an eviction and a prefetch of a device-0 and a device-3 slot in one call move both (before,
// only the first slot's device was looked at, and device 3's moves were dropped).
TEST_F(ResidencyTest, PlannedMovesReachEveryDevice) {
  configure(4 * kPage);
  Slot* a3 = nullptr;
  with_device(3, [&] {
    a3 = make_slot(3);
    fill(a3, 91);
    ASSERT_CU(cuStreamSynchronize(stream_));
  });
  Slot* a0 = make_slot(0);
  fill(a0, 92);
  ASSERT_CU(cuStreamSynchronize(stream_));
  residency::evict({a0, a3}, "plan");
  wait_mapped({a0, a3}, false);
  residency::prefetch({a0, a3});
  wait_mapped({a0, a3}, true);
  expect_holds(a0, 92);
  with_device(3, [&] { expect_holds(a3, 91); });
}

// A copy recorded into a capture is checked against its addresses then: a peer copy's slots of
// both devices are mapped again before it is recorded, each on its own device (before, only the
// first slot's device was looked at, and the other device's slot stayed away: the capture failed).
TEST_F(ResidencyTest, ACapturedPeerCopyBacksTheSlotsOfBothDevices) {
  configure(2 * kPage);
  Slot* a3 = nullptr;
  with_device(3, [&] {
    a3 = make_slot(3);
    Slot* b3 = make_slot(3);
    fill(a3, 61);
    fill(b3, 62);
    residency::evict({a3}, "plan");  // a3 leaves device 3
    ASSERT_CU(cuStreamSynchronize(stream_));
    wait_mapped({a3}, false);
  });
  Slot* a0 = make_slot(0);
  std::string message;
  residency::Acquired held;
  ASSERT_EQ(CUDA_SUCCESS, residency::back_for_capture({a0, a3}, stream_, &held, &message))
      << message;
  EXPECT_TRUE(mapped(a0));
  EXPECT_TRUE(mapped(a3)) << "device 3's slot is still away";
  EXPECT_EQ(held.slots.size(), 2u);
  residency::used(held);
  with_device(3, [&] { expect_holds(a3, 61); });
}

// The slots a captured copy names stay pinned until the copy is recorded: room made for the next
// one evicts another slot, never them. Before, the oldest was taken (a restore short of room took
// a capture's source between its map and the driver's check, and the capture waited
// residency.wait_limit for a map that never came).
TEST_F(ResidencyTest, SlotsHeldForACapturedCopyAreNotEvictedUntilItIsRecorded) {
  configure(2 * kPage);
  Slot* a = make_slot();
  Slot* b = make_slot();
  Slot* c = make_slot();
  std::string message;
  residency::Acquired held_a, held_b, held_c;
  ASSERT_EQ(CUDA_SUCCESS, residency::back_for_capture({a}, stream_, &held_a, &message)) << message;
  ASSERT_EQ(CUDA_SUCCESS, residency::back_for_capture({b}, stream_, &held_b, &message)) << message;
  residency::used(held_b);  // b's copy is recorded; a's is not yet
  ASSERT_EQ(CUDA_SUCCESS, residency::back_for_capture({c}, stream_, &held_c, &message)) << message;
  EXPECT_TRUE(mapped(a)) << "the slot of a copy not yet recorded was evicted";
  EXPECT_TRUE(mapped(c));
  wait_mapped({b}, false);
  residency::used(held_a);
  residency::used(held_c);
}

// The eviction a restore calls off took the slot's last uses with it. Those still running on other
// streams are the slot's again: its next eviction waits for them (here a use on the first stream,
// gated, while the reclaiming launch ran on a second one). Without, the second eviction copied
// and unmapped under the running use.
TEST_F(ResidencyTest, AReclaimedEvictionKeepsTheLastUsesOfOtherStreams) {
  configure(4 * kPage);
  Slot* a = make_slot();
  fill(a, 81);
  Gate gate;
  ASSERT_CU(cuLaunchHostFunc(stream_, Gate::wait_fn, &gate));  // the use on stream_ stays running
  residency::evict({a}, "plan");
  CUstream first = stream_;
  CUstream second = nullptr;
  ASSERT_CU(cuStreamCreate(&second, CU_STREAM_NON_BLOCKING));
  stream_ = second;
  const uint64_t reclaims = residency::stats().reclaims;  // the process's count so far
  ASSERT_EQ(CUDA_SUCCESS, use({a}, [] {}));  // a launch on the second stream: the reclaim
  ASSERT_CU(cuStreamSynchronize(second));
  EXPECT_EQ(residency::stats().reclaims, reclaims + 1);
  residency::evict({a}, "plan");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(mapped(a)) << "the eviction unmapped while a use on the first stream still ran";
  gate.release();
  ASSERT_CU(cuStreamSynchronize(first));
  wait_mapped({a}, false);
  expect_holds(a, 81);
  stream_ = first;
  ASSERT_CU(cuStreamDestroy(second));
}

// Device handshake: a restore decided while the slot's eviction took the host path (its D2H not
// enqueued yet; here because its last use's mark cannot be recorded while the stream captures)
// takes the host path too. That eviction is then called off before its copy (a reclaim), and an
// H2D enqueued ahead would have copied the host copy of the eviction before, stale, over the
// slot's live data. Before, it did: a holds 31 at the end instead of 32 (the fault matrix saw a
// wrong checksum in CI, once, where the mover's evictions for room take the host path).
TEST_F(ResidencyTest, ARestoreAfterAHostPathEvictionDoesNotGoAhead) {
  on_device(6, [&] {
    configure(4 * kPage, 0, residency::Handshake::device);
    Slot* a = make_slot(6);
    fill(a, 31);
    residency::evict({a}, "plan");  // its first eviction: copy graphs made, the host copy holds 31
    wait_mapped({a}, false);
    fill(a, 32);  // back, then 32 written: that use's mark stays open on stream_
    ASSERT_CU(cuStreamSynchronize(stream_));
    const uint64_t reclaims = residency::stats().reclaims;
    capture_gate::beginning();  // a capture the preload did not see begin: the mark stays open
    ASSERT_CU(cuStreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_RELAXED));
    residency::evict({a}, "plan");  // the host path: its D2H waits for the mark
    CUgraph graph = nullptr;
    ASSERT_CU(cuStreamEndCapture(stream_, &graph));
    capture_gate::closed();
    ASSERT_CU(cuGraphDestroy(graph));
    // Back for a launch on another stream, before the eviction copied anything: called off.
    CUstream other = nullptr;
    ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    std::swap(other, stream_);
    std::vector<uint32_t> host(kWords, 0);
    ASSERT_EQ(CUDA_SUCCESS,
              use({a}, [&] { ASSERT_CU(cuMemcpyDtoHAsync(host.data(), a->va, kPage, stream_)); }));
    ASSERT_CU(cuStreamSynchronize(stream_));
    std::swap(other, stream_);
    residency::stream_gone(other);
    ASSERT_CU(cuStreamDestroy(other));
    EXPECT_EQ(residency::stats().reclaims, reclaims + 1) << "the eviction was not called off";
    EXPECT_EQ(std::count(host.begin(), host.end(), 32u), static_cast<long>(kWords))
        << "the restore copied the stale host copy over the live data (word 0 holds " << host[0]
        << ")";
    expect_holds(a, 32);
  });
}

// An eviction with nothing to copy (a slot mapped but never used, as cudaMalloc leaves one) needs
// no device work: it is unmapped at once, even while another eviction's copy holds the offload
// stream (stalled 2 s here). Before, it recorded its events on that stream behind the copy and
// waited for them; on the H200, with streams parked by the device handshake, such events never
// completed, and the restores counting on the slot's pages never landed.
TEST_F(ResidencyTest, AnEvictionWithNothingToCopyIsNotQueuedBehindCopies) {
  configure(4 * kPage);  // the host path: every eviction's copy goes on the offload stream
  Slot* a = make_slot();
  fill(a, 51);
  ASSERT_CU(cuStreamSynchronize(stream_));
  Slot* b = engine().create_slot(0, kPage, /*intercepted=*/true, /*backed=*/true);
  residency::adopt(b, true);
  slots_.push_back(b);
  ASSERT_TRUE(mapped(b));
  ASSERT_EQ(vaswapSimInjectFault("copy_stall", 1, 2000), 0);  // the next copy to run: a's D2H
  residency::evict({a}, "plan");
  const auto start = std::chrono::steady_clock::now();
  residency::evict({b}, "plan");
  wait_mapped({b}, false);
  const double waited_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(waited_ms, 1000.0) << "b's eviction waited behind a's stalled copy";
  EXPECT_TRUE(mapped(a)) << "a's copy was to hold the offload stream meanwhile";
  for (int i = 0; i < 5000 && mapped(a); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_FALSE(mapped(a));
  expect_holds(a, 51);
}

// Device handshake: evictions decided together whose copies wait for the same last uses go on one
// stream, one after the other, so that the first room comes after one copy rather than after all
// of them sharing the link (on the H200 the plan's releases at one position were on as many
// streams). One waiting for other uses goes on a stream of its own, so that it holds back no copy
// that could run (here every copy waits behind a closed gate on the program's stream). Each
// copy's trace event is placed when it ran: after the gate opened (before, the unmapper placed it
// counting back from when the eviction was queued, long before the copy ran).
TEST_F(ResidencyTest, EvictionsWaitingForTheSameUsesCopyOnOneStream) {
  configure(8 * kPage, 0, residency::Handshake::device);
  Slot* a = make_slot();
  Slot* b = make_slot();
  Slot* c = make_slot();
  const std::string path = open_trace("one_stream");
  Gate gate;
  ASSERT_CU(cuLaunchHostFunc(stream_, Gate::wait_fn, &gate));
  ASSERT_EQ(CUDA_SUCCESS, use({a, b}, [&] {
              ASSERT_CU(cuMemsetD32Async(a->va, 61, kWords, stream_));
              ASSERT_CU(cuMemsetD32Async(b->va, 62, kWords, stream_));
            }));
  residency::evict({a, b}, "plan");
  fill(c, 63);
  residency::evict({c}, "plan");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const uint64_t opened_ns = trace::now_ns();
  gate.release();
  wait_mapped({a, b, c}, false);
  trace::close();
  std::map<uint64_t, std::string> stream_of;  // slot -> its D2H's stream
  std::ifstream in(path);
  std::string line;
  // The text after `"key":` up to the next `,` or `}` (quotes dropped).
  const auto field = [&line](const std::string& key) {
    const size_t at = line.find("\"" + key + "\":");
    if (at == std::string::npos) return std::string();
    const size_t from = at + key.size() + 3;
    std::string value = line.substr(from, line.find_first_of(",}", from) - from);
    value.erase(std::remove(value.begin(), value.end(), '"'), value.end());
    return value;
  };
  while (std::getline(in, line)) {
    if (field("ev") != "d2h") continue;
    stream_of[std::stoull(field("slot"))] = field("stream");
    EXPECT_GE(std::stoull(field("t_ns")), opened_ns)
        << "a D2H placed before it could run: " << line;
  }
  std::remove(path.c_str());
  ASSERT_EQ(stream_of.size(), 3u) << "one D2H per slot";
  EXPECT_EQ(stream_of[a->id], stream_of[b->id]);
  EXPECT_NE(stream_of[c->id], stream_of[a->id]);
  expect_holds(a, 61);
  expect_holds(b, 62);
  expect_holds(c, 63);
}

// Device handshake: while an eviction with data waits to be enqueued on the host (its last use was
// on a stream that captured, so its mark could not be recorded), a restore does not go ahead: if
// it counted on that eviction's pages, a stream parked on it would wait for work enqueued after
// the park, which on the H200 did not run. It takes the host path (counted), and its data comes
// back whole.
TEST_F(ResidencyTest, ARestoreTakesTheHostPathWhileAnEvictionCannotGoAhead) {
  on_device(6, [&] {
    configure(4 * kPage, 0, residency::Handshake::device);
    Slot* a = make_slot(6);
    Slot* c = make_slot(6);
    fill(c, 61);
    residency::evict({c}, "plan");  // ahead: its copy graphs are made, its D2H enqueued now
    wait_mapped({c}, false);
    fill(a, 62);  // a's use on stream_: its mark stays open
    ASSERT_CU(cuStreamSynchronize(stream_));
    capture_gate::beginning();
    ASSERT_CU(cuStreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_RELAXED));
    residency::evict({a}, "plan");  // the host path: its D2H waits until the mark is recorded
    CUgraph graph = nullptr;
    ASSERT_CU(cuStreamEndCapture(stream_, &graph));
    capture_gate::closed();
    ASSERT_CU(cuGraphDestroy(graph));
    const uint64_t before = residency::stats().host_path_restores;
    CUstream other = nullptr;
    ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    std::swap(other, stream_);
    std::vector<uint32_t> host(kWords, 0);
    ASSERT_EQ(CUDA_SUCCESS,
              use({c}, [&] { ASSERT_CU(cuMemcpyDtoHAsync(host.data(), c->va, kPage, stream_)); }));
    ASSERT_CU(cuStreamSynchronize(stream_));
    std::swap(other, stream_);
    residency::stream_gone(other);
    ASSERT_CU(cuStreamDestroy(other));
    EXPECT_EQ(residency::stats().host_path_restores, before + 1)
        << "c's restore went ahead while a's eviction could not";
    EXPECT_EQ(std::count(host.begin(), host.end(), 61u), static_cast<long>(kWords));
    expect_holds(a, 62);  // a's use on stream_ is closed now: its eviction ends, a comes back
    expect_holds(c, 61);
  });
}

// The copy test (the planner's, before a device's first plan) runs while one of the program's
// streams is parked on the device (here on a flag written 1.5 s later). It waits for its own stream
// only: a context-wide synchronize at its end would wait for the parked stream, and under the
// device handshake that stream may wait for a restore that needs the very pages the test holds
// (the fault matrix's demo hung so under load, until the watchdog ended it).
TEST_F(ResidencyTest, TheCopyTestDoesNotWaitForAParkedStream) {
  // The stream stays parked this long. The copy test itself, nine rounds 12 ms apart of up to
  // 64 MiB each way, took 1009 ms under ThreadSanitizer in CI (the bound was 1000 ms of a
  // 1500 ms park); waiting for the stream would take the whole park.
  constexpr double kParkedMs = 4000;
  uint32_t* flag = nullptr;
  ASSERT_CU(cuMemHostAlloc(reinterpret_cast<void**>(&flag), 64, CU_MEMHOSTALLOC_PORTABLE));
  __atomic_store_n(flag, 0u, __ATOMIC_RELEASE);
  CUdeviceptr address = 0;
  ASSERT_CU(cuMemHostGetDevicePointer(&address, flag, 0));
  ASSERT_CU(cuStreamWaitValue32(stream_, address, 1, CU_STREAM_WAIT_VALUE_GEQ));
  std::thread writer([flag] {
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(kParkedMs)));
    __atomic_store_n(flag, 1u, __ATOMIC_RELEASE);
  });
  const auto start = std::chrono::steady_clock::now();
  const plan::Model model = planner::copy_test(0, plan::Model{1, 1, 1, "given"});
  const double waited_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  writer.join();
  ASSERT_CU(cuStreamSynchronize(stream_));
  ASSERT_CU(cuMemFreeHost(flag));
  EXPECT_LT(waited_ms, kParkedMs - 1000.0) << "the copy test waited for the parked stream";
  EXPECT_EQ(model.source, "measured");
  EXPECT_GT(model.h2d_gbps, 0.0);
  EXPECT_GT(model.d2h_gbps, 0.0);
}

// The device handshake: a slot freed while a stream waits for its restore, still queued behind
// another restore (held 3 s in cuMemMap), has its flag written by the free, so the stream and the
// free's own synchronize go on once the other restore lands (before, the mover skipped the freed
// slot's restore, nothing wrote its flag, and the free hung until the watchdog's exit 70).
TEST_F(ResidencyTest, AFreedSlotReleasesTheStreamsWaitingForItsRestore) {
  EXPECT_EXIT(
      {
        configure(2 * kPage, 0, residency::Handshake::device);
        with_device(6, [&] {
          Slot* a = make_slot(6);
          Slot* b = make_slot(6);
          fill(a, 101);
          fill(b, 102);
          residency::evict({a, b}, "plan");
          ASSERT_CU(cuStreamSynchronize(stream_));
          wait_mapped({a, b}, false);
          vaswapSimInjectFault("cuMemMap", 1, -3000);  // b's restore holds the mover
          for (Slot* slot : {b, a}) {
            residency::Acquired acquired;
            std::string message;
            ASSERT_EQ(CUDA_SUCCESS,
                      residency::acquire({slot}, stream_, "a test launch", &acquired, &message));
            residency::used(acquired);
          }
          residency::forget(a);  // the program frees a: its restore will not run
          ASSERT_CU(cuStreamSynchronize(stream_));
          expect_holds(b, 102);
        });
        std::exit(::testing::Test::HasFailure() ? 1 : 0);
      },
      ::testing::ExitedWithCode(0), "");
}

// The device handshake's watchdog: a stream parked on a restore's flag that is not written within
// residency.wait_limit ends the process with a named error, whatever holds the restore back (here
// the mover stuck 5 s in cuMemMap, which no other wait watches) and while the application's
// thread is blocked in the driver, synchronizing the parked stream. (On the H200, with 32
// hardware queues, such a run hung silently past its limit.) The message says where the mover's
// restore stands.
TEST_F(ResidencyTest, AStreamParkedPastTheLimitIsANamedErrorNotAHang) {
  EXPECT_EXIT(
      {
        configure_briefly(residency::Handshake::device);
        with_device(6, [&] {
          Slot* a = make_slot(6);
          Slot* b = make_slot(6);
          fill(a, 31);
          fill(b, 32);  // a leaves
          ASSERT_CU(cuStreamSynchronize(stream_));
          wait_mapped({a}, false);
          ASSERT_FALSE(::testing::Test::HasFailure());
          vaswapSimInjectFault("cuMemMap", 1, -5000);  // a's map, for its restore
          residency::Acquired acquired;
          std::string message;
          ASSERT_EQ(CUDA_SUCCESS,
                    residency::acquire({a}, stream_, "a test launch", &acquired, &message));
          auto* words = reinterpret_cast<uint32_t*>(a->va);
          ASSERT_CU(sim_kernels::launch_add(stream_, words, words, 1, kWords));
          residency::used(acquired);
          cuStreamSynchronize(stream_);  // blocked until the flag is written
        });
        std::exit(0);
      },
      ::testing::ExitedWithCode(70),
      "restore stream 0x[0-9a-f]+ has waited on the device \\(CUDA_ERROR_LAUNCH_TIMEOUT\\) for "
      "[0-9]+ ms \\(residency.wait_limit "
      "300 ms\\) for the pages of the restore of slot [0-9]+ on device 6.*the mover took it up "
      "and has not mapped the pages \\(mapping its pages, try [0-9]+\\).*invariant 12");
}

// A peer copy names slots of two devices: a copy on device 0's stream from device 3's slot, which
// is away, into a device-0 slot. Each device's slots come back on their own device, and the stream
// waits for both (before, device 3's slot was skipped as "another device's" and the copy read
// unmapped pages: a fault on the simulator, an error or garbage on a GPU). Device 0 needs access
// to device 3's pages (as the copy hook grants it: on two H200s the copy failed with
// cudaErrorInvalidValue without), and keeps it when those pages are evicted and mapped again.
TEST_F(ResidencyTest, APeerCopyBringsBackTheSlotsOfBothDevices) {
  configure(1 * kPage);
  Slot *a3 = nullptr, *b3 = nullptr;
  with_device(3, [&] {
    a3 = make_slot(3);
    b3 = make_slot(3);
    fill(a3, 51);
    fill(b3, 52);  // a3 leaves device 3
    ASSERT_CU(cuStreamSynchronize(stream_));
    wait_mapped({a3}, false);
  });
  Slot* a0 = make_slot(0);
  Slot* b0 = make_slot(0);
  fill(a0, 53);
  fill(b0, 54);  // a0 leaves device 0
  ASSERT_CU(cuStreamSynchronize(stream_));
  wait_mapped({a0}, false);
  // Device 0's stream copies a3 (device 3, away) into a0 (device 0, away).
  CUresult copied = CUDA_ERROR_UNKNOWN;
  ASSERT_EQ(CUDA_SUCCESS, use({a0, a3}, [&] {
              copied = cuMemcpyPeerAsync(a0->va, nullptr, a3->va, nullptr, kPage, stream_);
            }));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, copied) << "a copy without access to the peer's pages";
  ASSERT_EQ(CUDA_SUCCESS, use({a0, a3}, [&] {
              engine().grant_access(a3, 0);
              ASSERT_CU(cuMemcpyPeerAsync(a0->va, nullptr, a3->va, nullptr, kPage, stream_));
            }));
  ASSERT_CU(cuStreamSynchronize(stream_));
  expect_holds(a0, 51);
  EXPECT_EQ(uint64_t{1}, a3->peers.load());
  with_device(3, [&] {
    expect_holds(a3, 51);
    // a3 leaves device 3 and comes back for the next copy: device 0's access comes with its
    // pages.
    fill(b3, 55);
    ASSERT_CU(cuStreamSynchronize(stream_));
    wait_mapped({a3}, false);
  });
  ASSERT_EQ(CUDA_SUCCESS, use({b0, a3}, [&] {
              ASSERT_CU(cuMemcpyPeerAsync(b0->va, nullptr, a3->va, nullptr, kPage, stream_));
            }));
  ASSERT_CU(cuStreamSynchronize(stream_));
  expect_holds(b0, 51);
}

// A handshake that cannot complete (the stream an eviction waits for never gets there) becomes a
// named error and the end of the process, within residency.wait_limit: never a silent hang.
TEST_F(ResidencyTest, AStuckHandshakeIsANamedErrorNotAHang) {
  EXPECT_EXIT(
      {
        configure_briefly(residency::Handshake::host);
        Slot* a = make_slot();
        Slot* b = make_slot();
        fill(a, 1);
        Gate never;  // holds the stream: a's use never completes
        cuLaunchHostFunc(stream_, Gate::wait_fn, &never);
        fill(b, 2);  // a must leave after its use: its eviction waits forever
        std::this_thread::sleep_for(std::chrono::seconds(5));
        std::exit(0);
      },
      ::testing::ExitedWithCode(70), "slot [0-9]+ on device 0 .*invariant 12");
}

// Adds a copy node of 1 KiB from `va` to host memory to a fresh graph: the driver checks `va`.
CUresult add_copy_node(CUdeviceptr va) {
  static char host[1024];
  CUgraph graph = nullptr;
  if (cuGraphCreate(&graph, 0) != CUDA_SUCCESS) return CUDA_ERROR_UNKNOWN;
  const CUDA_MEMCPY3D copy = copy_params(va, host, sizeof host, /*to_host=*/true);
  CUgraphNode node = nullptr;
  CUcontext context = nullptr;
  cuCtxGetCurrent(&context);
  const CUresult rc = cuGraphAddMemcpyNode(&node, graph, nullptr, 0, &copy, context);
  cuGraphDestroy(graph);
  return rc;
}

// For driver calls that check addresses (a copy node added, a graph instantiated), slots without
// pages get a placeholder: one granule mapped at each of their granules, shared, gone after the
// call; their data stays where it was. Where the driver refuses the placeholder, a slot gets its
// own pages instead.
TEST_F(ResidencyTest, SlotsWithoutPagesGetOneSharedPlaceholderForAnAddressCheck) {
  configure(1 * kPage);
  Slot* away = make_slot();
  Slot* resident = make_slot();
  fill(away, 5);
  fill(resident, 6);  // evicts `away`
  ASSERT_CU(cuStreamSynchronize(stream_));
  Slot* large = engine().create_slot(0, 4 * kPage, /*intercepted=*/true, /*backed=*/false);
  residency::adopt(large, false);
  slots_.push_back(large);  // never used: no pages, no data
  ASSERT_FALSE(mapped(away));
  ASSERT_TRUE(mapped(resident));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, add_copy_node(away->va));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, add_copy_node(large->va));
  const unsigned long long before = vaswapSimPhysicalBytes(0);

  unsigned long long during = 0;
  CUresult checked = CUDA_ERROR_UNKNOWN;
  residency::with_pages({away, resident, large}, [&] {
    during = vaswapSimPhysicalBytes(0);
    checked = add_copy_node(away->va);
    if (checked == CUDA_SUCCESS) checked = add_copy_node(large->va + 3 * kPage);
    if (checked == CUDA_SUCCESS) checked = add_copy_node(resident->va);
  });
  EXPECT_CU_ERR(CUDA_SUCCESS, checked);
  EXPECT_EQ(before + kPage, during) << "one granule for both slots without pages (5 granules)";
  EXPECT_EQ(before, vaswapSimPhysicalBytes(0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, add_copy_node(away->va));

  // The placeholder's first map refused: `away` gets its own pages, `large` the placeholder.
  ASSERT_EQ(0, vaswapSimInjectFault("cuMemMap", 1, CUDA_ERROR_OUT_OF_MEMORY));
  checked = CUDA_ERROR_UNKNOWN;
  residency::with_pages({away, large}, [&] {
    during = vaswapSimPhysicalBytes(0);
    checked = add_copy_node(away->va);
    if (checked == CUDA_SUCCESS) checked = add_copy_node(large->va);
  });
  vaswapSimClearFaults();
  EXPECT_CU_ERR(CUDA_SUCCESS, checked);
  EXPECT_EQ(before + 2 * kPage, during) << "its own page and one granule of placeholder";
  EXPECT_EQ(before, vaswapSimPhysicalBytes(0));
  EXPECT_FALSE(mapped(away));
  expect_holds(away, 5);
  expect_holds(resident, 6);
}

}  // namespace
}  // namespace vaswap

namespace {

// Residency is one per process and nothing resets it (the devices it started, their threads, a
// device whose start failed a moment ago): each test here assumes a process of its own, as ctest
// runs them (gtest_discover_tests, one filter each). Run whole, without --gtest_filter, the binary
// runs each test in a child process of its own and says which failed; before, tests after the
// first that started device 1 failed on state another test had left.
int run_each_alone(char** argv) {
  std::vector<std::string> names;
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  for (int i = 0; i < unit.total_test_suite_count(); ++i) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(i);
    for (int j = 0; j < suite.total_test_count(); ++j) {
      names.push_back(std::string(suite.name()) + "." + suite.GetTestInfo(j)->name());
    }
  }
  std::vector<std::string> failed;
  for (const std::string& name : names) {
    std::fflush(stdout);
    const pid_t child = fork();
    if (child < 0) {
      std::perror("fork");
      return 1;
    }
    if (child == 0) {
      const std::string filter = "--gtest_filter=" + name;
      std::vector<char*> args = {argv[0], const_cast<char*>(filter.c_str()),
                                 const_cast<char*>("--gtest_brief=1"), nullptr};
      execv("/proc/self/exe", args.data());
      std::perror("execv");
      _exit(127);
    }
    int status = 0;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      failed.push_back(name);
    }
  }
  std::printf("%zu tests, each in a process of its own: %zu failed\n", names.size(), failed.size());
  for (const std::string& name : failed) std::printf("  FAILED %s\n", name.c_str());
  return failed.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Seven simulated devices of 64 MiB: device 1 and 2 for the default handshake, 3 for two devices
  // from one thread, 4 and 5 for the device handshake where it cannot work, 6 for it at work. Set
  // before the driver's cuInit reads them.
  setenv("VASWAP_SIM_DEVICES", "7", 1);
  setenv("VASWAP_SIM_DEVICE_MEMORY", "64MiB", 1);
  ::testing::InitGoogleTest(&argc, argv);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  if (GTEST_FLAG_GET(filter) == "*" && !GTEST_FLAG_GET(list_tests) && argc == 1) {
    return run_each_alone(argv);
  }
  return RUN_ALL_TESTS();
}
