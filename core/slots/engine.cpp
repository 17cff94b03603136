#include "slots/engine.h"

#include <algorithm>
#include <functional>
#include <unordered_map>

#include "base/errors.h"
#include "base/log.h"
#include "base/trace.h"

namespace vaswap {

namespace {}  // namespace

// =============================================================================================
// Context scope, slot description
// =============================================================================================

ContextScope::ContextScope(const Driver& driver, CUcontext context) : driver_(driver) {
  if (driver_.cuCtxGetCurrent(&previous_) != CUDA_SUCCESS) previous_ = nullptr;
  if (previous_ != context) switched_ = driver_.cuCtxSetCurrent(context) == CUDA_SUCCESS;
}

ContextScope::~ContextScope() {
  if (switched_) driver_.cuCtxSetCurrent(previous_);
}

std::string Slot::describe() const {
  return "slot " + std::to_string(id) + " (va " + hex(va) + ", " + byte_size(bytes) +
         " on device " + std::to_string(device) + ")";
}

// =============================================================================================
// Driver calls
// =============================================================================================

void Engine::check(CUresult result, const char* call, const std::string& subject, bool report) {
  if (result == CUDA_SUCCESS) return;
  const std::string message = cuda_failure(call, result, subject);
  if (!report) fail_driver(result, message, call);
  errors_.fetch_add(1);
  log().error("{}", message);
  if (trace::enabled()) {
    trace::Record(trace::Event::error)
        .add("call", call)
        .add("code", cuda_error_name(result))
        .add("message", message)
        .emit();
  }
  fail_driver(result, message, call);
}

std::unique_lock<std::mutex> Engine::driver_call_lock() {
  if (serial_.load()) return std::unique_lock<std::mutex>(driver_call_mutex_);
  return std::unique_lock<std::mutex>();
}

// One physical handle for the whole range (DESIGN.md §7: cost grows with handles, not bytes): a
// kept one of this size if there is one (vaswap_set_page_reuse), else a new one. A new one that
// finds the device full releases the kept handles first and tries again.
CUmemGenericAllocationHandle Engine::map_pages(Device& d, CUdeviceptr va, size_t bytes,
                                               const std::string& subject, PageTimes* times,
                                               uint64_t peers, bool report) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = d.ordinal;
  // The device's own access first, then each peer's: at most one of each bit of `peers`, and of
  // the devices the program gave access to all of this device's memory.
  const auto& device_peers = device_peers_[static_cast<size_t>(d.ordinal) % 64];
  peers |= device_peers.load(std::memory_order_acquire);
  CUmemAccessDesc access[65]{};
  unsigned accesses = 0;
  for (int ordinal = -1; ordinal < 64; ++ordinal) {
    if (ordinal >= 0 && (ordinal == d.ordinal || (peers >> ordinal & 1) == 0)) continue;
    CUmemAccessDesc& desc = access[accesses++];
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = ordinal < 0 ? d.ordinal : ordinal;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }

  auto lock = driver_call_lock();
  uint64_t t = trace::now_ns();
  CUmemGenericAllocationHandle handle = take_spare(d, bytes);
  times->reused = handle != 0;
  if (handle == 0) {
    CUresult rc = driver_.cuMemCreate(&handle, bytes, &prop, 0);
    if (rc == CUDA_ERROR_OUT_OF_MEMORY && release_spares(d) > 0) {
      rc = driver_.cuMemCreate(&handle, bytes, &prop, 0);
    }
    check(rc, "cuMemCreate", subject, report);
  }
  times->create_us = trace::us_since(t);
  t = trace::now_ns();
  CUresult rc = driver_.cuMemMap(va, bytes, 0, handle, 0);
  if (rc != CUDA_SUCCESS) driver_.cuMemRelease(handle);
  check(rc, "cuMemMap", subject, report);
  times->map_us = trace::us_since(t);
  t = trace::now_ns();
  rc = driver_.cuMemSetAccess(va, bytes, access, accesses);
  // A device given access to all of this device's memory meanwhile (grant_device_access) may have
  // missed these pages: it looks at mapped ones only. Its access now.
  for (uint64_t late = device_peers.load(std::memory_order_acquire) & ~peers;
       rc == CUDA_SUCCESS && late != 0; late &= late - 1) {
    CUmemAccessDesc desc = access[0];
    desc.location.id = __builtin_ctzll(late);
    rc = driver_.cuMemSetAccess(va, bytes, &desc, 1);
  }
  if (rc != CUDA_SUCCESS) {
    driver_.cuMemUnmap(va, bytes);
    driver_.cuMemRelease(handle);
  }
  check(rc, "cuMemSetAccess", subject, report);
  times->access_us = trace::us_since(t);
  return handle;
}

