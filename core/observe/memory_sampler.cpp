#include "observe/memory_sampler.h"

#include <chrono>

#include "base/errors.h"
#include "base/own_thread.h"
#include "base/trace.h"
#include "slots/engine.h"

namespace vaswap {

MemorySampler::MemorySampler(const Driver& driver, CUcontext context, int device,
                             uint64_t interval_ns)
    : thread_(start_thread([this, &driver, context, device, interval_ns] {
        run(driver, context, device, interval_ns);
      })) {}

MemorySampler::~MemorySampler() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void MemorySampler::run(const Driver& driver, CUcontext context, int device, uint64_t interval_ns) {
  driver.cuCtxSetCurrent(context);
  // Invariant 5: like every vaswap thread, never able to invalidate a global capture.
  CUstreamCaptureMode relaxed = CU_STREAM_CAPTURE_MODE_RELAXED;
  driver.cuThreadExchangeStreamCaptureMode(&relaxed);
  size_t last = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    size_t free_bytes = 0, total_bytes = 0;
    try {
      engine().note_memory();
    } catch (const Error&) {  // no engine: the samples alone
    }
    if (driver.cuMemGetInfo(&free_bytes, &total_bytes) == CUDA_SUCCESS && free_bytes != last &&
        trace::enabled()) {
      trace::Record(trace::Event::mem_sample)
          .add("device", device)
          .add("free", static_cast<uint64_t>(free_bytes))
          .add("total", static_cast<uint64_t>(total_bytes))
          .emit();
      last = free_bytes;
    }
    wake_.wait_for(lock, std::chrono::nanoseconds(interval_ns));
  }
}

}  // namespace vaswap
