#include "slots/host_pool.h"

#include <chrono>
#include <thread>

#include "base/driver.h"
#include "base/errors.h"
#include "base/trace.h"

namespace vaswap {

namespace {

// Pool sizes are rounded to the VMM granularity: slots come in these units, so a buffer freed by
// one slot fits the next slot of the same size exactly.
constexpr size_t kHostRounding = size_t{2} << 20;

}  // namespace

void* HostPool::allocate(size_t bytes) {
  if (bytes == 0) fail(VASWAP_ERROR_INVALID_ARGUMENT, "vaswap_host_alloc: bytes must be > 0");
  const size_t rounded = (bytes + kHostRounding - 1) / kHostRounding * kHostRounding;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = cached_.find(rounded);
    if (it != cached_.end()) {
      void* host = it->second;
      cached_.erase(it);
      in_use_[host] = rounded;
      bytes_in_use_ += rounded;
      return host;
    }
  }
  const uint64_t start = trace::now_ns();
  void* host = nullptr;
  // Pinning can fail for a moment (another process pinning, the kernel compacting): three tries
  // over ~20 ms before the failure is the caller's.
  CUresult rc = CUDA_SUCCESS;
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(4 << (2 * attempt)));
    const RelaxedCapture relaxed(driver_);  // an eviction decided while the thread captures
    rc = driver_.cuMemHostAlloc(&host, rounded, CU_MEMHOSTALLOC_PORTABLE);
    if (rc == CUDA_SUCCESS) break;
  }
  if (rc != CUDA_SUCCESS) {
    fail_driver(
        rc, cuda_failure("cuMemHostAlloc", rc, "a pinned host buffer of " + byte_size(rounded)) +
                "; free host memory or lower the offloaded bytes");
  }
  if (trace::enabled()) {
    trace::Record(trace::Event::host_alloc)
        .at(start)
        .add("bytes", static_cast<uint64_t>(rounded))
        .add("dur_us", static_cast<double>(trace::now_ns() - start) / 1e3)
        .hex("host", reinterpret_cast<uintptr_t>(host))
        .emit();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  in_use_[host] = rounded;
  bytes_in_use_ += rounded;
  bytes_pinned_ += rounded;
  return host;
}

void HostPool::release(void* host) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = in_use_.find(host);
  if (it == in_use_.end()) {
    fail(VASWAP_ERROR_INVALID_ARGUMENT,
         "vaswap_host_free: " + hex(reinterpret_cast<uintptr_t>(host)) +
             " is not a buffer from vaswap_host_alloc, or was freed already");
  }
  cached_.emplace(it->second, host);
  bytes_in_use_ -= it->second;
  in_use_.erase(it);
}

uint64_t HostPool::bytes_pinned() {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_pinned_;
}

uint64_t HostPool::bytes_in_use() {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_in_use_;
}

}  // namespace vaswap
