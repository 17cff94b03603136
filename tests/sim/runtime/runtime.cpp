// The simulated CUDA runtime (libcudart.so.13): a thin layer over the simulated driver.
//
// As NVIDIA's runtime does, it loads libcuda.so.1 by soname, takes cuGetProcAddress from it with
// dlsym, and resolves every other driver entry point through cuGetProcAddress, so a preload that
// routes cuGetProcAddress sees the runtime's driver calls. Kernels come from
// __cudaRegisterFatBinary/__cudaRegisterFunction (see vaswap_sim/kernel.h) and are loaded into
// each device lazily, at their first launch there.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "vaswap_sim/abi.h"

#define SIM_API extern "C" __attribute__((visibility("default")))

namespace {

// ---------------------------------------------------------------------------------------------
// Errors: one table shared with the driver (errors.def).
// ---------------------------------------------------------------------------------------------

#define SIM_ERROR(cu, rt, text) static_assert(static_cast<int>(cu) == static_cast<int>(rt), #cu);
#include "vaswap_sim/errors.def"
#undef SIM_ERROR

// NOLINTBEGIN(bugprone-branch-clone): CUDA_ERROR_UNKNOWN and the default both map to
// cudaErrorUnknown
cudaError_t to_runtime(CUresult rc) {
  switch (rc) {
#define SIM_ERROR(cu, rt, text) \
  case cu:                      \
    return rt;
#include "vaswap_sim/errors.def"
#undef SIM_ERROR
    default: return cudaErrorUnknown;
  }
}
// NOLINTEND(bugprone-branch-clone)

thread_local cudaError_t tls_last_error = cudaSuccess;

cudaError_t note(cudaError_t e) {
  if (e != cudaSuccess) tls_last_error = e;
  return e;
}
cudaError_t note(CUresult rc) { return note(to_runtime(rc)); }

// ---------------------------------------------------------------------------------------------
// The driver, resolved through cuGetProcAddress
// ---------------------------------------------------------------------------------------------

// clang-format off
#define SIM_DRIVER_FUNCTIONS(X)                                                                  \
  X(cuInit) X(cuDeviceGetCount) X(cuDeviceGetAttribute) X(cuDriverGetVersion)                    \
  X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent) X(cuCtxSynchronize) X(cuMemAlloc) X(cuMemFree)  \
  X(cuMemAllocAsync) X(cuMemFreeAsync) X(cuMemGetInfo) X(cuMemHostAlloc) X(cuMemAllocHost)       \
  X(cuMemFreeHost) X(cuMemHostGetFlags) X(cuPointerGetAttribute) X(cuMemcpy) X(cuMemcpyHtoD)     \
  X(cuMemcpyDtoH) X(cuMemcpyDtoD) X(cuMemcpyAsync) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync)     \
  X(cuMemcpyDtoDAsync) X(cuMemsetD8) X(cuMemsetD8Async) X(cuStreamCreateWithPriority)            \
  X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamQuery) X(cuStreamWaitEvent)                \
  X(cuLaunchHostFunc) X(cuStreamBeginCapture) X(cuStreamBeginCaptureToGraph)                     \
  X(cuStreamEndCapture) X(cuStreamIsCapturing) X(cuStreamGetCaptureInfo)                         \
  X(cuThreadExchangeStreamCaptureMode) X(cuEventCreate) X(cuEventDestroy)                        \
  X(cuEventRecordWithFlags) X(cuEventQuery) X(cuEventSynchronize) X(cuEventElapsedTime)          \
  X(cuModuleLoadData) X(cuModuleGetFunction) X(cuFuncGetParamInfo) X(cuLaunchKernel)            \
  X(cuLaunchKernelEx)                                                                            \
  X(cuGraphCreate) X(cuGraphDestroy) X(cuGraphGetNodes) X(cuGraphNodeGetType)                    \
  X(cuGraphKernelNodeGetParams) X(cuGraphChildGraphNodeGetGraph) X(cuGraphInstantiateWithFlags)  \
  X(cuGraphInstantiateWithParams) X(cuGraphExecDestroy) X(cuGraphLaunch) X(cuGraphUpload)        \
  X(cuGraphAddKernelNode) X(cuGraphExecUpdate) X(cuGraphExecKernelNodeSetParams)               \
  X(cuMemcpy2D) X(cuMemcpy2DAsync) X(cuMemsetD2D8) X(cuMemsetD2D8Async) X(cuMemcpyPeer)          \
  X(cuMemcpyPeerAsync) X(cuCtxGetCurrent) X(cuMemcpyBatchAsync) X(cuDeviceCanAccessPeer)          \
  X(cuCtxEnablePeerAccess) X(cuMemcpy3DPeer) X(cuMemcpy3DPeerAsync) X(cuGraphAddMemcpyNode)    \
  X(cuGraphAddMemsetNode) X(cuGraphMemcpyNodeSetParams) X(cuGraphMemsetNodeSetParams)          \
  X(cuGraphNodeSetEnabled) X(cuGraphNodeGetEnabled) X(cuGraphKernelNodeSetParams) X(cuGraphClone) \
  X(cuGraphNodeFindInClone)
// clang-format on

struct Driver {
#define SIM_DECLARE(name) decltype(&::name) name = nullptr;
  SIM_DRIVER_FUNCTIONS(SIM_DECLARE)
#undef SIM_DECLARE
  decltype(&::cuGetProcAddress) getProcAddress = nullptr;
  int (*faultCheck)(const char*) = nullptr;
};

struct FatBinary {
  const vaswap_sim_image* image = nullptr;  // nullptr: not a simulator image (e.g. real SASS)
  std::vector<CUmodule> modules;            // per device, loaded lazily
};

struct Kernel {
  FatBinary* binary = nullptr;
  std::string name;
  std::vector<CUfunction> functions;  // per device
};

struct Runtime {
  std::once_flag once;
  CUresult init_rc = CUDA_ERROR_NOT_INITIALIZED;
  Driver d;
  int device_count = 0;
  std::mutex mu;
  std::vector<CUcontext> contexts;  // primary context per device, retained once
  std::unordered_map<const void*, Kernel> kernels;
  std::unordered_map<CUfunction, const void*> host_functions;
};

Runtime& rt() {
  static auto* r = new Runtime;  // leaked: kernels register before main and launch until exit
  return *r;
}

// The version of the ABI revision that cuda.h declares under `name`. Usually the newest, but
// CUDA 13.0 added context-taking revisions of these two at version 13000 and kept the old
// declarations: asking for CUDA_VERSION would hand back a function of another signature.
int header_abi_version(const char* name) {
  if (std::strcmp(name, "cuCtxSynchronize") == 0 || std::strcmp(name, "cuCtxGetDevice") == 0) {
    return 2000;
  }
  return CUDA_VERSION;
}

