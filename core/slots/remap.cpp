// Restore: remap at the same address (and copy back) on the remap worker, the waits that order a
// stream after it, adoption of the new pages by their slots, and cleanup of a remap.
#include <algorithm>
#include <chrono>

#include "base/errors.h"
#include "base/log.h"
#include "base/trace.h"
#include "slots/engine.h"

namespace vaswap {

namespace {

// Per kind: the C call that submits it, and its name in the trace.
struct KindNames {
  const char* call;
  const char* trace;
};

KindNames names_of(RemapKind kind) {
  switch (kind) {
    case RemapKind::remap_only: return {"vaswap_remap_after", "remap_only"};
    case RemapKind::copy: return {"vaswap_remap_and_copy_after", "copy"};
    case RemapKind::deferred: return {"vaswap_remap_deferred_after", "deferred"};
  }
  return {"vaswap_remap", "?"};
}

}  // namespace

// H2D copies whose completion the completion worker waits for.
struct Engine::CopiesDone {
  Engine* engine = nullptr;
  RemapBatch* batch = nullptr;
  std::vector<size_t> indices;
  uint64_t done_ns = 0;
};

void CUDA_CB Engine::on_remap_point(void* data) {
  auto* batch = static_cast<RemapBatch*>(data);  // no CUDA here (invariant 4)
  batch->device->remap_worker->post([batch] { engine().run_remap(*batch); });
}

SharedEvent Engine::make_event(unsigned flags, const std::string& subject) {
  CUevent event = nullptr;
  check(driver_.cuEventCreate(&event, flags), "cuEventCreate", subject);
  const Driver* driver = &driver_;
  return SharedEvent(event, [driver](CUevent e) { driver->cuEventDestroy(e); });
}

// =============================================================================================
// Submission
// =============================================================================================

RemapBatch* Engine::remap_after(RemapKind kind, const std::vector<Slot*>& slots,
                                const std::vector<void*>& hosts, CUstream stream) {
  return submit_remap(kind, slots, hosts, stream, nullptr);
}

RemapBatch* Engine::remap_when(const std::vector<Slot*>& slots, const std::vector<void*>& hosts,
                               CUevent after) {
  return submit_remap(RemapKind::copy, slots, hosts, nullptr, after);
}

// `stream` null: no remap point; the job goes to the worker at once.
RemapBatch* Engine::submit_remap(RemapKind kind, const std::vector<Slot*>& slots,
                                 const std::vector<void*>& hosts, CUstream stream, CUevent after) {
  const char* call = names_of(kind).call;
  auto batch = std::make_unique<RemapBatch>();
  batch->id = next_id_.fetch_add(1);
  batch->kind = kind;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    checked_batch(slots, call);
    const std::string earlier = take_async_errors(slots);
    if (!earlier.empty()) fail(VASWAP_ERROR_CUDA, std::string(call) + ": " + earlier);
    for (Slot* slot : slots) {
      if (slot->remap != nullptr) {
        fail(VASWAP_ERROR_INVALID_STATE, std::string(call) + ": " + slot->describe() +
                                             " already has a remap in flight (remap " +
                                             std::to_string(slot->remap->id) +
                                             "); adopt or destroy it first");
      }
      if (slot->handle != 0 && !slot->release_pending) {
        fail(VASWAP_ERROR_INVALID_STATE,
             std::string(call) + ": " + slot->describe() +
                 " is still mapped and has no release pending; release it first "
                 "(vaswap_release_after or vaswap_offload_after)");
      }
    }
    for (size_t i = 0; i < slots.size(); ++i) {
      RemapEntry entry;
      entry.slot = slots[i];
      entry.slot_id = slots[i]->id;
      entry.va = slots[i]->va;
      entry.bytes = slots[i]->bytes;
      entry.mapped_bytes = slots[i]->mapped_bytes;
      entry.host = kind == RemapKind::remap_only ? nullptr : hosts[i];
      batch->entries.push_back(std::move(entry));
    }
    for (Slot* slot : slots) slot->remap = batch.get();
    remaps_.insert(batch.get());
  }
  try {
    Device& d = device_with_workers(slots[0]->device);
    batch->device = &d;
    batch->after = after;
    after = nullptr;  // the batch owns it now
    ContextScope scope(driver_, d.context);
    if (stream != nullptr) check_stream(d, stream, call);
    if (kind != RemapKind::remap_only) {
      for (size_t i = 0; i < slots.size(); ++i) check_host_buffer(*slots[i], hosts[i]);
    }
    for (RemapEntry& entry : batch->entries) {
      const std::string subject = "the remap of slot " + std::to_string(entry.slot_id);
      entry.copied = make_event(CU_EVENT_DISABLE_TIMING, subject);
      if (kind != RemapKind::remap_only) {
        check(driver_.cuEventCreate(&entry.start, CU_EVENT_DEFAULT), "cuEventCreate", subject);
        check(driver_.cuEventCreate(&entry.end, CU_EVENT_BLOCKING_SYNC), "cuEventCreate", subject);
      }
      if (kind == RemapKind::deferred) {
        check(driver_.cuEventCreate(&entry.ready, CU_EVENT_DISABLE_TIMING), "cuEventCreate",
              subject);
      }
    }
    batch->outstanding = 1;  // the worker's run
    batch->queued_ns = trace::now_ns();
    if (stream != nullptr) {
      check(driver_.cuLaunchHostFunc(stream, &Engine::on_remap_point, batch.get()),
            "cuLaunchHostFunc", "the remap point of remap " + std::to_string(batch->id));
    } else {
      RemapBatch* job = batch.get();
      d.remap_worker->post([job] { engine().run_remap(*job); });
    }
  } catch (...) {
    if (after != nullptr) driver_.cuEventDestroy(after);
    if (batch->after != nullptr) driver_.cuEventDestroy(batch->after);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (Slot* slot : slots) slot->remap = nullptr;
      remaps_.erase(batch.get());
    }
    changed_.notify_all();
    for (RemapEntry& entry : batch->entries) {
      for (CUevent event : {entry.start, entry.end, entry.ready}) {
        if (event != nullptr) driver_.cuEventDestroy(event);
      }
    }
    throw;
  }
  if (trace::enabled()) {
    uint64_t bytes = 0;
    for (const RemapEntry& entry : batch->entries) bytes += entry.bytes;
    trace::Record(trace::Event::remap_queued)
        .add("batch", batch->id)
        .add("kind", names_of(kind).trace)
        .add("slots", static_cast<uint64_t>(slots.size()))
        .add("bytes", bytes)
        .add("device", slots[0]->device)
        .hex("stream", stream_id(stream))
        .emit();
  }
  return batch.release();
}

