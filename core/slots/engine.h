// The slot engine: fixed-VA slots, their release and remap, per-device resources and workers.
// One object per process (engine()); the C API in interpose/c_api.cpp is a thin layer over it.
//
// State lives under one mutex (Engine::mutex) and every change is announced on Engine::changed.
// Driver calls are made without that mutex held; VMM calls additionally take the driver-call
// lock when calls are serialized (the default). Host callbacks only post jobs to workers.
#pragma once

#include <cuda.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "base/driver.h"
#include "slots/device_costs.h"
#include "slots/host_pool.h"
#include "slots/worker.h"
#include "vaswap/vaswap.h"

namespace vaswap {

struct RemapBatch;

// An event shared by a remap and the slot that adopted it; destroyed with its last owner.
using SharedEvent = std::shared_ptr<CUevent_st>;

// ---------------------------------------------------------------------------------------------
// Devices
// ---------------------------------------------------------------------------------------------

// What allocations can have of cuMemGetInfo's free memory (Engine::allocatable). An H100 reported
// about 2.2 MiB free that neither cuMemCreate nor cuMemAlloc got, at every fill from 256 to 8 MiB
// left (bench/results/create_room_session54_h100.txt); counted as room, a capture's copy was
// planned into pages the device would not give, found only by failed maps. One granule is held
// back, or more once a device was seen to keep more back (Engine::learn_held_back), at most
// kHeldBackMax: memory freed where vaswap does not see it (another process) while a map fails can
// make the figure too high, and it costs every user of the room that much.
constexpr uint64_t kFreeNoAllocationGets = uint64_t{2} << 20;
constexpr uint64_t kHeldBackMax = uint64_t{64} << 20;

struct Device {
  int ordinal = 0;
  CUdevice device = 0;
  CUcontext context = nullptr;  // the primary context, retained for the life of the process
  size_t granularity = 0;       // minimum VMM allocation granularity
  std::once_flag workers_once;
  CUstream copy_stream = nullptr;    // vaswap's H2D stream for the remap worker's copies
  CUstream launch_stream = nullptr;  // vaswap's H2D stream for vaswap_remap_launch_h2d
  std::unique_ptr<Worker> release_worker;
  std::unique_ptr<Worker> remap_worker;
  std::unique_ptr<Worker> completion_worker;  // waits for vaswap's H2D copies to complete
  // vaswap H2D copies submitted on this device whose completion callback has not run yet
  // (guarded by Engine's mutex). Workers make no VMM call while it is non-zero: on the H200 any
  // VMM call halves the bandwidth of an H2D copy running at the time.
  int h2d_in_flight = 0;
  // Physical handles kept after an unmap for a later map of the same size (vaswap_set_page_reuse):
  // an H2D into a handle mapped again runs at the link's speed, into a new one about 8% slower
  // (docs/PERFORMANCE.md). Keyed by size; guarded by spare_mutex.
  std::mutex spare_mutex;
  std::multimap<size_t, CUmemGenericAllocationHandle> spare;
  uint64_t spare_bytes = 0;
  // One granule of pages mapped at every granule of the slots that need a valid address and no
  // data (Engine::map_placeholder); made for the first of them, released with the last.
  std::mutex placeholder_mutex;
  CUmemGenericAllocationHandle placeholder = 0;
  size_t placeholder_users = 0;
  // Free memory (cuMemGetInfo) that no allocation gets: kFreeNoAllocationGets, or what a failed
  // map showed beyond it (Engine::learn_held_back). Never lowered.
  std::atomic<uint64_t> held_back{kFreeNoAllocationGets};
};

// Makes a context current on this thread for a scope, and restores the previous one.
class ContextScope {
 public:
  ContextScope(const Driver& driver, CUcontext context);
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;
  ~ContextScope();

 private:
  const Driver& driver_;
  CUcontext previous_ = nullptr;
  bool switched_ = false;
};

// ---------------------------------------------------------------------------------------------
// Slots and remaps
// ---------------------------------------------------------------------------------------------

struct Slot {
  uint64_t id = 0;
  int device = 0;
  size_t bytes = 0;         // asked for
  size_t mapped_bytes = 0;  // one handle: bytes rounded up to the granularity
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle handle = 0;  // pages the slot owns; 0 when released
  bool release_pending = false;
  bool closing = false;
  bool intercepted = false;     // backs an allocation the preload intercepted: its free destroys it
  bool managed = false;         // residency.h moves its pages; the C API's moves refuse it
  RemapBatch* remap = nullptr;  // a remap that references the slot, until adopt/destroy
  // Devices besides its own whose work reaches its pages (bit N: device N), granted by
  // grant_access() and given again at every later map. cudaMalloc memory is reachable by a copy
  // on another device's stream without any call; VMM pages only by the devices given access.
  std::atomic<uint64_t> peers{0};
  SharedEvent last_copy;    // the H2D of the remap it adopted; a release waits on it
  std::string async_error;  // a worker's failure, reported by the next call on the slot