CUresult load_driver(Runtime& r) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "vaswap simulated runtime: cannot load libcuda.so.1: %s\n", dlerror());
    return CUDA_ERROR_NO_DEVICE;
  }
  r.d.getProcAddress =
      reinterpret_cast<decltype(r.d.getProcAddress)>(dlsym(lib, "cuGetProcAddress_v2"));
  if (r.d.getProcAddress == nullptr) return CUDA_ERROR_NOT_FOUND;
  CUdriverProcAddressQueryResult status{};
#define SIM_RESOLVE(name)                                                             \
  if (CUresult rc = r.d.getProcAddress(#name, reinterpret_cast<void**>(&r.d.name),    \
                                       header_abi_version(#name),                     \
                                       CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status)) { \
    std::fprintf(stderr, "vaswap simulated runtime: driver lacks %s\n", #name);       \
    return rc;                                                                        \
  }
  SIM_DRIVER_FUNCTIONS(SIM_RESOLVE)
#undef SIM_RESOLVE
  // Optional: a real driver has no fault injection.
  r.d.getProcAddress("vaswapSimFaultCheck", reinterpret_cast<void**>(&r.d.faultCheck), 0, 0,
                     &status);

  if (CUresult rc = r.d.cuInit(0)) return rc;
  if (CUresult rc = r.d.cuDeviceGetCount(&r.device_count)) return rc;
  r.contexts.assign(static_cast<size_t>(r.device_count), nullptr);
  return CUDA_SUCCESS;
}

thread_local int tls_device = 0;
thread_local CUcontext tls_bound = nullptr;

// Initializes lazily and makes the current device's primary context current on this thread.
cudaError_t enter(const char* function) {
  Runtime& r = rt();
  std::call_once(r.once, [&r] { r.init_rc = load_driver(r); });
  if (r.init_rc != CUDA_SUCCESS) return to_runtime(r.init_rc);
  if (r.d.faultCheck != nullptr) {
    if (int f = r.d.faultCheck(function)) {
      if (f > 0) return static_cast<cudaError_t>(f);
      std::this_thread::sleep_for(std::chrono::milliseconds(-f));  // a stalled call, then it runs
    }
  }
  if (tls_device >= r.device_count) return cudaErrorInvalidDevice;
  CUcontext ctx = nullptr;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    CUcontext& slot = r.contexts[static_cast<size_t>(tls_device)];
    if (slot == nullptr) {
      if (CUresult rc = r.d.cuDevicePrimaryCtxRetain(&slot, tls_device)) return to_runtime(rc);
    }
    ctx = slot;
  }
  if (tls_bound != ctx) {
    if (CUresult rc = r.d.cuCtxSetCurrent(ctx)) return to_runtime(rc);
    tls_bound = ctx;
  }
  return cudaSuccess;
}

#define RT_ENTER()                                               \
  do {                                                           \
    if (cudaError_t rt_e_ = enter(__func__)) return note(rt_e_); \
  } while (0)

Driver& drv() { return rt().d; }

CUdeviceptr dptr(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }
CUstream cu(cudaStream_t s) { return reinterpret_cast<CUstream>(s); }
CUevent cu(cudaEvent_t e) { return reinterpret_cast<CUevent>(e); }
CUgraph cu(cudaGraph_t g) { return reinterpret_cast<CUgraph>(g); }
CUgraphExec cu(cudaGraphExec_t g) { return reinterpret_cast<CUgraphExec>(g); }
CUgraphNode cu(cudaGraphNode_t n) { return reinterpret_cast<CUgraphNode>(n); }

// The null stream of a _ptsz entry point is the calling thread's per-thread stream.
cudaStream_t per_thread(cudaStream_t s) { return s == nullptr ? cudaStreamPerThread : s; }

cudaError_t kernel_function(const void* host_fun, CUfunction* out) {
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.kernels.find(host_fun);
  if (it == r.kernels.end()) return cudaErrorInvalidDeviceFunction;
  Kernel& k = it->second;
  const auto dev = static_cast<size_t>(tls_device);
  if (k.functions.size() <= dev) k.functions.resize(static_cast<size_t>(r.device_count), nullptr);
  if (k.functions[dev] == nullptr) {
    FatBinary& fb = *k.binary;
    if (fb.image == nullptr) return cudaErrorInvalidKernelImage;
    if (fb.modules.size() <= dev) fb.modules.resize(static_cast<size_t>(r.device_count), nullptr);
    if (fb.modules[dev] == nullptr) {
      if (CUresult rc = r.d.cuModuleLoadData(&fb.modules[dev], fb.image)) return to_runtime(rc);
    }
    if (CUresult rc = r.d.cuModuleGetFunction(&k.functions[dev], fb.modules[dev], k.name.c_str())) {
      return to_runtime(rc);
    }
    r.host_functions[k.functions[dev]] = host_fun;
  }
  *out = k.functions[dev];
  return cudaSuccess;
}

}  // namespace

// -----------------------------------------------------------------------------------------------
// Kernel registration (called by static initializers, before main: no driver calls here)
// -----------------------------------------------------------------------------------------------

SIM_API void** __cudaRegisterFatBinary(void* wrapper) {
  auto* fb = new FatBinary;
  const auto* w = static_cast<const vaswap_sim_fatbin_wrapper*>(wrapper);
  if (w != nullptr && static_cast<uint32_t>(w->magic) == VASWAP_SIM_IMAGE_MAGIC)
    fb->image = w->data;
  return reinterpret_cast<void**>(fb);
}

SIM_API void __cudaRegisterFatBinaryEnd(void** handle) { (void)handle; }

SIM_API void __cudaUnregisterFatBinary(void** handle) {
  (void)handle;  // kernels stay registered: stream threads may still run them at exit
}

SIM_API void __cudaRegisterFunction(void** handle, const char* host_fun, char* device_fun,
                                    const char* device_name, int thread_limit, uint3* tid,
                                    uint3* bid, dim3* block, dim3* grid, int* warp_size) {
  (void)device_fun, (void)thread_limit, (void)tid, (void)bid, (void)block, (void)grid,
      (void)warp_size;
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  Kernel& k = r.kernels[host_fun];
  k.binary = reinterpret_cast<FatBinary*>(handle);
  k.name = device_name;
}

// -----------------------------------------------------------------------------------------------
// Errors and versions
// -----------------------------------------------------------------------------------------------

SIM_API const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
#define SIM_ERROR(cu, rt, text) \
  case rt:                      \
    return #rt;
