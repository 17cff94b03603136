// The memory sampler (trace.memory_interval): cuMemGetInfo on a thread of its own, every
// interval, with each change of what the device has free written to the trace (`mem_sample`), so
// that a report can show device memory over time next to what vaswap moved.
#pragma once

#include <cuda.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "base/driver.h"

namespace vaswap {

class MemorySampler {
 public:
  // Samples `device` in `context` until destroyed.
  MemorySampler(const Driver& driver, CUcontext context, int device, uint64_t interval_ns);
  MemorySampler(const MemorySampler&) = delete;
  MemorySampler& operator=(const MemorySampler&) = delete;
  ~MemorySampler();

 private:
  void run(const Driver& driver, CUcontext context, int device, uint64_t interval_ns);

  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace vaswap
