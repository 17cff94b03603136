// Offload: the D2H burst (for vaswap_offload_after), one host callback after it, and the release
// worker that unmaps and releases the batch (invariants 3 and 4).
#include <algorithm>

#include "base/errors.h"
#include "base/log.h"
#include "base/trace.h"
#include "slots/engine.h"

namespace vaswap {

struct Engine::ReleaseJob {
  Engine* engine = nullptr;
  Device* device = nullptr;
  uint64_t batch = 0;
  std::vector<Slot*> slots;
  std::vector<SlotFacts> facts;  // for the trace: a slot may be destroyed once released
  CUstream stream = nullptr;
  uint64_t callback_ns = 0;          // when the stream reached the release point
  std::vector<CUevent> copy_events;  // offload: before the first D2H, then after each one
};

void CUDA_CB Engine::on_release_point(void* data) {
  // A host callback: no CUDA here (invariant 4). Stamp the time and hand over to the worker.
  auto* job = static_cast<ReleaseJob*>(data);
  job->callback_ns = trace::now_ns();
  job->device->release_worker->post([job] {
    job->engine->run_release(*job);
    delete job;
  });
}

void Engine::release_after(const std::vector<Slot*>& slots, CUstream stream) {
  start_release("vaswap_release_after", slots, {}, stream);
}

void Engine::offload_after(const std::vector<Slot*>& slots, const std::vector<void*>& hosts,
                           CUstream stream) {
  start_release("vaswap_offload_after", slots, hosts, stream);
}

void Engine::start_release(const char* call, const std::vector<Slot*>& slots,
                           const std::vector<void*>& hosts, CUstream stream) {
  auto job = std::make_unique<ReleaseJob>();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    checked_batch(slots, call);
    const std::string earlier = take_async_errors(slots);
    if (!earlier.empty()) fail(VASWAP_ERROR_CUDA, std::string(call) + ": " + earlier);
    for (Slot* slot : slots) {
      if (slot->handle == 0 || slot->release_pending || slot->remap != nullptr) {
        const char* why = slot->release_pending ? " already has a release pending"
                          : slot->remap != nullptr
                              ? " has a remap in flight; adopt or destroy the remap first"
                              : " is not mapped (released already); remap it before releasing it";
        fail(VASWAP_ERROR_INVALID_STATE, std::string(call) + ": " + slot->describe() + why);
      }
    }
    for (Slot* slot : slots) slot->release_pending = true;
  }
  job->engine = this;
  job->batch = next_id_.fetch_add(1);
  const uint64_t batch = job->batch;
  job->slots = slots;
  for (const Slot* slot : slots) job->facts.push_back(facts_of(*slot));
  job->stream = stream;
  uint64_t bytes = 0;
  try {
    Device& d = device_with_workers(slots[0]->device);
    job->device = &d;
    ContextScope scope(driver_, d.context);
    check_stream(d, stream, call);
    for (size_t i = 0; i < hosts.size(); ++i) check_host_buffer(*slots[i], hosts[i]);
    for (Slot* slot : slots) {
      // Invariant 3: the H2D that restored the slot must finish before the slot is read or
      // unmapped. The event only changes while the slot is reserved, so no lock is needed.
      if (slot->last_copy) {
        check(driver_.cuStreamWaitEvent(stream, slot->last_copy.get(), 0), "cuStreamWaitEvent",
              slot->describe());
      }
    }
    if (!hosts.empty()) {
      job->copy_events.assign(slots.size() + 1, nullptr);
      for (CUevent& event : job->copy_events) {
        check(driver_.cuEventCreate(&event, CU_EVENT_DEFAULT), "cuEventCreate",
              "a D2H timing event");
      }
      check(driver_.cuEventRecord(job->copy_events[0], stream), "cuEventRecord", "the D2H burst");
      for (size_t i = 0; i < slots.size(); ++i) {
        check(driver_.cuMemcpyDtoHAsync(hosts[i], slots[i]->va, slots[i]->bytes, stream),
              "cuMemcpyDtoHAsync", slots[i]->describe());
        check(driver_.cuEventRecord(job->copy_events[i + 1], stream), "cuEventRecord",
              slots[i]->describe());
        bytes += slots[i]->bytes;
      }
    }
    check(driver_.cuLaunchHostFunc(stream, &Engine::on_release_point, job.get()),
          "cuLaunchHostFunc", "the release point of " + slots[0]->describe() + "'s batch");
    // Owned by the callback from here on: its worker may finish and delete the job before this
    // function returns, so nothing below may touch it.
    static_cast<void>(job.release());
  } catch (...) {
    for (CUevent event : job->copy_events) {
      if (event != nullptr) driver_.cuEventDestroy(event);
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (Slot* slot : slots) slot->release_pending = false;
    }
    changed_.notify_all();
    throw;
  }
  if (trace::enabled()) {
    trace::Record(trace::Event::release_queued)
        .add("batch", batch)
        .add("slots", static_cast<uint64_t>(slots.size()))
        .add("d2h_bytes", bytes)
        .add("device", slots[0]->device)
        .hex("stream", stream_id(stream))
        .emit();
  }
}

