#include "slots/worker.h"

#include "base/driver.h"
#include "base/log.h"
#include "base/own_thread.h"

namespace vaswap {

Worker::Worker(const Driver& driver, CUcontext context, const std::string& name)
    : thread_(start_thread([this, &driver, context, name] { run(driver, context, name); })) {}

Worker::~Worker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void Worker::post(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back(std::move(job));
  }
  wake_.notify_one();
}

void become_worker(const Driver& driver, CUcontext context, const std::string& name) {
  become_own_thread(name);
  CUresult rc = driver.cuCtxSetCurrent(context);
  if (rc != CUDA_SUCCESS) {
    log().error("worker {}: cuCtxSetCurrent failed with {}", name, cuda_error_name(rc));
  }
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  rc = driver.cuThreadExchangeStreamCaptureMode(&mode);
  if (rc != CUDA_SUCCESS) {
    log().error("worker {}: cuThreadExchangeStreamCaptureMode failed with {}", name,
                cuda_error_name(rc));
  }
}

void Worker::run(const Driver& driver, CUcontext context, const std::string& name) {
  become_worker(driver, context, name);
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stop_ with nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

}  // namespace vaswap