// =============================================================================================
// The remap worker
// =============================================================================================

// Two phases, because VMM calls made while an H2D copy runs halve that copy's bandwidth on the
// H200 (D2H is unaffected; bench/vmm_interference.cu, docs/PERFORMANCE.md): first wait until no
// vaswap H2D is in flight on the device and map every slot of the batch, then submit all copies.
void Engine::run_remap(RemapBatch& batch) {
  Device& d = *batch.device;
  std::vector<std::string> errors(batch.entries.size());
  std::vector<CUmemGenericAllocationHandle> handles(batch.entries.size(), 0);
  if (batch.after != nullptr) {
    // Pages are never visible before their data arrives (DESIGN.md invariant 10): map only once
    // the stream reached the point the copies wait for, then copy at once. Mapped any earlier, a
    // reader vaswap did not see would read fresh pages instead of faulting.
    const CUresult rc = driver_.cuEventSynchronize(batch.after);
    if (rc != CUDA_SUCCESS) {
      log().warn("{}; the pages of remap {} are mapped now",
                 cuda_failure("cuEventSynchronize", rc, "the restore point"), batch.id);
    }
  }
  {
    std::unique_lock<std::mutex> lock(mutex_);
    wait_until(lock, [&] { return d.h2d_in_flight == 0; });
  }
  for (size_t i = 0; i < batch.entries.size(); ++i) {
    RemapEntry& entry = batch.entries[i];
    const uint64_t wait_start = trace::now_ns();
    std::string subject;
    std::string not_released;
    uint64_t peers = 0;
    {
      // The slot may have been offloaded by a release still queued on another stream.
      std::unique_lock<std::mutex> lock(mutex_);
      wait_until(lock, [&] { return !entry.slot->release_pending; });
      subject = entry.slot->describe();
      peers = entry.slot->peers.load(std::memory_order_acquire);
      if (entry.slot->handle != 0) {
        not_released = entry.slot->async_error.empty() ? "it was not released"
                                                       : std::move(entry.slot->async_error);
        entry.slot->async_error.clear();
      }
    }
    const double wait_us = trace::us_since(wait_start);
    const uint64_t start = trace::now_ns();
    PageTimes times;
    try {
      if (!not_released.empty()) {
        std::string message = subject;
        message.append(" still holds its pages: ").append(not_released);
        fail(VASWAP_ERROR_INVALID_STATE, message);
      }
      handles[i] = map_pages(d, entry.va, entry.mapped_bytes, subject, &times, peers);
    } catch (const Error& e) {
      errors[i] = std::string(e.what()) +
                  ". Nothing is lost: the host copy is untouched; destroy this remap and submit "
                  "the slot again";
      continue;
    }
    const SlotFacts facts{entry.slot_id, entry.va, entry.bytes, entry.mapped_bytes, d.ordinal};
    pages_mapped(
        facts, times, start,
        BatchTiming{batch.id, wait_us, static_cast<double>(start - batch.queued_ns) / 1e3});
    if (batch.kind == RemapKind::deferred) {  // launch_h2d may go ahead with this slot now
      {
        std::lock_guard<std::mutex> lock(mutex_);
        entry.handle = handles[i];
        entry.mapped = true;
      }
      changed_.notify_all();
    }
  }

  std::vector<size_t> copies;
  if (batch.after != nullptr && batch.kind == RemapKind::copy) {
    // The copies start no earlier than the point the planner chose on the launching stream.
    const CUresult rc = driver_.cuStreamWaitEvent(d.copy_stream, batch.after, 0);
    if (rc != CUDA_SUCCESS) {
      log().warn("{}; the copies of remap {} start at once",
                 cuda_failure("cuStreamWaitEvent", rc, "the copy stream"), batch.id);
    }
  }
  for (size_t i = 0; i < batch.entries.size(); ++i) {
    RemapEntry& entry = batch.entries[i];
    if (handles[i] == 0 || batch.kind == RemapKind::deferred) continue;
    const std::string subject =
        "slot " + std::to_string(entry.slot_id) + " (va " + hex(entry.va) + ")";
    try {
      if (batch.kind == RemapKind::copy) {
        entry.copy_stream = d.copy_stream;
        check(driver_.cuEventRecord(entry.start, d.copy_stream), "cuEventRecord", subject);
        check(driver_.cuMemcpyHtoDAsync(entry.va, entry.host, entry.bytes, d.copy_stream),
              "cuMemcpyHtoDAsync", subject);
        check(driver_.cuEventRecord(entry.end, d.copy_stream), "cuEventRecord", subject);
        copies.push_back(i);
      }
      check(driver_.cuEventRecord(entry.copied.get(), d.copy_stream), "cuEventRecord", subject);
    } catch (const Error& e) {
      errors[i] = std::string(e.what()) +
                  ". Nothing is lost: the host copy is untouched; destroy this remap and submit "
                  "the slot again";
    }
  }
  if (!copies.empty()) track_copies(batch, copies);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < batch.entries.size(); ++i) {
      RemapEntry& entry = batch.entries[i];
      entry.handle = handles[i];
      entry.mapped = handles[i] != 0;
      entry.failed = !errors[i].empty();
      entry.error = std::move(errors[i]);
      if (batch.kind != RemapKind::deferred && !entry.failed) entry.submitted = true;
    }
    batch.worker_done = true;
    --batch.outstanding;
  }
  changed_.notify_all();
}