void Engine::h2d_done(Device& d) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    --d.h2d_in_flight;
  }
  changed_.notify_all();
}

void Engine::run_release(ReleaseJob& job) {
  // The callback ran after the burst, so its events are complete: read their times without
  // waiting. A copy's start is placed on the host clock by counting back from the callback. Done
  // before any slot is marked released, so a D2H is in the trace (and the counters) before
  // anything can remap its slot.
  if (!job.copy_events.empty()) {
    float total_ms = 0;
    driver_.cuEventElapsedTime(&total_ms, job.copy_events.front(), job.copy_events.back());
    for (size_t i = 0; i < job.slots.size(); ++i) {
      float offset_ms = 0, copy_ms = 0;
      driver_.cuEventElapsedTime(&offset_ms, job.copy_events[0], job.copy_events[i]);
      driver_.cuEventElapsedTime(&copy_ms, job.copy_events[i], job.copy_events[i + 1]);
      const SlotFacts* slot = &job.facts[i];
      bytes_offloaded_.fetch_add(slot->bytes);
      device_costs_.copied(slot->device, true, slot->bytes, static_cast<double>(copy_ms) * 1e3);
      if (trace::enabled()) {
        const auto back_ns = static_cast<uint64_t>(std::max(0.0f, total_ms - offset_ms) * 1e6f);
        trace::Record(trace::Event::d2h)
            .at(job.callback_ns - std::min(back_ns, job.callback_ns))
            .add("slot", slot->id)
            .hex("va", slot->va)
            .add("bytes", static_cast<uint64_t>(slot->bytes))
            .add("device", slot->device)
            .hex("stream", stream_id(job.stream))
            .add("batch", job.batch)
            .add("dur_us", static_cast<double>(copy_ms) * 1e3)
            .emit();
      }
    }
    for (CUevent event : job.copy_events) driver_.cuEventDestroy(event);
    job.copy_events.clear();
  }
  {
    // Unmapping while vaswap's own H2D runs would halve that copy's bandwidth; the pages can
    // wait the few milliseconds until it completes (it does not depend on this release).
    std::unique_lock<std::mutex> lock(mutex_);
    wait_until(lock, [&] { return job.device->h2d_in_flight == 0; });
  }
  for (Slot* slot : job.slots) {
    // id, va, sizes and device never change; handle and last_copy are reserved by
    // release_pending, so they can be read here without the lock.
    const std::string subject = slot->describe();
    const uint64_t start = trace::now_ns();
    PageTimes times;
    try {
      unmap_pages(*job.device, slot->va, slot->mapped_bytes, slot->handle, subject, &times,
                  reuse_limit_.load());
    } catch (const Error& e) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        slot->release_pending = false;
        slot->async_error = std::string("the release of ") + subject + " failed: " + e.what() +
                            ". The slot keeps its pages and its contents";
      }
      changed_.notify_all();
      continue;
    }
    pages_released(facts_of(*slot), times, start,
                   BatchTiming{job.batch, 0, static_cast<double>(start - job.callback_ns) / 1e3});
    SharedEvent last_copy;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      slot->handle = 0;
      last_copy = std::move(slot->last_copy);
      slot->release_pending = false;
    }
    changed_.notify_all();
  }
}

}  // namespace vaswap
