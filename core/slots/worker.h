// A resident worker thread. Host callbacks enqueued on CUDA streams must not call CUDA
// (invariant 4: an unmap inside a callback deadlocks), so they only post() a job here; the worker
// makes the driver calls. The worker runs with its capture mode relaxed (invariant 5), so none of
// its calls can invalidate a capture that another thread of the application has open.
#pragma once

#include <cuda.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace vaswap {

struct Driver;

// Makes the calling thread one of vaswap's: named (for debuggers and the trace's tid), with
// `context` current, and its capture mode relaxed (invariant 5).
void become_worker(const Driver& driver, CUcontext context, const std::string& name);

class Worker {
 public:
  // Starts the thread; it makes `context` current before its first job.
  Worker(const Driver& driver, CUcontext context, const std::string& name);
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  ~Worker();

  // Queues a job. Safe from a host callback: it takes a mutex and signals, nothing else.
  void post(std::function<void()> job);

 private:
  void run(const Driver& driver, CUcontext context, const std::string& name);

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace vaswap