// Counts the copies as vaswap H2D in flight on the device until they complete; the completion
// worker waits on the last copy's event (a blocking-sync event: the thread sleeps), then reads
// their times. Not a host callback: the driver runs host callbacks of all streams one at a time
// in submission order, so a callback behind the copies on this stream could wait for another
// stream's callback, and stall copies queued after it (seen on the H200: an offload and a
// restore on two streams ran one after the other).
void Engine::track_copies(RemapBatch& batch, std::vector<size_t> indices) {
  auto* done = new CopiesDone{this, &batch, std::move(indices), 0};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++batch.outstanding;
    ++batch.device->h2d_in_flight;
  }
  batch.device->completion_worker->post([done] {
    Engine& e = *done->engine;
    const RemapEntry& last = done->batch->entries[done->indices.back()];
    const CUresult rc = e.driver_.cuEventSynchronize(last.end);
    done->done_ns = trace::now_ns();
    if (rc != CUDA_SUCCESS) {
      log().error("{}", cuda_failure("cuEventSynchronize", rc,
                                     "the H2D of remap " + std::to_string(done->batch->id)));
    }
    e.h2d_done(*done->batch->device);
    e.collect_copies(*done);
    delete done;
  });
}

void Engine::collect_copies(const CopiesDone& done) {
  RemapBatch& batch = *done.batch;
  const RemapEntry& last = batch.entries[done.indices.back()];
  for (const size_t i : done.indices) {
    const RemapEntry& entry = batch.entries[i];
    float copy_ms = 0, to_end_ms = 0;
    driver_.cuEventElapsedTime(&copy_ms, entry.start, entry.end);
    driver_.cuEventElapsedTime(&to_end_ms, entry.start, last.end);
    bytes_restored_.fetch_add(entry.bytes);
    device_costs_.copied(batch.device->ordinal, false, entry.bytes,
                         static_cast<double>(copy_ms) * 1e3);
    if (trace::enabled()) {
      const auto back_ns = static_cast<uint64_t>(std::max(0.0f, to_end_ms) * 1e6f);
      trace::Record(trace::Event::h2d)
          .at(done.done_ns - std::min(back_ns, done.done_ns))
          .add("slot", entry.slot_id)
          .hex("va", entry.va)
          .add("bytes", static_cast<uint64_t>(entry.bytes))
          .add("device", batch.device->ordinal)
          .hex("stream", stream_id(entry.copy_stream))
          .add("batch", batch.id)
          .add("dur_us", static_cast<double>(copy_ms) * 1e3)
          .emit();
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    --batch.outstanding;
  }
  changed_.notify_all();
}

// =============================================================================================
// Deferred copies and waits
// =============================================================================================

RemapEntry& Engine::entry_of(RemapBatch* batch, size_t index, const char* call) {
  if (index >= batch->entries.size()) {
    fail(VASWAP_ERROR_INVALID_ARGUMENT, std::string(call) + ": index " + std::to_string(index) +
                                            " is out of range: remap " + std::to_string(batch->id) +
                                            " has " + std::to_string(batch->entries.size()) +
                                            " slot(s)");
  }
  return batch->entries[index];
}

void Engine::launch_h2d(RemapBatch* batch, size_t index, CUstream stream) {
  const char* call = "vaswap_remap_launch_h2d";
  RemapEntry* entry = nullptr;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    entry = &entry_of(batch, index, call);
    if (batch->kind != RemapKind::deferred) {
      fail(VASWAP_ERROR_INVALID_STATE,
           std::string(call) + ": remap " + std::to_string(batch->id) +
               " was not made by vaswap_remap_deferred_after; only deferred remaps launch their "
               "own copies");
    }
    if (entry->launched) {
      fail(VASWAP_ERROR_INVALID_STATE, std::string(call) + ": the H2D of slot " +
                                           std::to_string(entry->slot_id) +
                                           " was launched already");
    }
    wait_until(lock, [&] { return entry->mapped || entry->failed || entry->slot == nullptr; });
    if (entry->failed) fail(VASWAP_ERROR_CUDA, std::string(call) + ": " + entry->error);
    if (entry->slot == nullptr) {
      fail(VASWAP_ERROR_INVALID_STATE,
           std::string(call) + ": slot " + std::to_string(entry->slot_id) + " was destroyed");
    }
    entry->launched = true;
  }
  const std::string subject =
      "slot " + std::to_string(entry->slot_id) + " (va " + hex(entry->va) + ")";
  // The copy runs on the device's launch stream, ordered after the work already on `stream`, and
  // `stream` waits for it: the same order as a copy on `stream` itself. Not on `stream` itself:
  // on the H200, a timing event recorded on a stream just before an H2D held that H2D back until
  // a D2H burst on another stream had finished (bench/slot_bench.cu, SLOT_BENCH_DIAG=1: 55 GB/s
  // for both directions instead of 86). On vaswap's own stream the timing events cost nothing.
  Device& d = *batch->device;
  ContextScope scope(driver_, d.context);
  try {
    check_stream(d, stream, call);
    check(driver_.cuEventRecord(entry->ready, stream), "cuEventRecord", subject);
    check(driver_.cuStreamWaitEvent(d.launch_stream, entry->ready, 0), "cuStreamWaitEvent",
          subject);
    check(driver_.cuEventRecord(entry->start, d.launch_stream), "cuEventRecord", subject);
    check(driver_.cuMemcpyHtoDAsync(entry->va, entry->host, entry->bytes, d.launch_stream),
          "cuMemcpyHtoDAsync", subject);
    check(driver_.cuEventRecord(entry->end, d.launch_stream), "cuEventRecord", subject);
    check(driver_.cuEventRecord(entry->copied.get(), d.launch_stream), "cuEventRecord", subject);
    check(driver_.cuStreamWaitEvent(stream, entry->copied.get(), 0), "cuStreamWaitEvent", subject);
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      entry->launched = false;
    }
    throw;
  }
  entry->copy_stream = d.launch_stream;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    entry->submitted = true;
  }
  changed_.notify_all();
  track_copies(*batch, {index});
}