// Throws if the unmap fails (the pages stay mapped, nothing changed). A failed release after a
// successful unmap is reported but not thrown: the address is free of pages either way.
void Engine::unmap_pages(Device& d, CUdeviceptr va, size_t bytes,
                         CUmemGenericAllocationHandle handle, const std::string& subject,
                         PageTimes* times, uint64_t keep_limit) {
  const GivingBack giving_back(*this);
  auto lock = driver_call_lock();
  uint64_t t = trace::now_ns();
  check(driver_.cuMemUnmap(va, bytes), "cuMemUnmap", subject);
  times->unmap_us = trace::us_since(t);
  t = trace::now_ns();
  times->kept = keep_limit != 0 && keep_spare(d, bytes, handle, keep_limit);
  if (!times->kept) {
    try {
      check(driver_.cuMemRelease(handle), "cuMemRelease", subject);
    } catch (const Error&) {
      // Reported by check(); the handle's pages may stay allocated until the process exits.
    }
  }
  times->release_us = trace::us_since(t);
}

CUmemGenericAllocationHandle Engine::take_spare(Device& d, size_t bytes) {
  std::lock_guard<std::mutex> lock(d.spare_mutex);
  auto it = d.spare.find(bytes);
  if (it == d.spare.end()) return 0;
  const CUmemGenericAllocationHandle handle = it->second;
  d.spare.erase(it);
  d.spare_bytes -= bytes;
  return handle;
}

bool Engine::keep_spare(Device& d, size_t bytes, CUmemGenericAllocationHandle handle,
                        uint64_t limit) {
  std::lock_guard<std::mutex> lock(d.spare_mutex);
  if (bytes > limit || d.spare_bytes > limit - bytes) return false;
  d.spare.emplace(bytes, handle);
  d.spare_bytes += bytes;
  return true;
}

// Largest first, until at most `keep` bytes are kept. A failed release is counted as released:
// the handle is gone from vaswap's hands either way, and check() reported it.
uint64_t Engine::release_spares(Device& d, uint64_t keep) {
  std::vector<std::pair<size_t, CUmemGenericAllocationHandle>> going;
  {
    std::lock_guard<std::mutex> lock(d.spare_mutex);
    while (d.spare_bytes > keep && !d.spare.empty()) {
      auto last = std::prev(d.spare.end());
      going.emplace_back(*last);
      d.spare_bytes -= last->first;
      d.spare.erase(last);
    }
  }
  if (going.empty()) return 0;
  uint64_t released = 0;
  const GivingBack giving_back(*this);
  for (const auto& [bytes, handle] : going) {
    try {
      check(driver_.cuMemRelease(handle), "cuMemRelease",
            "a kept handle of " + byte_size(bytes) + " on device " + std::to_string(d.ordinal));
    } catch (const Error&) {
    }
    released += bytes;
  }
  if (released > 0) note_memory();
  return released;
}

uint64_t Engine::spare_bytes(int ordinal, size_t size, bool* has_size) {
  Device& d = device(ordinal);
  std::lock_guard<std::mutex> lock(d.spare_mutex);
  if (has_size != nullptr) *has_size = d.spare.count(size) != 0;
  return d.spare_bytes;
}

uint64_t Engine::trim_spares(int ordinal, uint64_t keep) {
  Device& d = device(ordinal);
  {
    std::lock_guard<std::mutex> lock(d.spare_mutex);
    if (d.spare_bytes <= keep) return 0;
  }
  ContextScope scope(driver_, d.context);
  RelaxedCapture relaxed(driver_);
  auto lock = driver_call_lock();
  return release_spares(d, keep);
}

uint64_t Engine::set_page_reuse(uint64_t bytes) {
  reuse_limit_.store(bytes);
  std::vector<Device*> known;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& d : devices_) {
      if (d) known.push_back(d.get());
    }
  }
  uint64_t released = 0;
  for (Device* d : known) {
    released += trim_spares(d->ordinal, bytes);
  }
  return released;
}

// =============================================================================================
// Devices
// =============================================================================================

Device& Engine::device(int ordinal) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Known devices are returned without asking the driver again: this is on every slot call.
  if (ordinal >= 0 && static_cast<size_t>(ordinal) < devices_.size() &&
      devices_[static_cast<size_t>(ordinal)]) {
    return *devices_[static_cast<size_t>(ordinal)];
  }
  int count = 0;
  check(driver_.cuDeviceGetCount(&count), "cuDeviceGetCount", "the device count");
  if (ordinal < 0 || ordinal >= count) {
    fail(VASWAP_ERROR_INVALID_ARGUMENT,
         "device " + std::to_string(ordinal) + " does not exist: this process sees " +
             std::to_string(count) + " CUDA device(s), numbered from 0");
  }
  if (devices_.size() < static_cast<size_t>(count)) devices_.resize(static_cast<size_t>(count));
  auto& slot = devices_[static_cast<size_t>(ordinal)];
  if (!slot) {
    auto d = std::make_unique<Device>();
    d->ordinal = ordinal;
    const std::string subject = "device " + std::to_string(ordinal);
    check(driver_.cuDeviceGet(&d->device, ordinal), "cuDeviceGet", subject);
    check(driver_.cuDevicePrimaryCtxRetain(&d->context, d->device), "cuDevicePrimaryCtxRetain",
          subject);
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal;
    const CUresult rc = driver_.cuMemGetAllocationGranularity(&d->granularity, &prop,
                                                              CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (rc != CUDA_SUCCESS) {
      // The device is looked at again later (a second after, residency's retry): the context
      // retained for this look goes back, or each look would hold one more.
      driver_.cuDevicePrimaryCtxRelease(d->device);
      check(rc, "cuMemGetAllocationGranularity", subject);
    }
    slot = std::move(d);
  }
  return *slot;
}

