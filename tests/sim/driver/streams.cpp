// Simulated driver: streams (one worker thread each), events, host functions, stream capture.
//
// Ordering model. Each stream executes its operations in order on its own thread. An operation is
// identified by a ticket; waits (events, the legacy stream's implicit synchronization) always
// name tickets issued earlier, so waiting threads can never form a cycle.
#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "state.h"

namespace vsim {

namespace {

std::mutex& registry_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::unordered_map<Stream*, std::shared_ptr<Stream>>& stream_registry() {
  static auto* r = new std::unordered_map<Stream*, std::shared_ptr<Stream>>;
  return *r;
}
std::unordered_map<Event*, std::shared_ptr<Event>>& event_registry() {
  static auto* r = new std::unordered_map<Event*, std::shared_ptr<Event>>;
  return *r;
}
std::vector<Capture*>& active_captures() {  // guarded by capture_mutex()
  static auto* v = new std::vector<Capture*>;
  return *v;
}

std::atomic<uint64_t> g_next_stream_id{1};
std::atomic<uint64_t> g_next_capture_id{1};
thread_local CUstreamCaptureMode tls_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
thread_local std::map<int, std::shared_ptr<Stream>> tls_per_thread_streams;

void mark_dispatched(Device& device, uint64_t sequence) {
  std::lock_guard<std::mutex> lock(device.queue_mutex);
  device.queue_dispatched = sequence;
  device.queue_cv.notify_all();
}

int jitter_us() {
  static const int value = [] {
    const char* v = std::getenv("VASWAP_SIM_JITTER_US");
    return v != nullptr ? std::max(0, std::atoi(v)) : 0;
  }();
  return value;
}

void worker_loop(Stream* s) {
  Device& device = devices()[static_cast<size_t>(s->device)];
  tls_worker_device = s->device;
  std::unique_lock<std::mutex> lock(s->mu);
  for (;;) {
    s->cv.wait(lock, [s] { return !s->ops.empty() || s->stopping; });
    if (s->ops.empty()) return;  // stopping and drained
    Stream::Op op = std::move(s->ops.front());
    s->ops.pop_front();
    lock.unlock();
    // After a device fault nothing more runs on the device (host functions included); operations
    // still retire, so waits end and the calls that check return the fault.
    if (device.sticky.load() != 0) op.run = [] {};
    if (const int jitter = jitter_us()) {
      // VASWAP_SIM_JITTER_US: each operation starts up to that many microseconds late, at random:
      // orders that timing alone keeps from happening happen (a test's race finder).
      thread_local unsigned seed = static_cast<unsigned>(s->id * 2654435761u);
      std::this_thread::sleep_for(std::chrono::microseconds(rand_r(&seed) % jitter));
    }
    if (op.queue_sequence != 0) {
      // One hardware queue: wait until every earlier operation of the device was dispatched.
      {
        std::unique_lock<std::mutex> queue_lock(device.queue_mutex);
        device.queue_cv.wait(queue_lock,
                             [&] { return device.queue_dispatched + 1 >= op.queue_sequence; });
      }
      if (!op.holds_queue) mark_dispatched(device, op.queue_sequence);
      op.run();
      if (op.holds_queue) mark_dispatched(device, op.queue_sequence);
    } else {
      op.run();
    }
    lock.lock();
    ++s->completed;
    s->cv.notify_all();
  }
}

std::shared_ptr<Stream> make_stream(int device, unsigned flags, int priority) {
  auto s = std::make_shared<Stream>();
  s->device = device;
  s->flags = flags;
  s->priority = priority;
  s->id = g_next_stream_id.fetch_add(1);
  s->worker = std::thread(worker_loop, s.get());
  std::lock_guard<std::mutex> lock(registry_mutex());
  stream_registry()[s.get()] = s;
  return s;
}

std::shared_ptr<Stream> legacy_stream(int device) {
  Context& ctx = devices()[static_cast<size_t>(device)].primary;
  static auto* m = new std::mutex;
  std::lock_guard<std::mutex> lock(*m);
  if (!ctx.legacy) {
    ctx.legacy = make_stream(device, 0, 0);
    ctx.legacy->legacy = true;
  }
  return ctx.legacy;
}

std::shared_ptr<Stream> per_thread_stream(int device) {
  auto& slot = tls_per_thread_streams[device];
  if (!slot) {
    slot = make_stream(device, 0, 0);
    slot->per_thread = true;
  }
  return slot;
}

bool blocking(const Stream& s) { return (s.flags & CU_STREAM_NON_BLOCKING) == 0; }

// Pushes `op`, first making it wait for what the legacy-stream rules require: an op on the legacy
// stream waits for all blocking streams of its device, an op on a blocking stream waits for the
// legacy stream.
uint64_t enqueue(const std::shared_ptr<Stream>& s, std::function<void()> op,
                 bool holds_queue = false) {
  std::vector<std::pair<std::shared_ptr<Stream>, uint64_t>> waits;
  if (s->legacy) {
    std::lock_guard<std::mutex> lock(registry_mutex());
    for (auto& entry : stream_registry()) {
      const auto& other = entry.second;
      if (other == s || other->device != s->device || !blocking(*other)) continue;
      const uint64_t t = other->tail();
      if (!other->done(t)) waits.emplace_back(other, t);
    }
  } else if (blocking(*s)) {
    Context& ctx = devices()[static_cast<size_t>(s->device)].primary;
    std::shared_ptr<Stream> legacy;
    {
      std::lock_guard<std::mutex> lock(registry_mutex());
      legacy = ctx.legacy;
    }
    if (legacy) {
      const uint64_t t = legacy->tail();
      if (!legacy->done(t)) waits.emplace_back(legacy, t);
    }
  }
  if (!waits.empty()) {
    op = [waits = std::move(waits), inner = std::move(op)] {
      for (const auto& w : waits) w.first->wait(w.second);
      inner();
    };
    holds_queue = true;
  }
  return s->push(std::move(op), holds_queue);
}

void invalidate(Capture* c) { c->invalidated = true; }

std::vector<Node*> merged(std::vector<Node*> a, const std::vector<Node*>& b) {
  for (Node* n : b) {
    if (std::find(a.begin(), a.end(), n) == a.end()) a.push_back(n);
  }
  return a;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Stream
// ---------------------------------------------------------------------------------------------

uint64_t Stream::push(std::function<void()> op, bool holds_queue) {
  Device& d = devices()[static_cast<size_t>(device)];
  // The device-wide sequence is taken under the stream's lock, so each stream's operations carry
  // increasing sequence numbers.
  const bool single = d.single_queue.load();
  std::unique_lock<std::mutex> queue_lock(d.queue_mutex, std::defer_lock);
  if (single) queue_lock.lock();
  std::lock_guard<std::mutex> lock(mu);
  ops.push_back(Op{std::move(op), single ? ++d.queue_submitted : 0, holds_queue});
  const uint64_t ticket = ++enqueued;
  cv.notify_all();
  return ticket;
}

uint64_t Stream::tail() {
  std::lock_guard<std::mutex> lock(mu);
  return enqueued;
}

bool Stream::done(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mu);
  return completed >= ticket;
}

void Stream::wait(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return completed >= ticket; });
}