#include "vaswap_sim/errors.def"
#undef SIM_ERROR
    default: return "unrecognized error code";
  }
}

SIM_API const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
#define SIM_ERROR(cu, rt, text) \
  case rt:                      \
    return text;
#include "vaswap_sim/errors.def"
#undef SIM_ERROR
    default: return "unrecognized error code";
  }
}

SIM_API cudaError_t cudaGetLastError(void) {
  const cudaError_t e = tls_last_error;
  tls_last_error = cudaSuccess;
  return e;
}

SIM_API cudaError_t cudaPeekAtLastError(void) { return tls_last_error; }

SIM_API cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return note(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}

SIM_API cudaError_t cudaDriverGetVersion(int* version) {
  RT_ENTER();
  return note(drv().cuDriverGetVersion(version));
}

// -----------------------------------------------------------------------------------------------
// Devices
// -----------------------------------------------------------------------------------------------

SIM_API cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return note(cudaErrorInvalidValue);
  RT_ENTER();
  *count = rt().device_count;
  return cudaSuccess;
}

SIM_API cudaError_t cudaDeviceCanAccessPeer(int* can, int device, int peer) {
  RT_ENTER();
  return note(drv().cuDeviceCanAccessPeer(can, device, peer));
}

// The current device's context enables access to `peer`'s memory (its primary context).
SIM_API cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  RT_ENTER();
  Runtime& r = rt();
  if (peer < 0 || peer >= r.device_count) return note(cudaErrorInvalidDevice);
  CUcontext ctx = nullptr;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    CUcontext& slot = r.contexts[static_cast<size_t>(peer)];
    if (slot == nullptr) {
      if (CUresult rc = r.d.cuDevicePrimaryCtxRetain(&slot, peer)) return note(to_runtime(rc));
    }
    ctx = slot;
  }
  return note(drv().cuCtxEnablePeerAccess(ctx, flags));
}

SIM_API cudaError_t cudaSetDevice(int device) {
  Runtime& r = rt();
  std::call_once(r.once, [&r] { r.init_rc = load_driver(r); });
  if (r.init_rc != CUDA_SUCCESS) return note(r.init_rc);
  if (device < 0 || device >= r.device_count) return note(cudaErrorInvalidDevice);
  tls_device = device;
  RT_ENTER();
  return cudaSuccess;
}

SIM_API cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return note(cudaErrorInvalidValue);
  RT_ENTER();
  *device = tls_device;
  return cudaSuccess;
}

SIM_API cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  RT_ENTER();
  return note(drv().cuDeviceGetAttribute(value, static_cast<CUdevice_attribute>(attr), device));
}

SIM_API cudaError_t cudaDeviceSynchronize(void) {
  RT_ENTER();
  return note(drv().cuCtxSynchronize());
}

// Synchronizes; the simulator keeps allocations and streams across a reset (docs/SIMULATOR.md).
SIM_API cudaError_t cudaDeviceReset(void) {
  RT_ENTER();
  return note(drv().cuCtxSynchronize());
}

SIM_API cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  RT_ENTER();
  return note(drv().cuMemGetInfo(free_bytes, total_bytes));
}

SIM_API cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn,
                                                     unsigned int version, unsigned long long flags,
                                                     cudaDriverEntryPointQueryResult* status) {
  RT_ENTER();
  return note(drv().getProcAddress(symbol, fn, static_cast<int>(version), flags,
                                   reinterpret_cast<CUdriverProcAddressQueryResult*>(status)));
}

SIM_API cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** fn, unsigned long long flags,
                                            cudaDriverEntryPointQueryResult* status) {
  RT_ENTER();
  return note(drv().getProcAddress(symbol, fn, CUDART_VERSION, flags,
                                   reinterpret_cast<CUdriverProcAddressQueryResult*>(status)));
}

// -----------------------------------------------------------------------------------------------
// Memory
// -----------------------------------------------------------------------------------------------

SIM_API cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  RT_ENTER();
  if (ptr == nullptr) return note(cudaErrorInvalidValue);
  if (bytes == 0) {
    *ptr = nullptr;
    return cudaSuccess;
  }
  CUdeviceptr p = 0;
  if (CUresult rc = drv().cuMemAlloc(&p, bytes)) return note(rc);
  *ptr = reinterpret_cast<void*>(p);
  return cudaSuccess;
}

SIM_API cudaError_t cudaFree(void* ptr) {
  RT_ENTER();
  if (ptr == nullptr) return cudaSuccess;
  return note(drv().cuMemFree(dptr(ptr)));
}

SIM_API cudaError_t cudaMallocAsync(void** ptr, size_t bytes, cudaStream_t s) {
  RT_ENTER();
  if (ptr == nullptr) return note(cudaErrorInvalidValue);
  CUdeviceptr p = 0;
  if (CUresult rc = drv().cuMemAllocAsync(&p, bytes, cu(s))) return note(rc);
  *ptr = reinterpret_cast<void*>(p);
  return cudaSuccess;
}

SIM_API cudaError_t cudaFreeAsync(void* ptr, cudaStream_t s) {
  RT_ENTER();
  return note(drv().cuMemFreeAsync(dptr(ptr), cu(s)));
}

SIM_API cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int flags) {
  RT_ENTER();
  return note(drv().cuMemHostAlloc(ptr, bytes, flags));
}

SIM_API cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  RT_ENTER();
  return note(drv().cuMemAllocHost(ptr, bytes));
}

SIM_API cudaError_t cudaFreeHost(void* ptr) {
  RT_ENTER();
  return note(drv().cuMemFreeHost(ptr));
}

SIM_API cudaError_t cudaHostGetFlags(unsigned int* flags, void* ptr) {
  RT_ENTER();
  return note(drv().cuMemHostGetFlags(flags, ptr));
}

SIM_API cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* ptr) {
  RT_ENTER();
  if (attr == nullptr) return note(cudaErrorInvalidValue);
  unsigned type = 0;
  *attr = cudaPointerAttributes{};
  if (drv().cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dptr(ptr)) !=
      CUDA_SUCCESS) {
    attr->type = cudaMemoryTypeUnregistered;
    attr->device = cudaInvalidDeviceId;
    attr->hostPointer = const_cast<void*>(ptr);
    return cudaSuccess;
  }
  int device = 0;
  drv().cuPointerGetAttribute(&device, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dptr(ptr));
  attr->device = device;
  if (type == CU_MEMORYTYPE_HOST) {
    attr->type = cudaMemoryTypeHost;
    attr->hostPointer = const_cast<void*>(ptr);
    attr->devicePointer = const_cast<void*>(ptr);
  } else {
    attr->type = cudaMemoryTypeDevice;
    attr->devicePointer = const_cast<void*>(ptr);
  }
  return cudaSuccess;
}

