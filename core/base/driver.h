// The CUDA driver, resolved at run time. libvaswap.so links no CUDA library: it opens
// libcuda.so.1 on first need and takes every entry point through cuGetProcAddress, asking for the
// ABI revision of the headers it was built with (CUDA_VERSION), as the real runtime does.
#pragma once

#include <cuda.h>

#include <string>

namespace vaswap {

// Every driver function core/ calls, with the CUDA version of the ABI revision that this
// header's declaration has (the version in the matching PFN_<name>_v<version> typedef). The
// version is explicit because the newest revision is not always the header's: CUDA 13.0 added
// cuCtxSynchronize(CUcontext) and cuCtxGetDevice(CUdevice*, CUcontext) as version 13000, while
// cuda.h still declares the old forms under those names. Asking for CUDA_VERSION would return a
// function with another signature (seen on the H200: CUDA_ERROR_CONTEXT_IS_DESTROYED).
// clang-format off
#define VASWAP_DRIVER_FUNCTIONS(X)                                                                \
  X(cuInit, 2000) X(cuDeviceGet, 2000) X(cuDeviceGetCount, 2000)                                  \
  X(cuDevicePrimaryCtxRetain, 7000) X(cuCtxGetCurrent, 4000) X(cuCtxSetCurrent, 4000)             \
  X(cuCtxGetDevice, 2000) X(cuCtxSynchronize, 2000) X(cuMemGetInfo, 3020)                         \
  X(cuMemGetAllocationGranularity, 10020) X(cuMemAddressReserve, 10020)                           \
  X(cuMemAddressFree, 10020) X(cuMemCreate, 10020) X(cuMemRelease, 10020) X(cuMemMap, 10020)      \
  X(cuMemUnmap, 10020) X(cuMemSetAccess, 10020) X(cuMemHostAlloc, 2020) X(cuMemFreeHost, 2000)    \
  X(cuPointerGetAttribute, 4000) X(cuMemcpyHtoDAsync, 3020) X(cuMemcpyDtoHAsync, 3020)            \
  X(cuStreamCreate, 2000) X(cuStreamGetDevice, 12080) X(cuStreamIsCapturing, 10000)               \
  X(cuStreamWaitEvent, 3020) X(cuLaunchHostFunc, 10000) X(cuEventCreate, 2000)                    \
  X(cuEventDestroy, 4000) X(cuEventRecord, 2000) X(cuEventQuery, 2000)                            \
  X(cuEventSynchronize, 2000) X(cuEventElapsedTime, 12080)                                        \
  X(cuThreadExchangeStreamCaptureMode, 10010) X(cuGetErrorName, 6000)                          \
  X(cuStreamGetCaptureInfo, 12030) X(cuGraphGetNodes, 10000) X(cuGraphNodeGetType, 10000)           \
  X(cuGraphKernelNodeGetParams, 12000) X(cuFuncGetParamInfo, 12040) X(cuKernelGetParamInfo, 12040)  \
  X(cuGraphMemcpyNodeGetParams, 10000) X(cuGraphMemsetNodeGetParams, 10000)                        \
  X(cuGraphChildGraphNodeGetGraph, 10000) X(cuGraphBatchMemOpNodeGetParams, 11070)              \
  X(cuMemHostGetDevicePointer, 3020) X(cuStreamWaitValue32, 11070) X(cuStreamWriteValue32, 11070) \
  X(cuStreamBatchMemOp, 11070) X(cuStreamGetCtx, 9020) X(cuStreamQuery, 2000)                     \
  X(cuDeviceGetAttribute, 2000) X(cuStreamDestroy, 4000) X(cuStreamSynchronize, 2000)            \
  X(cuGraphClone, 10000) X(cuGraphNodeFindInClone, 10000) X(cuGraphDestroy, 10000)                 \
  X(cuGraphNodeGetDependencies, 12030) X(cuGraphAddDependencies, 12030)                           \
  X(cuGraphAddMemcpyNode, 10000) X(cuGraphAddBatchMemOpNode, 11070)                        \
  X(cuGraphCreate, 10000) X(cuGraphInstantiateWithFlags, 11040) X(cuGraphLaunch, 10000)           \
  X(cuGraphUpload, 11010) X(cuGraphExecDestroy, 10000) X(cuGraphAddMemsetNode, 10000)          \
  X(cuGraphNodeSetEnabled, 11060) X(cuDevicePrimaryCtxRelease, 11000)
// clang-format on

struct Driver {
#define VASWAP_DRIVER_MEMBER(name, version) decltype(&::name) name = nullptr;
  VASWAP_DRIVER_FUNCTIONS(VASWAP_DRIVER_MEMBER)
#undef VASWAP_DRIVER_MEMBER
  // Where the driver is the simulator (tests/sim), its vaswapSimFaultCheck: faults a test arms in
  // vaswap's own steps that no driver call stands for (a thread vaswap cannot start). nullptr on
  // a GPU's driver, which has no such entry point.
  int (*sim_fault_check)(const char* step) = nullptr;
};

// The driver, loaded and initialized once. Returns nullptr when it cannot be, and then `error`
// (if given) says why: no libcuda.so.1, a missing entry point, or cuInit's error.
const Driver* load_driver(std::string* error);
// The driver where load_driver has loaded it already, else nullptr; never loads it (nor calls
// cuInit, which would fix the visible devices before the program has chosen them).
const Driver* loaded_driver();

// A kernel parameter's offset and size: cuFuncGetParamInfo for a CUfunction, else
// cuKernelGetParamInfo (library kernels, which are launched through CUkernel handles cast to
// CUfunction, and graph nodes that name only a CUkernel). False past the last parameter, or when
// the kernel has no layout to give; `failure` then holds cuFuncGetParamInfo's result.
bool kernel_param_info(const Driver& driver, CUfunction function, CUkernel kernel, size_t index,
                       size_t* offset, size_t* bytes, CUresult* failure = nullptr);

// The driver's own cuGetProcAddress_v2, without initializing the driver (it works before cuInit).
// nullptr when libcuda.so.1 cannot be loaded, and then `error` (if given) says why. Cheap after
// the first call. load_driver takes every other function through it.
using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult*);
GetProcAddress driver_get_proc_address(std::string* error = nullptr);

