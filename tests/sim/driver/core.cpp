// Simulated driver: initialization, devices, primary contexts, errors, fault injection.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "state.h"

namespace vsim {

thread_local bool tls_in_host_fn = false;
std::atomic<unsigned long long> g_host_fn_violations{0};
thread_local bool tls_null_is_per_thread = false;

namespace {

std::atomic<bool> g_initialized{false};
std::atomic<bool> g_shut_down{false};
thread_local Context* tls_context = nullptr;

// ---------------------------------------------------------------------------------------------
// Fault injection
// ---------------------------------------------------------------------------------------------

struct Armed {
  unsigned long long remaining;
  int error;
};

std::mutex& fault_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::unordered_map<std::string, Armed>& armed_faults() {
  static auto* m = new std::unordered_map<std::string, Armed>;
  return *m;
}
std::atomic<bool> g_any_armed{false};

// VASWAP_SIM_COUNT="cuMemMap,device": how often each named function (or pseudo-function) was
// checked, printed at exit as "vaswap-sim: calls cuMemMap=12 device=40".
std::atomic<bool> g_counting{false};
std::map<std::string, unsigned long long>& counted_calls() {  // guarded by fault_mutex()
  static auto* m = new std::map<std::string, unsigned long long>;
  return *m;
}

void print_counts() {
  std::lock_guard<std::mutex> lock(fault_mutex());
  std::string line = "vaswap-sim: calls";
  for (const auto& c : counted_calls()) line += " " + c.first + "=" + std::to_string(c.second);
  std::fprintf(stderr, "%s\n", line.c_str());
}

void count_from_env() {
  const char* spec = std::getenv("VASWAP_SIM_COUNT");
  if (spec == nullptr || *spec == '\0') return;
  std::string s(spec);
  size_t at = 0;
  while (at <= s.size()) {
    size_t comma = s.find(',', at);
    if (comma == std::string::npos) comma = s.size();
    if (comma > at) counted_calls()[s.substr(at, comma - at)] = 0;
    at = comma + 1;
  }
  g_counting.store(true);
  std::atexit(print_counts);
}

// VASWAP_SIM_FAULTS="cuMemMap:3:2,cudaMalloc:1:2": function, nth call, error code.
void arm_faults_from_env() {
  const char* spec = std::getenv("VASWAP_SIM_FAULTS");
  if (spec == nullptr) return;
  std::string s(spec);
  size_t at = 0;
  while (at < s.size()) {
    size_t comma = s.find(',', at);
    if (comma == std::string::npos) comma = s.size();
    const std::string item = s.substr(at, comma - at);
    const size_t c1 = item.find(':');
    const size_t c2 = c1 == std::string::npos ? c1 : item.find(':', c1 + 1);
    if (c2 != std::string::npos) {
      vaswapSimInjectFault(item.substr(0, c1).c_str(),
                           std::strtoull(item.c_str() + c1 + 1, nullptr, 10),
                           static_cast<int>(std::strtol(item.c_str() + c2 + 1, nullptr, 10)));
    }
    at = comma + 1;
  }
}

}  // namespace

size_t parse_bytes(const std::string& text, size_t fallback) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (end == text.c_str()) return fallback;
  const std::string unit(end);
  if (unit.empty() || unit == "B") return v;
  if (unit == "KiB") return v << 10;
  if (unit == "MiB") return v << 20;
  if (unit == "GiB") return v << 30;
  return fallback;
}

bool initialized() { return g_initialized.load(std::memory_order_acquire); }
bool shut_down() { return g_shut_down.load(std::memory_order_acquire); }

CUresult fault_check(const char* function) {
  const int error = vaswapSimFaultCheck(function);
  if (error >= 0) return static_cast<CUresult>(error);
  // A negative "error" holds the call that long (milliseconds), then runs it: a driver call that
  // blocks.
  std::this_thread::sleep_for(std::chrono::milliseconds(-error));
  return CUDA_SUCCESS;
}

thread_local int tls_worker_device = -1;
std::atomic<bool> g_any_sticky{false};