static CUresult copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s,
                     bool async) {
  Driver& d = drv();
  switch (kind) {
    case cudaMemcpyHostToDevice:
      return async ? d.cuMemcpyHtoDAsync(dptr(dst), src, bytes, cu(s))
                   : d.cuMemcpyHtoD(dptr(dst), src, bytes);
    case cudaMemcpyDeviceToHost:
      return async ? d.cuMemcpyDtoHAsync(dst, dptr(src), bytes, cu(s))
                   : d.cuMemcpyDtoH(dst, dptr(src), bytes);
    case cudaMemcpyDeviceToDevice:
      return async ? d.cuMemcpyDtoDAsync(dptr(dst), dptr(src), bytes, cu(s))
                   : d.cuMemcpyDtoD(dptr(dst), dptr(src), bytes);
    case cudaMemcpyHostToHost:
    case cudaMemcpyDefault:
      return async ? d.cuMemcpyAsync(dptr(dst), dptr(src), bytes, cu(s))
                   : d.cuMemcpy(dptr(dst), dptr(src), bytes);
  }
  return CUDA_ERROR_INVALID_VALUE;
}

SIM_API cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  RT_ENTER();
  if (kind > cudaMemcpyDefault) return note(cudaErrorInvalidMemcpyDirection);
  return note(copy(dst, src, bytes, kind, nullptr, false));
}

SIM_API cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                                    cudaStream_t s) {
  RT_ENTER();
  if (kind > cudaMemcpyDefault) return note(cudaErrorInvalidMemcpyDirection);
  return note(copy(dst, src, bytes, kind, s, true));
}

// A batch of copies: the driver's, with the attributes carried over field by field.
SIM_API cudaError_t cudaMemcpyBatchAsync(void* const* dsts, const void* const* srcs,
                                         const size_t* sizes, size_t count,
                                         cudaMemcpyAttributes* attrs, size_t* attrsIdxs,
                                         size_t numAttrs, cudaStream_t s) {
  RT_ENTER();
  if (dsts == nullptr || srcs == nullptr || sizes == nullptr || attrs == nullptr) {
    return note(cudaErrorInvalidValue);
  }
  std::vector<CUdeviceptr> d(count), from(count);
  std::vector<size_t> n(sizes, sizes + count);
  for (size_t i = 0; i < count; ++i) {
    d[i] = dptr(dsts[i]);
    from[i] = dptr(srcs[i]);
  }
  std::vector<CUmemcpyAttributes> a(numAttrs);
  for (size_t i = 0; i < numAttrs; ++i) {
    a[i].srcAccessOrder = static_cast<CUmemcpySrcAccessOrder>(attrs[i].srcAccessOrder);
    a[i].srcLocHint.type = static_cast<CUmemLocationType>(attrs[i].srcLocHint.type);
    a[i].srcLocHint.id = attrs[i].srcLocHint.id;
    a[i].dstLocHint.type = static_cast<CUmemLocationType>(attrs[i].dstLocHint.type);
    a[i].dstLocHint.id = attrs[i].dstLocHint.id;
    a[i].flags = attrs[i].flags;
  }
  return note(drv().cuMemcpyBatchAsync(d.data(), from.data(), n.data(), count, a.data(), attrsIdxs,
                                       numAttrs, cu(s)));
}

// 2D copies: rows of `width` bytes, `height` of them, each side's rows its pitch apart.
static CUresult copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                        size_t height, cudaMemcpyKind kind, cudaStream_t s, bool async) {
  CUDA_MEMCPY2D c{};
  const bool src_host = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyHostToHost;
  const bool dst_host = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost;
  c.srcMemoryType = kind == cudaMemcpyDefault ? CU_MEMORYTYPE_UNIFIED
                    : src_host                ? CU_MEMORYTYPE_HOST
                                              : CU_MEMORYTYPE_DEVICE;
  c.dstMemoryType = kind == cudaMemcpyDefault ? CU_MEMORYTYPE_UNIFIED
                    : dst_host                ? CU_MEMORYTYPE_HOST
                                              : CU_MEMORYTYPE_DEVICE;
  c.srcHost = src;
  c.srcDevice = dptr(src);
  c.dstHost = dst;
  c.dstDevice = dptr(dst);
  c.srcPitch = spitch;
  c.dstPitch = dpitch;
  c.WidthInBytes = width;
  c.Height = height;
  return async ? drv().cuMemcpy2DAsync(&c, cu(s)) : drv().cuMemcpy2D(&c);
}

SIM_API cudaError_t cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch,
                                 size_t width, size_t height, cudaMemcpyKind kind) {
  RT_ENTER();
  if (kind > cudaMemcpyDefault) return note(cudaErrorInvalidMemcpyDirection);
  return note(copy_2d(dst, dpitch, src, spitch, width, height, kind, nullptr, false));
}

SIM_API cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                                      size_t width, size_t height, cudaMemcpyKind kind,
                                      cudaStream_t s) {
  RT_ENTER();
  if (kind > cudaMemcpyDefault) return note(cudaErrorInvalidMemcpyDirection);
  return note(copy_2d(dst, dpitch, src, spitch, width, height, kind, s, true));
}

SIM_API cudaError_t cudaMemset2D(void* ptr, size_t pitch, int value, size_t width, size_t height) {
  RT_ENTER();
  return note(
      drv().cuMemsetD2D8(dptr(ptr), pitch, static_cast<unsigned char>(value), width, height));
}

SIM_API cudaError_t cudaMemset2DAsync(void* ptr, size_t pitch, int value, size_t width,
                                      size_t height, cudaStream_t s) {
  RT_ENTER();
  return note(drv().cuMemsetD2D8Async(dptr(ptr), pitch, static_cast<unsigned char>(value), width,
                                      height, cu(s)));
}

SIM_API cudaError_t cudaMemcpyPeer(void* dst, int, const void* src, int, size_t bytes) {
  RT_ENTER();
  CUcontext context = nullptr;
  drv().cuCtxGetCurrent(&context);
  return note(drv().cuMemcpyPeer(dptr(dst), context, dptr(src), context, bytes));
}

SIM_API cudaError_t cudaMemcpyPeerAsync(void* dst, int, const void* src, int, size_t bytes,
                                        cudaStream_t s) {
  RT_ENTER();
  CUcontext context = nullptr;
  drv().cuCtxGetCurrent(&context);
  return note(drv().cuMemcpyPeerAsync(dptr(dst), context, dptr(src), context, bytes, cu(s)));
}