  std::string describe() const;  // "slot 3 (va 0x…, 64 MiB on device 0)"
};

// What the trace says about a slot; copied where the slot may be gone by the time it is written.
struct SlotFacts {
  uint64_t id = 0;
  CUdeviceptr va = 0;
  size_t bytes = 0;
  size_t mapped_bytes = 0;
  int device = 0;
};

inline SlotFacts facts_of(const Slot& slot) {
  return {slot.id, slot.va, slot.bytes, slot.mapped_bytes, slot.device};
}

// How long the driver calls of one map or unmap took, for the trace.
struct PageTimes {
  double create_us = 0, map_us = 0, access_us = 0;  // map_pages
  double unmap_us = 0, release_us = 0;              // unmap_pages
  bool reused = false;  // map_pages mapped a kept handle: no cuMemCreate
  bool kept = false;    // unmap_pages kept the handle for reuse: no cuMemRelease
};

// Where a worker's map or unmap sat in its batch; absent for the synchronous calls.
struct BatchTiming {
  uint64_t batch = 0;
  double wait_us = 0;  // remap: waiting for the slot's release
  double lag_us = 0;   // from the callback (release) or the submission (remap) to the work
};

inline uint64_t stream_id(CUstream stream) { return reinterpret_cast<uintptr_t>(stream); }

enum class RemapKind { remap_only, copy, deferred };

struct RemapEntry {
  Slot* slot = nullptr;  // nullptr once the slot is destroyed
  uint64_t slot_id = 0;
  CUdeviceptr va = 0;
  size_t bytes = 0;
  size_t mapped_bytes = 0;
  void* host = nullptr;
  CUmemGenericAllocationHandle handle = 0;  // new pages, owned by the batch until adopted
  bool mapped = false;
  bool submitted = false;  // copy event recorded (or, with no copy, mapping done)
  bool failed = false;
  bool adopted = false;
  bool launched = false;  // deferred: vaswap_remap_launch_h2d has taken this entry
  std::string error;
  CUevent start = nullptr;         // timing, before the H2D
  CUevent end = nullptr;           // timing, after the H2D
  CUevent ready = nullptr;         // deferred: the launching stream's point the copy waits for
  SharedEvent copied;              // after the H2D (or the mapping, for remap-only); no timing
  CUstream copy_stream = nullptr;  // where the H2D ran
};

struct RemapBatch {
  uint64_t id = 0;
  RemapKind kind = RemapKind::copy;
  Device* device = nullptr;
  std::vector<RemapEntry> entries;
  bool worker_done = false;
  bool destroying = false;
  int outstanding = 0;  // callbacks and jobs that still reference the batch
  uint64_t queued_ns = 0;
  CUevent after = nullptr;  // remap_when: the copies wait for it on the copy stream (owned)
};

// ---------------------------------------------------------------------------------------------
// The engine
// ---------------------------------------------------------------------------------------------

class Engine {
 public:
  explicit Engine(const Driver& driver) : driver_(driver) {}

  // Slots
  // `intercepted`: the slot backs an allocation the preload intercepted; only the program's free
  // of that allocation may destroy it (vaswap_slot_destroy refuses).
  // `backed` false: the address alone is reserved; the slot has no pages until back().
  // `report` false: a failure is thrown without going to the log and the error count.
  Slot* create_slot(int device, size_t bytes, bool intercepted = false, bool backed = true,
                    bool report = true);
  // Waits for the device (cuCtxSynchronize, as cudaFree does) before the pages go, unless
  // `device_idle_for_it` says nothing queued can touch them (the caller synchronized the one
  // stream that used them: a context-wide wait also waits for streams parked on a restore).
  void destroy_slot(Slot* slot, bool device_idle_for_it = false);
  vaswap_slot_info info(Slot* slot);
  void unmap_and_release(Slot* slot);
  void create_and_remap(Slot* slot);