CUresult sticky_error() {
  if (!g_any_sticky.load(std::memory_order_acquire)) return CUDA_SUCCESS;
  if (tls_context != nullptr) {
    return static_cast<CUresult>(devices()[static_cast<size_t>(tls_context->device)].sticky.load());
  }
  for (const Device& d : devices()) {
    if (int e = d.sticky.load()) return static_cast<CUresult>(e);
  }
  return CUDA_SUCCESS;
}

CUresult device_error(int device) {
  return static_cast<CUresult>(devices()[static_cast<size_t>(device)].sticky.load());
}

thread_local const char* tls_running = nullptr;

namespace {

// A touch of an unmapped device address is a SIGSEGV here, where a GPU would report an illegal
// address. Say what touched it, and where, before the process dies as it would anyway.
void report_device_fault(int, siginfo_t* info, void*) {
  char line[160];
  size_t n = 0;
  auto put = [&](const char* text) {
    while (*text != '\0' && n < sizeof line - 1) line[n++] = *text++;
  };
  put("vaswap-sim: device fault: ");
  put(tls_running != nullptr ? tls_running : "host code");
  put(" touched unmapped address 0x");
  const auto address = reinterpret_cast<uintptr_t>(info->si_addr);
  for (int shift = 60; shift >= 0; shift -= 4) {
    if (n < sizeof line - 1) line[n++] = "0123456789abcdef"[(address >> shift) & 0xf];
  }
  put(" (a GPU: CUDA_ERROR_ILLEGAL_ADDRESS)\n");
  ssize_t ignored = write(STDERR_FILENO, line, n);
  (void)ignored;
  signal(SIGSEGV, SIG_DFL);  // returning re-runs the access, which now kills the process
}

}  // namespace

void install_fault_reporter() {
  struct sigaction current {};
  if (sigaction(SIGSEGV, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) return;
  struct sigaction report {};
  report.sa_sigaction = report_device_fault;
  report.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&report.sa_mask);
  sigaction(SIGSEGV, &report, nullptr);
}

bool kernel_faults() {
  const int error = vaswapSimFaultCheck("device");
  if (error == 0 || tls_worker_device < 0) return false;
  int none = 0;
  devices()[static_cast<size_t>(tls_worker_device)].sticky.compare_exchange_strong(none, error);
  g_any_sticky.store(true, std::memory_order_release);
  return true;
}

std::vector<Device>& devices() {
  static auto* d = new std::vector<Device>();
  return *d;
}

int device_count() { return static_cast<int>(devices().size()); }

Context* current_context() { return tls_context; }

CUresult current_device(int* device) {
  if (tls_context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *device = tls_context->device;
  return CUDA_SUCCESS;
}

CUresult charge_physical(int device, size_t bytes, size_t keep_free) {
  Device& d = devices()[static_cast<size_t>(device)];
  size_t used = d.physical_bytes.load();
  do {
    if (used + bytes + keep_free > d.capacity_bytes) return CUDA_ERROR_OUT_OF_MEMORY;
  } while (!d.physical_bytes.compare_exchange_weak(used, used + bytes));
  return CUDA_SUCCESS;
}

CUresult charge_allocation(int device, size_t bytes) {
  return charge_physical(device, bytes, devices()[static_cast<size_t>(device)].holdback.load());
}

void refund_physical(int device, size_t bytes) {
  devices()[static_cast<size_t>(device)].physical_bytes.fetch_sub(bytes);
}

}  // namespace vsim

using namespace vsim;

// -----------------------------------------------------------------------------------------------
// Simulator controls
// -----------------------------------------------------------------------------------------------

extern "C" int vaswapSimInjectFault(const char* function, unsigned long long nth, int error) {
  if (function == nullptr || nth == 0 || error == 0) return 1;
  std::lock_guard<std::mutex> lock(fault_mutex());
  armed_faults()[function] = Armed{nth, error};
  g_any_armed.store(true);
  return 0;
}