// A 3D peer copy between pitched device pointers, as the driver's CUDA_MEMCPY3D_PEER (no arrays
// on the simulated device).
static CUresult copy_3d_peer(const cudaMemcpy3DPeerParms* p, cudaStream_t s, bool async) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (p->srcArray != nullptr || p->dstArray != nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  CUcontext context = nullptr;
  drv().cuCtxGetCurrent(&context);
  CUDA_MEMCPY3D_PEER c{};
  c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  c.srcDevice = dptr(p->srcPtr.ptr);
  c.srcContext = context;
  c.srcXInBytes = p->srcPos.x;
  c.srcY = p->srcPos.y;
  c.srcZ = p->srcPos.z;
  c.srcPitch = p->srcPtr.pitch;
  c.srcHeight = p->srcPtr.ysize;
  c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.dstDevice = dptr(p->dstPtr.ptr);
  c.dstContext = context;
  c.dstXInBytes = p->dstPos.x;
  c.dstY = p->dstPos.y;
  c.dstZ = p->dstPos.z;
  c.dstPitch = p->dstPtr.pitch;
  c.dstHeight = p->dstPtr.ysize;
  c.WidthInBytes = p->extent.width;
  c.Height = p->extent.height;
  c.Depth = p->extent.depth;
  return async ? drv().cuMemcpy3DPeerAsync(&c, cu(s)) : drv().cuMemcpy3DPeer(&c);
}

SIM_API cudaError_t cudaMemcpy3DPeer(const cudaMemcpy3DPeerParms* p) {
  RT_ENTER();
  return note(copy_3d_peer(p, nullptr, false));
}

SIM_API cudaError_t cudaMemcpy3DPeerAsync(const cudaMemcpy3DPeerParms* p, cudaStream_t s) {
  RT_ENTER();
  return note(copy_3d_peer(p, s, true));
}

SIM_API cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  RT_ENTER();
  return note(drv().cuMemsetD8(dptr(ptr), static_cast<unsigned char>(value), bytes));
}

SIM_API cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t s) {
  RT_ENTER();
  return note(drv().cuMemsetD8Async(dptr(ptr), static_cast<unsigned char>(value), bytes, cu(s)));
}

// -----------------------------------------------------------------------------------------------
// Streams and events
// -----------------------------------------------------------------------------------------------

SIM_API cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned int flags,
                                                 int priority) {
  RT_ENTER();
  return note(drv().cuStreamCreateWithPriority(reinterpret_cast<CUstream*>(s), flags, priority));
}
SIM_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  RT_ENTER();
  return note(drv().cuStreamCreateWithPriority(reinterpret_cast<CUstream*>(s), flags, 0));
}
SIM_API cudaError_t cudaStreamCreate(cudaStream_t* s) {
  RT_ENTER();
  return note(drv().cuStreamCreateWithPriority(reinterpret_cast<CUstream*>(s), 0, 0));
}
SIM_API cudaError_t cudaStreamDestroy(cudaStream_t s) {
  RT_ENTER();
  return note(drv().cuStreamDestroy(cu(s)));
}
SIM_API cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  RT_ENTER();
  return note(drv().cuStreamSynchronize(cu(s)));
}
SIM_API cudaError_t cudaStreamQuery(cudaStream_t s) {
  RT_ENTER();
  const CUresult rc = drv().cuStreamQuery(cu(s));
  return rc == CUDA_ERROR_NOT_READY ? cudaErrorNotReady : note(rc);  // not ready is no error
}
SIM_API cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  RT_ENTER();
  return note(drv().cuStreamWaitEvent(cu(s), cu(e), flags));
}
SIM_API cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data) {
  RT_ENTER();
  return note(drv().cuLaunchHostFunc(cu(s), fn, data));
}

SIM_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  RT_ENTER();
  return note(drv().cuEventCreate(reinterpret_cast<CUevent*>(e), flags));
}
SIM_API cudaError_t cudaEventCreate(cudaEvent_t* e) {
  RT_ENTER();
  return note(drv().cuEventCreate(reinterpret_cast<CUevent*>(e), 0));
}
SIM_API cudaError_t cudaEventDestroy(cudaEvent_t e) {
  RT_ENTER();
  return note(drv().cuEventDestroy(cu(e)));
}
SIM_API cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned int flags) {
  RT_ENTER();
  return note(drv().cuEventRecordWithFlags(cu(e), cu(s), flags));
}
SIM_API cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  RT_ENTER();
  return note(drv().cuEventRecordWithFlags(cu(e), cu(s), 0));
}
SIM_API cudaError_t cudaEventQuery(cudaEvent_t e) {
  RT_ENTER();
  const CUresult rc = drv().cuEventQuery(cu(e));
  return rc == CUDA_ERROR_NOT_READY ? cudaErrorNotReady : note(rc);
}
SIM_API cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  RT_ENTER();
  return note(drv().cuEventSynchronize(cu(e)));
}
SIM_API cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  RT_ENTER();
  return note(drv().cuEventElapsedTime(ms, cu(start), cu(end)));
}

// -----------------------------------------------------------------------------------------------
// Kernels
// -----------------------------------------------------------------------------------------------

SIM_API cudaError_t cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args,
                                     size_t shared_bytes, cudaStream_t s) {
  RT_ENTER();
  CUfunction f = nullptr;
  if (cudaError_t e = kernel_function(func, &f)) return note(e);
  return note(drv().cuLaunchKernel(f, grid.x, grid.y, grid.z, block.x, block.y, block.z,
                                   static_cast<unsigned>(shared_bytes), cu(s), args, nullptr));
}

SIM_API cudaError_t cudaGetFuncBySymbol(cudaFunction_t* out, const void* func) {
  RT_ENTER();
  if (out == nullptr) return note(cudaErrorInvalidValue);
  CUfunction f = nullptr;
  if (cudaError_t e = kernel_function(func, &f)) return note(e);
  *out = reinterpret_cast<cudaFunction_t>(f);
  return cudaSuccess;
}

SIM_API cudaError_t cudaFuncGetParamInfo(const void* func, size_t index, size_t* offset,
                                         size_t* bytes) {
  RT_ENTER();
  CUfunction f = nullptr;
  if (cudaError_t e = kernel_function(func, &f)) return note(e);
  return note(drv().cuFuncGetParamInfo(f, index, offset, bytes));
}

SIM_API cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* func,
                                        void** args) {
  RT_ENTER();
  if (config == nullptr) return note(cudaErrorInvalidValue);
  CUfunction f = nullptr;
  if (cudaError_t e = kernel_function(func, &f)) return note(e);
  CUlaunchConfig c{};
  c.gridDimX = config->gridDim.x;
  c.gridDimY = config->gridDim.y;
  c.gridDimZ = config->gridDim.z;
  c.blockDimX = config->blockDim.x;
  c.blockDimY = config->blockDim.y;
  c.blockDimZ = config->blockDim.z;
  c.sharedMemBytes = static_cast<unsigned>(config->dynamicSmemBytes);
  c.hStream = cu(config->stream);
  return note(drv().cuLaunchKernelEx(&c, f, args, nullptr));
}