void Engine::wait_submitted(RemapBatch* batch, size_t index) {
  const char* call = "vaswap_remap_wait_slot_submitted";
  std::unique_lock<std::mutex> lock(mutex_);
  RemapEntry& entry = entry_of(batch, index, call);
  wait_until(lock, [&] { return entry.submitted || entry.failed || entry.slot == nullptr; });
  if (entry.failed) fail(VASWAP_ERROR_CUDA, std::string(call) + ": " + entry.error);
  if (!entry.submitted) {
    fail(VASWAP_ERROR_INVALID_STATE,
         std::string(call) + ": slot " + std::to_string(entry.slot_id) + " was destroyed");
  }
}

// index == SIZE_MAX: every slot of the remap.
void Engine::wait_on_stream(RemapBatch* batch, size_t index, CUstream stream) {
  const char* call =
      index == SIZE_MAX ? "vaswap_remap_wait_on_stream" : "vaswap_remap_wait_slot_on_stream";
  if (index != SIZE_MAX) {
    std::lock_guard<std::mutex> lock(mutex_);
    entry_of(batch, index, call);  // the index check, with this call's name
  }
  check_stream(*batch->device, stream, call);
  std::vector<SharedEvent> events;
  const size_t first = index == SIZE_MAX ? 0 : index;
  const size_t last = index == SIZE_MAX ? batch->entries.size() : index + 1;
  for (size_t i = first; i < last; ++i) {
    wait_submitted(batch, i);
    std::lock_guard<std::mutex> lock(mutex_);
    events.push_back(batch->entries[i].copied);
  }
  stream_waits(*batch, stream, events);
}