extern "C" void vaswapSimClearFaults(void) {
  std::lock_guard<std::mutex> lock(fault_mutex());
  armed_faults().clear();
  g_any_armed.store(false);
  for (Device& d : devices()) d.sticky.store(0);
  g_any_sticky.store(false);
}

extern "C" int vaswapSimFaultCheck(const char* function) {
  if (g_counting.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(fault_mutex());
    auto it = counted_calls().find(function);
    if (it != counted_calls().end()) ++it->second;
  }
  if (!g_any_armed.load(std::memory_order_relaxed)) return 0;
  std::lock_guard<std::mutex> lock(fault_mutex());
  auto it = armed_faults().find(function);
  if (it == armed_faults().end()) return 0;
  if (--it->second.remaining > 0) return 0;
  const int error = it->second.error;
  armed_faults().erase(it);
  g_any_armed.store(!armed_faults().empty());
  // Said on stderr, so a test knows the fault fired (and when, among the program's own messages).
  std::fprintf(stderr, "vaswap-sim: injected fault: %s -> %d\n", function, error);
  return error;
}

extern "C" unsigned long long vaswapSimHostFnViolations(void) {
  return g_host_fn_violations.load();
}

extern "C" void vaswapSimSetSingleQueue(int single) {
  for (Device& d : devices()) {
    std::lock_guard<std::mutex> lock(d.queue_mutex);
    d.single_queue = single != 0;
  }
}

extern "C" void vaswapSimSetStreamBytes(unsigned long long bytes) {
  for (Device& d : devices()) d.stream_bytes.store(static_cast<size_t>(bytes));
}

extern "C" void vaswapSimSetHoldback(unsigned long long bytes) {
  for (Device& d : devices()) d.holdback.store(static_cast<size_t>(bytes));
}

extern "C" unsigned long long vaswapSimPhysicalBytes(int device) {
  if (device < 0 || device >= device_count()) return 0;
  return devices()[static_cast<size_t>(device)].physical_bytes.load();
}

// -----------------------------------------------------------------------------------------------
// Initialization and devices
// -----------------------------------------------------------------------------------------------

// VASWAP_SIM_DEVICES: number of devices (default 2).
// VASWAP_SIM_DEVICE_MEMORY: capacity of each device, one value or a comma list (default 16GiB).
CUresult CUDAAPI cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  static std::once_flag once;
  std::call_once(once, [] {
    // The driver shuts down as the process exits, after the atexit handlers registered after
    // this first cuInit (a runtime's, or vaswap's) have run: every call from then on answers
    // CUDA_ERROR_DEINITIALIZED, as a GPU's driver did to vaswap's threads once the program had
    // called exit (bench/results/capacity_edges_session51_h100.md). The teardown waits for the
    // device's pending work (500 ms at most), which still retires; threads that call meanwhile see
    // the shut-down driver.
    std::atexit([] {
      g_shut_down.store(true, std::memory_order_release);
      drain_at_shutdown(std::chrono::milliseconds(500));
    });
    arm_faults_from_env();
    count_from_env();
    install_fault_reporter();
    int count = 2;
    if (const char* n = std::getenv("VASWAP_SIM_DEVICES")) count = std::atoi(n);
    if (count < 0) count = 0;
    std::vector<std::string> caps;
    if (const char* m = std::getenv("VASWAP_SIM_DEVICE_MEMORY")) {
      std::string s(m);
      size_t at = 0;
      while (at <= s.size()) {
        size_t comma = s.find(',', at);
        if (comma == std::string::npos) comma = s.size();
        caps.push_back(s.substr(at, comma - at));
        at = comma + 1;
      }
    }
    // Read once, at start, as the driver reads it when it creates a context.
    // VASWAP_SIM_SINGLE_QUEUE=1 gives the same one queue where the program cannot see it in its
    // environment: a device on which a waiting stream holds back all work enqueued after it, as
    // the H200 did in the device handshake's failures (bench/results/copy_h200.md).
    const char* connections = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    const char* hidden = std::getenv("VASWAP_SIM_SINGLE_QUEUE");
    const bool single_queue = (connections != nullptr && std::atoi(connections) == 1) ||
                              (hidden != nullptr && std::atoi(hidden) == 1);
    const char* per_stream = std::getenv("VASWAP_SIM_STREAM_BYTES");
    const size_t stream_bytes = per_stream != nullptr ? parse_bytes(per_stream, 0) : 0;
    const char* held_back = std::getenv("VASWAP_SIM_HOLDBACK");
    const size_t holdback = held_back != nullptr ? parse_bytes(held_back, 0) : 0;
    std::vector<Device> devs(static_cast<size_t>(count));
    for (int i = 0; i < count; ++i) {
      devs[static_cast<size_t>(i)].ordinal = i;
      const std::string& cap =
          caps.empty() ? std::string("16GiB") : caps[std::min(caps.size() - 1, size_t(i))];
      devs[static_cast<size_t>(i)].capacity_bytes = parse_bytes(cap, size_t{16} << 30);
      devs[static_cast<size_t>(i)].primary.device = i;
      devs[static_cast<size_t>(i)].single_queue = single_queue;
      devs[static_cast<size_t>(i)].stream_bytes = stream_bytes;
      devs[static_cast<size_t>(i)].holdback = holdback;
    }
    devices().swap(devs);
    g_initialized.store(true, std::memory_order_release);
  });
  if (CUresult f = fault_check(__func__)) return f;
  return device_count() == 0 ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
}