// -----------------------------------------------------------------------------------------------
// Capture and graphs
// -----------------------------------------------------------------------------------------------

SIM_API cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  RT_ENTER();
  return note(drv().cuStreamBeginCapture(cu(s), static_cast<CUstreamCaptureMode>(mode)));
}
SIM_API cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t s, cudaGraph_t g,
                                                  const cudaGraphNode_t* deps,
                                                  const cudaGraphEdgeData* edges, size_t n,
                                                  cudaStreamCaptureMode mode) {
  RT_ENTER();
  return note(drv().cuStreamBeginCaptureToGraph(
      cu(s), cu(g), reinterpret_cast<const CUgraphNode*>(deps),
      reinterpret_cast<const CUgraphEdgeData*>(edges), n, static_cast<CUstreamCaptureMode>(mode)));
}
SIM_API cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g) {
  RT_ENTER();
  return note(drv().cuStreamEndCapture(cu(s), reinterpret_cast<CUgraph*>(g)));
}
SIM_API cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  RT_ENTER();
  return note(drv().cuStreamIsCapturing(cu(s), reinterpret_cast<CUstreamCaptureStatus*>(status)));
}
SIM_API cudaError_t cudaStreamGetCaptureInfo(cudaStream_t s, cudaStreamCaptureStatus* status,
                                             unsigned long long* id, cudaGraph_t* g,
                                             const cudaGraphNode_t** deps,
                                             const cudaGraphEdgeData** edges, size_t* n) {
  RT_ENTER();
  return note(drv().cuStreamGetCaptureInfo(
      cu(s), reinterpret_cast<CUstreamCaptureStatus*>(status), reinterpret_cast<cuuint64_t*>(id),
      reinterpret_cast<CUgraph*>(g), reinterpret_cast<const CUgraphNode**>(deps),
      reinterpret_cast<const CUgraphEdgeData**>(edges), n));
}
SIM_API cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  RT_ENTER();
  return note(
      drv().cuThreadExchangeStreamCaptureMode(reinterpret_cast<CUstreamCaptureMode*>(mode)));
}