Device& Engine::device_with_workers(int ordinal) {
  Device& d = device(ordinal);
  // A throw (a stream the device has no room for, a thread the system will not start) leaves
  // the once open: the next call goes on from what failed, keeping what was made before it.
  std::call_once(d.workers_once, [&] {
    ContextScope scope(driver_, d.context);
    const auto stream = [&](CUstream* made, const char* which) {
      if (*made != nullptr) return;
      CUstream created = nullptr;
      check(driver_.cuStreamCreate(&created, CU_STREAM_NON_BLOCKING), "cuStreamCreate",
            std::string("the ") + which + " stream of device " + std::to_string(ordinal));
      *made = created;
    };
    stream(&d.copy_stream, "copy");
    stream(&d.launch_stream, "launch");
    const auto worker = [&](std::unique_ptr<Worker>* made, const char* name) {
      if (!*made)
        *made = std::make_unique<Worker>(driver_, d.context, name + std::to_string(ordinal));
    };
    worker(&d.release_worker, "vaswap-rel");
    worker(&d.remap_worker, "vaswap-map");
    worker(&d.completion_worker, "vaswap-slc");
  });
  return d;
}

void Engine::init_workers(int device) { device_with_workers(device); }

void Engine::memory_info(int ordinal, size_t* free_bytes, size_t* total_bytes) {
  Device& d = device(ordinal);
  ContextScope scope(driver_, d.context);
  check(driver_.cuMemGetInfo(free_bytes, total_bytes), "cuMemGetInfo",
        "device " + std::to_string(ordinal));
}

std::optional<uint64_t> Engine::free_memory(int ordinal) {
  try {
    Device& d = device(ordinal);
    ContextScope scope(driver_, d.context);
    size_t free_bytes = 0, total_bytes = 0;
    if (driver_.cuMemGetInfo(&free_bytes, &total_bytes) != CUDA_SUCCESS) return std::nullopt;
    return free_bytes;
  } catch (const Error&) {
    return std::nullopt;  // no such device, or no context
  }
}

uint64_t Engine::allocatable(int ordinal, uint64_t free_bytes) {
  const uint64_t held_back = device(ordinal).held_back.load(std::memory_order_relaxed);
  return free_bytes > held_back ? free_bytes - held_back : 0;
}

std::optional<uint64_t> Engine::allocatable_now(int ordinal) {
  const std::optional<uint64_t> free_bytes = free_memory(ordinal);
  if (!free_bytes) return std::nullopt;
  return allocatable(ordinal, *free_bytes);
}

void Engine::giving_back(bool begins) {
  // Begun: counted alive before the mark moves. Ended: the mark moves before it stops counting,
  // so a mark taken with none alive is never one that an end still in progress leaves unmoved.
  if (begins) giving_back_.fetch_add(1);
  given_back_.fetch_add(1);
  if (!begins) giving_back_.fetch_sub(1);
}

std::optional<uint64_t> Engine::given_back_mark() const {
  const uint64_t mark = given_back_.load();
  if (giving_back_.load() != 0) return std::nullopt;
  return mark;
}

Engine::HeldBack Engine::learn_held_back(int ordinal, uint64_t pages, uint64_t mark,
                                         uint64_t free_before) {
  HeldBack result;
  const std::optional<uint64_t> read = free_memory(ordinal);
  // Read before the mark is compared: memory that went back before the reading moved it.
  if (!read || given_back_.load() != mark) return result;
  // The smaller of the readings around the map: memory that went back where the mark does not
  // see it (a stream-ordered free's pool releasing at a synchronize, a pool trim, another
  // process) raises only the later one.
  const uint64_t free_bytes = std::min(*read, free_before);
  result.free_bytes = free_bytes;
  std::atomic<uint64_t>& held_back = device(ordinal).held_back;
  uint64_t before = held_back.load();
  result.bytes = before;
  if (free_bytes < pages + kFreeNoAllocationGets) return result;  // the one granule explains it
  const uint64_t seen = std::min(free_bytes - pages + kFreeNoAllocationGets, kHeldBackMax);
  while (seen > before && !held_back.compare_exchange_weak(before, seen)) {
  }
  if (seen <= before) {
    result.bytes = before;
    return result;
  }
  result.learned = true;
  result.first = before == kFreeNoAllocationGets;
  result.bytes = seen;
  return result;
}

// =============================================================================================
// Checks shared by the calls
// =============================================================================================

