// CK(call) for the driver-API probes in bench/: the call must succeed; otherwise it prints
// "FATAL <call>: <error name>" and returns 1 from the enclosing function (the probe's main).
#pragma once

#include <cuda.h>

#include <cstdio>
#include <string>

#define CK(x)                                \
  do {                                       \
    CUresult r_ = (x);                       \
    if (r_ != CUDA_SUCCESS) {                \
      const char* n_ = nullptr;              \
      cuGetErrorName(r_, &n_);               \
      std::printf("FATAL %s: %s\n", #x, n_); \
      return 1;                              \
    }                                        \
  } while (0)

// cuInit, then device 0's primary context made current: how the probes start.
inline CUresult start_device0(CUdevice* device, CUcontext* context) {
  CUresult rc = cuInit(0);
  if (rc == CUDA_SUCCESS) rc = cuDeviceGet(device, 0);
  if (rc == CUDA_SUCCESS) rc = cuDevicePrimaryCtxRetain(context, *device);
  if (rc == CUDA_SUCCESS) rc = cuCtxSetCurrent(*context);
  return rc;
}

// "ok", or the driver's name for a code (the number where it has none).
inline std::string result_name(CUresult rc) {
  if (rc == CUDA_SUCCESS) return "ok";
  const char* n = nullptr;
  cuGetErrorName(rc, &n);
  return n != nullptr ? n : std::to_string(static_cast<int>(rc));
}