  // Offload
  void release_after(const std::vector<Slot*>& slots, CUstream stream);
  void offload_after(const std::vector<Slot*>& slots, const std::vector<void*>& hosts,
                     CUstream stream);

  // Restore
  RemapBatch* remap_after(RemapKind kind, const std::vector<Slot*>& slots,
                          const std::vector<void*>& hosts, CUstream stream);
  // A copy remap with no host callback: the worker maps the pages as soon as the slots' releases
  // are done, and the H2D copies wait for `after` (may be null) on the copy stream. The batch
  // takes ownership of `after`. For the planner: host callbacks of all streams run one at a
  // time, so a remap point could wait behind another stream's release point.
  RemapBatch* remap_when(const std::vector<Slot*>& slots, const std::vector<void*>& hosts,
                         CUevent after);
  void launch_h2d(RemapBatch* batch, size_t index, CUstream stream);
  void wait_submitted(RemapBatch* batch, size_t index);
  void wait_on_stream(RemapBatch* batch, size_t index, CUstream stream);
  bool try_wait_on_stream(RemapBatch* batch, CUstream stream);  // false: not ready
  // Blocks until every copy of the batch is submitted (or failed), at most `timeout_ms`; true
  // when they are. Woken as soon as the worker submits.
  bool wait_submitted_for(RemapBatch* batch, int timeout_ms);
  void adopt(RemapBatch* batch);
  // Pages nobody adopted are unmapped after a device-wide synchronize. `may_synchronize` false
  // (a stream capture is open, core/base/capture_gate.h): if there are such pages, it fails with
  // VASWAP_ERROR_INVALID_STATE and the batch is left as it was.
  void destroy_remap(RemapBatch* batch, bool may_synchronize = true);

  // Mechanism for the slots residency.h manages (Slot::managed): pages at the slot's address, or
  // none. Each throws Error with nothing changed; the caller serializes the calls of one slot.
  // `report` false: a failure is thrown without going to the log and the error count (the
  // caller retries, and reports what remains).
  // back() maps a kept handle of the slot's size if there is one. unback() with `keep` keeps the
  // handle for the next back() of that size (residency counts kept bytes within its budget);
  // without, page reuse applies as the C API set it (vaswap_set_page_reuse).
  void back(Slot* slot, const std::optional<BatchTiming>& timing, bool report = true);
  void unback(Slot* slot, const std::optional<BatchTiming>& timing, bool keep = false);
  // For driver calls that check a slot's address and touch no data (adding a copy node to a
  // graph, instantiating one): map_placeholder() maps the device's placeholder granule at each of
  // the slot's granules, so the address is valid and costs one granule of memory for all slots
  // mapped so at once; unmap_placeholder() takes it away. The slot must have no pages (managed, not
  // resident) and nothing may run on it meanwhile. Each throws Error naming the call and the slot,
  // without logging it, with nothing mapped.
  void map_placeholder(Slot* slot);
  void unmap_placeholder(Slot* slot);
  // Gives `ordinal` (another device) read and write access to the slot's pages, now and at every
  // later map: a copy enqueued on that device's stream names the slot (a peer copy). The caller
  // holds the slot mapped meanwhile (residency's acquire). Throws Error naming the call, the
  // slot and the device (for one that cannot reach this one's memory), without logging it.
  void grant_access(Slot* slot, int ordinal);
  // Gives `accessor` access to every slot of device `owner`, now and at every later map (the
  // program enabled peer access: its kernels may dereference them). Returns the slots it was
  // given for now; a slot whose pages are away gets it at its next map.
  uint64_t grant_device_access(int owner, int accessor);
  // Counts a copy residency made (the engine's stats and its peaks).
  // A copy residency made, of `bytes` in `us` on the device's clock (0: not timed).
  void count_copy(int device, bool d2h, uint64_t bytes, double us) {
    (d2h ? bytes_offloaded_ : bytes_restored_).fetch_add(bytes);
    device_costs_.copied(device, d2h, bytes, us);
  }
  const Driver& driver() const { return driver_; }