Slot* Engine::slot_of(const void* handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto* slot = static_cast<Slot*>(const_cast<void*>(handle));
  if (handle == nullptr || slots_.count(slot) == 0) {
    fail(VASWAP_ERROR_INVALID_ARGUMENT,
         "slot handle " + hex(reinterpret_cast<uintptr_t>(handle)) +
             " is not a live vaswap slot (never created, or destroyed already)");
  }
  return slot;
}

RemapBatch* Engine::remap_of(const void* handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto* batch = static_cast<RemapBatch*>(const_cast<void*>(handle));
  if (handle == nullptr || remaps_.count(batch) == 0) {
    fail(VASWAP_ERROR_INVALID_ARGUMENT,
         "remap handle " + hex(reinterpret_cast<uintptr_t>(handle)) +
             " is not a live vaswap remap (never returned, or destroyed already)");
  }
  return batch;
}

// Under mutex_: the batch is non-empty, each slot live and listed once, one device for all.
std::vector<Slot*> Engine::checked_batch(const std::vector<Slot*>& slots, const char* call) {
  if (slots.empty()) {
    fail(VASWAP_ERROR_INVALID_ARGUMENT,
         std::string(call) + ": the batch is empty; pass at least one slot");
  }
  std::unordered_map<Slot*, size_t> seen;
  for (size_t i = 0; i < slots.size(); ++i) {
    Slot* slot = slots[i];
    if (slot == nullptr || slots_.count(slot) == 0) {
      fail(VASWAP_ERROR_INVALID_ARGUMENT, std::string(call) + ": slots[" + std::to_string(i) +
                                              "] (" + hex(reinterpret_cast<uintptr_t>(slot)) +
                                              ") is not a live vaswap slot");
    }
    auto [it, fresh] = seen.emplace(slot, i);
    if (!fresh) {
      fail(VASWAP_ERROR_INVALID_ARGUMENT, std::string(call) + ": " + slot->describe() +
                                              " appears twice in the batch (slots[" +
                                              std::to_string(it->second) + "] and slots[" +
                                              std::to_string(i) + "]); list each slot once");
    }
    if (slot->device != slots[0]->device) {
      fail(VASWAP_ERROR_DEVICE_MISMATCH,
           std::string(call) + ": the batch mixes devices: " + slots[0]->describe() + " and " +
               slot->describe() + "; submit one batch per device");
    }
    if (slot->closing) {
      fail(VASWAP_ERROR_INVALID_STATE,
           std::string(call) + ": " + slot->describe() + " is being destroyed");
    }
    if (slot->managed) {
      fail(VASWAP_ERROR_INVALID_STATE,
           std::string(call) + ": " + slot->describe() +
               " backs an allocation of the program and its pages are moved by the preload; "
               "read it (vaswap_slot_info) but do not release or remap it");
    }
  }
  return slots;
}

std::string Engine::take_async_errors(const std::vector<Slot*>& slots) {
  for (Slot* slot : slots) {
    if (!slot->async_error.empty()) {
      std::string error = std::move(slot->async_error);
      slot->async_error.clear();
      return error;
    }
  }
  return "";
}

void Engine::check_stream(Device& d, CUstream stream, const char* call) {
  ContextScope scope(driver_, d.context);
  const std::string subject = "stream " + hex(stream_id(stream));
  // Capture first: cuStreamGetDevice on a capturing stream fails and invalidates the capture
  // (measured on the H200), which would break invariant 5.
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  const CUresult rc = driver_.cuStreamIsCapturing(stream, &status);
  if (rc == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT || status != CU_STREAM_CAPTURE_STATUS_NONE) {
    fail(VASWAP_ERROR_CAPTURING,
         std::string(call) + ": " + subject +
             " is capturing a graph (or would join another thread's capture); vaswap's callback "
             "would be captured instead of run. Call it outside the capture");
  }
  check(rc, "cuStreamIsCapturing", subject);
  CUdevice stream_device = 0;
  check(driver_.cuStreamGetDevice(stream, &stream_device), "cuStreamGetDevice", subject);
  if (stream_device != d.device) {
    fail(VASWAP_ERROR_DEVICE_MISMATCH,
         std::string(call) + ": " + subject + " belongs to device " +
             std::to_string(stream_device) + " but the slots to device " +
             std::to_string(d.ordinal) + "; pass a stream of device " + std::to_string(d.ordinal));
  }
}

void Engine::check_host_buffer(const Slot& slot, void* host) {
  const std::string buffer = "host buffer " + hex(reinterpret_cast<uintptr_t>(host));
  const std::string fix =
      "; use vaswap_host_alloc (or cudaHostAlloc) and pass the pointer it returned";
  if (host == nullptr) {
    fail(VASWAP_ERROR_HOST_BUFFER, "the host buffer for " + slot.describe() + " is NULL" + fix);
  }
  const auto ptr = static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(host));
  unsigned type = 0;
  if (driver_.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr) != CUDA_SUCCESS ||
      type != CU_MEMORYTYPE_HOST) {
    fail(VASWAP_ERROR_HOST_BUFFER, buffer + " for " + slot.describe() +
                                       " is not pinned host memory (pageable or device memory)" +
                                       fix);
  }
  CUdeviceptr start = 0;
  size_t size = 0;
  const CUresult rc1 =
      driver_.cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, ptr);
  const CUresult rc2 = driver_.cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, ptr);
  check(rc1 != CUDA_SUCCESS ? rc1 : rc2, "cuPointerGetAttribute", buffer);
  if (start != ptr) {
    fail(VASWAP_ERROR_HOST_BUFFER, buffer + " for " + slot.describe() + " lies " +
                                       std::to_string(ptr - start) +
                                       " bytes into its pinned allocation (at " + hex(start) +
                                       "); pass the start of the allocation (offset 0)");
  }
  if (size < slot.bytes) {
    fail(VASWAP_ERROR_HOST_BUFFER, buffer + " holds " + byte_size(size) + " but " +
                                       slot.describe() + " needs " + byte_size(slot.bytes));
  }
}

