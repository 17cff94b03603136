// A stand-in for NCCL in tests/integration/preload_guards_test.sh: built as libnccl.so, it makes
// an allocation whose caller is "libnccl", which vaswap must never back with a slot.
#include <cuda_runtime_api.h>

#include <cstdio>

// Checks the result as NCCL's CUDACHECK does; this also keeps the call from being a tail call,
// which would hide libnccl from the return address.
extern "C" __attribute__((visibility("default"))) cudaError_t probe_alloc(void** ptr,
                                                                          size_t bytes) {
  const cudaError_t rc = cudaMalloc(ptr, bytes);
  if (rc != cudaSuccess) std::fprintf(stderr, "fake nccl: cudaMalloc failed with %d\n", rc);
  return rc;
}