  // Diagnostics and policy
  void memory_info(int device, size_t* free_bytes, size_t* total_bytes);
  // cuMemGetInfo's free memory of the device; empty where it cannot be read (nothing logged).
  std::optional<uint64_t> free_memory(int device);
  // What allocations can have of `free_bytes` on the device: less what it holds back (one granule,
  // or what learn_held_back learned). Every user of the device's room reads it through this: the
  // budget, a capture's copy, a placeholder, the program's allocations beside rewritten graphs.
  uint64_t allocatable(int device, uint64_t free_bytes);
  // allocatable() of the free memory now; empty where cuMemGetInfo fails.
  std::optional<uint64_t> allocatable_now(int device);
  // Memory going back to the driver: an unmap's release, kept handles', the placeholder's, and the
  // program's frees (intercept's hooks hold one around the real call). A reading of free memory
  // after a failed map says what the device keeps back only where nothing went back since before
  // the map: given_back_mark() before it (empty while memory is going back), and learn_held_back
  // compares. Before, a release that ended between the failed map and the reading made the
  // simulator, which keeps nothing back, "learn" 4 MiB (the demo at 40 MiB, every buffer a slot).
  void giving_back(bool begins);  // true as it begins, false once it has ended
  class GivingBack {
   public:
    explicit GivingBack(Engine& engine) : engine_(engine) { engine_.giving_back(true); }
    GivingBack(const GivingBack&) = delete;
    GivingBack& operator=(const GivingBack&) = delete;
    ~GivingBack() { engine_.giving_back(false); }

   private:
    Engine& engine_;
  };
  std::optional<uint64_t> given_back_mark() const;
  // A map of `pages` on the device failed out of memory in cuMemCreate; `mark` was
  // given_back_mark() and `free_before` free_memory() before it. Where cuMemGetInfo reported room
  // for them beyond the one granule both before and after, and nothing went back since the mark,
  // the device keeps that much back (by the smaller reading): allocatable() leaves it out from now
  // on (at most kHeldBackMax; never lowered). What it learned, for the caller to say.
  struct HeldBack {
    bool learned = false;     // the figure grew
    bool first = false;       // from the one granule: nothing was learned before
    uint64_t bytes = 0;       // the figure now
    uint64_t free_bytes = 0;  // cuMemGetInfo's free memory it read
  };
  HeldBack learn_held_back(int device, uint64_t pages, uint64_t mark, uint64_t free_before);
  void init_workers(int device);
  // The device's primary context, retained by the engine for the life of the process.
  CUcontext context(int ordinal) { return device(ordinal).context; }
  void set_serial_driver_calls(bool serial) { serial_.store(serial); }
  // vaswap_set_page_reuse: keep up to `bytes` of unmapped handles per device for later maps of
  // the same size (0: none, and the kept ones are released now). Returns the bytes released.
  uint64_t set_page_reuse(uint64_t bytes);
  // Kept handles of a device (for residency, which counts them within its budget): their bytes
  // (and, with `has_size`, whether one of exactly `size` bytes is there), and releasing them down
  // to `keep` bytes.
  uint64_t spare_bytes(int ordinal, size_t size = 0, bool* has_size = nullptr);
  // The bytes of every live slot's pages, mapped or not (all devices).
  uint64_t slot_bytes() const { return bytes_reserved_.load(std::memory_order_relaxed); }
  // Of the slots on `device` alone (every device's where its ordinal is past 63).
  uint64_t slot_bytes(int device) const {
    return device >= 0 && device < 64 ? device_reserved_[device].load(std::memory_order_relaxed)
                                      : slot_bytes();
  }
  uint64_t trim_spares(int ordinal, uint64_t keep);
  vaswap_stats stats();
  // What this process's maps and unmaps have cost, per device (the planner's model reads it).
  const DeviceCosts& device_costs() const { return device_costs_; }
  // Device memory as the driver reports it (cuMemGetInfo), read after every map and unmap of a
  // slot's pages and by the planner's sampler: the most in use, and the most in use plus the
  // slot pages released at that moment (what the program would have held without vaswap).
  struct MemoryPeaks {
    uint64_t used = 0, without_releases = 0;
  };
  void note_memory();
  MemoryPeaks memory_peaks() const { return {peak_used_.load(), peak_without_.load()}; }
  void* host_alloc(size_t bytes);
  void host_free(void* host) { host_pool_.release(host); }

  // Handle checks: the object, or an INVALID_ARGUMENT error naming the handle.
  Slot* slot_of(const void* handle);
  RemapBatch* remap_of(const void* handle);

 private:
  struct ReleaseJob;
  struct CopiesDone;
  static void CUDA_CB on_release_point(void* job);
  static void CUDA_CB on_remap_point(void* batch);
  RemapBatch* submit_remap(RemapKind kind, const std::vector<Slot*>& slots,
                           const std::vector<void*>& hosts, CUstream stream, CUevent after);