void Engine::wait_until(std::unique_lock<std::mutex>& lock, const std::function<bool()>& done) {
  changed_.wait(lock, done);
}

// =============================================================================================
// Slots
// =============================================================================================

Slot* Engine::create_slot(int ordinal, size_t bytes, bool intercepted, bool backed, bool report) {
  if (bytes == 0) fail(VASWAP_ERROR_INVALID_ARGUMENT, "vaswap_slot_create: bytes must be > 0");
  Device& d = device(ordinal);
  auto slot = std::make_unique<Slot>();
  slot->id = next_id_.fetch_add(1);
  slot->device = ordinal;
  slot->bytes = bytes;
  slot->intercepted = intercepted;
  slot->mapped_bytes = (bytes + d.granularity - 1) / d.granularity * d.granularity;
  const uint64_t start = trace::now_ns();
  ContextScope scope(driver_, d.context);
  {
    auto lock = driver_call_lock();
    check(driver_.cuMemAddressReserve(&slot->va, slot->mapped_bytes, d.granularity, 0, 0),
          "cuMemAddressReserve",
          "a slot of " + byte_size(bytes) + " on device " + std::to_string(ordinal));
  }
  PageTimes times;
  if (backed) {
    try {
      slot->handle = map_pages(d, slot->va, slot->mapped_bytes, slot->describe(), &times,
                               slot->peers.load(std::memory_order_acquire), report);
    } catch (const Error&) {
      auto lock = driver_call_lock();
      driver_.cuMemAddressFree(slot->va, slot->mapped_bytes);
      throw;
    }
    bytes_mapped_.fetch_add(slot->mapped_bytes);
  }
  bytes_reserved_.fetch_add(slot->mapped_bytes);
  if (slot->device >= 0 && slot->device < 64) {
    device_reserved_[slot->device].fetch_add(slot->mapped_bytes);
  }
  note_memory();
  if (trace::enabled()) {
    trace::Record(trace::Event::slot_create)
        .at(start)
        .add("slot", slot->id)
        .hex("va", slot->va)
        .add("bytes", static_cast<uint64_t>(slot->bytes))
        .add("mapped_bytes", static_cast<uint64_t>(slot->mapped_bytes))
        .add("device", ordinal)
        .add("backed", backed)
        .add("dur_us", trace::us_since(start))
        .emit();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    slots_.insert(slot.get());
  }
  // A device given access to all of this device's slots while this one was being made may have
  // looked for it before it was listed: its access again, now that grant_device_access sees it.
  const uint64_t peers = device_peers_[static_cast<size_t>(ordinal) % 64].load();
  if (backed && peers != 0) {
    ContextScope again(driver_, d.context);
    auto lock = driver_call_lock();
    for (uint64_t left = peers; left != 0; left &= left - 1) {
      CUmemAccessDesc access{};
      access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access.location.id = __builtin_ctzll(left);
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      driver_.cuMemSetAccess(slot->va, slot->mapped_bytes, &access, 1);  // as map_pages did
    }
  }
  return slot.release();
}

void Engine::back(Slot* slot, const std::optional<BatchTiming>& timing, bool report) {
  Device& d = device(slot->device);
  ContextScope scope(driver_, d.context);
  const uint64_t start = trace::now_ns();
  PageTimes times;
  const CUmemGenericAllocationHandle handle =
      map_pages(d, slot->va, slot->mapped_bytes, slot->describe(), &times,
                slot->peers.load(std::memory_order_acquire), report);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    slot->handle = handle;
  }
  pages_mapped(facts_of(*slot), times, start, timing);
}

void Engine::grant_access(Slot* slot, int ordinal) {
  if (ordinal == slot->device || ordinal < 0 || ordinal >= 64) return;
  const uint64_t bit = uint64_t{1} << ordinal;
  if ((slot->peers.load(std::memory_order_acquire) & bit) != 0) return;
  Device& d = device(slot->device);
  ContextScope scope(driver_, d.context);
  RelaxedCapture relaxed(driver_);  // the application's thread: never end another's capture
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = ordinal;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  {
    auto lock = driver_call_lock();
    check(driver_.cuMemSetAccess(slot->va, slot->mapped_bytes, &access, 1), "cuMemSetAccess",
          slot->describe() + ", for device " + std::to_string(ordinal) +
              " (a copy on its stream names the slot)",
          /*report=*/false);  // the caller says so, once
  }
  slot->peers.fetch_or(bit, std::memory_order_acq_rel);
}

