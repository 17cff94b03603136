// Pinned host buffers for offload. Pinning costs milliseconds per call (cuMemHostAlloc), so a
// freed buffer is kept and handed out again for a request of the same rounded size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>

namespace vaswap {

struct Driver;

class HostPool {
 public:
  explicit HostPool(const Driver& driver) : driver_(driver) {}

  // A pinned, portable buffer of at least `bytes` (rounded up to 2 MiB). Throws Error.
  void* allocate(size_t bytes);
  // Returns a buffer from allocate(); throws INVALID_ARGUMENT for any other pointer.
  void release(void* host);

  uint64_t bytes_pinned();
  uint64_t bytes_in_use();

 private:
  const Driver& driver_;
  std::mutex mutex_;
  std::unordered_map<void*, size_t> in_use_;  // buffer -> rounded size
  std::multimap<size_t, void*> cached_;       // rounded size -> free buffer
  uint64_t bytes_pinned_ = 0;
  uint64_t bytes_in_use_ = 0;
};

}  // namespace vaswap
