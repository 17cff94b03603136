// The region registry: every device allocation vaswap has seen, found from any address inside it.
//
// Readers (the hooks and, later, the launch scanner) ask on every call, so a lookup is a binary
// search under a shared lock; writers (allocation and free) take it exclusively. Each region
// records the capture it was made in, if any: PyTorch allocates graph-pool segments while a
// thread captures, and those are the regions a graph owns.
#pragma once

#include <pthread.h>
#include <cstdint>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace vaswap {

// The capture an allocation was made in, from the allocating thread's point of view.
struct CaptureTag {
  uint64_t thread = 0;    // Linux thread id of the capturing thread
  uintptr_t stream = 0;   // the capturing stream
  uint64_t sequence = 0;  // the capture's id (cuStreamGetCaptureInfo), unique in the process
  uint64_t ordinal = 0;   // 1 for the process's first capture (how rules name captures)
};

// runtime_malloc: cudaMalloc; driver_malloc: cuMemAlloc; stream_ordered: the cudaMallocAsync /
// cuMemAllocAsync families (tracked, never slots); slot: backed by a vaswap slot.
enum class RegionKind { runtime_malloc, driver_malloc, stream_ordered, slot };

struct Region {
  uintptr_t base = 0;
  size_t bytes = 0;
  int device = 0;
  RegionKind kind = RegionKind::runtime_malloc;
  std::optional<CaptureTag> capture;  // empty: not made during a capture
  void* slot = nullptr;               // the backing slot, for RegionKind::slot
};

// A reader-writer lock that lets a waiting writer in ahead of new readers. glibc's default (and
// std::shared_mutex) prefers readers: with lookups on every launch, an allocation could wait
// indefinitely (measured: 2000 inserts took 16 s against three reading threads).
class WriterPreferringLock {
 public:
  WriterPreferringLock();
  WriterPreferringLock(const WriterPreferringLock&) = delete;
  WriterPreferringLock& operator=(const WriterPreferringLock&) = delete;
  ~WriterPreferringLock();
  void lock() { pthread_rwlock_wrlock(&lock_); }
  void unlock() { pthread_rwlock_unlock(&lock_); }
  void lock_shared() { pthread_rwlock_rdlock(&lock_); }
  void unlock_shared() { pthread_rwlock_unlock(&lock_); }

 private:
  pthread_rwlock_t lock_;
};

class RegionRegistry {
 public:
  // Adds a region. Returns false, and changes nothing, when it overlaps one already registered
  // (a double registration is a bug in the caller; the error says which region is in the way).
  bool insert(const Region& region, std::string* error);
  // Removes the region that starts at `base`; returns it, or nothing if none starts there.
  std::optional<Region> erase(uintptr_t base);
  // The region containing `address` (its base, or any byte inside), if any.
  std::optional<Region> find(uintptr_t address) const;
  // Every region whose bytes intersect [begin, end).
  std::vector<Region> overlapping(uintptr_t begin, uintptr_t end) const;
  size_t size() const;

 private:
  // Under mutex_ (shared or exclusive): the region containing `address`, or regions_.end().
  std::map<uintptr_t, Region>::const_iterator containing(uintptr_t address) const;

  mutable WriterPreferringLock mutex_;
  std::map<uintptr_t, Region> regions_;  // by base; regions never overlap
};

}  // namespace vaswap