uint64_t Engine::grant_device_access(int owner, int accessor) {
  if (owner == accessor || owner < 0 || owner >= 64 || accessor < 0 || accessor >= 64) return 0;
  const uint64_t bit = uint64_t{1} << accessor;
  // First the bit, then every slot of the device (whether mapped, or adopted, or not: a remap maps
  // before the slot adopts): a map that read the bits before this one was set finished its
  // cuMemMap before, so the call below finds its pages; a map that reads them after includes it.
  if ((device_peers_[owner].fetch_or(bit, std::memory_order_acq_rel) & bit) != 0) return 0;
  std::vector<std::pair<CUdeviceptr, size_t>> ranges;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Slot* slot : slots_) {
      if (slot->device == owner) ranges.emplace_back(slot->va, slot->mapped_bytes);
    }
  }
  Device& d = device(owner);
  ContextScope scope(driver_, d.context);
  RelaxedCapture relaxed(driver_);
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = accessor;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  uint64_t granted = 0;
  for (const auto& [va, bytes] : ranges) {
    auto lock = driver_call_lock();
    // A slot with no pages now fails here, and gets the access at its next map.
    if (driver_.cuMemSetAccess(va, bytes, &access, 1) == CUDA_SUCCESS) ++granted;
  }
  return granted;
}

void Engine::unback(Slot* slot, const std::optional<BatchTiming>& timing, bool keep) {
  Device& d = device(slot->device);
  ContextScope scope(driver_, d.context);
  const uint64_t start = trace::now_ns();
  PageTimes times;
  unmap_pages(d, slot->va, slot->mapped_bytes, slot->handle, slot->describe(), &times,
              keep ? UINT64_MAX : reuse_limit_.load());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    slot->handle = 0;
  }
  pages_released(facts_of(*slot), times, start, timing);
}

void Engine::map_placeholder(Slot* slot) {
  Device& d = device(slot->device);
  ContextScope scope(driver_, d.context);
  const std::string subject = slot->describe() + ", a placeholder for the driver's address check";
  const size_t granule = d.granularity;
  std::lock_guard<std::mutex> users(d.placeholder_mutex);
  auto lock = driver_call_lock();
  if (d.placeholder_users == 0) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = d.ordinal;
    CUmemGenericAllocationHandle handle = 0;
    CUresult rc = driver_.cuMemCreate(&handle, granule, &prop, 0);
    if (rc == CUDA_ERROR_OUT_OF_MEMORY && release_spares(d) > 0) {
      rc = driver_.cuMemCreate(&handle, granule, &prop, 0);
    }
    check(rc, "cuMemCreate", subject, /*report=*/false);
    d.placeholder = handle;
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = d.ordinal;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  size_t mapped = 0;
  CUresult rc = CUDA_SUCCESS;
  const char* call = "cuMemMap";
  for (; mapped < slot->mapped_bytes; mapped += granule) {
    rc = driver_.cuMemMap(slot->va + mapped, granule, 0, d.placeholder, 0);
    if (rc != CUDA_SUCCESS) break;
  }
  if (rc == CUDA_SUCCESS) {
    call = "cuMemSetAccess";
    rc = driver_.cuMemSetAccess(slot->va, slot->mapped_bytes, &access, 1);
  }
  if (rc == CUDA_SUCCESS) {
    ++d.placeholder_users;
    return;
  }
  for (size_t at = 0; at < mapped; at += granule) driver_.cuMemUnmap(slot->va + at, granule);
  if (d.placeholder_users == 0) {
    driver_.cuMemRelease(d.placeholder);
    d.placeholder = 0;
  }
  check(rc, call, subject, /*report=*/false);
}

void Engine::unmap_placeholder(Slot* slot) {
  Device& d = device(slot->device);
  const GivingBack giving_back(*this);
  ContextScope scope(driver_, d.context);
  std::lock_guard<std::mutex> users(d.placeholder_mutex);
  auto lock = driver_call_lock();
  // One granule at a time, as they were mapped.
  CUresult failed = CUDA_SUCCESS;
  for (size_t at = 0; at < slot->mapped_bytes; at += d.granularity) {
    const CUresult rc = driver_.cuMemUnmap(slot->va + at, d.granularity);
    if (rc != CUDA_SUCCESS && failed == CUDA_SUCCESS) failed = rc;
  }
  if (failed == CUDA_SUCCESS && --d.placeholder_users == 0) {
    driver_.cuMemRelease(d.placeholder);  // freed with its last mapping in any case
    d.placeholder = 0;
  }
  check(failed, "cuMemUnmap", slot->describe() + ", its placeholder for the driver's address check",
        /*report=*/false);
}