void Engine::stream_waits(const RemapBatch& batch, CUstream stream,
                          const std::vector<SharedEvent>& events) {
  ContextScope scope(driver_, batch.device->context);
  for (const SharedEvent& event : events) {
    check(driver_.cuStreamWaitEvent(stream, event.get(), 0), "cuStreamWaitEvent",
          "stream " + hex(stream_id(stream)) + " waiting for remap " + std::to_string(batch.id));
  }
}

bool Engine::wait_submitted_for(RemapBatch* batch, int timeout_ms) {
  std::unique_lock<std::mutex> lock(mutex_);
  return changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
    return std::all_of(batch->entries.begin(), batch->entries.end(), [](const RemapEntry& e) {
      return e.submitted || e.failed || e.slot == nullptr;
    });
  });
}

bool Engine::try_wait_on_stream(RemapBatch* batch, CUstream stream) {
  const char* call = "vaswap_remap_try_wait_on_stream";
  check_stream(*batch->device, stream, call);
  std::vector<SharedEvent> events;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const RemapEntry& entry : batch->entries) {
      if (entry.failed) fail(VASWAP_ERROR_CUDA, std::string(call) + ": " + entry.error);
      if (!entry.submitted) return false;
      events.push_back(entry.copied);
    }
  }
  stream_waits(*batch, stream, events);
  return true;
}

// =============================================================================================
// Adoption and cleanup
// =============================================================================================

