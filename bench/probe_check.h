// CK(call) for the driver-API probes in bench/: the call must succeed; otherwise it prints
// "FATAL <call>: <error name>" and returns 1 from the enclosing function (the probe's main).
#pragma once

#include <cuda.h>

#include <cstdio>

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