void Engine::destroy_slot(Slot* slot, bool device_idle_for_it) {
  CUmemGenericAllocationHandle remap_handle = 0;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (slot->closing) {
      fail(VASWAP_ERROR_INVALID_STATE, "vaswap_slot_destroy: " + slot->describe() +
                                           " is already being destroyed by another thread");
    }
    slot->closing = true;
    wait_until(lock, [&] {
      return !slot->release_pending && (slot->remap == nullptr || slot->remap->worker_done);
    });
    if (slot->remap != nullptr) {
      for (RemapEntry& entry : slot->remap->entries) {
        if (entry.slot != slot) continue;
        if (!entry.adopted) remap_handle = entry.handle;
        entry.handle = 0;
        entry.mapped = false;
        entry.slot = nullptr;
      }
      slot->remap = nullptr;
    }
    slots_.erase(slot);
  }
  changed_.notify_all();
  std::unique_ptr<Slot> owned(slot);
  const uint64_t start = trace::now_ns();
  Device& d = device(slot->device);
  ContextScope scope(driver_, d.context);
  std::string first_error;
  // As cudaFree does: nothing queued on the device may still touch the pages.
  if (!device_idle_for_it) {
    try {
      check(driver_.cuCtxSynchronize(), "cuCtxSynchronize", slot->describe());
    } catch (const Error& e) {
      first_error = e.what();
    }
  }
  PageTimes times;
  for (CUmemGenericAllocationHandle handle : {slot->handle, remap_handle}) {
    if (handle == 0) continue;
    try {
      // A destroyed slot's pages go back to the driver, as cudaFree's do: never kept.
      unmap_pages(d, slot->va, slot->mapped_bytes, handle, slot->describe(), &times,
                  /*keep_limit=*/0);
      if (handle == slot->handle) bytes_mapped_.fetch_sub(slot->mapped_bytes);
    } catch (const Error& e) {
      if (first_error.empty()) first_error = e.what();
    }
  }
  bytes_reserved_.fetch_sub(slot->mapped_bytes);
  if (slot->device >= 0 && slot->device < 64) {
    device_reserved_[slot->device].fetch_sub(slot->mapped_bytes);
  }
  slot->last_copy.reset();
  {
    auto lock = driver_call_lock();
    const CUresult rc = driver_.cuMemAddressFree(slot->va, slot->mapped_bytes);
    if (rc != CUDA_SUCCESS && first_error.empty()) {
      first_error = cuda_failure("cuMemAddressFree", rc, slot->describe());
    }
  }
  if (trace::enabled()) {
    trace::Record(trace::Event::slot_destroy)
        .at(start)
        .add("slot", slot->id)
        .hex("va", slot->va)
        .add("bytes", static_cast<uint64_t>(slot->bytes))
        .add("device", slot->device)
        .add("dur_us", trace::us_since(start))
        .emit();
  }
  if (!first_error.empty()) fail(VASWAP_ERROR_CUDA, first_error);
}

vaswap_slot_info Engine::info(Slot* slot) {
  std::lock_guard<std::mutex> lock(mutex_);
  vaswap_slot_info info{};
  info.id = slot->id;
  info.va = slot->va;
  info.bytes = slot->bytes;
  info.mapped_bytes = slot->mapped_bytes;
  info.device = slot->device;
  bool remap_mapped = false;
  if (slot->remap != nullptr) {
    for (const RemapEntry& entry : slot->remap->entries) {
      if (entry.slot == slot && entry.mapped) remap_mapped = true;
    }
  }
  info.mapped = slot->handle != 0 || remap_mapped ? 1 : 0;
  info.release_pending = slot->release_pending ? 1 : 0;
  info.remap_pending = slot->remap != nullptr ? 1 : 0;
  return info;
}

void Engine::pages_released(const SlotFacts& slot, const PageTimes& times, uint64_t start_ns,
                            const std::optional<BatchTiming>& timing) {
  bytes_mapped_.fetch_sub(slot.mapped_bytes);
  note_memory();
  releases_.fetch_add(1);
  device_costs_.unmapped(slot.device, times.unmap_us + times.release_us);
  if (!trace::enabled()) return;
  trace::Record record(trace::Event::release);
  record.at(start_ns)
      .add("slot", slot.id)
      .hex("va", slot.va)
      .add("bytes", static_cast<uint64_t>(slot.mapped_bytes))
      .add("device", slot.device);
  if (timing) record.add("batch", timing->batch).add("lag_us", timing->lag_us);
  record.add("unmap_us", times.unmap_us).add("release_us", times.release_us);
  if (times.kept) record.add("kept", true);
  if (!timing) record.add("sync", true);
  record.emit();
}

void Engine::pages_mapped(const SlotFacts& slot, const PageTimes& times, uint64_t start_ns,
                          const std::optional<BatchTiming>& timing) {
  bytes_mapped_.fetch_add(slot.mapped_bytes);
  note_memory();
  remaps_done_.fetch_add(1);
  device_costs_.mapped(slot.device, times.create_us + times.map_us + times.access_us);
  if (!trace::enabled()) return;
  trace::Record record(trace::Event::remap);
  record.at(start_ns)
      .add("slot", slot.id)
      .hex("va", slot.va)
      .add("bytes", static_cast<uint64_t>(slot.mapped_bytes))
      .add("device", slot.device);
  if (timing) {
    record.add("batch", timing->batch)
        .add("wait_us", timing->wait_us)
        .add("lag_us", timing->lag_us);
  }
  record.add("create_us", times.create_us)
      .add("map_us", times.map_us)
      .add("access_us", times.access_us);
  if (times.reused) record.add("reused", true);
  if (!timing) record.add("sync", true);
  record.emit();
}

