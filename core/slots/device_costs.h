// What one device's VMM calls and copies have cost in this process, as vaswap made them: the last
// kSamples maps (cuMemCreate or a kept handle, cuMemMap, cuMemSetAccess), unmaps (cuMemUnmap,
// cuMemRelease), and copies each way (GB/s on the device's clock). The copy test measures on a
// device that may be busy with learning's copies, and maps on an idle one; the schedule needs
// what the link gives and what a map costs beside the run's copies (docs/PLANNER.md, "The model").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace vaswap {

class DeviceCosts {
 public:
  static constexpr size_t kSamples = 128;  // per device and kind: about the last few steps' worth
  static constexpr size_t kEnough = 16;    // fewer seen: no figure
  // Copies smaller than this measure the call's latency more than the link.
  static constexpr uint64_t kMinCopyBytes = uint64_t{8} << 20;

  void mapped(int device, double us) { note(device, us, &Device::maps); }
  void unmapped(int device, double us) { note(device, us, &Device::unmaps); }
  // A copy of `bytes` that took `us` on the device, to the host (D2H) or from it.
  void copied(int device, bool to_host, uint64_t bytes, double us);

  // The `quantile` (0..1) of the maps seen plus that of the unmaps: one region's map-and-unmap
  // cost as the run has been paying it. 0 while fewer than kEnough of either were seen. Stalls
  // are left out: a call that took more than kStall times the median of its kind waited for
  // something besides its own work, which a margin on every remap does not model (under a budget
  // the static demo's learning saw 14% of its unmaps take 10-30 ms beside host allocations and
  // on-demand restores, where the median took 50 us and the plan's own unmaps at most 0.34 ms;
  // bench/results/demo_budgets_session45_h100.md). A map beside a D2H (about 1 ms against 0.1-0.2
  // idle) is a cost, not a stall, and stays in.
  static constexpr double kStall = 20;
  double remap_us(int device, double quantile) const;
  // The `quantile` of the copies' speeds one way, in GB/s; 0 while fewer than kEnough were seen.
  double gbps(int device, bool to_host, double quantile) const;

 private:
  struct Ring {
    std::array<double, kSamples> values{};
    size_t seen = 0;  // ever; the next goes at seen % kSamples
  };
  struct Device {
    Ring maps, unmaps, d2h_gbps, h2d_gbps;
  };
  void note(int device, double value, Ring Device::*ring);
  static double quantile_of(const Ring& ring, double quantile, double stall = 0);

  mutable std::mutex mutex_;
  std::unordered_map<int, Device> devices_;
};

}  // namespace vaswap