void Stream::stop_and_join() {
  {
    std::lock_guard<std::mutex> lock(mu);
    stopping = true;
    cv.notify_all();
  }
  if (worker.joinable()) worker.join();
}

std::mutex& capture_mutex() {
  static auto* m = new std::mutex;
  return *m;
}

CUresult resolve_stream(CUstream h, std::shared_ptr<Stream>* out) {
  const auto raw = reinterpret_cast<uintptr_t>(h);
  if (raw == 0 || raw == reinterpret_cast<uintptr_t>(CU_STREAM_LEGACY) ||
      raw == reinterpret_cast<uintptr_t>(CU_STREAM_PER_THREAD)) {
    int dev = 0;
    SIM_TRY(current_device(&dev));
    const bool per_thread = raw == reinterpret_cast<uintptr_t>(CU_STREAM_PER_THREAD) ||
                            (raw == 0 && tls_null_is_per_thread);
    *out = per_thread ? per_thread_stream(dev) : legacy_stream(dev);
    return CUDA_SUCCESS;
  }
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = stream_registry().find(reinterpret_cast<Stream*>(h));
  if (it == stream_registry().end()) return CUDA_ERROR_INVALID_HANDLE;
  *out = it->second;
  return CUDA_SUCCESS;
}

std::shared_ptr<Event> lookup_event(CUevent h) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = event_registry().find(reinterpret_cast<Event*>(h));
  return it == event_registry().end() ? nullptr : it->second;
}