void Engine::reserve_for_sync(Slot* slot, const char* call, bool want_mapped) {
  std::lock_guard<std::mutex> lock(mutex_);
  checked_batch({slot}, call);
  const bool mapped = slot->handle != 0;
  if (mapped != want_mapped || slot->release_pending || slot->remap != nullptr) {
    const char* why =
        mapped != want_mapped
            ? (want_mapped ? " has no pages of its own to release" : " is mapped already")
            : " has a release or remap in flight; wait for it first";
    fail(VASWAP_ERROR_INVALID_STATE, std::string(call) + ": " + slot->describe() + why);
  }
  slot->release_pending = true;
}

void Engine::end_sync(Slot* slot, std::optional<CUmemGenericAllocationHandle> handle) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (handle) slot->handle = *handle;
    slot->release_pending = false;
  }
  changed_.notify_all();
}

void Engine::unmap_and_release(Slot* slot) {
  reserve_for_sync(slot, "vaswap_slot_unmap_and_release", /*want_mapped=*/true);
  Device& d = device(slot->device);
  ContextScope scope(driver_, d.context);
  const uint64_t start = trace::now_ns();
  PageTimes times;
  try {
    unmap_pages(d, slot->va, slot->mapped_bytes, slot->handle, slot->describe(), &times,
                reuse_limit_.load());
  } catch (const Error&) {
    end_sync(slot, std::nullopt);
    throw;
  }
  pages_released(facts_of(*slot), times, start, std::nullopt);
  end_sync(slot, CUmemGenericAllocationHandle{0});
}

void Engine::create_and_remap(Slot* slot) {
  reserve_for_sync(slot, "vaswap_slot_create_and_remap", /*want_mapped=*/false);
  Device& d = device(slot->device);
  ContextScope scope(driver_, d.context);
  const uint64_t start = trace::now_ns();
  PageTimes times;
  CUmemGenericAllocationHandle handle = 0;
  try {
    handle = map_pages(d, slot->va, slot->mapped_bytes, slot->describe(), &times,
                       slot->peers.load(std::memory_order_acquire));
  } catch (const Error&) {
    end_sync(slot, std::nullopt);
    throw;
  }
  pages_mapped(facts_of(*slot), times, start, std::nullopt);
  end_sync(slot, handle);
}

void* Engine::host_alloc(size_t bytes) {
  // cuMemHostAlloc needs a current context; portable buffers serve every device.
  CUcontext current = nullptr;
  if (driver_.cuCtxGetCurrent(&current) == CUDA_SUCCESS && current != nullptr) {
    return host_pool_.allocate(bytes);
  }
  ContextScope scope(driver_, device(0).context);
  return host_pool_.allocate(bytes);
}

void Engine::note_memory() {
  size_t free_bytes = 0, total_bytes = 0;
  if (driver_.cuMemGetInfo(&free_bytes, &total_bytes) != CUDA_SUCCESS) return;
  const uint64_t used = total_bytes - free_bytes;
  const uint64_t reserved = bytes_reserved_.load(), mapped = bytes_mapped_.load();
  const uint64_t without = used + (reserved > mapped ? reserved - mapped : 0);
  for (auto [peak, value] : {std::pair{&peak_used_, used}, std::pair{&peak_without_, without}}) {
    uint64_t seen = peak->load();
    while (value > seen && !peak->compare_exchange_weak(seen, value)) {
    }
  }
}

vaswap_stats Engine::stats() {
  vaswap_stats s{};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    s.slots_live = slots_.size();
  }
  s.bytes_mapped = bytes_mapped_.load();
  s.releases = releases_.load();
  s.remaps = remaps_done_.load();
  s.bytes_offloaded = bytes_offloaded_.load();
  s.bytes_restored = bytes_restored_.load();
  s.errors = errors_.load();
  s.host_bytes_pinned = host_pool_.bytes_pinned();
  s.host_bytes_in_use = host_pool_.bytes_in_use();
  return s;
}

// =============================================================================================
// The process's engine
// =============================================================================================

Engine& engine() {
  static Engine* instance = [] {
    std::string error;
    const Driver* driver = load_driver(&error);
    if (driver == nullptr) return static_cast<Engine*>(nullptr);
    trace::open_from_environment();
    return new Engine(*driver);  // leaked: workers and callbacks outlive static destructors
  }();
  if (instance == nullptr) {
    std::string error;
    load_driver(&error);
    fail(VASWAP_ERROR_UNAVAILABLE, error);
  }
  return *instance;
}

}  // namespace vaswap
