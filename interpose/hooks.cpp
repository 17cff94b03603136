// The CUDA entry points of libvaswap.so, defined from interpose/hooks.def.
//
// A hook finds the real function, decodes its arguments into driver types, and hands the call to
// core/observe/intercept.h; it decides nothing. Runtime hooks find the real function with
// dlsym(RTLD_NEXT) (falling back to the loaded libcudart); driver hooks ask the driver's own
// cuGetProcAddress for the ABI revision they implement. A per-thread depth counter makes a user
// call that passes through cudart and then the driver count once, at the level it entered.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "base/driver.h"
#include "base/errors.h"
#include "base/log.h"
#include "base/symbols.h"
#include "hooks.h"
#include "observe/intercept.h"

// Deprecated entry points (cudaGetDriverEntryPoint) are still called by programs built against
// older toolkits, so they are hooked all the same.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

// cuda.h maps these names to their newest ABI revisions; hooks.def names each revision exactly.
#undef cuGetProcAddress
#undef cuGraphExecUpdate
#undef cuGraphExecKernelNodeSetParams
#undef cuGraphAddNode

#define VASWAP_EXPORT extern "C" __attribute__((visibility("default")))

namespace vaswap::hooks {

using intercept::Api;
using intercept::Call;

// =============================================================================================
// The table
// =============================================================================================

enum Index : int {
#define VASWAP_RUNTIME_HOOK(kind, symbol, stream, params, args) k_##symbol,
#define VASWAP_DRIVER_HOOK(kind, base, symbol, version, stream, params, args) k_##symbol,
#include "hooks.def"
#undef VASWAP_RUNTIME_HOOK
#undef VASWAP_DRIVER_HOOK
  kCount
};

namespace {

constexpr bool legacy = false;
constexpr bool per_thread = true;

// Constant-initialized: lookups may arrive before any constructor of this library has run.
constexpr Entry kEntries[] = {
#define VASWAP_RUNTIME_HOOK(kind, symbol, stream, params, args) \
  {#symbol, #symbol, 0, stream, Api::runtime},
#define VASWAP_DRIVER_HOOK(kind, base, symbol, version, stream, params, args) \
  {#symbol, #base, version, stream, Api::driver},
#include "hooks.def"
#undef VASWAP_RUNTIME_HOOK
#undef VASWAP_DRIVER_HOOK
};
static_assert(sizeof kEntries / sizeof kEntries[0] == kCount, "one entry per hook");

std::atomic<void*> g_real[kCount];         // the real functions, found on first need
std::atomic<bool> g_missing_said[kCount];  // a missing real function is reported once

// A null answer is not cached: a libcudart loaded later can still provide the function.
void* find_runtime_symbol(const char* name, void* self) {
  void* fn = real_dlsym(RTLD_NEXT, name);
  if (fn != nullptr && fn != self) return fn;
  // RTLD_NEXT misses a libcudart that was loaded RTLD_LOCAL (as Python loads extension modules
  // and their dependencies); ask the copy that is loaded.
  for (const char* soname : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
    void* library = dlopen(soname, RTLD_LAZY | RTLD_NOLOAD);
    if (library == nullptr) continue;
    fn = real_dlsym(library, name);
    dlclose(library);
    if (fn != nullptr && fn != self) return fn;
  }
  return nullptr;
}

void* find_runtime_real(int index) {
  return find_runtime_symbol(kEntries[index].symbol, wrapper(index));
}

// The driver's own version (cuDriverGetVersion), read once; 0 when it cannot be read.
int driver_version(GetProcAddress get_proc_address) {
  static std::atomic<int> cached{-1};
  int version = cached.load(std::memory_order_acquire);
  if (version >= 0) return version;
  using GetVersion = CUresult (*)(int*);
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  version = 0;
  if (get_proc_address("cuDriverGetVersion", &fn, 2020, CU_GET_PROC_ADDRESS_DEFAULT, &status) ==
          CUDA_SUCCESS &&
      fn != nullptr && reinterpret_cast<GetVersion>(fn)(&version) != CUDA_SUCCESS) {
    version = 0;
  }
  cached.store(version, std::memory_order_release);
  return version;
}

// The CUDA version that introduced per-thread default streams, and with them the _ptds/_ptsz twins.
constexpr int kPerThreadSince = 7000;

// Whether `fn` is the driver's function exported as `symbol` (true where dladdr cannot name it).
bool named(void* fn, const char* symbol) {
  Dl_info info{};
  if (dladdr(fn, &info) == 0 || info.dli_sname == nullptr) return true;
  return std::strcmp(info.dli_sname, symbol) == 0;
}

void* find_driver_real(int index) {
  const Entry& e = kEntries[index];
  GetProcAddress get_proc_address = driver_get_proc_address();
  if (get_proc_address == nullptr) return nullptr;
  // A driver older than the revision a hook wraps answers with an older revision under the same
  // name, whose signature differs (cuMemcpyBatchAsync: CUDA 12.8's has a failure index before the
  // stream). Not hooked there: the call passes through unhandled rather than with the wrong
  // arguments.
  const int have = driver_version(get_proc_address);
  if (have != 0 && have < e.version) return nullptr;
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  const cuuint64_t flags = e.per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                        : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
  // Per-thread twins exist from CUDA 7.0 on: asked at an older revision's version the driver
  // answers with no function (CUDA_SUCCESS, VERSION_NOT_SUFFICIENT: cuMemcpyHtoD_v2_ptds at 3020,
  // bench/results/procaddr_ptds_h100.txt), so they are asked at 7000, and the answer is kept only
  // where it is the twin of this revision (no hooked call gained a revision between the two).
  const int version = e.per_thread ? std::max(e.version, kPerThreadSince) : e.version;
  if (get_proc_address(e.base, &fn, version, flags, &status) == CUDA_SUCCESS && fn != nullptr &&
      fn != wrapper(index) && (version == e.version || named(fn, e.symbol))) {
    return fn;
  }
  // Not answered for this revision, or answered with the wrong definition: the driver library's
  // own symbol of exactly this name (the name is the revision). A driver that takes its own
  // functions' addresses through the global scope answers with the preloaded definition, vaswap's
  // own.
  Dl_info driver{};
  if (dladdr(reinterpret_cast<void*>(get_proc_address), &driver) == 0) return nullptr;
  void* library = dlopen(driver.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (library == nullptr) return nullptr;
  fn = real_dlsym(library, e.symbol);
  dlclose(library);
  return fn != wrapper(index) ? fn : nullptr;
}

}  // namespace

int count() { return kCount; }
const Entry& entry(int index) { return kEntries[index]; }

void* real(int index) {
  void* fn = g_real[index].load(std::memory_order_acquire);
  if (fn != nullptr) return fn;
  fn = kEntries[index].api == Api::runtime ? find_runtime_real(index) : find_driver_real(index);
  if (fn != nullptr) g_real[index].store(fn, std::memory_order_release);
  return fn;
}

int find(const char* symbol) {
  for (int i = 0; i < kCount; ++i) {
    if (std::strcmp(kEntries[i].symbol, symbol) == 0) return i;
  }
  return -1;
}

namespace {

// What a hook returns when the function it stands in for does not exist in this process.
template <class R>
R missing(int index) {
  if (!g_missing_said[index].exchange(true)) {
    log().error("{} was called, but vaswap cannot find the real {} ({}); the call fails",
                kEntries[index].symbol, kEntries[index].symbol,
                kEntries[index].api == Api::runtime
                    ? "no libcudart in this process defines it"
                    : "the CUDA driver does not provide this revision");
  }
  if constexpr (std::is_same_v<R, cudaError_t>) {
    return cudaErrorSharedObjectSymbolNotFound;
  } else {
    return CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND;
  }
}

// =============================================================================================
// How each kind of call is handled
// =============================================================================================

// The depth of hooked calls on this thread. initial-exec: one TLS load, no __tls_get_addr; the
// single int fits the static TLS surplus that a dlopen'ed libvaswap.so (Python binding) gets.
__attribute__((tls_model("initial-exec"))) thread_local int tls_depth = 0;

struct Scope {
  Scope() { ++tls_depth; }
  ~Scope() { --tls_depth; }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
};

// True when this call is the user's: the preload is on and no hook is already running on this
// thread (cudart calling the driver from inside a runtime hook, vaswap's own driver calls).
inline bool handle() { return tls_depth == 0 && intercept::on(); }

inline CUdeviceptr to_va(void* p) { return reinterpret_cast<CUdeviceptr>(p); }
inline CUdeviceptr to_va(CUdeviceptr p) { return p; }
template <class P>
P from_va(CUdeviceptr va) {
  if constexpr (std::is_pointer_v<P>) {
    return reinterpret_cast<P>(va);
  } else {
    return static_cast<P>(va);
  }
}

// The runtime's error codes carry the driver's numbers: in CUDA 13's cuda.h and driver_types.h
// every driver code but CUDA_ERROR_CONTEXT_ALREADY_CURRENT (202) and CUDA_ERROR_KEY_ROTATION
// (916) has a runtime code of the same number and meaning (CUDA_ERROR_INVALID_CONTEXT is
// cudaErrorDeviceUninitialized, "invalid device context"). A runtime hook thus returns the
// driver's error as the runtime would have, not cudaErrorUnknown.
static_assert(static_cast<int>(cudaErrorMemoryAllocation) == CUDA_ERROR_OUT_OF_MEMORY &&
                  static_cast<int>(cudaErrorInitializationError) == CUDA_ERROR_NOT_INITIALIZED &&
                  static_cast<int>(cudaErrorInvalidResourceHandle) == CUDA_ERROR_INVALID_HANDLE &&
                  static_cast<int>(cudaErrorIllegalAddress) == CUDA_ERROR_ILLEGAL_ADDRESS &&
                  static_cast<int>(cudaErrorLaunchTimeout) == CUDA_ERROR_LAUNCH_TIMEOUT &&
                  static_cast<int>(cudaErrorNotSupported) == CUDA_ERROR_NOT_SUPPORTED &&
                  static_cast<int>(cudaErrorGraphExecUpdateFailure) ==
                      CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE &&
                  static_cast<int>(cudaErrorUnknown) == CUDA_ERROR_UNKNOWN,
              "the runtime's error codes carry the driver's numbers");
template <class R>
R to_status(CUresult rc) {
  if constexpr (std::is_same_v<R, cudaError_t>) {
    switch (static_cast<int>(rc)) {
      case 202:  // CUDA_ERROR_CONTEXT_ALREADY_CURRENT: no runtime twin
      case 916:  // CUDA_ERROR_KEY_ROTATION: no runtime twin
        return cudaErrorUnknown;
      default: return static_cast<cudaError_t>(rc);
    }
  } else {
    return rc;
  }
}

// A real call that failed while the slots it names could not be given pages for lack of device
// memory (intercept::with_pages_named): the driver says an address is invalid, and the program is
// told the cause, out of memory. Any other result is the driver's.
template <class R>
R for_pages(R rc, CUresult pages) {
  return rc != R{} && pages == CUDA_ERROR_OUT_OF_MEMORY ? to_status<R>(CUDA_ERROR_OUT_OF_MEMORY)
                                                        : rc;
}

// A driver launch refused for want of memory: the driver takes a kernel's local memory (and a
// graph's) from the device when it is launched, so a launch can run out of memory as an
// allocation does. Slots no launch in flight needs give pages back and the launch is tried again
// (three rounds, asking for more each time: the driver does not say how much it wanted), here at
// the driver, before a runtime above it records the error as the thread's last one. Runtime
// launches reach this through cudart's own driver call. With the preload off: the call alone.
constexpr size_t kLaunchRoom = size_t{256} << 20;
template <class R, class Real>
R launch_with_room(const Call& call, Real&& real) {
  R rc = real();
  if constexpr (std::is_same_v<R, CUresult>) {
    for (int round = 0; round < 3 && rc == CUDA_ERROR_OUT_OF_MEMORY && intercept::on() &&
                        intercept::out_of_memory(call, kLaunchRoom << round, "launch");
         ++round) {
      rc = real();
    }
  }
  return rc;
}

// Device handshake: a kernel's first launch (lazy module loading) waits on the host until no
// stream is parked on a restore (intercept::settle), and `quiet` keeps any from being parked again
// until the launch is made; false, with the error in `rc`, when that wait ran out. Called before
// anything else of the launch: reading a lazily loaded kernel's parameters loads it too, and its
// own slots' restores then take the host path (the launch's stream is not parked). `*first` says
// whether this was a first launch, for made() once it returned.
template <class R>
bool settled(const Call& call, const void* function, R* rc, intercept::Quiet* quiet, bool* first) {
  *first = intercept::first_launch(function);
  if (!*first) return true;
  const CUresult settled_rc = intercept::settle(call, "the first launch of a kernel", quiet);
  if (settled_rc == CUDA_SUCCESS) return true;
  *rc = to_status<R>(settled_rc);
  return false;
}

// After a first launch returned: its kernel is loaded, and later launches need not settle.
template <class R>
R made(const void* function, bool first, R rc) {
  if (first && rc == R{}) intercept::launch_made(function);
  return rc;
}

// Device handshake: `real`, first-time work (a module load, a lookup that loads, an instantiation),
// runs once no stream is parked (with `settle`), and none is parked again until it returns; the
// settle's error when that wait ran out (residency.wait_limit). vaswap's own calls inside are not
// handled again.
template <class R, class Real>
R quietly(const Call& call, const char* what, bool settle, Real&& real) {
  Scope scope;
  intercept::Quiet quiet;
  if (settle) {
    if (const CUresult rc = intercept::settle(call, what, &quiet); rc != CUDA_SUCCESS) {
      return to_status<R>(rc);
    }
  }
  return real();
}

// The runtime records every failed call as the thread's last error, which the program reads
// with cudaGetLastError. A call vaswap makes or retries must leave that record as the program's
// own calls would: keep_last_error(any function of that libcudart, what it was before) clears
// a failure vaswap caused (the runtime cannot be given an older error back, so a failure the
// program had not read yet, left before vaswap's call, is cleared too; vaswap only calls this
// after a failure of its own, where the runtime had replaced that record already).
void* runtime_function(void* any_function, const char* name) {
  Dl_info info{};
  if (dladdr(any_function, &info) == 0 || info.dli_fname == nullptr) return nullptr;
  void* library = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (library == nullptr) return nullptr;
  void* fn = real_dlsym(library, name);
  dlclose(library);
  return fn;
}

// One libcudart per process: its two functions are found once, from the first function asked.
using LastError = cudaError_t (*)();
LastError last_error_function(void* any_function, bool peek) {
  static std::atomic<LastError> peek_fn{nullptr}, get_fn{nullptr};
  std::atomic<LastError>& slot = peek ? peek_fn : get_fn;
  LastError fn = slot.load(std::memory_order_acquire);
  if (fn == nullptr) {
    fn = reinterpret_cast<LastError>(
        runtime_function(any_function, peek ? "cudaPeekAtLastError" : "cudaGetLastError"));
    if (fn != nullptr) slot.store(fn, std::memory_order_release);
  }
  return fn;
}

cudaError_t peek_last_error(void* any_function) {
  const LastError peek = last_error_function(any_function, true);
  return peek != nullptr ? peek() : cudaSuccess;
}

void keep_last_error(void* any_function, cudaError_t before) {
  if (before != cudaSuccess) return;  // the program's own, unread: left as it is
  const LastError get = last_error_function(any_function, false);
  if (get != nullptr) get();
}

template <class Fn>
struct Allocate;
template <class R, class P>
struct Allocate<R (*)(P*, size_t)> {
  R (*real)(P*, size_t);
  Call call;
  R operator()(P* ptr, size_t bytes) const {
    if (!handle()) return real(ptr, bytes);
    Scope scope;
    if (!intercept::room_beside_graphs(call, bytes)) {
      return to_status<R>(CUDA_ERROR_OUT_OF_MEMORY);
    }
    CUdeviceptr va = 0;
    const char* skipped = nullptr;
    if (ptr != nullptr && intercept::try_slot(call, bytes, &va, &skipped)) {
      *ptr = from_va<P>(va);
      return R{};
    }
    R rc = real(ptr, bytes);
    // The program's own allocation ran out of memory: slots not in use give their pages back
    // first, and the allocation is tried again before the error reaches the program (a few
    // times: other threads may take what was given back first).
    bool retried = false;
    for (int round = 0; round < 3 && rc == to_status<R>(CUDA_ERROR_OUT_OF_MEMORY) &&
                        intercept::out_of_memory(call, bytes, "allocation of " + byte_size(bytes));
         ++round) {
      rc = real(ptr, bytes);
      retried = true;
    }
    // Retried and allocated: the runtime's record of the first attempt's failure goes too (an
    // H200 PyTorch run raised it at its next launch check as "CUDA error: out of memory").
    if constexpr (std::is_same_v<R, cudaError_t>) {
      if (retried && rc == R{}) keep_last_error(reinterpret_cast<void*>(real), cudaSuccess);
    }
    if (rc == R{} && ptr != nullptr) {
      intercept::allocated(call, to_va(*ptr), bytes, nullptr, skipped);
    }
    return rc;
  }
};

// The stream of a stream-ordered call (its last argument) as the registry records it: a null
// stream becomes CU_STREAM_LEGACY, so "stream-ordered" survives. nullptr for a call with none.
template <class... Args>
CUstream ordering_stream(Args... args) {
  if constexpr (sizeof...(Args) == 0) {
    return nullptr;
  } else {
    const CUstream stream = std::get<sizeof...(Args) - 1>(std::tie(args...));
    return stream != nullptr ? stream : CU_STREAM_LEGACY;
  }
}

// Stream-ordered allocations (..., [pool,] stream) are tracked, never slots: their pool owns the
// memory.
template <class Fn>
struct AllocateAsync;
template <class R, class P, class... Rest>
struct AllocateAsync<R (*)(P*, size_t, Rest...)> {
  R (*real)(P*, size_t, Rest...);
  Call call;
  R operator()(P* ptr, size_t bytes, Rest... rest) const {
    if (!handle()) return real(ptr, bytes, rest...);
    Scope scope;
    // Not weighed against rewritten graphs' reserves (intercept::room_beside_graphs): a pool may
    // serve it from memory it holds already, which the device's free bytes do not show, and a
    // refusal would then be a false out-of-memory.
    const R rc = real(ptr, bytes, rest...);
    if (rc == R{} && ptr != nullptr) {
      intercept::allocated(call, to_va(*ptr), bytes, ordering_stream(rest...));
    }
    return rc;
  }
};

// cudaFree / cuMemFree, and the stream-ordered frees (ptr, stream). A slot is destroyed here
// whichever free the program used.
template <class Fn>
struct Free;
template <class R, class P, class... Stream>
struct Free<R (*)(P, Stream...)> {
  R (*real)(P, Stream...);
  Call call;
  R operator()(P ptr, Stream... stream) const {
    if (!handle()) return real(ptr, stream...);
    Scope scope;
    if (auto rc = intercept::free_slot(call, to_va(ptr))) return to_status<R>(*rc);
    R rc{};
    {
      const intercept::ProgramFree giving_back;  // a map refused meanwhile learns nothing
      rc = real(ptr, stream...);
    }
    if (rc == R{}) intercept::freed(call, to_va(ptr), ordering_stream(stream...));
    return rc;
  }
};

template <class Fn>
struct BeginCapture;
template <class R, class M>
struct BeginCapture<R (*)(CUstream, M)> {
  R (*real)(CUstream, M);
  Call call;
  R operator()(CUstream stream, M mode) const {
    if (!handle()) return real(stream, mode);
    Scope scope;
    intercept::capture_beginning(call, stream);
    const R rc = real(stream, mode);
    if (rc == R{}) {
      intercept::capture_began(call, stream, static_cast<CUstreamCaptureMode>(mode), nullptr);
    } else {
      intercept::capture_refused();
    }
    return rc;
  }
};

template <class Fn>
struct BeginCaptureToGraph;
template <class R, class D, class E, class M>
struct BeginCaptureToGraph<R (*)(CUstream, CUgraph, D, E, size_t, M)> {
  R (*real)(CUstream, CUgraph, D, E, size_t, M);
  Call call;
  R operator()(CUstream stream, CUgraph graph, D dependencies, E edges, size_t count,
               M mode) const {
    if (!handle()) return real(stream, graph, dependencies, edges, count, mode);
    Scope scope;
    intercept::capture_beginning(call, stream);
    const R rc = real(stream, graph, dependencies, edges, count, mode);
    if (rc == R{}) {
      intercept::capture_began(call, stream, static_cast<CUstreamCaptureMode>(mode), graph);
    } else {
      intercept::capture_refused();
    }
    return rc;
  }
};

template <class Fn>
struct EndCapture;
template <class R>
struct EndCapture<R (*)(CUstream, CUgraph*)> {
  R (*real)(CUstream, CUgraph*);
  Call call;
  R operator()(CUstream stream, CUgraph* graph) const {
    if (!handle()) return real(stream, graph);
    Scope scope;
    const R rc = real(stream, graph);
    intercept::capture_ended(call, stream, rc == R{} && graph != nullptr ? *graph : nullptr,
                             rc == R{} ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
    return rc;
  }
};

template <class Fn>
struct ExchangeMode;
template <class R, class M>
struct ExchangeMode<R (*)(M*)> {
  R (*real)(M*);
  Call call;
  R operator()(M* mode) const {
    if (!handle() || mode == nullptr) return real(mode);
    Scope scope;
    const M wanted = *mode;
    const R rc = real(mode);  // sets `wanted`, answers with the mode it replaced
    if (rc == R{}) {
      intercept::capture_mode_exchanged(call, static_cast<CUstreamCaptureMode>(*mode),
                                        static_cast<CUstreamCaptureMode>(wanted));
    }
    return rc;
  }
};

template <class Fn>
struct Instantiate;
template <class R, class Rest>
struct Instantiate<R (*)(CUgraphExec*, CUgraph, Rest)> {
  R (*real)(CUgraphExec*, CUgraph, Rest);
  Call call;
  R operator()(CUgraphExec* exec, CUgraph graph, Rest rest) const {
    if (!handle()) return real(exec, graph, rest);
    // Instantiating loads the graph's kernels: not while a stream is parked (device handshake).
    return quietly<R>(call, "an instantiation", intercept::settles(), [&] {
      // The graph is scanned once, by the first of these calls that needs it.
      intercept::Scanned scanned(graph);
      // With pages for the slots its copies and memsets name: the driver checks them here.
      auto instantiate = [&](CUgraph which) {
        R rc{};
        const CUresult pages = intercept::with_pages_to_instantiate(
            call, which, &scanned, [&] { rc = real(exec, which, rest); });
        return for_pages<R>(rc, pages);
      };
      CUgraph instead = intercept::graph_to_instantiate(call, graph, &scanned);
      R rc = instantiate(instead);
      if (rc != R{} && instead != graph) {
        // The driver refused the rewritten copy: the graph is instantiated as captured (the
        // planner between launches still applies), and the program sees what the driver says
        // of that.
        log().warn(
            "{}: the driver refused the rewritten copy of graph {} ({}): it is "
            "instantiated as captured",
            call.symbol, hex(reinterpret_cast<uintptr_t>(graph)), static_cast<int>(rc));
        intercept::instantiated(call, nullptr, graph, instead, &scanned);  // the copy goes
        instead = graph;
        rc = instantiate(graph);
      }
      const bool made = rc == R{} && exec != nullptr;
      if (made || instead != graph) {
        intercept::instantiated(call, made ? *exec : nullptr, graph, instead, &scanned);
      }
      return rc;
    });
  }
};

template <class Fn>
struct Launch;
template <class R>
struct Launch<R (*)(CUgraphExec, CUstream)> {
  R (*real)(CUgraphExec, CUstream);
  Call call;
  R operator()(CUgraphExec exec, CUstream stream) const {
    const auto forward = [&] { return real(exec, stream); };
    if (!handle()) return launch_with_room<R>(call, forward);
    Scope scope;
    const intercept::Ticket ticket = intercept::launched(call, exec, stream);
    if (ticket.result != CUDA_SUCCESS) return to_status<R>(ticket.result);
    const R rc = launch_with_room<R>(call, forward);
    intercept::launch_returned(call, exec, stream, ticket, rc == R{});
    return rc;
  }
};

// cudaGraphExecUpdate / cuGraphExecUpdate[_v2]: (exec, graph, ...).
template <class Fn>
struct ExecUpdate;
template <class R, class E, class G, class... Rest>
struct ExecUpdate<R (*)(E, G, Rest...)> {
  R (*real)(E, G, Rest...);
  Call call;
  R operator()(E exec, G graph, Rest... rest) const {
    if (!handle()) return real(exec, graph, rest...);
    Scope scope;
    const auto cu_exec = reinterpret_cast<CUgraphExec>(exec);
    const auto cu_graph = reinterpret_cast<CUgraph>(graph);
    intercept::Scanned scanned(cu_graph);
    const CUgraph instead = intercept::update_source(call, cu_exec, cu_graph, &scanned);
    const R rc = real(exec, reinterpret_cast<G>(instead), rest...);
    const CUresult after =
        intercept::exec_updated(call, cu_exec, cu_graph, instead, rc == R{}, &scanned);
    return rc == R{} && after != CUDA_SUCCESS ? to_status<R>(after) : rc;
  }
};

// A type whose size is known (not an opaque handle's struct).
template <class T, class = void>
struct Complete : std::false_type {};
template <class T>
struct Complete<T, std::void_t<decltype(sizeof(T))>> : std::true_type {};

// An argument's bytes as 8-byte words, where an address may sit: a pointer itself (a 1D copy's
// dst or src), and the words of the struct it points to (a copy's or memset's parameters).
template <class T>
void add_words(std::vector<uintptr_t>* words, T arg) {
  if constexpr (std::is_pointer_v<T>) {
    words->push_back(reinterpret_cast<uintptr_t>(arg));
    using Pointee = std::remove_cv_t<std::remove_pointer_t<T>>;
    if constexpr (!std::is_void_v<Pointee> && Complete<Pointee>::value) {
      if (arg != nullptr) {
        for (size_t at = 0; at + sizeof(uintptr_t) <= sizeof(Pointee); at += sizeof(uintptr_t)) {
          uintptr_t word = 0;
          std::memcpy(&word, reinterpret_cast<const char*>(arg) + at, sizeof word);
          words->push_back(word);
        }
      }
    }
  }
}

// The words of these arguments (add_words), where the addresses they name may sit.
template <class... Args>
std::vector<uintptr_t> words_of(Args... args) {
  std::vector<uintptr_t> words;
  (add_words(&words, args), ...);
  return words;
}

// The arguments of a copy's or memset's new parameters (after the executable and the node), whose
// words hold every address it names; not a child graph's, a batch of memory operations', or the
// generic cudaGraphExecNodeSetParams' (a kernel's there names its arguments through pointers).
template <class... Rest>
struct NewCopyParams : std::false_type {};
template <class... Rest>
struct NewCopyParams<const cudaMemcpy3DParms*, Rest...> : std::true_type {};
template <class... Rest>
struct NewCopyParams<void*, Rest...> : std::true_type {};  // 1D, FromSymbol: dst first
template <class... Rest>
struct NewCopyParams<const void*, Rest...> : std::true_type {};  // ToSymbol: the symbol, then src
template <class... Rest>
struct NewCopyParams<const cudaMemsetParams*, Rest...> : std::true_type {};
template <class... Rest>
struct NewCopyParams<const CUDA_MEMCPY3D*, Rest...> : std::true_type {};
template <class... Rest>
struct NewCopyParams<const CUDA_MEMSET_NODE_PARAMS*, Rest...> : std::true_type {};

// cudaGraphExec*NodeSetParams* / cuGraphExec*NodeSetParams*: (exec, node, ...). The driver checks
// a copy's or memset's new addresses at the call: the slots they name have pages meanwhile.
template <class Fn>
struct ExecChange;
template <class R, class E, class N, class... Rest>
struct ExecChange<R (*)(E, N, Rest...)> {
  R (*real)(E, N, Rest...);
  Call call;
  R operator()(E exec, N node, Rest... rest) const {
    if (!handle()) return real(exec, node, rest...);
    Scope scope;
    CUresult refused = CUDA_SUCCESS;
    const N named = reinterpret_cast<N>(intercept::exec_node_changing(
        call, reinterpret_cast<CUgraphExec>(exec), reinterpret_cast<CUgraphNode>(node), &refused));
    if (refused != CUDA_SUCCESS) return to_status<R>(refused);
    const std::vector<uintptr_t> words = words_of(rest...);
    R rc{};
    const CUresult pages =
        intercept::with_pages_named(call, words, [&] { rc = real(exec, named, rest...); });
    if (rc != R{}) return for_pages<R>(rc, pages);
    if constexpr (NewCopyParams<Rest...>::value) {
      // A copy's or memset's new addresses are all in its arguments.
      intercept::exec_copy_changed(call, reinterpret_cast<CUgraphExec>(exec), words);
    } else {
      intercept::exec_changed(call, reinterpret_cast<CUgraphExec>(exec), std::nullopt);
    }
    return rc;
  }
};

// Calls that name a node of an executable and change nothing it reads or writes in device memory:
// cudaGraphNode{Set,Get}Enabled, cudaGraphExecHostNodeSetParams, cudaGraphExecEvent{Record,Wait}
// NodeSetEvent, cudaGraphExecExternalSemaphores{Signal,Wait}NodeSetParams and their driver twins,
// (exec, node, ...). The program names a node of the graph it instantiated; an executable made
// from a rewritten copy has the node's counterpart there (intercept::exec_node_in). A disabled
// node uses less than the scan counted, and one enabled again no more: the windows stay.
template <class Fn>
struct ExecNamed;
template <class R, class E, class N, class... Rest>
struct ExecNamed<R (*)(E, N, Rest...)> {
  R (*real)(E, N, Rest...);
  Call call;
  R operator()(E exec, N node, Rest... rest) const {
    if (!handle()) return real(exec, node, rest...);
    Scope scope;
    return real(exec,
                reinterpret_cast<N>(intercept::exec_node_in(reinterpret_cast<CUgraphExec>(exec),
                                                            reinterpret_cast<CUgraphNode>(node))),
                rest...);
  }
};

// A graph built node by node: cudaGraphAdd{Memcpy,Memset}Node*, cuGraphAddNode[_v2] and their
// driver twins, (node out, graph, dependencies, [edge data,] count, parameters...). The slots the
// parameters name have pages for the call, as for an executable's new parameters (ExecChange):
// the driver checks a copy's or memset's addresses as it makes the node. What the graph uses is
// learnt when it is instantiated (its scan), so nothing else is recorded here.
template <class Fn>
struct NodeAdd;
template <class R, class O, class G, class D, class... Rest>
struct NodeAdd<R (*)(O*, G, const D*, Rest...)> {
  R (*real)(O*, G, const D*, Rest...);
  Call call;
  R operator()(O* out, G graph, const D* deps, Rest... rest) const {
    if (!handle()) return real(out, graph, deps, rest...);
    Scope scope;
    const std::vector<uintptr_t> words = words_of(rest...);  // a count or edge data: no slot
    R rc{};
    const CUresult pages =
        intercept::with_pages_named(call, words, [&] { rc = real(out, graph, deps, rest...); });
    return for_pages<R>(rc, pages);
  }
};

// A graph's node given new parameters: cudaGraph{Memcpy,Memset}NodeSetParams*,
// cudaGraphNodeSetParams and their driver twins, (node, parameters...). As NodeAdd.
template <class Fn>
struct NodeChange;
template <class R, class N, class... Rest>
struct NodeChange<R (*)(N, Rest...)> {
  R (*real)(N, Rest...);
  Call call;
  R operator()(N node, Rest... rest) const {
    if (!handle()) return real(node, rest...);
    Scope scope;
    const std::vector<uintptr_t> words = words_of(rest...);
    R rc{};
    const CUresult pages =
        intercept::with_pages_named(call, words, [&] { rc = real(node, rest...); });
    return for_pages<R>(rc, pages);
  }
};

// cudaGraphExecKernelNodeSetParams / cuGraphExecKernelNodeSetParams[_v2]: the node's new
// arguments are scanned as an eager launch's are (runtime_param_info, below, for a runtime kernel).
intercept::Param runtime_param_info(const void* host_function, size_t index, size_t* offset,
                                    size_t* bytes);
template <class Fn>
struct ExecKernelChange;
template <class R, class E, class N, class P>
struct ExecKernelChange<R (*)(E, N, const P*)> {
  R (*real)(E, N, const P*);
  Call call;
  R operator()(E exec, N node, const P* params) const {
    if (!handle()) return real(exec, node, params);
    Scope scope;
    CUresult refused = CUDA_SUCCESS;
    const N named = reinterpret_cast<N>(intercept::exec_node_changing(
        call, reinterpret_cast<CUgraphExec>(exec), reinterpret_cast<CUgraphNode>(node), &refused));
    if (refused != CUDA_SUCCESS) return to_status<R>(refused);
    const R rc = real(exec, named, params);
    if (rc != R{}) return rc;
    if (params == nullptr) {
      intercept::exec_changed(call, reinterpret_cast<CUgraphExec>(exec), std::nullopt);
    } else if constexpr (std::is_same_v<P, cudaKernelNodeParams>) {
      intercept::exec_kernel_changed(call, reinterpret_cast<CUgraphExec>(exec),
                                     {params->func, &runtime_param_info}, params->kernelParams,
                                     params->extra);
    } else {
      // CUDA_KERNEL_NODE_PARAMS (v1, v2): a CUfunction; a v2 node that names only a CUkernel has
      // no layout here (null key: counted as using every slot).
      intercept::exec_kernel_changed(call, reinterpret_cast<CUgraphExec>(exec),
                                     {params->func, &intercept::driver_param_info},
                                     params->kernelParams, params->extra);
    }
    return rc;
  }
};

// =============================================================================================
// Eager work
// =============================================================================================

// A runtime kernel's parameter layout: its CUfunction from cudaGetFuncBySymbol, then the
// driver's cuFuncGetParamInfo, which finds the end of the list by failing. The runtime's own
// cudaFuncGetParamInfo fails the same way and records that failure as the thread's last error,
// which the program reads next (PyTorch checks cudaGetLastError after every launch): it is used
// only where cudaGetFuncBySymbol is missing, and the failure it records is taken back.
intercept::Param runtime_param_info(const void* host_function, size_t index, size_t* offset,
                                    size_t* bytes) {
  using GetFunc = cudaError_t (*)(cudaFunction_t*, const void*);
  using ParamInfo = cudaError_t (*)(const void*, size_t, size_t*, size_t*);
  static std::atomic<GetFunc> get_func{nullptr};
  static std::atomic<ParamInfo> param_info{nullptr};
  GetFunc get = get_func.load(std::memory_order_acquire);
  if (get == nullptr) {
    get = reinterpret_cast<GetFunc>(find_runtime_symbol("cudaGetFuncBySymbol", nullptr));
    if (get != nullptr) get_func.store(get, std::memory_order_release);
  }
  if (get != nullptr) {
    cudaFunction_t function = nullptr;
    const cudaError_t before = peek_last_error(reinterpret_cast<void*>(get));
    if (get(&function, host_function) != cudaSuccess) {
      keep_last_error(reinterpret_cast<void*>(get), before);
      return intercept::Param::unknown;
    }
    return intercept::driver_param_info(function, index, offset, bytes);
  }
  ParamInfo info = param_info.load(std::memory_order_acquire);
  if (info == nullptr) {
    info = reinterpret_cast<ParamInfo>(find_runtime_symbol("cudaFuncGetParamInfo", nullptr));
    if (info == nullptr) return intercept::Param::unknown;
    param_info.store(info, std::memory_order_release);
  }
  const cudaError_t before = peek_last_error(reinterpret_cast<void*>(info));
  const cudaError_t rc = info(host_function, index, offset, bytes);
  if (rc == cudaSuccess) return intercept::Param::found;
  keep_last_error(reinterpret_cast<void*>(info), before);
  return rc == cudaErrorInvalidValue ? intercept::Param::end : intercept::Param::unknown;
}

// What every kernel launch hook does once it handles the call: first-time work settled (device
// handshake), the kernel's slots made resident (when eager work is scanned), then the real launch,
// retried after evictions if the driver refuses it for want of memory (driver launches).
template <class R, class Forward>
R launch_kernel(const Call& call, CUstream stream, const intercept::Kernel& kernel, void** params,
                void** extra, Forward&& forward) {
  R rc{};
  intercept::Quiet quiet;
  bool first = false;
  if (!settled(call, kernel.key, &rc, &quiet, &first)) return rc;
  if (!intercept::eager_wanted()) {
    // A runtime launch's driver call is handled.
    return made(kernel.key, first, launch_with_room<R>(call, forward));
  }
  Scope scope;
  const auto ticket = intercept::eager_kernel(call, stream, kernel, params, extra);
  if (ticket.result != CUDA_SUCCESS) return to_status<R>(ticket.result);
  rc = launch_with_room<R>(call, forward);
  intercept::eager_done(ticket);
  return made(kernel.key, first, rc);
}

// A driver launch not handled here: from inside a runtime launch (whose hook settled for the host
// stub; this is the function cudart loads, and no stream is parked then) or with the preload off.
template <class R, class Forward>
R driver_launch_unhandled(const Call& call, const void* function, Forward&& forward) {
  R rc{};
  intercept::Quiet quiet;
  bool first = false;
  if (intercept::on() && !settled(call, function, &rc, &quiet, &first)) return rc;
  return made(function, first, launch_with_room<R>(call, forward));
}

template <class Fn>
struct LaunchKernel;
// cudaLaunchKernel[_ptsz]
template <class R>
struct LaunchKernel<R (*)(const void*, dim3, dim3, void**, size_t, cudaStream_t)> {
  R (*real)(const void*, dim3, dim3, void**, size_t, cudaStream_t);
  Call call;
  R operator()(const void* func, dim3 grid, dim3 block, void** args, size_t shared,
               cudaStream_t stream) const {
    const auto forward = [&] { return real(func, grid, block, args, shared, stream); };
    if (!handle()) return forward();
    return launch_kernel<R>(call, stream, {func, &runtime_param_info}, args, nullptr, forward);
  }
};
// cudaLaunchKernelExC[_ptsz]
template <class R>
struct LaunchKernel<R (*)(const cudaLaunchConfig_t*, const void*, void**)> {
  R (*real)(const cudaLaunchConfig_t*, const void*, void**);
  Call call;
  R operator()(const cudaLaunchConfig_t* config, const void* func, void** args) const {
    const auto forward = [&] { return real(config, func, args); };
    if (!handle() || config == nullptr) return forward();
    return launch_kernel<R>(call, config->stream, {func, &runtime_param_info}, args, nullptr,
                            forward);
  }
};
// cuLaunchKernel[_ptsz]
template <class R>
struct LaunchKernel<R (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                          unsigned, CUstream, void**, void**)> {
  using Fn = R (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                   CUstream, void**, void**);
  Fn real;
  Call call;
  R operator()(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
               unsigned bz, unsigned shared, CUstream stream, void** params, void** extra) const {
    const auto forward = [&] {
      return real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
    };
    if (!handle()) return driver_launch_unhandled<R>(call, f, forward);
    return launch_kernel<R>(call, stream, {f, &intercept::driver_param_info}, params, extra,
                            forward);
  }
};
// cuLaunchKernelEx[_ptsz]
template <class R>
struct LaunchKernel<R (*)(const CUlaunchConfig*, CUfunction, void**, void**)> {
  R (*real)(const CUlaunchConfig*, CUfunction, void**, void**);
  Call call;
  R operator()(const CUlaunchConfig* config, CUfunction f, void** params, void** extra) const {
    const auto forward = [&] { return real(config, f, params, extra); };
    if (!handle() || config == nullptr) return driver_launch_unhandled<R>(call, f, forward);
    return launch_kernel<R>(call, config->hStream, {f, &intercept::driver_param_info}, params,
                            extra, forward);
  }
};

// The stream of a copy or memset: its last argument when that is a stream; null (the default
// stream, or the per-thread one for _ptds) for the synchronous forms.
template <class... Rest>
CUstream last_stream(Rest... rest) {
  if constexpr (sizeof...(Rest) == 0) {
    return nullptr;
  } else {
    using Last = std::tuple_element_t<sizeof...(Rest) - 1, std::tuple<Rest...>>;
    if constexpr (std::is_same_v<Last, CUstream>) {
      return std::get<sizeof...(Rest) - 1>(std::tie(rest...));
    } else {
      return nullptr;
    }
  }
}

inline uintptr_t address_of(const void* p) { return reinterpret_cast<uintptr_t>(p); }
inline uintptr_t address_of(CUdeviceptr p) { return static_cast<uintptr_t>(p); }

// Runs `real` after making the slots that `addresses` name resident for work on `stream`. With
// `shape` (an asynchronous copy or memset between device addresses), the device handshake may
// have the same work made as a graph instead, launched on the stream without waiting for pages.
template <class R, class Real>
R accessed(const Call& call, CUstream stream, const uintptr_t* addresses, size_t count, Real&& real,
           const residency::EagerShape* shape = nullptr) {
  Scope scope;  // held through the real call: cudart's own copy is not handled again
  const auto ticket = intercept::eager_access(call, stream, addresses, count, shape);
  if (ticket.result != CUDA_SUCCESS) return to_status<R>(ticket.result);
  if (ticket.acquired.substitute != nullptr) {
    const Driver* driver = load_driver(nullptr);
    const CUresult rc = driver->cuGraphLaunch(ticket.acquired.substitute, ticket.acquired.stream);
    intercept::eager_done(ticket);
    return to_status<R>(rc);
  }
  const R rc = real();
  intercept::eager_done(ticket);
  return rc;
}

// A copy that may wait on the host for its stream's earlier work: a synchronous form, or one with
// pageable host memory on either side (the driver stages it). On the H200 such a wait holds a
// driver lock that vaswap's mover needs to map the pages a parked stream waits for
// (bench/results/stall_dump_h200.md). Under the device handshake it runs only once no stream is
// parked, and none is parked again until it returns: its own slots' restores take the host path,
// so what it waits for needs nothing more from the mover.
template <class R, class Real>
R staged(const Call& call, CUstream stream, const uintptr_t* addresses, size_t count,
         bool synchronous, Real&& real) {
  intercept::Quiet quiet;
  if (tls_depth == 0 && intercept::settles() &&
      (synchronous || intercept::pageable(addresses, count))) {
    Scope scope;
    if (const CUresult rc = intercept::settle(call, "a copy that waits on the host", &quiet);
        rc != CUDA_SUCCESS) {
      return to_status<R>(rc);
    }
  }
  return accessed<R>(call, stream, addresses, count, std::forward<Real>(real));
}

// Whether a copy's remaining arguments make it one between device addresses, as far as they
// say: a runtime copy names its kind (device to device, or default: then the driver is asked
// when the copy is made as a graph); a driver copy between two CUdeviceptr is one.
inline bool d2d_kind(cudaMemcpyKind kind) {
  return kind == cudaMemcpyDeviceToDevice || kind == cudaMemcpyDefault;
}
template <class T>
bool d2d_kind(T /*not a kind*/) {
  return false;
}
template <class D, class S, class... Rest>
bool device_to_device(Rest... rest) {
  if constexpr ((std::is_same_v<Rest, cudaMemcpyKind> || ...)) {
    return (d2d_kind(rest) || ...);
  } else {
    return std::is_same_v<D, CUdeviceptr> && std::is_same_v<S, CUdeviceptr>;
  }
}

// Whether a copy between device addresses (device_to_device) may still name pageable host memory:
// the runtime's cudaMemcpyDefault and the driver's unified cuMemcpy and cuMemcpyAsync, where
// unified addressing says which side is which. The explicit device-to-device forms
// (cudaMemcpyDeviceToDevice, cuMemcpyDtoD*) take device memory only, so they are not asked
// (the question is a cuPointerGetAttribute per address vaswap does not track).
inline bool unified_kind(cudaMemcpyKind kind) { return kind == cudaMemcpyDefault; }
template <class T>
bool unified_kind(T /*not a kind*/) {
  return false;
}
template <class... Rest>
bool unified(const Call& call, Rest... rest) {
  if constexpr ((std::is_same_v<Rest, cudaMemcpyKind> || ...)) {
    return (unified_kind(rest) || ...);
  } else {
    return std::strncmp(call.symbol, "cuMemcpyDtoD", 12) != 0;
  }
}

// True when the call's last argument is a stream: an asynchronous copy or memset.
template <class... Rest>
constexpr bool has_stream() {
  if constexpr (sizeof...(Rest) == 0) {
    return false;
  } else {
    return std::is_same_v<std::tuple_element_t<sizeof...(Rest) - 1, std::tuple<Rest...>>, CUstream>;
  }
}

// Copies: (dst, src, bytes, [kind], [stream]). Host addresses are looked up too and find nothing.
template <class Fn>
struct Copy;
template <class R, class D, class S, class... Rest>
struct Copy<R (*)(D, S, size_t, Rest...)> {
  R (*real)(D, S, size_t, Rest...);
  Call call;
  R operator()(D dst, S src, size_t bytes, Rest... rest) const {
    const auto forward = [&] { return real(dst, src, bytes, rest...); };
    if (!handle() || !intercept::access_wanted()) return forward();
    const uintptr_t addresses[] = {address_of(dst), address_of(src)};
    // A copy whose kind says device to device may still name pageable memory (cudaMemcpyDefault,
    // cuMemcpyAsync: unified addressing tells); staged() settles such a copy.
    if (has_stream<Rest...>() && device_to_device<D, S>(rest...) &&
        !(intercept::settles() && unified(call, rest...) && intercept::pageable(addresses, 2))) {
      residency::EagerShape shape;
      shape.dst = static_cast<CUdeviceptr>(address_of(dst));
      shape.src = static_cast<CUdeviceptr>(address_of(src));
      shape.count = bytes;
      return accessed<R>(call, last_stream(rest...), addresses, 2, forward, &shape);
    }
    return staged<R>(call, last_stream(rest...), addresses, 2, !has_stream<Rest...>(), forward);
  }
};

// Batches of copies (cuMemcpyBatchAsync, CUDA 13's revision): (dsts, srcs, sizes, count, attrs,
// attrs_idxs, num_attrs, stream). Every copy's two addresses are looked up, as for one copy. The
// runtime's cudaMemcpyBatchAsync is not hooked: its CUDA 12.8 form has a failure index before the
// stream, and libcudart.so.12 exports it under the same unversioned name, so a hook with one
// signature would pass another runtime the wrong arguments. cudart reaches the driver's
// cuMemcpyBatchAsync (the revision of its own version), which is hooked; CUDA 12.8's revision
// of it passes through.
template <class Fn>
struct CopyBatch;
template <class R, class D, class S, class Z, class... Rest>
struct CopyBatch<R (*)(D*, S*, Z*, size_t, Rest...)> {
  R (*real)(D*, S*, Z*, size_t, Rest...);
  Call call;
  R operator()(D* dsts, S* srcs, Z* sizes, size_t count, Rest... rest) const {
    const auto forward = [&] { return real(dsts, srcs, sizes, count, rest...); };
    if (!handle() || !intercept::access_wanted() || dsts == nullptr || srcs == nullptr) {
      return forward();
    }
    std::vector<uintptr_t> addresses;
    addresses.reserve(2 * count);
    for (size_t i = 0; i < count; ++i) {
      addresses.push_back(address_of(dsts[i]));
      addresses.push_back(address_of(srcs[i]));
    }
    // A copy with pageable memory in the batch waits on the host: the batch settles (staged).
    // So does one whose sources may be read out of stream order (during the call, or at any
    // time): the stream's wait for a restore would not hold them back, so its slots must be on
    // the device, with their data, before the call (the host path).
    // (attrs, attrs_idxs, num_attrs, stream)
    const CUmemcpyAttributes* attrs = std::get<0>(std::tie(rest...));
    const size_t num_attrs = std::get<2>(std::tie(rest...));
    bool unordered = false;
    for (size_t i = 0; attrs != nullptr && i < num_attrs; ++i) {
      unordered = unordered || attrs[i].srcAccessOrder != CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    }
    return staged<R>(call, last_stream(rest...), addresses.data(), addresses.size(), unordered,
                     forward);
  }
};

// Batches of 3D copies (cuMemcpy3DBatchAsync, CUDA 13's revision): (count, ops, flags, stream).
// Each pointer operand is looked up (an array operand names no slot); like a batch of linear
// copies, one with pageable memory settles. CUDA 12.8's revision (a failure index before the
// flags) passes through, as cuMemcpyBatchAsync's does.
template <class Fn>
struct Copy3DBatch;
template <class R, class... Rest>
struct Copy3DBatch<R (*)(size_t, CUDA_MEMCPY3D_BATCH_OP*, Rest...)> {
  R (*real)(size_t, CUDA_MEMCPY3D_BATCH_OP*, Rest...);
  Call call;
  R operator()(size_t count, CUDA_MEMCPY3D_BATCH_OP* ops, Rest... rest) const {
    const auto forward = [&] { return real(count, ops, rest...); };
    if (!handle() || !intercept::access_wanted() || ops == nullptr) return forward();
    std::vector<uintptr_t> addresses;
    addresses.reserve(2 * count);
    bool unordered = false;  // sources read out of stream order: as for cuMemcpyBatchAsync
    for (size_t i = 0; i < count; ++i) {
      for (const CUmemcpy3DOperand* o : {&ops[i].dst, &ops[i].src}) {
        if (o->type == CU_MEMCPY_OPERAND_TYPE_POINTER)
          addresses.push_back(address_of(o->op.ptr.ptr));
      }
      unordered = unordered || ops[i].srcAccessOrder != CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    }
    return staged<R>(call, last_stream(rest...), addresses.data(), addresses.size(), unordered,
                     forward);
  }
};

// Copies between a CUDA array and device memory (cuMemcpyDtoA: array, offset, device, bytes;
// cuMemcpyAtoD: device, array, offset, bytes; synchronous): the device side is looked up, as for
// any synchronous copy.
template <class Fn>
struct CopyArray;
template <class R, class A, class B, class C>
struct CopyArray<R (*)(A, B, C, size_t)> {
  R (*real)(A, B, C, size_t);
  Call call;
  R operator()(A a, B b, C c, size_t bytes) const {
    const auto forward = [&] { return real(a, b, c, bytes); };
    if (!handle() || !intercept::access_wanted()) return forward();
    uintptr_t device = 0;
    if constexpr (std::is_same_v<A, CUdeviceptr>) {
      device = address_of(a);
    } else {
      device = address_of(c);
    }
    const uintptr_t addresses[] = {device};
    return staged<R>(call, nullptr, addresses, 1, true, forward);
  }
};

// Memsets: (dst, value, count, [stream]).
template <class Fn>
struct Set;
template <class R, class D, class V, class... Rest>
struct Set<R (*)(D, V, size_t, Rest...)> {
  R (*real)(D, V, size_t, Rest...);
  Call call;
  R operator()(D dst, V value, size_t count, Rest... rest) const {
    const auto forward = [&] { return real(dst, value, count, rest...); };
    if (!handle() || !intercept::access_wanted()) return forward();
    const uintptr_t addresses[] = {address_of(dst)};
    if (has_stream<Rest...>()) {
      // cudaMemset takes an int and sets bytes; cuMemsetD8/D16/D32 set elements of their size.
      residency::EagerShape shape;
      shape.memset = true;
      shape.dst = static_cast<CUdeviceptr>(address_of(dst));
      shape.element = std::is_same_v<V, int> ? 1 : static_cast<unsigned>(sizeof(V));
      shape.value = std::is_same_v<V, int> ? static_cast<unsigned>(value) & 0xffu
                                           : static_cast<unsigned>(value);
      shape.count = count;
      return accessed<R>(call, last_stream(rest...), addresses, 1, forward, &shape);
    }
    return accessed<R>(call, last_stream(rest...), addresses, 1, forward);
  }
};

// cudaMemcpy2D[Async]: (dst, dpitch, src, spitch, width, height, kind, [stream]).
template <class Fn>
struct Copy2D;
template <class R, class... Rest>
struct Copy2D<R (*)(void*, size_t, const void*, size_t, size_t, size_t, Rest...)> {
  R (*real)(void*, size_t, const void*, size_t, size_t, size_t, Rest...);
  Call call;
  R operator()(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
               size_t height, Rest... rest) const {
    const auto forward = [&] { return real(dst, dpitch, src, spitch, width, height, rest...); };
    if (!handle() || !intercept::access_wanted()) return forward();
    const uintptr_t addresses[] = {address_of(dst), address_of(src)};
    return staged<R>(call, last_stream(rest...), addresses, 2, !has_stream<Rest...>(), forward);
  }
};

// 2D memsets: (dst, pitch, value, width, height, [stream]).
template <class Fn>
struct Set2D;
template <class R, class D, class V, class... Rest>
struct Set2D<R (*)(D, size_t, V, size_t, size_t, Rest...)> {
  R (*real)(D, size_t, V, size_t, size_t, Rest...);
  Call call;
  R operator()(D dst, size_t pitch, V value, size_t width, size_t height, Rest... rest) const {
    const auto forward = [&] { return real(dst, pitch, value, width, height, rest...); };
    if (!handle() || !intercept::access_wanted()) return forward();
    const uintptr_t addresses[] = {address_of(dst)};
    return accessed<R>(call, last_stream(rest...), addresses, 1, forward);
  }
};

// The device addresses of a 2D or 3D copy's parameters (host ones find nothing; arrays have none).
inline void copy_addresses(const CUDA_MEMCPY2D& p, uintptr_t out[2]) {
  out[0] = p.dstMemoryType == CU_MEMORYTYPE_HOST ? address_of(p.dstHost) : address_of(p.dstDevice);
  out[1] = p.srcMemoryType == CU_MEMORYTYPE_HOST ? address_of(p.srcHost) : address_of(p.srcDevice);
}
inline void copy_addresses(const CUDA_MEMCPY3D& p, uintptr_t out[2]) {
  out[0] = p.dstMemoryType == CU_MEMORYTYPE_HOST ? address_of(p.dstHost) : address_of(p.dstDevice);
  out[1] = p.srcMemoryType == CU_MEMORYTYPE_HOST ? address_of(p.srcHost) : address_of(p.srcDevice);
}
inline void copy_addresses(const CUDA_MEMCPY3D_PEER& p, uintptr_t out[2]) {
  out[0] = p.dstMemoryType == CU_MEMORYTYPE_HOST ? address_of(p.dstHost) : address_of(p.dstDevice);
  out[1] = p.srcMemoryType == CU_MEMORYTYPE_HOST ? address_of(p.srcHost) : address_of(p.srcDevice);
}
inline void copy_addresses(const cudaMemcpy3DParms& p, uintptr_t out[2]) {
  out[0] = address_of(p.dstPtr.ptr);
  out[1] = address_of(p.srcPtr.ptr);
}
inline void copy_addresses(const cudaMemcpy3DPeerParms& p, uintptr_t out[2]) {
  out[0] = address_of(p.dstPtr.ptr);
  out[1] = address_of(p.srcPtr.ptr);
}

// cuMemcpy2D*/cuMemcpy3D*[Peer]/cudaMemcpy3D*[Peer]: (params, [stream]). A peer copy's two
// sides may be slots of two devices: each comes back on its own.
template <class Fn>
struct CopyParams;
template <class R, class P, class... Rest>
struct CopyParams<R (*)(const P*, Rest...)> {
  R (*real)(const P*, Rest...);
  Call call;
  R operator()(const P* params, Rest... rest) const {
    const auto forward = [&] { return real(params, rest...); };
    if (!handle() || !intercept::access_wanted() || params == nullptr) return forward();
    uintptr_t addresses[2] = {};
    copy_addresses(*params, addresses);
    return staged<R>(call, last_stream(rest...), addresses, 2, !has_stream<Rest...>(), forward);
  }
};

// Peer copies: (dst, dst device or context, src, src device or context, bytes, [stream]).
template <class Fn>
struct CopyPeer;
template <class R, class D, class DC, class S, class SC, class... Rest>
struct CopyPeer<R (*)(D, DC, S, SC, size_t, Rest...)> {
  R (*real)(D, DC, S, SC, size_t, Rest...);
  Call call;
  R operator()(D dst, DC dst_where, S src, SC src_where, size_t bytes, Rest... rest) const {
    const auto forward = [&] { return real(dst, dst_where, src, src_where, bytes, rest...); };
    if (!handle() || !intercept::access_wanted()) return forward();
    const uintptr_t addresses[] = {address_of(dst), address_of(src)};
    return accessed<R>(call, last_stream(rest...), addresses, 2, forward);
  }
};

// The handle is forgotten before the real destroy: once destroyed, the driver may hand the same
// value to another thread's new graph.
template <class Fn>
struct Destroy;
template <class R, class H>
struct Destroy<R (*)(H)> {
  R (*real)(H);
  Call call;
  R operator()(H handle_value) const {
    if (!handle()) return real(handle_value);
    Scope scope;
    if constexpr (std::is_same_v<H, CUgraphExec>) {
      intercept::exec_destroyed(call, handle_value);
    } else {
      intercept::graph_destroyed(call, handle_value);
    }
    return real(handle_value);
  }
};

// A stream is destroyed: the slots' uses enqueued on it are closed by a mark recorded before the
// real destroy (its work may still run; the mark completes after it).
template <class Fn>
struct StreamGone;
template <class R, class S>
struct StreamGone<R (*)(S)> {
  R (*real)(S);
  Call call;
  R operator()(S stream) const {
    if (!handle()) return real(stream);
    Scope scope;
    intercept::stream_destroying(call, reinterpret_cast<CUstream>(stream));
    return real(stream);
  }
};

// A module or library load (cuModuleLoadData, cuLibraryLoadData, ...: Triton, NVRTC and other
// JIT compilers reach the driver so). On the H200 a load does not return while a stream is parked
// on a wait-value, and a worker's copy that would write the flag waits behind it: with the device
// handshake, it runs only once no stream is parked, and none is parked again until it returns.
// Nothing else is done here, and nothing starts vaswap: cudart loads its own modules this way
// while it initializes, inside the first call of the program.
template <class Fn>
struct Load;
template <class R, class... A>
struct Load<R (*)(A...)> {
  R (*real)(A...);
  Call call;
  R operator()(A... args) const {
    if (tls_depth != 0 || !intercept::settles()) return real(args...);
    return quietly<R>(call, "a module load", true, [&] { return real(args...); });
  }
};

// A kernel's lookup (cuModuleGetFunction, cuLibraryGetKernel, cuKernelGetFunction, ...): under
// lazy loading, CUDA's default, the first lookup of a kernel loads it, and a load waits for
// parked streams as Load's do. Settled as a load until a lookup of a handle and name returned in
// a context (every thread asking meanwhile settles: the first may still wait, its kernel not
// loaded yet): programs may look kernels up before every launch, and a settle in steady state
// would make their thread wait for restores.
template <class O, class H>
std::pair<const void*, const char*> lookup_of(O*, H handle, const char* name) {
  return {reinterpret_cast<const void*>(handle), name};
}
template <class O, class H>
std::pair<const void*, const char*> lookup_of(O*, H handle) {
  return {reinterpret_cast<const void*>(handle), nullptr};
}
template <class H>
std::pair<const void*, const char*> lookup_of(H handle) {
  return {reinterpret_cast<const void*>(handle), nullptr};
}

template <class Fn>
struct Lookup;
template <class R, class... A>
struct Lookup<R (*)(A...)> {
  R (*real)(A...);
  Call call;
  R operator()(A... args) const {
    if (tls_depth != 0 || !intercept::settles()) return real(args...);
    const auto [handle, name] = lookup_of(args...);
    if (!intercept::first_lookup(handle, name)) return real(args...);
    const R rc = quietly<R>(call, "a kernel's first lookup", true, [&] { return real(args...); });
    if (rc == R{}) intercept::lookup_made(handle, name);
    return rc;
  }
};

template <class Fn>
struct MemInfo;
template <class R>
struct MemInfo<R (*)(size_t*, size_t*)> {
  R (*real)(size_t*, size_t*);
  Call call;
  R operator()(size_t* free_bytes, size_t* total_bytes) const {
    if (!handle()) return real(free_bytes, total_bytes);
    Scope scope;
    const R rc = real(free_bytes, total_bytes);
    if (rc == R{} && free_bytes != nullptr && total_bytes != nullptr) {
      intercept::memory_queried(call, *free_bytes, *total_bytes);
    }
    return rc;
  }
};

template <class Fn>
struct Reset;
template <class R, class... Device>
struct Reset<R (*)(Device...)> {
  R (*real)(Device...);
  Call call;
  R operator()(Device... device) const {
    if (!handle()) return real(device...);
    Scope scope;
    std::optional<CUdevice> which;
    ((which = static_cast<CUdevice>(device)), ...);
    intercept::device_resetting(call, which);
    return real(device...);
  }
};

// A pointer's attributes: the driver's answer, except where it refuses an address inside a slot
// whose pages are away or not made yet (a reserved VA without pages is "not a CUDA pointer" to the
// driver). Launchers check every pointer argument so (Triton's, Inductor's static launcher):
// vaswap answers for its slots as for the cudaMalloc'd memory they stand for.
template <class Fn>
struct PointerAttribute;
template <class R>
struct PointerAttribute<R (*)(void*, CUpointer_attribute, CUdeviceptr)> {
  R (*real)(void*, CUpointer_attribute, CUdeviceptr);
  Call call;
  R operator()(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) const {
    const R rc = real(data, attribute, ptr);
    if (rc != CUDA_ERROR_INVALID_VALUE || data == nullptr || !handle()) return rc;
    Scope scope;
    return intercept::slot_pointer_attribute(data, attribute, ptr) ? CUDA_SUCCESS : rc;
  }
};

// Several attributes at once (what a real libcudart's cudaPointerGetAttributes asks): the driver
// answers an address that is not a CUDA pointer with null values and success, so a slot without
// pages reads as no device memory. Where the address lies in such a slot, each attribute vaswap
// can answer is replaced (intercept::slot_pointer_attributes).
template <class Fn>
struct PointerAttributes;
template <class R>
struct PointerAttributes<R (*)(unsigned int, CUpointer_attribute*, void**, CUdeviceptr)> {
  R (*real)(unsigned int, CUpointer_attribute*, void**, CUdeviceptr);
  Call call;
  R operator()(unsigned int count, CUpointer_attribute* attributes, void** data,
               CUdeviceptr ptr) const {
    const R rc = real(count, attributes, data, ptr);
    if (rc != CUDA_SUCCESS || attributes == nullptr || data == nullptr || !handle()) return rc;
    Scope scope;
    intercept::slot_pointer_attributes(count, attributes, data, ptr);
    return rc;
  }
};

// The program enabled the current device's access to a peer's memory (the runtime names the peer
// device, the driver its context): kernels may now dereference the peer's allocations, so its
// slots' pages are mapped for the current device too. Already enabled (704 either way) is success
// for this: the slots need the access all the same.
template <class Fn>
struct PeerAccess;
template <class R, class Peer>
struct PeerAccess<R (*)(Peer, unsigned int)> {
  R (*real)(Peer, unsigned int);
  Call call;
  R operator()(Peer peer, unsigned int flags) const {
    if (!handle()) return real(peer, flags);
    Scope scope;
    const R rc = real(peer, flags);
    if (rc == R{} || static_cast<int>(rc) == 704) intercept::peer_access_enabled(call, peer);
    return rc;
  }
};

// Lookups of driver functions: the real answer, with the functions vaswap hooks swapped for its
// own. Not gated by the depth counter: cudaGetDriverEntryPoint reaches the driver's
// cuGetProcAddress from inside a hook, and swapping an answer twice changes nothing.
template <class Fn>
struct Route;
template <class R, class... Rest>
struct Route<R (*)(const char*, void**, Rest...)> {
  R (*real)(const char*, void**, Rest...);
  Call call;
  R operator()(const char* symbol, void** fn, Rest... rest) const {
    const R rc = real(symbol, fn, rest...);
    if (rc == R{} && fn != nullptr) *fn = route_proc_address(*fn);
    return rc;
  }
};

}  // namespace

// =============================================================================================
// Routing
// =============================================================================================

void* route_proc_address(void* fn) {
  if (fn == nullptr || !intercept::routing_on()) return fn;
  // By identity, not by name: one function can be answered under several names and versions, and
  // an older or newer ABI revision under a hooked name is another function with another signature
  // ("cuGraphInstantiate" is the 5-argument CUDA 11 form, not cuda.h's macro for
  // cuGraphInstantiateWithFlags), which must not be swapped.
  for (int i = 0; i < kCount; ++i) {
    if (kEntries[i].api == Api::driver && real(i) == fn) return wrapper(i);
  }
  return fn;
}

void* route_export(int index, void* fn) {
  if (fn == nullptr || fn == wrapper(index)) return fn;
  if (fn == real(index)) return wrapper(index);
  if (kEntries[index].api == Api::runtime) return fn;  // another libcudart: not ours to swap
  // libcuda's exported symbol can be a different address from what cuGetProcAddress answers
  // for the same revision; the exported name fixes the revision, so the object decides.
  Dl_info theirs{}, driver{};
  auto get_proc_address = reinterpret_cast<void*>(driver_get_proc_address());
  if (get_proc_address != nullptr && dladdr(fn, &theirs) != 0 &&
      dladdr(get_proc_address, &driver) != 0 && theirs.dli_fbase == driver.dli_fbase) {
    return wrapper(index);
  }
  return fn;
}

}  // namespace vaswap::hooks

// =============================================================================================
// The exported functions
// =============================================================================================

#define VASWAP_DEFINE_HOOK(kind, symbol, ret, api, stream, params, args) \
  VASWAP_EXPORT ret symbol params {                                      \
    using Fn = ret(*) params;                                            \
    using namespace vaswap::hooks;                                       \
    const auto real_fn = reinterpret_cast<Fn>(real(k_##symbol));         \
    if (real_fn == nullptr) return missing<ret>(k_##symbol);             \
    return kind<Fn> {                                                    \
      real_fn, { #symbol, api, stream, __builtin_return_address(0) }     \
    }                                                                    \
    args;                                                                \
  }
#define VASWAP_RUNTIME_HOOK(kind, symbol, stream, params, args) \
  VASWAP_DEFINE_HOOK(kind, symbol, cudaError_t, Api::runtime, stream, params, args)
#define VASWAP_DRIVER_HOOK(kind, base, symbol, version, stream, params, args) \
  VASWAP_DEFINE_HOOK(kind, symbol, CUresult, Api::driver, stream, params, args)
#include "hooks.def"
#undef VASWAP_RUNTIME_HOOK
#undef VASWAP_DRIVER_HOOK

namespace vaswap::hooks {

void* wrapper(int index) {
  switch (index) {
#define VASWAP_RUNTIME_HOOK(kind, symbol, stream, params, args) \
  case k_##symbol:                                              \
    return reinterpret_cast<void*>(&::symbol);
#define VASWAP_DRIVER_HOOK(kind, base, symbol, version, stream, params, args) \
  case k_##symbol:                                                            \
    return reinterpret_cast<void*>(&::symbol);
#include "hooks.def"
#undef VASWAP_RUNTIME_HOOK
#undef VASWAP_DRIVER_HOOK
    default: return nullptr;
  }
}

}  // namespace vaswap::hooks