// VASWAP_SIM_DRIVER_VERSION (say 12080) makes the simulator an older driver: it says so, and
// cuGetProcAddress answers no ABI revision newer than it.
int vsim::driver_version() {
  static const int version = [] {
    const char* v = std::getenv("VASWAP_SIM_DRIVER_VERSION");
    const int asked = v != nullptr ? std::atoi(v) : 0;
    return asked > 0 && asked < CUDA_VERSION ? asked : CUDA_VERSION;
  }();
  return version;
}

CUresult CUDAAPI cuDriverGetVersion(int* version) {
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = driver_version();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetCount(int* count) {
  SIM_ENTER();
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = device_count();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
  SIM_ENTER();
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal < 0 || ordinal >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice dev) {
  SIM_ENTER();
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<size_t>(len), "vaswap simulated device %d", dev);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  SIM_ENTER();
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = devices()[static_cast<size_t>(dev)].capacity_bytes;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int* value, CUdevice_attribute attrib, CUdevice dev) {
  SIM_ENTER();
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  // What an H200 reports for the attributes programs commonly ask; every other attribute is 0.
  static const std::pair<CUdevice_attribute, int> kAttributes[] = {
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
      {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132},
      {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024},
      {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32},
      {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
      {CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1},
      {CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1},
      {CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, 2},
      {CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1},
      {CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, 1},
      {CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR, 1},
  };
  *value = 0;
  for (const auto& entry : kAttributes) {
    if (entry.first == attrib) *value = entry.second;
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  SIM_ENTER();
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  std::memset(uuid->bytes, 0, sizeof(uuid->bytes));
  std::memcpy(uuid->bytes, "VSIM", 4);
  uuid->bytes[15] = static_cast<char>(dev);
  return CUDA_SUCCESS;
}

// -----------------------------------------------------------------------------------------------
// Primary contexts. The simulator has exactly one context per device.
// -----------------------------------------------------------------------------------------------

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  SIM_ENTER();
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  Context& ctx = devices()[static_cast<size_t>(dev)].primary;
  std::lock_guard<std::mutex> lock(capture_mutex());
  ++ctx.retains;
  *pctx = reinterpret_cast<CUcontext>(&ctx);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  SIM_ENTER();
  if (dev < 0 || dev >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  Context& ctx = devices()[static_cast<size_t>(dev)].primary;
  std::lock_guard<std::mutex> lock(capture_mutex());
  if (ctx.retains == 0) return CUDA_ERROR_INVALID_CONTEXT;
  --ctx.retains;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  SIM_ENTER();
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  *flags = 0;
  *active = devices()[static_cast<size_t>(dev)].primary.retains > 0 ? 1 : 0;
  return CUDA_SUCCESS;
}

static Context* context_from_handle(CUcontext h) {
  auto* ctx = reinterpret_cast<Context*>(h);
  for (auto& d : devices()) {
    if (&d.primary == ctx) return ctx;
  }
  return nullptr;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  SIM_ENTER();
  if (ctx == nullptr) {
    tls_context = nullptr;
    return CUDA_SUCCESS;
  }
  Context* c = context_from_handle(ctx);
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  tls_context = c;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext* pctx) {
  SIM_ENTER();
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = reinterpret_cast<CUcontext>(tls_context);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx) { return cuCtxSetCurrent(ctx); }

CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext* pctx) {
  SIM_ENTER();
  if (pctx != nullptr) *pctx = reinterpret_cast<CUcontext>(tls_context);
  tls_context = nullptr;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice* device) {
  SIM_ENTER();
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return current_device(device);
}

CUresult CUDAAPI cuCtxSynchronize(void) {
  SIM_ENTER();
  int dev = 0;
  SIM_TRY(current_device(&dev));
  SIM_TRY(check_capture_safety());
  SIM_TRY(check_device_sync(dev));
  synchronize_device(dev);
  return device_error(dev);
}

// Peer access: every simulated device can reach every other's memory once its context enabled
// access to the other's (copies need no enabling; kernels on a GPU do). Enabling twice is
// CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, as on a GPU.
CUresult CUDAAPI cuDeviceCanAccessPeer(int* can, CUdevice dev, CUdevice peer) {
  SIM_ENTER();
  if (can == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= device_count() || peer < 0 || peer >= device_count()) {
    return CUDA_ERROR_INVALID_DEVICE;
  }
  *can = dev != peer ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  SIM_ENTER();
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Context* other = context_from_handle(peer);
  Context* self = current_context();
  if (other == nullptr || self == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (other->device == self->device) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> lock(capture_mutex());
  const uint64_t bit = uint64_t{1} << other->device;
  if ((self->peers & bit) != 0) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
  self->peers |= bit;
  return CUDA_SUCCESS;
}

// CUDA 13.0 revisions (cuGetProcAddress version 13000) that name the context; NULL means the
// current one. cuda.h keeps the old forms under the plain names, so a caller that asks for
// version 13000 and calls the old signature passes garbage here, as on a GPU.
namespace {

CUresult context_or_current(CUcontext ctx, Context** out) {
  *out = ctx != nullptr ? context_from_handle(ctx) : current_context();
  if (*out != nullptr) return CUDA_SUCCESS;
  return ctx != nullptr ? CUDA_ERROR_CONTEXT_IS_DESTROYED : CUDA_ERROR_INVALID_CONTEXT;
}

}  // namespace

CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
  SIM_ENTER();
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* c = nullptr;
  SIM_TRY(context_or_current(ctx, &c));
  *device = c->device;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
  SIM_ENTER();
  Context* c = nullptr;
  SIM_TRY(context_or_current(ctx, &c));
  SIM_TRY(check_capture_safety());
  SIM_TRY(check_device_sync(c->device));
  synchronize_device(c->device);
  return CUDA_SUCCESS;
}

// -----------------------------------------------------------------------------------------------
// Errors
// -----------------------------------------------------------------------------------------------

CUresult CUDAAPI cuGetErrorName(CUresult error, const char** str) {
  if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
#define SIM_ERROR(cu, rt, text) \
  case cu:                      \
    *str = #cu;                 \
    return CUDA_SUCCESS;
#include "vaswap_sim/errors.def"
#undef SIM_ERROR
    default: *str = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char** str) {
  if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
#define SIM_ERROR(cu, rt, text) \
  case cu:                      \
    *str = text;                \
    return CUDA_SUCCESS;
#include "vaswap_sim/errors.def"
#undef SIM_ERROR
    default: *str = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
}