  Device& device(int ordinal);
  Device& device_with_workers(int ordinal);
  std::vector<Slot*> checked_batch(const std::vector<Slot*>& slots, const char* call);
  void check_stream(Device& d, CUstream stream, const char* call);
  void check_host_buffer(const Slot& slot, void* host);
  void start_release(const char* call, const std::vector<Slot*>& slots,
                     const std::vector<void*>& hosts, CUstream stream);
  void run_release(ReleaseJob& job);
  void run_remap(RemapBatch& batch);
  void collect_copies(const CopiesDone& done);
  void track_copies(RemapBatch& batch, std::vector<size_t> indices);
  void h2d_done(Device& d);
  SharedEvent make_event(unsigned flags, const std::string& subject);
  RemapEntry& entry_of(RemapBatch* batch, size_t index, const char* call);
  void stream_waits(const RemapBatch& batch, CUstream stream,
                    const std::vector<SharedEvent>& events);
  void wait_until(std::unique_lock<std::mutex>& lock, const std::function<bool()>& done);
  std::string take_async_errors(const std::vector<Slot*>& slots);

  // Driver calls with error reporting; see engine.cpp.
  void check(CUresult result, const char* call, const std::string& subject, bool report = true);
  // `peers`: other devices given access besides d (Slot::peers).
  CUmemGenericAllocationHandle map_pages(Device& d, CUdeviceptr va, size_t bytes,
                                         const std::string& subject, PageTimes* times,
                                         uint64_t peers, bool report = true);
  // `keep_limit`: the handle is kept for reuse if the device's kept bytes stay within it (0:
  // released).
  void unmap_pages(Device& d, CUdeviceptr va, size_t bytes, CUmemGenericAllocationHandle handle,
                   const std::string& subject, PageTimes* times, uint64_t keep_limit);
  // Kept handles: a handle of exactly `bytes`, or 0; keep one if the limit allows; release kept
  // handles (all, or down to `keep` bytes). Callers hold driver_call_lock where it applies.
  CUmemGenericAllocationHandle take_spare(Device& d, size_t bytes);
  bool keep_spare(Device& d, size_t bytes, CUmemGenericAllocationHandle handle, uint64_t limit);
  uint64_t release_spares(Device& d, uint64_t keep = 0);
  // Counters and trace for pages that went away or came back, shared by workers and the
  // synchronous calls.
  void pages_released(const SlotFacts& slot, const PageTimes& times, uint64_t start_ns,
                      const std::optional<BatchTiming>& timing);
  void pages_mapped(const SlotFacts& slot, const PageTimes& times, uint64_t start_ns,
                    const std::optional<BatchTiming>& timing);
  // The synchronous calls reserve the slot (release_pending) against workers and other calls.
  void reserve_for_sync(Slot* slot, const char* call, bool want_mapped);
  void end_sync(Slot* slot, std::optional<CUmemGenericAllocationHandle> handle);
  std::unique_lock<std::mutex> driver_call_lock();

  std::atomic<int> giving_back_{0};      // GivingBack objects alive
  std::atomic<uint64_t> given_back_{0};  // GivingBack objects made and ended
  const Driver& driver_;
  std::mutex mutex_;
  // Per device, the other devices given access to all its slots (bit N: device N).
  std::atomic<uint64_t> device_peers_[64] = {};
  std::condition_variable changed_;
  std::unordered_set<Slot*> slots_;
  std::unordered_set<RemapBatch*> remaps_;
  std::vector<std::unique_ptr<Device>> devices_;  // by ordinal, created on first use
  std::mutex driver_call_mutex_;
  std::atomic<bool> serial_{true};
  std::atomic<uint64_t> next_id_{1};
  HostPool host_pool_{driver_};

  std::atomic<uint64_t> bytes_mapped_{0}, releases_{0}, remaps_done_{0}, bytes_offloaded_{0},
      bytes_restored_{0}, errors_{0};
  std::atomic<uint64_t> bytes_reserved_{0};         // mapped_bytes of every live slot
  std::atomic<uint64_t> device_reserved_[64] = {};  // the same per device (ordinals below 64)
  std::atomic<uint64_t> reuse_limit_{0};            // vaswap_set_page_reuse, per device
  std::atomic<uint64_t> peak_used_{0}, peak_without_{0};
  DeviceCosts device_costs_;
};

// The process's engine, created on first use. Throws VASWAP_ERROR_UNAVAILABLE when the CUDA
// driver cannot be loaded.
Engine& engine();

}  // namespace vaswap
