#include "base/driver.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>

#include "base/log.h"
#include "base/symbols.h"

namespace vaswap {

namespace {

std::string error_name(const Driver& api, CUresult result) {
  const char* name = nullptr;
  if (api.cuGetErrorName != nullptr && api.cuGetErrorName(result, &name) == CUDA_SUCCESS &&
      name != nullptr) {
    return name;
  }
  return "CUresult " + std::to_string(static_cast<int>(result));
}

struct LoadedDriver {
  Driver api;
  std::string error;  // empty when `api` is complete and cuInit succeeded
};

template <class Fn>
bool resolve(decltype(&::cuGetProcAddress) get_proc_address, const char* name, int version, Fn* fn,
             std::string* error) {
  void* address = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  const CUresult rc =
      get_proc_address(name, &address, version, CU_GET_PROC_ADDRESS_DEFAULT, &status);
  if (rc != CUDA_SUCCESS || address == nullptr) {
    *error = std::string("the CUDA driver has no ") + name + " of CUDA version " +
             std::to_string(version) + " (cuGetProcAddress status " + std::to_string(status) +
             "); vaswap needs driver 580 or newer";
    return false;
  }
  *fn = reinterpret_cast<Fn>(address);
  return true;
}

LoadedDriver* load() {
  auto* loaded = new LoadedDriver;  // leaked: workers use the table until the process exits
  const GetProcAddress get_proc_address = driver_get_proc_address(&loaded->error);
  if (get_proc_address == nullptr) return loaded;
#define VASWAP_RESOLVE(name, version) \
  if (!resolve(get_proc_address, #name, version, &loaded->api.name, &loaded->error)) return loaded;
  VASWAP_DRIVER_FUNCTIONS(VASWAP_RESOLVE)
#undef VASWAP_RESOLVE
  void* check = nullptr;
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (get_proc_address("vaswapSimFaultCheck", &check, 0, CU_GET_PROC_ADDRESS_DEFAULT, &found) ==
          CUDA_SUCCESS &&
      check != nullptr) {
    loaded->api.sim_fault_check = reinterpret_cast<int (*)(const char*)>(check);
  }
  const CUresult rc = loaded->api.cuInit(0);
  if (rc != CUDA_SUCCESS) loaded->error = "cuInit failed: " + error_name(loaded->api, rc);
  return loaded;
}

}  // namespace

namespace {
std::atomic<const Driver*> g_loaded{nullptr};  // set once load_driver has succeeded
}  // namespace

const Driver* load_driver(std::string* error) {
  static LoadedDriver* loaded = load();
  if (!loaded->error.empty()) {
    if (error != nullptr) *error = loaded->error;
    return nullptr;
  }
  g_loaded.store(&loaded->api, std::memory_order_release);
  return &loaded->api;
}

const Driver* loaded_driver() { return g_loaded.load(std::memory_order_acquire); }

GetProcAddress driver_get_proc_address(std::string* error) {
  // No static-local guard: this runs inside dlsym and cuGetProcAddress calls that other
  // libraries make while they are being initialized. Racing threads find the same function.
  static std::atomic<GetProcAddress> cached{nullptr};
  GetProcAddress fn = cached.load(std::memory_order_acquire);
  if (fn != nullptr) return fn;
  // RTLD_LOCAL: the driver is normally loaded already (the application's cudart opened it) and
  // this only takes a reference; if it is not, it must not join the global scope on our account.
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    if (error != nullptr) {
      const char* why = dlerror();
      *error = std::string("cannot load the CUDA driver libcuda.so.1: ") +
               (why != nullptr ? why : "unknown error");
    }
    return nullptr;
  }
  fn = reinterpret_cast<GetProcAddress>(real_dlsym(library, "cuGetProcAddress_v2"));
  if (fn == nullptr) {
    if (error != nullptr) {
      *error = "libcuda.so.1 has no cuGetProcAddress_v2; vaswap needs driver 580 or newer";
    }
    return nullptr;
  }
  cached.store(fn, std::memory_order_release);
  return fn;
}

namespace {
std::atomic<bool> g_shut_down{false};

// Latches the shutdown at the first CUDA_ERROR_DEINITIALIZED that cuda_error_name is given.
void notice_result(CUresult result) {
  if (result != CUDA_ERROR_DEINITIALIZED || g_shut_down.exchange(true)) return;
  log().debug(
      "the CUDA driver is shutting down (CUDA_ERROR_DEINITIALIZED): the process is exiting; "
      "vaswap steps aside and says nothing more");
  log().set_level(spdlog::level::off);
}
}  // namespace

bool driver_shut_down() { return g_shut_down.load(std::memory_order_acquire); }

std::string cuda_error_name(CUresult result) {
  notice_result(result);
  // Named here: the shut-down driver no longer answers cuGetErrorName.
  if (result == CUDA_ERROR_DEINITIALIZED) return "CUDA_ERROR_DEINITIALIZED";
  const Driver* driver = load_driver(nullptr);
  return driver != nullptr ? error_name(*driver, result)
                           : "CUresult " + std::to_string(static_cast<int>(result));
}

bool kernel_param_info(const Driver& driver, CUfunction function, CUkernel kernel, size_t index,
                       size_t* offset, size_t* bytes, CUresult* failure) {
  CUresult rc = CUDA_ERROR_INVALID_HANDLE;
  if (function != nullptr) {
    rc = driver.cuFuncGetParamInfo(function, index, offset, bytes);
    if (rc == CUDA_SUCCESS) return true;
  }
  if (kernel == nullptr) kernel = reinterpret_cast<CUkernel>(function);
  if (kernel != nullptr &&
      driver.cuKernelGetParamInfo(kernel, index, offset, bytes) == CUDA_SUCCESS) {
    return true;
  }
  if (failure != nullptr) *failure = rc;
  return false;
}

double elapsed_us(const Driver& driver, CUevent from, CUevent to) {
  float ms = 0;
  if (driver.cuEventElapsedTime(&ms, from, to) != CUDA_SUCCESS) return 0;
  return static_cast<double>(ms) * 1e3;
}

}  // namespace vaswap