void Engine::adopt(RemapBatch* batch) {
  std::string first_error;
  std::vector<SlotFacts> adopted;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    wait_until(lock, [&] {
      return std::all_of(batch->entries.begin(), batch->entries.end(), [](const RemapEntry& e) {
        return e.submitted || e.failed || e.slot == nullptr;
      });
    });
    for (RemapEntry& entry : batch->entries) {
      if (entry.adopted || entry.slot == nullptr) continue;
      if (entry.failed) {
        if (first_error.empty()) first_error = entry.error;
        continue;
      }
      Slot* slot = entry.slot;
      slot->handle = entry.handle;
      slot->last_copy = entry.copied;
      slot->remap = nullptr;
      entry.adopted = true;
      adopted.push_back(facts_of(*slot));
    }
  }
  changed_.notify_all();
  if (trace::enabled()) {
    for (const SlotFacts& slot : adopted) {
      trace::Record(trace::Event::adopt)
          .add("slot", slot.id)
          .hex("va", slot.va)
          .add("device", slot.device)
          .add("batch", batch->id)
          .emit();
    }
  }
  if (!first_error.empty()) fail(VASWAP_ERROR_CUDA, "vaswap_remap_adopt: " + first_error);
}

void Engine::destroy_remap(RemapBatch* batch, bool may_synchronize) {
  struct Discard {
    Slot* slot;
    SlotFacts facts;
    size_t mapped_bytes;
    CUmemGenericAllocationHandle handle;
  };
  std::vector<Discard> discards;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (batch->destroying) {
      fail(VASWAP_ERROR_INVALID_STATE, "vaswap_remap_destroy: remap " + std::to_string(batch->id) +
                                           " is already being destroyed by another thread");
    }
    batch->destroying = true;
    wait_until(lock, [&] { return batch->worker_done && batch->outstanding == 0; });
    const bool discards_pages =
        std::any_of(batch->entries.begin(), batch->entries.end(), [](const RemapEntry& entry) {
          return !entry.adopted && entry.slot != nullptr && entry.handle != 0;
        });
    if (discards_pages && !may_synchronize) {
      batch->destroying = false;
      fail(VASWAP_ERROR_INVALID_STATE,
           "vaswap_remap_destroy: remap " + std::to_string(batch->id) +
               " holds pages nobody adopted, and unmapping them needs a device-wide synchronize, "
               "which would invalidate the stream capture open in this process; adopt them "
               "(vaswap_remap_adopt) or destroy the remap after the capture ends");
    }
    for (RemapEntry& entry : batch->entries) {
      if (entry.adopted || entry.slot == nullptr) continue;
      if (entry.handle != 0) {
        // Reserve the slot until its pages are gone: a new remap must not map over them.
        entry.slot->release_pending = true;
        discards.push_back({entry.slot, facts_of(*entry.slot), entry.mapped_bytes, entry.handle});
      }
      entry.slot->remap = nullptr;
    }
    remaps_.erase(batch);
  }
  changed_.notify_all();
  std::string first_error;
  if (!discards.empty()) {
    ContextScope scope(driver_, batch->device->context);
    try {  // nothing queued may still use pages that nobody adopted
      check(driver_.cuCtxSynchronize(), "cuCtxSynchronize", "remap " + std::to_string(batch->id));
    } catch (const Error& e) {
      first_error = e.what();
    }
    for (const Discard& discard : discards) {
      PageTimes times;
      try {
        unmap_pages(*batch->device, discard.facts.va, discard.mapped_bytes, discard.handle,
                    discard.slot->describe(), &times, reuse_limit_.load());
        bytes_mapped_.fetch_sub(discard.mapped_bytes);
      } catch (const Error& e) {
        if (first_error.empty()) first_error = e.what();
        std::lock_guard<std::mutex> lock(mutex_);
        discard.slot->handle = discard.handle;  // still mapped: the slot keeps the pages
      }
      if (trace::enabled()) {
        trace::Record(trace::Event::remap_discard)
            .add("slot", discard.facts.id)
            .hex("va", discard.facts.va)
            .add("device", discard.facts.device)
            .add("batch", batch->id)
            .emit();
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        discard.slot->release_pending = false;
      }
      changed_.notify_all();
    }
  }
  for (RemapEntry& entry : batch->entries) {
    for (CUevent event : {entry.start, entry.end, entry.ready}) {
      if (event != nullptr) driver_.cuEventDestroy(event);
    }
  }
  if (batch->after != nullptr) driver_.cuEventDestroy(batch->after);
  delete batch;
  if (!first_error.empty()) fail(VASWAP_ERROR_CUDA, "vaswap_remap_destroy: " + first_error);
}

}  // namespace vaswap
