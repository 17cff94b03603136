// The CUDA driver, resolved at run time. libvaswap.so links no CUDA library: it opens
// libcuda.so.1 on first need and takes every entry point through cuGetProcAddress, asking for the
// ABI revision of the headers it was built with (CUDA_VERSION), as the real runtime does.
#pragma once

#include <cuda.h>

#include <string>

namespace vaswap {

// Every driver function core/ calls. A name here is the base name cuGetProcAddress understands;
// the member's type is the header's declaration for this CUDA_VERSION (cuMemGetInfo ->
// cuMemGetInfo_v2), so a call through the table has the ABI the driver hands back.
// clang-format off
#define VASWAP_DRIVER_FUNCTIONS(X)                                                                \
  X(cuInit) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDevicePrimaryCtxRetain)                        \
  X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuCtxGetDevice) X(cuCtxSynchronize)                     \
  X(cuMemGetInfo) X(cuMemGetAllocationGranularity) X(cuMemAddressReserve) X(cuMemAddressFree)     \
  X(cuMemCreate) X(cuMemRelease) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess)                      \
  X(cuMemHostAlloc) X(cuMemFreeHost) X(cuPointerGetAttribute)                                     \
  X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync)                                                       \
  X(cuStreamCreate) X(cuStreamGetDevice) X(cuStreamIsCapturing) X(cuStreamWaitEvent)              \
  X(cuLaunchHostFunc) X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventQuery)         \
  X(cuEventSynchronize) X(cuEventElapsedTime) X(cuThreadExchangeStreamCaptureMode)                \
  X(cuGetErrorName)
// clang-format on

struct Driver {
#define VASWAP_DRIVER_MEMBER(name) decltype(&::name) name = nullptr;
  VASWAP_DRIVER_FUNCTIONS(VASWAP_DRIVER_MEMBER)
#undef VASWAP_DRIVER_MEMBER
};

// The driver, loaded and initialized once. Returns nullptr when it cannot be, and then `error`
// (if given) says why: no libcuda.so.1, a missing entry point, or cuInit's error.
const Driver* load_driver(std::string* error);

// "CUDA_ERROR_OUT_OF_MEMORY" for a code, or "CUresult 999" when the driver has no name for it.
std::string cuda_error_name(CUresult result);

}  // namespace vaswap