// CUDA's rule for "potentially unsafe" calls (allocation, free, synchronous copies and memsets,
// synchronization, VMM mapping): a thread in relaxed mode may always make them; otherwise they
// are prohibited while the thread itself has a non-relaxed capture open, and, for a thread in
// global mode, while any other thread has a global-mode capture open. A prohibited call fails
// and invalidates the captures it interfered with.
CUresult check_capture_safety(bool own_only) {
  if (tls_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
  std::lock_guard<std::mutex> lock(capture_mutex());
  bool prohibited = false;
  const auto self = std::this_thread::get_id();
  for (Capture* c : active_captures()) {
    const bool own = c->thread == self && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED;
    const bool foreign = !own_only && c->thread != self &&
                         c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
                         tls_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
    if (own || foreign) {
      invalidate(c);
      prohibited = true;
    }
  }
  return prohibited ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

CUresult check_device_sync(int device) {
  std::lock_guard<std::mutex> lock(capture_mutex());
  bool prohibited = false;
  for (Capture* c : active_captures()) {
    for (Stream* member : c->streams) {
      if (member->device != device) continue;
      invalidate(c);
      prohibited = true;
      break;
    }
  }
  return prohibited ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

CUresult submit(CUstream h, std::unique_ptr<Node> node, Enqueued* after) {
  std::shared_ptr<Stream> s;
  SIM_TRY(resolve_stream(h, &s));
  // Not while the device loads a module (Device::loading).
  std::shared_lock<std::shared_mutex> loading(devices()[static_cast<size_t>(s->device)].loading);
  {
    std::lock_guard<std::mutex> lock(capture_mutex());
    if (Capture* c = s->capture) {
      if (c->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
      Node* n = c->graph->add(std::move(node),
                              reinterpret_cast<const CUgraphNode*>(s->capture_deps.data()),
                              s->capture_deps.size());
      s->capture_deps.assign(1, n);
      return CUDA_SUCCESS;
    }
    // Work on the legacy stream would have to wait for a capturing blocking stream: prohibited.
    if (s->legacy) {
      bool implicit = false;
      for (Capture* c : active_captures()) {
        for (Stream* member : c->streams) {
          if (member->device == s->device && blocking(*member)) {
            invalidate(c);
            implicit = true;
          }
        }
      }
      if (implicit) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    }
  }
  if (after != nullptr) {
    const std::shared_ptr<Stream> previous = after->stream.lock();
    const uint64_t ticket = after->ticket;
    if (previous && previous != s && !previous->done(ticket)) {
      enqueue(
          s, [previous, ticket] { previous->wait(ticket); }, /*holds_queue=*/true);
    }
  }
  const bool holds = node->holds_queue();
  std::shared_ptr<Node> shared(std::move(node));
  const uint64_t ticket = enqueue(
      s, [shared] { shared->run(); }, holds);
  if (after != nullptr) *after = Enqueued{s, ticket};
  return CUDA_SUCCESS;
}

void synchronize_device(int device) {
  std::vector<std::pair<std::shared_ptr<Stream>, uint64_t>> waits;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    for (auto& entry : stream_registry()) {
      if (entry.second->device == device) waits.emplace_back(entry.second, entry.second->tail());
    }
  }
  for (auto& w : waits) w.first->wait(w.second);
}

}  // namespace vsim

using namespace vsim;

// -----------------------------------------------------------------------------------------------
// Streams
// -----------------------------------------------------------------------------------------------

CUresult CUDAAPI cuStreamCreateWithPriority(CUstream* ph, unsigned int flags, int priority) {
  SIM_ENTER();
  if (ph == nullptr || (flags & ~unsigned(CU_STREAM_NON_BLOCKING)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  int dev = 0;
  SIM_TRY(current_device(&dev));
  const size_t cost = devices()[static_cast<size_t>(dev)].stream_bytes.load();
  if (cost > 0) SIM_TRY(charge_physical(dev, cost));
  const std::shared_ptr<Stream> s = make_stream(dev, flags, priority);
  s->charged = cost;
  *ph = reinterpret_cast<CUstream>(s.get());
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamCreate(CUstream* ph, unsigned int flags) {
  return cuStreamCreateWithPriority(ph, flags, 0);
}

CUresult CUDAAPI cuStreamDestroy_v2(CUstream h) {
  SIM_ENTER();
  std::shared_ptr<Stream> s;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto it = stream_registry().find(reinterpret_cast<Stream*>(h));
    if (it == stream_registry().end() || it->second->legacy || it->second->per_thread) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
    s = it->second;
    stream_registry().erase(it);
  }
  {
    std::lock_guard<std::mutex> lock(capture_mutex());
    if (s->capture) invalidate(s->capture);
  }
  s->stop_and_join();  // pending work completes first, as on a GPU
  if (s->charged > 0) refund_physical(s->device, s->charged);
  return CUDA_SUCCESS;
}

CUresult vsim::sync_or_query(CUstream h, bool wait) {
  std::shared_ptr<Stream> s;
  SIM_TRY(resolve_stream(h, &s));
  {
    std::lock_guard<std::mutex> lock(capture_mutex());
    if (s->capture) {
      invalidate(s->capture);
      return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
  }
  // A query of another stream's work is unsafe for a thread's own capture too: on an H100 a
  // thread capturing in the global mode had its capture invalidated by cuStreamQuery and
  // cuEventQuery of another stream's finished work
  // (bench/results/capture_unsafe_session52_h100.txt).
  SIM_TRY(check_capture_safety(/*own_only=*/true));
  if (!wait) return s->done(s->tail()) ? device_error(s->device) : CUDA_ERROR_NOT_READY;
  SIM_TRY(check_capture_safety());
  s->wait(s->tail());
  return device_error(s->device);
}

CUresult vsim::finish_staged(CUstream h, bool to_host) {
  std::shared_ptr<Stream> s;
  SIM_TRY(resolve_stream(h, &s));
  {
    std::lock_guard<std::mutex> lock(capture_mutex());
    if (s->capture) return CUDA_SUCCESS;
  }
  std::unique_lock<std::shared_mutex> held(devices()[static_cast<size_t>(s->device)].loading);
  const uint64_t tail = s->tail();
  s->wait(to_host ? tail : tail - 1);
  return device_error(s->device);
}

CUresult CUDAAPI cuStreamSynchronize(CUstream h) {
  SIM_ENTER();
  return sync_or_query(h, true);
}

CUresult CUDAAPI cuStreamQuery(CUstream h) {
  SIM_ENTER();
  return sync_or_query(h, false);
}

CUresult CUDAAPI cuStreamGetFlags(CUstream h, unsigned int* flags) {
  SIM_ENTER();
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Stream> s;
  SIM_TRY(resolve_stream(h, &s));
  *flags = s->flags;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamGetPriority(CUstream h, int* priority) {
  SIM_ENTER();
  if (priority == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Stream> s;
  SIM_TRY(resolve_stream(h, &s));
  *priority = s->priority;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamGetId(CUstream h, unsigned long long* id) {
  SIM_ENTER();
  if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Stream> s;
  SIM_TRY(resolve_stream(h, &s));
  *id = s->id;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamGetDevice(CUstream h, CUdevice* device) {
  SIM_ENTER();
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Stream> s;
  SIM_TRY(resolve_stream(h, &s));
  {
    // Measured on an H200 (driver 580): on a capturing stream, even a relaxed-mode capture, this
    // query fails and invalidates the capture. cuStreamIsCapturing is the safe question.
    std::lock_guard<std::mutex> lock(capture_mutex());
    if (s->capture) {
      invalidate(s->capture);
      return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
  }
  *device = s->device;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamGetCtx(CUstream h, CUcontext* pctx) {
  SIM_ENTER();
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Stream> s;
  SIM_TRY(resolve_stream(h, &s));
  *pctx = reinterpret_cast<CUcontext>(&devices()[static_cast<size_t>(s->device)].primary);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuLaunchHostFunc(CUstream h, CUhostFn fn, void* data) {
  SIM_ENTER();
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto node = std::make_unique<Node>();
  node->type = CU_GRAPH_NODE_TYPE_HOST;
  node->host_fn = fn;
  node->host_data = data;
  return submit(h, std::move(node));
}

// -----------------------------------------------------------------------------------------------
// Events
// -----------------------------------------------------------------------------------------------

CUresult CUDAAPI cuEventCreate(CUevent* ph, unsigned int flags) {
  SIM_ENTER();
  constexpr unsigned kKnown =
      CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (ph == nullptr || (flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
  int device = 0;
  SIM_TRY(current_device(&device));
  auto e = std::make_shared<Event>();
  e->flags = flags;
  e->device = device;
  std::lock_guard<std::mutex> lock(registry_mutex());
  event_registry()[e.get()] = e;
  *ph = reinterpret_cast<CUevent>(e.get());
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventDestroy_v2(CUevent h) {
  SIM_ENTER();
  std::lock_guard<std::mutex> lock(registry_mutex());
  return event_registry().erase(reinterpret_cast<Event*>(h)) ? CUDA_SUCCESS
                                                             : CUDA_ERROR_INVALID_HANDLE;
}

extern "C" unsigned long long vaswapSimLiveEvents(void) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return event_registry().size();
}

CUresult CUDAAPI cuEventRecordWithFlags(CUevent he, CUstream hs, unsigned int flags) {
  SIM_ENTER();
  if (flags != CU_EVENT_RECORD_DEFAULT) return CUDA_ERROR_NOT_SUPPORTED;
  auto e = lookup_event(he);
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  std::shared_ptr<Stream> s;
  SIM_TRY(resolve_stream(hs, &s));
  if (s->device != e->device) return CUDA_ERROR_INVALID_HANDLE;  // as CUDA: one context for both
  std::lock_guard<std::mutex> capture_lock(capture_mutex());
  std::lock_guard<std::mutex> event_lock(e->mu);
  if (Capture* c = s->capture) {
    if (c->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    e->capture = c;
    e->capture_deps = s->capture_deps;
    return CUDA_SUCCESS;
  }
  e->capture = nullptr;
  e->stamped = false;
  e->stream = s;
  const uint64_t generation = ++e->generation;
  std::weak_ptr<Event> weak = e;
  e->ticket = enqueue(s, [weak, generation] {
    if (auto ev = weak.lock()) {
      std::lock_guard<std::mutex> lock(ev->mu);
      if (ev->generation == generation) {
        ev->stamp = std::chrono::steady_clock::now();
        ev->stamped = true;
      }
    }
  });
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventRecord(CUevent he, CUstream hs) {
  return cuEventRecordWithFlags(he, hs, 0);
}

CUresult CUDAAPI cuEventQuery(CUevent he) {
  SIM_ENTER();
  auto e = lookup_event(he);
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  SIM_TRY(check_capture_safety(/*own_only=*/true));  // as a stream's query, measured on an H100
  std::lock_guard<std::mutex> lock(e->mu);
  if (e->capture != nullptr) return CUDA_ERROR_CAPTURED_EVENT;
  if (!e->stream || e->stamped) return CUDA_SUCCESS;
  return e->stream->done(e->ticket) ? device_error(e->stream->device) : CUDA_ERROR_NOT_READY;
}

CUresult CUDAAPI cuEventSynchronize(CUevent he) {
  SIM_ENTER();
  auto e = lookup_event(he);
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  std::shared_ptr<Stream> s;
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    if (e->capture != nullptr) return CUDA_ERROR_CAPTURED_EVENT;
    s = e->stream;
    ticket = e->ticket;
  }
  SIM_TRY(check_capture_safety());
  if (!s) return CUDA_SUCCESS;
  s->wait(ticket);
  return device_error(s->device);
}

CUresult CUDAAPI cuEventElapsedTime_v2(float* ms, CUevent hstart, CUevent hend) {
  SIM_ENTER();
  if (ms == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto a = lookup_event(hstart);
  auto b = lookup_event(hend);
  if (!a || !b) return CUDA_ERROR_INVALID_HANDLE;
  // One event may be both ends (0 ms, as on a GPU): lock it once.
  std::unique_lock<std::mutex> lock_a(a->mu, std::defer_lock);
  std::unique_lock<std::mutex> lock_b(b->mu, std::defer_lock);
  if (a == b) {
    lock_a.lock();
  } else {
    std::lock(lock_a, lock_b);
  }
  if (((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING) != 0 || !a->stream || !b->stream) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (!a->stamped || !b->stamped) return CUDA_ERROR_NOT_READY;
  *ms = std::chrono::duration<float, std::milli>(b->stamp - a->stamp).count();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream hs, CUevent he, unsigned int flags) {
  SIM_ENTER();
  if (flags != CU_EVENT_WAIT_DEFAULT) return CUDA_ERROR_NOT_SUPPORTED;
  auto e = lookup_event(he);
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  std::shared_ptr<Stream> s;
  SIM_TRY(resolve_stream(hs, &s));
  std::shared_ptr<Stream> producer;
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> capture_lock(capture_mutex());
    std::lock_guard<std::mutex> event_lock(e->mu);
    if (Capture* c = e->capture) {
      if (c->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
      if (s->capture == c) {
        s->capture_deps = merged(s->capture_deps, e->capture_deps);
      } else if (s->capture == nullptr) {  // fork: the stream joins the capture
        s->capture = c;
        s->capture_deps = e->capture_deps;
        c->streams.insert(s.get());
      } else {
        invalidate(s->capture);
        return CUDA_ERROR_STREAM_CAPTURE_MERGE;
      }
      return CUDA_SUCCESS;
    }
    if (s->capture != nullptr) {  // a capture may not depend on uncaptured work
      invalidate(s->capture);
      return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
    }
    producer = e->stream;
    ticket = e->ticket;
  }
  if (!producer || producer == s || producer->done(ticket)) return CUDA_SUCCESS;
  enqueue(
      s, [producer, ticket] { producer->wait(ticket); }, /*holds_queue=*/true);
  return CUDA_SUCCESS;
}

// -----------------------------------------------------------------------------------------------
// Stream capture
// -----------------------------------------------------------------------------------------------

static CUresult begin_capture(CUstream hs, Graph* into, const CUgraphNode* deps, size_t num_deps,
                              CUstreamCaptureMode mode) {
  if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::shared_ptr<Stream> s;
  SIM_TRY(resolve_stream(hs, &s));
  if (s->legacy) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  std::lock_guard<std::mutex> lock(capture_mutex());
  if (s->capture != nullptr) return CUDA_ERROR_ILLEGAL_STATE;
  auto* c = new Capture;
  c->id = g_next_capture_id.fetch_add(1);
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->owns_graph = into == nullptr;
  c->graph = into != nullptr ? into : new Graph;
  c->origin = s.get();
  c->streams.insert(s.get());
  s->capture = c;
  s->capture_deps.assign(reinterpret_cast<Node* const*>(deps),
                         reinterpret_cast<Node* const*>(deps) + num_deps);
  active_captures().push_back(c);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream hs, CUstreamCaptureMode mode) {
  SIM_ENTER();
  return begin_capture(hs, nullptr, nullptr, 0, mode);
}

CUresult CUDAAPI cuStreamBeginCaptureToGraph(CUstream hs, CUgraph hg, const CUgraphNode* deps,
                                             const CUgraphEdgeData* edge_data, size_t num_deps,
                                             CUstreamCaptureMode mode) {
  SIM_ENTER();
  (void)edge_data;  // the simulator has only default edges
  Graph* g = lookup_graph(hg);
  if (g == nullptr || (num_deps > 0 && deps == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  return begin_capture(hs, g, deps, num_deps, mode);
}

CUresult CUDAAPI cuStreamEndCapture(CUstream hs, CUgraph* phGraph) {
  SIM_ENTER();
  if (phGraph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Stream> s;
  SIM_TRY(resolve_stream(hs, &s));
  std::lock_guard<std::mutex> lock(capture_mutex());
  Capture* c = s->capture;
  if (c == nullptr) return CUDA_ERROR_ILLEGAL_STATE;
  if (c->origin != s.get()) return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
  if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && c->thread != std::this_thread::get_id()) {
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  }
  for (Stream* member : c->streams) {
    member->capture = nullptr;
    member->capture_deps.clear();
  }
  auto& active = active_captures();
  active.erase(std::remove(active.begin(), active.end(), c), active.end());
  const bool ok = !c->invalidated;
  *phGraph = nullptr;
  if (ok) {
    if (c->owns_graph) register_graph(c->graph);
    *phGraph = reinterpret_cast<CUgraph>(c->graph);
  } else if (c->owns_graph) {
    delete c->graph;
  }
  delete c;
  return ok ? CUDA_SUCCESS : CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
}

CUresult CUDAAPI cuStreamIsCapturing(CUstream hs, CUstreamCaptureStatus* status) {
  SIM_ENTER();
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Stream> s;
  SIM_TRY(resolve_stream(hs, &s));
  std::lock_guard<std::mutex> lock(capture_mutex());
  if (s->capture == nullptr) {
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
  } else {
    *status = s->capture->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                      : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamGetCaptureInfo_v3(CUstream hs, CUstreamCaptureStatus* status,
                                           cuuint64_t* id, CUgraph* graph, const CUgraphNode** deps,
                                           const CUgraphEdgeData** edge_data, size_t* num_deps) {
  SIM_ENTER();
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Stream> s;
  SIM_TRY(resolve_stream(hs, &s));
  std::lock_guard<std::mutex> lock(capture_mutex());
  Capture* c = s->capture;
  if (c == nullptr) {
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
  }
  *status = c->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  if (id != nullptr) *id = c->id;
  if (graph != nullptr) *graph = reinterpret_cast<CUgraph>(c->graph);
  if (deps != nullptr) *deps = reinterpret_cast<const CUgraphNode*>(s->capture_deps.data());
  if (edge_data != nullptr) {
    static thread_local std::vector<CUgraphEdgeData> edges;
    edges.assign(s->capture_deps.size(), CUgraphEdgeData{});
    *edge_data = edges.data();
  }
  if (num_deps != nullptr) *num_deps = s->capture_deps.size();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  SIM_ENTER();
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::swap(*mode, tls_capture_mode);
  return CUDA_SUCCESS;
}

void vsim::drain_at_shutdown(std::chrono::milliseconds limit) {
  std::vector<std::shared_ptr<Stream>> streams;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    for (auto& entry : stream_registry()) streams.push_back(entry.second);
  }
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (const auto& s : streams) {
    const uint64_t t = s->tail();
    while (!s->done(t) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}