SIM_API cudaError_t cudaGraphCreate(cudaGraph_t* g, unsigned int flags) {
  RT_ENTER();
  return note(drv().cuGraphCreate(reinterpret_cast<CUgraph*>(g), flags));
}
SIM_API cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  RT_ENTER();
  return note(drv().cuGraphDestroy(cu(g)));
}
SIM_API cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t* nodes, size_t* n) {
  RT_ENTER();
  return note(drv().cuGraphGetNodes(cu(g), reinterpret_cast<CUgraphNode*>(nodes), n));
}
SIM_API cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, cudaGraphNodeType* type) {
  RT_ENTER();
  return note(drv().cuGraphNodeGetType(cu(node), reinterpret_cast<CUgraphNodeType*>(type)));
}
SIM_API cudaError_t cudaGraphChildGraphNodeGetGraph(cudaGraphNode_t node, cudaGraph_t* g) {
  RT_ENTER();
  return note(drv().cuGraphChildGraphNodeGetGraph(cu(node), reinterpret_cast<CUgraph*>(g)));
}
SIM_API cudaError_t cudaGraphKernelNodeGetParams(cudaGraphNode_t node, cudaKernelNodeParams* p) {
  RT_ENTER();
  if (p == nullptr) return note(cudaErrorInvalidValue);
  CUDA_KERNEL_NODE_PARAMS k{};
  if (CUresult rc = drv().cuGraphKernelNodeGetParams(cu(node), &k)) return note(rc);
  {
    std::lock_guard<std::mutex> lock(rt().mu);
    auto it = rt().host_functions.find(k.func);
    p->func = it == rt().host_functions.end() ? nullptr : const_cast<void*>(it->second);
  }
  p->gridDim = dim3(k.gridDimX, k.gridDimY, k.gridDimZ);
  p->blockDim = dim3(k.blockDimX, k.blockDimY, k.blockDimZ);
  p->sharedMemBytes = k.sharedMemBytes;
  p->kernelParams = k.kernelParams;
  p->extra = k.extra;
  return cudaSuccess;
}
// A kernel node of a runtime kernel: the host stub resolved to the current device's function.
static cudaError_t kernel_node_params(const cudaKernelNodeParams* p, CUDA_KERNEL_NODE_PARAMS* k) {
  if (p == nullptr) return cudaErrorInvalidValue;
  *k = CUDA_KERNEL_NODE_PARAMS{};
  if (cudaError_t e = kernel_function(p->func, &k->func)) return e;
  k->gridDimX = p->gridDim.x;
  k->gridDimY = p->gridDim.y;
  k->gridDimZ = p->gridDim.z;
  k->blockDimX = p->blockDim.x;
  k->blockDimY = p->blockDim.y;
  k->blockDimZ = p->blockDim.z;
  k->sharedMemBytes = p->sharedMemBytes;
  k->kernelParams = p->kernelParams;
  k->extra = p->extra;
  return cudaSuccess;
}
SIM_API cudaError_t cudaGraphAddKernelNode(cudaGraphNode_t* node, cudaGraph_t g,
                                           const cudaGraphNode_t* deps, size_t n,
                                           const cudaKernelNodeParams* p) {
  RT_ENTER();
  CUDA_KERNEL_NODE_PARAMS k{};
  if (cudaError_t e = kernel_node_params(p, &k)) return note(e);
  return note(drv().cuGraphAddKernelNode(reinterpret_cast<CUgraphNode*>(node), cu(g),
                                         reinterpret_cast<const CUgraphNode*>(deps), n, &k));
}
// Graphs built node by node: 1D copies of an explicit kind (not cudaMemcpyDefault), and memsets.
static cudaError_t copy_node_params(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                                    CUDA_MEMCPY3D* c) {
  *c = CUDA_MEMCPY3D{};
  const bool from_device = kind == cudaMemcpyDeviceToDevice || kind == cudaMemcpyDeviceToHost;
  const bool to_device = kind == cudaMemcpyDeviceToDevice || kind == cudaMemcpyHostToDevice;
  if (kind != cudaMemcpyHostToHost && !from_device && !to_device) return cudaErrorNotSupported;
  c->srcMemoryType = from_device ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
  c->srcDevice = from_device ? reinterpret_cast<CUdeviceptr>(src) : 0;
  c->srcHost = from_device ? nullptr : src;
  c->dstMemoryType = to_device ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
  c->dstDevice = to_device ? reinterpret_cast<CUdeviceptr>(dst) : 0;
  c->dstHost = to_device ? nullptr : dst;
  c->WidthInBytes = bytes;
  c->Height = 1;
  c->Depth = 1;
  return cudaSuccess;
}
static CUDA_MEMSET_NODE_PARAMS memset_node_params(const cudaMemsetParams& p) {
  CUDA_MEMSET_NODE_PARAMS m{};
  m.dst = reinterpret_cast<CUdeviceptr>(p.dst);
  m.pitch = p.pitch;
  m.value = p.value;
  m.elementSize = p.elementSize;
  m.width = p.width;
  m.height = p.height;
  return m;
}
SIM_API cudaError_t cudaGraphAddMemcpyNode1D(cudaGraphNode_t* node, cudaGraph_t g,
                                             const cudaGraphNode_t* deps, size_t n, void* dst,
                                             const void* src, size_t bytes, cudaMemcpyKind kind) {
  RT_ENTER();
  CUDA_MEMCPY3D c;
  if (cudaError_t e = copy_node_params(dst, src, bytes, kind, &c)) return note(e);
  CUcontext ctx = nullptr;
  drv().cuCtxGetCurrent(&ctx);
  return note(drv().cuGraphAddMemcpyNode(reinterpret_cast<CUgraphNode*>(node), cu(g),
                                         reinterpret_cast<const CUgraphNode*>(deps), n, &c, ctx));
}
SIM_API cudaError_t cudaGraphMemcpyNodeSetParams1D(cudaGraphNode_t node, void* dst, const void* src,
                                                   size_t bytes, cudaMemcpyKind kind) {
  RT_ENTER();
  CUDA_MEMCPY3D c;
  if (cudaError_t e = copy_node_params(dst, src, bytes, kind, &c)) return note(e);
  return note(drv().cuGraphMemcpyNodeSetParams(cu(node), &c));
}
SIM_API cudaError_t cudaGraphAddMemsetNode(cudaGraphNode_t* node, cudaGraph_t g,
                                           const cudaGraphNode_t* deps, size_t n,
                                           const cudaMemsetParams* p) {
  RT_ENTER();
  if (p == nullptr) return note(cudaErrorInvalidValue);
  const CUDA_MEMSET_NODE_PARAMS m = memset_node_params(*p);
  CUcontext ctx = nullptr;
  drv().cuCtxGetCurrent(&ctx);
  return note(drv().cuGraphAddMemsetNode(reinterpret_cast<CUgraphNode*>(node), cu(g),
                                         reinterpret_cast<const CUgraphNode*>(deps), n, &m, ctx));
}
SIM_API cudaError_t cudaGraphMemsetNodeSetParams(cudaGraphNode_t node, const cudaMemsetParams* p) {
  RT_ENTER();
  if (p == nullptr) return note(cudaErrorInvalidValue);
  const CUDA_MEMSET_NODE_PARAMS m = memset_node_params(*p);
  return note(drv().cuGraphMemsetNodeSetParams(cu(node), &m));
}
SIM_API cudaError_t cudaGraphExecKernelNodeSetParams(cudaGraphExec_t e, cudaGraphNode_t node,
                                                     const cudaKernelNodeParams* p) {
  RT_ENTER();
  CUDA_KERNEL_NODE_PARAMS k{};
  if (cudaError_t err = kernel_node_params(p, &k)) return note(err);
  return note(drv().cuGraphExecKernelNodeSetParams(cu(e), cu(node), &k));
}
SIM_API cudaError_t cudaGraphKernelNodeSetParams(cudaGraphNode_t node,
                                                 const cudaKernelNodeParams* p) {
  RT_ENTER();
  CUDA_KERNEL_NODE_PARAMS k{};
  if (cudaError_t err = kernel_node_params(p, &k)) return note(err);
  return note(drv().cuGraphKernelNodeSetParams(cu(node), &k));
}
SIM_API cudaError_t cudaGraphClone(cudaGraph_t* out, cudaGraph_t original) {
  RT_ENTER();
  return note(drv().cuGraphClone(reinterpret_cast<CUgraph*>(out), cu(original)));
}
SIM_API cudaError_t cudaGraphNodeFindInClone(cudaGraphNode_t* out, cudaGraphNode_t original,
                                             cudaGraph_t clone) {
  RT_ENTER();
  return note(
      drv().cuGraphNodeFindInClone(reinterpret_cast<CUgraphNode*>(out), cu(original), cu(clone)));
}
SIM_API cudaError_t cudaGraphNodeSetEnabled(cudaGraphExec_t e, cudaGraphNode_t node,
                                            unsigned int enabled) {
  RT_ENTER();
  return note(drv().cuGraphNodeSetEnabled(cu(e), cu(node), enabled));
}
SIM_API cudaError_t cudaGraphNodeGetEnabled(cudaGraphExec_t e, cudaGraphNode_t node,
                                            unsigned int* enabled) {
  RT_ENTER();
  return note(drv().cuGraphNodeGetEnabled(cu(e), cu(node), enabled));
}
SIM_API cudaError_t cudaGraphExecUpdate(cudaGraphExec_t e, cudaGraph_t g,
                                        cudaGraphExecUpdateResultInfo* info) {
  RT_ENTER();
  static_assert(sizeof(cudaGraphExecUpdateResultInfo) == sizeof(CUgraphExecUpdateResultInfo),
                "ABI");
  return note(
      drv().cuGraphExecUpdate(cu(e), cu(g), reinterpret_cast<CUgraphExecUpdateResultInfo*>(info)));
}
SIM_API cudaError_t cudaGraphInstantiate(cudaGraphExec_t* e, cudaGraph_t g,
                                         unsigned long long flags) {
  RT_ENTER();
  return note(drv().cuGraphInstantiateWithFlags(reinterpret_cast<CUgraphExec*>(e), cu(g), flags));
}
SIM_API cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* e, cudaGraph_t g,
                                                  unsigned long long flags) {
  RT_ENTER();
  return note(drv().cuGraphInstantiateWithFlags(reinterpret_cast<CUgraphExec*>(e), cu(g), flags));
}
SIM_API cudaError_t cudaGraphInstantiateWithParams(cudaGraphExec_t* e, cudaGraph_t g,
                                                   cudaGraphInstantiateParams* p) {
  RT_ENTER();
  static_assert(sizeof(cudaGraphInstantiateParams) == sizeof(CUDA_GRAPH_INSTANTIATE_PARAMS), "ABI");
  return note(
      drv().cuGraphInstantiateWithParams(reinterpret_cast<CUgraphExec*>(e), cu(g),
                                         reinterpret_cast<CUDA_GRAPH_INSTANTIATE_PARAMS*>(p)));
}
SIM_API cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
  RT_ENTER();
  return note(drv().cuGraphExecDestroy(cu(e)));
}
SIM_API cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
  RT_ENTER();
  return note(drv().cuGraphLaunch(cu(e), cu(s)));
}
SIM_API cudaError_t cudaGraphUpload(cudaGraphExec_t e, cudaStream_t s) {
  RT_ENTER();
  return note(drv().cuGraphUpload(cu(e), cu(s)));
}

