#include "plan/copy_test.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <thread>

#include "base/driver.h"
#include "base/errors.h"
#include "base/log.h"
#include "base/trace.h"
#include "slots/engine.h"

namespace vaswap::planner {

namespace {

// One region of at most this size each way, kRounds times (the first warms the path); less when
// the device is short of memory, at least one page.
constexpr size_t kBytes = size_t{64} << 20;
constexpr size_t kMinBytes = size_t{2} << 20;
// The program's copies and vaswap's own may share the link while the test runs (under the device
// handshake the program is ahead of the device, and restores are in flight): each figure is the
// best of the rounds after the first, as sharing only slows them. One H200 run measured 28 GB/s
// H2D and a 58 ms remap in a single round, where the link gives 54 GB/s and a remap 0.3 ms, and
// planned no window at all. Three rounds one after another were not enough either: learning's
// restores and evictions, made at its launches, shared all three in 6 of 16 runs of the
// per-layer PyTorch job (2026-12-04: 18-36 GB/s one way, against 46-55), and those runs planned
// for a slow link: fewer windows, restores on demand, the step up to 4 ms slower
// (bench/results/copy_test_spread_h200.md). So the rounds are spread over about 100 ms, kPause
// apart, and the best of eight counts.
constexpr int kRounds = 9;
constexpr auto kPause = std::chrono::milliseconds(12);
// When nothing could be measured and the policy gives no figures: a PCIe 3 x16 link's, which
// every current system beats, so the plan errs towards starting restores early.
constexpr double kFallbackGbps = 12;

}  // namespace

plan::Model copy_test(int device, const plan::Model& given) {
  const Driver& driver = *load_driver(nullptr);
  Engine& e = engine();
  plan::Model m{0, 0, 0, "measured"};
  Slot* slot = nullptr;
  void* host = nullptr;
  CUstream stream = nullptr;
  CUevent events[3] = {};
  size_t bytes = kBytes;
  try {
    ContextScope scope(driver, e.context(device));
    size_t free_bytes = 0, total_bytes = 0;
    if (driver.cuMemGetInfo(&free_bytes, &total_bytes) == CUDA_SUCCESS) {
      bytes = std::max(kMinBytes, std::min(bytes, free_bytes / 4 / kMinBytes * kMinBytes));
    }
    // Quietly: under memory pressure the test may not fit, and the plan then uses other figures.
    slot = e.create_slot(device, bytes, /*intercepted=*/false, /*backed=*/true, /*report=*/false);
    host = e.host_alloc(bytes);
    const CUresult made = driver.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING);
    if (made != CUDA_SUCCESS) {
      stream = nullptr;
      fail_driver(made, cuda_failure("cuStreamCreate", made, "the copy test's stream"));
    }
    for (CUevent& event : events) {
      const CUresult rc = driver.cuEventCreate(&event, CU_EVENT_DEFAULT);
      if (rc != CUDA_SUCCESS) {
        event = nullptr;
        fail_driver(rc, cuda_failure("cuEventCreate", rc, "the copy test's timing"));
      }
    }
    double d2h_us = 0, h2d_us = 0;
    for (int round = 0; round < kRounds; ++round) {
      if (round > 1) std::this_thread::sleep_for(kPause);
      driver.cuEventRecord(events[0], stream);
      driver.cuMemcpyDtoHAsync(host, slot->va, bytes, stream);
      driver.cuEventRecord(events[1], stream);
      driver.cuMemcpyHtoDAsync(slot->va, host, bytes, stream);
      driver.cuEventRecord(events[2], stream);
      const CUresult rc = driver.cuEventSynchronize(events[2]);
      if (rc != CUDA_SUCCESS) {
        fail_driver(rc, cuda_failure("cuEventSynchronize", rc, "the copy test's copies"));
      }
      if (round == 0) continue;
      const double d2h = elapsed_us(driver, events[0], events[1]);
      const double h2d = elapsed_us(driver, events[1], events[2]);
      if (d2h > 0 && (d2h_us == 0 || d2h < d2h_us)) d2h_us = d2h;
      if (h2d > 0 && (h2d_us == 0 || h2d < h2d_us)) h2d_us = h2d;
    }
    for (int round = 1; round < 4; ++round) {  // three maps: a remap is not shared as a copy is
      const uint64_t start = trace::now_ns();
      e.unback(slot, std::nullopt);
      e.back(slot, std::nullopt, /*report=*/false);
      const double remap = trace::us_since(start);
      if (m.remap_us == 0 || remap < m.remap_us) m.remap_us = remap;
    }
    m.d2h_gbps = d2h_us > 0 ? static_cast<double>(bytes) / (d2h_us * 1e3) : 0;
    m.h2d_gbps = h2d_us > 0 ? static_cast<double>(bytes) / (h2d_us * 1e3) : 0;
  } catch (const Error& error) {
    log().info("the copy test could not run ({}); planning with the policy's numbers",
               error.what());
    m.source = "measured (failed)";
  }
  for (CUevent event : events) {
    if (event != nullptr) driver.cuEventDestroy(event);
  }
  // Only the test's own stream touched the slot. A context-wide synchronize would also wait for
  // the program's streams, and under the device handshake one may be parked on a restore that
  // waits for the very pages this slot holds (the fault matrix's demo hung so, under load).
  bool idle = true;
  if (stream != nullptr) {
    idle = driver.cuStreamSynchronize(stream) == CUDA_SUCCESS;
    driver.cuStreamDestroy(stream);
  }
  if (host != nullptr) e.host_free(host);
  if (slot != nullptr) {
    try {
      e.destroy_slot(slot, /*device_idle_for_it=*/idle);
    } catch (const Error& error) {
      log().warn("the copy test's slot: {}", error.what());
    }
  }
  if (m.h2d_gbps <= 0 || m.d2h_gbps <= 0) {
    // Nothing measured: the policy's numbers, or a slow link's.
    m = given;
    m.source = "given (copy test failed)";
    if (m.h2d_gbps <= 0 || m.d2h_gbps <= 0) {
      m = plan::Model{kFallbackGbps, kFallbackGbps, 1000, "fallback (copy test failed)"};
    }
  }
  return m;
}

}  // namespace vaswap::planner