// "CUDA_ERROR_OUT_OF_MEMORY" for a code, or "CUresult 999" when the driver has no name for it.
// Every failure vaswap names passes here, so it also notices the driver's shutdown (below).
std::string cuda_error_name(CUresult result);

// Whether a driver call has answered CUDA_ERROR_DEINITIALIZED: the driver is shutting down, so
// the process is exiting. What fails from then on is the teardown, not the program's work: vaswap
// says nothing more (the log goes off), its hooks forward every call untouched, and its own
// threads stop where they are instead of ending the process with a status of their own.
bool driver_shut_down();

// Microseconds from one recorded timing event to another (cuEventElapsedTime); 0 when the driver
// cannot say (an event not recorded, or made without timing).
double elapsed_us(const Driver& driver, CUevent from, CUevent to);

// The calling thread's capture mode relaxed for a scope, for a call that the global mode forbids
// or that would invalidate another thread's global capture (DESIGN.md invariant 5) and that runs
// on the application's thread: releasing kept handles (its out-of-memory path,
// vaswap_set_page_reuse), pinning host memory for an eviction decided while its stream
// captures.
class RelaxedCapture {
 public:
  explicit RelaxedCapture(const Driver& driver) : driver_(driver) {
    changed_ = driver_.cuThreadExchangeStreamCaptureMode(&mode_) == CUDA_SUCCESS;
  }
  ~RelaxedCapture() {
    if (changed_) driver_.cuThreadExchangeStreamCaptureMode(&mode_);
  }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  const Driver& driver_;
  CUstreamCaptureMode mode_ = CU_STREAM_CAPTURE_MODE_RELAXED;
  bool changed_ = false;
};

}  // namespace vaswap
