#include "slots/device_costs.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace vaswap {

void DeviceCosts::note(int device, double value, Ring Device::*ring) {
  std::lock_guard<std::mutex> lock(mutex_);
  Ring& r = devices_[device].*ring;
  r.values[r.seen % kSamples] = value;
  ++r.seen;
}

void DeviceCosts::copied(int device, bool to_host, uint64_t bytes, double us) {
  if (bytes < kMinCopyBytes || !(us > 0)) return;
  note(device, static_cast<double>(bytes) / (us * 1e3),
       to_host ? &Device::d2h_gbps : &Device::h2d_gbps);
}

// The nearest rank: the smallest sample with at least `quantile` of them at or below it; `stall`
// above 0: of the samples at most `stall` times the median.
double DeviceCosts::quantile_of(const Ring& ring, double quantile, double stall) {
  const size_t seen = std::min(ring.seen, kSamples);
  std::vector<double> values(ring.values.begin(),
                             ring.values.begin() + static_cast<std::ptrdiff_t>(seen));
  if (stall > 0) {
    std::vector<double> sorted = values;
    const auto middle = sorted.begin() + static_cast<std::ptrdiff_t>(seen / 2);
    std::nth_element(sorted.begin(), middle, sorted.end());
    const double limit = stall * *middle;
    values.erase(
        std::remove_if(values.begin(), values.end(), [limit](double v) { return v > limit; }),
        values.end());
  }
  const size_t n = values.size();  // not empty: the median itself is kept
  const double rank = std::ceil(std::clamp(quantile, 0.0, 1.0) * static_cast<double>(n));
  const size_t k = std::max<size_t>(1, static_cast<size_t>(rank)) - 1;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(k), values.end());
  return values[k];
}

double DeviceCosts::remap_us(int device, double quantile) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = devices_.find(device);
  if (it == devices_.end()) return 0;
  const Device& d = it->second;
  if (d.maps.seen < kEnough || d.unmaps.seen < kEnough) return 0;
  return quantile_of(d.maps, quantile, kStall) + quantile_of(d.unmaps, quantile, kStall);
}

double DeviceCosts::gbps(int device, bool to_host, double quantile) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = devices_.find(device);
  if (it == devices_.end()) return 0;
  const Ring& r = to_host ? it->second.d2h_gbps : it->second.h2d_gbps;
  return r.seen < kEnough ? 0 : quantile_of(r, quantile);
}

}  // namespace vaswap