// -----------------------------------------------------------------------------------------------
// Per-thread default stream entry points (nvcc --default-stream per-thread)
// -----------------------------------------------------------------------------------------------

SIM_API cudaError_t cudaMemcpy_ptds(void* d, const void* s, size_t n, cudaMemcpyKind k) {
  if (cudaError_t e = cudaMemcpyAsync(d, s, n, k, cudaStreamPerThread)) return e;
  return cudaStreamSynchronize(cudaStreamPerThread);
}
SIM_API cudaError_t cudaMemset_ptds(void* p, int v, size_t n) {
  if (cudaError_t e = cudaMemsetAsync(p, v, n, cudaStreamPerThread)) return e;
  return cudaStreamSynchronize(cudaStreamPerThread);
}
SIM_API cudaError_t cudaMemcpyBatchAsync_ptsz(void* const* d, const void* const* s, const size_t* n,
                                              size_t c, cudaMemcpyAttributes* a, size_t* i,
                                              size_t na, cudaStream_t st) {
  return cudaMemcpyBatchAsync(d, s, n, c, a, i, na, per_thread(st));
}
SIM_API cudaError_t cudaMemcpyAsync_ptsz(void* d, const void* s, size_t n, cudaMemcpyKind k,
                                         cudaStream_t st) {
  return cudaMemcpyAsync(d, s, n, k, per_thread(st));
}
SIM_API cudaError_t cudaMemsetAsync_ptsz(void* p, int v, size_t n, cudaStream_t st) {
  return cudaMemsetAsync(p, v, n, per_thread(st));
}
SIM_API cudaError_t cudaMemcpy2D_ptds(void* d, size_t dp, const void* s, size_t sp, size_t w,
                                      size_t h, cudaMemcpyKind k) {
  if (cudaError_t e = cudaMemcpy2DAsync(d, dp, s, sp, w, h, k, cudaStreamPerThread)) return e;
  return cudaStreamSynchronize(cudaStreamPerThread);
}
SIM_API cudaError_t cudaMemcpy2DAsync_ptsz(void* d, size_t dp, const void* s, size_t sp, size_t w,
                                           size_t h, cudaMemcpyKind k, cudaStream_t st) {
  return cudaMemcpy2DAsync(d, dp, s, sp, w, h, k, per_thread(st));
}
SIM_API cudaError_t cudaMemcpy3DPeer_ptds(const cudaMemcpy3DPeerParms* p) {
  if (cudaError_t e = cudaMemcpy3DPeerAsync(p, cudaStreamPerThread)) return e;
  return cudaStreamSynchronize(cudaStreamPerThread);
}
SIM_API cudaError_t cudaMemcpy3DPeerAsync_ptsz(const cudaMemcpy3DPeerParms* p, cudaStream_t st) {
  return cudaMemcpy3DPeerAsync(p, per_thread(st));
}
SIM_API cudaError_t cudaMemset2D_ptds(void* p, size_t pitch, int v, size_t w, size_t h) {
  if (cudaError_t e = cudaMemset2DAsync(p, pitch, v, w, h, cudaStreamPerThread)) return e;
  return cudaStreamSynchronize(cudaStreamPerThread);
}
SIM_API cudaError_t cudaMemset2DAsync_ptsz(void* p, size_t pitch, int v, size_t w, size_t h,
                                           cudaStream_t st) {
  return cudaMemset2DAsync(p, pitch, v, w, h, per_thread(st));
}
SIM_API cudaError_t cudaMallocAsync_ptsz(void** p, size_t n, cudaStream_t st) {
  return cudaMallocAsync(p, n, per_thread(st));
}
SIM_API cudaError_t cudaFreeAsync_ptsz(void* p, cudaStream_t st) {
  return cudaFreeAsync(p, per_thread(st));
}
SIM_API cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t st) {
  return cudaStreamSynchronize(per_thread(st));
}
SIM_API cudaError_t cudaStreamQuery_ptsz(cudaStream_t st) {
  return cudaStreamQuery(per_thread(st));
}
SIM_API cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t st, cudaEvent_t e, unsigned f) {
  return cudaStreamWaitEvent(per_thread(st), e, f);
}
SIM_API cudaError_t cudaEventRecord_ptsz(cudaEvent_t e, cudaStream_t st) {
  return cudaEventRecord(e, per_thread(st));
}
SIM_API cudaError_t cudaEventRecordWithFlags_ptsz(cudaEvent_t e, cudaStream_t st, unsigned f) {
  return cudaEventRecordWithFlags(e, per_thread(st), f);
}
SIM_API cudaError_t cudaLaunchHostFunc_ptsz(cudaStream_t st, cudaHostFn_t fn, void* d) {
  return cudaLaunchHostFunc(per_thread(st), fn, d);
}
SIM_API cudaError_t cudaLaunchKernel_ptsz(const void* f, dim3 g, dim3 b, void** a, size_t shm,
                                          cudaStream_t st) {
  return cudaLaunchKernel(f, g, b, a, shm, per_thread(st));
}
SIM_API cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t* c, const void* f, void** a) {
  if (c == nullptr) return note(cudaErrorInvalidValue);
  cudaLaunchConfig_t copy = *c;
  copy.stream = per_thread(c->stream);
  return cudaLaunchKernelExC(&copy, f, a);
}
SIM_API cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t st, cudaStreamCaptureMode m) {
  return cudaStreamBeginCapture(per_thread(st), m);
}
SIM_API cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t st, cudaGraph_t* g) {
  return cudaStreamEndCapture(per_thread(st), g);
}
SIM_API cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t st, cudaStreamCaptureStatus* s) {
  return cudaStreamIsCapturing(per_thread(st), s);
}
SIM_API cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t e, cudaStream_t st) {
  return cudaGraphLaunch(e, per_thread(st));
}
SIM_API cudaError_t cudaGraphUpload_ptsz(cudaGraphExec_t e, cudaStream_t st) {
  return cudaGraphUpload(e, per_thread(st));
}
