#include "observe/registry.h"

#include <mutex>
#include <shared_mutex>

#include "base/errors.h"

namespace vaswap {

WriterPreferringLock::WriterPreferringLock() : lock_() {
  pthread_rwlockattr_t attr;
  pthread_rwlockattr_init(&attr);
  pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init(&lock_, &attr);
  pthread_rwlockattr_destroy(&attr);
}

WriterPreferringLock::~WriterPreferringLock() { pthread_rwlock_destroy(&lock_); }

std::map<uintptr_t, Region>::const_iterator RegionRegistry::containing(uintptr_t address) const {
  auto it = regions_.upper_bound(address);  // first region starting after `address`
  if (it == regions_.begin()) return regions_.end();
  --it;
  return address - it->first < it->second.bytes ? it : regions_.end();
}

bool RegionRegistry::insert(const Region& region, std::string* error) {
  if (region.bytes == 0 || region.base + region.bytes < region.base) {
    if (error != nullptr) {
      *error = "region at " + hex(region.base) + " of " + std::to_string(region.bytes) +
               " bytes is empty or wraps around the address space";
    }
    return false;
  }
  std::unique_lock<WriterPreferringLock> lock(mutex_);
  auto next = regions_.lower_bound(region.base);
  const bool hits_next = next != regions_.end() && next->first < region.base + region.bytes;
  const bool hits_previous = next != regions_.begin() &&
                             region.base - std::prev(next)->first < std::prev(next)->second.bytes;
  if (hits_next || hits_previous) {
    if (error != nullptr) {
      const Region& in_the_way = hits_previous ? std::prev(next)->second : next->second;
      *error = "region [" + hex(region.base) + ", " + hex(region.base + region.bytes) +
               ") overlaps the registered region [" + hex(in_the_way.base) + ", " +
               hex(in_the_way.base + in_the_way.bytes) + ")";
    }
    return false;
  }
  regions_.emplace_hint(next, region.base, region);
  return true;
}

std::optional<Region> RegionRegistry::erase(uintptr_t base) {
  std::unique_lock<WriterPreferringLock> lock(mutex_);
  auto it = regions_.find(base);
  if (it == regions_.end()) return std::nullopt;
  Region region = it->second;
  regions_.erase(it);
  return region;
}

std::optional<Region> RegionRegistry::find(uintptr_t address) const {
  std::shared_lock<WriterPreferringLock> lock(mutex_);
  auto it = containing(address);
  if (it == regions_.end()) return std::nullopt;
  return it->second;
}

std::vector<Region> RegionRegistry::overlapping(uintptr_t begin, uintptr_t end) const {
  std::vector<Region> out;
  if (end <= begin) return out;
  std::shared_lock<WriterPreferringLock> lock(mutex_);
  auto it = containing(begin);
  if (it == regions_.end()) it = regions_.lower_bound(begin);
  for (; it != regions_.end() && it->first < end; ++it) out.push_back(it->second);
  return out;
}

size_t RegionRegistry::size() const {
  std::shared_lock<WriterPreferringLock> lock(mutex_);
  return regions_.size();
}

}  // namespace vaswap
