// Probe: which driver calls, made by a thread while it captures a stream in the global mode (the
// default, and PyTorch's), invalidate that capture? vaswap's own calls for a capture's copy run
// on the capturing thread (evictions, restores ahead on its streams, their waits, copy graphs):
// on an H100 one of them invalidated the program's capture under a 12 MiB budget, and relaxed
// mode for them fixed it (bench/results/capacity_edges_session51_h100.md). This names the call.
//
// Each case: cuStreamBeginCapture(S, GLOBAL); a kernel on S; the call (on another stream T, or
// none); a kernel on S; cuStreamEndCapture. Printed: the call's result and the capture's end
// ("ok" or the error). Every case runs with the thread in the global mode and then relaxed
// (cuThreadExchangeStreamCaptureMode), the capture begun global both times.
// Usage: capture_unsafe_cuda            (no arguments; prints one line per case and mode)
#include <cuda.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "probe_check.h"

__global__ void touch(unsigned* p) { p[threadIdx.x] += 1; }

namespace {

struct Case {
  const char* what;
  std::function<CUresult()> call;
};

}  // namespace

int main() {
  CK(cuInit(0));
  CUdevice dev = 0;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx = nullptr;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CUstream S = nullptr, T = nullptr;
  CK(cuStreamCreate(&S, CU_STREAM_NON_BLOCKING));
  CK(cuStreamCreate(&T, CU_STREAM_NON_BLOCKING));
  CUdeviceptr buf = 0;
  CK(cuMemAlloc(&buf, 1 << 20));
  CK(cuMemsetD8(buf, 0, 1 << 20));
  void* pinned = nullptr;
  CK(cuMemHostAlloc(&pinned, 1 << 20, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
  std::memset(pinned, 0, 1 << 20);
  CUdeviceptr flag = 0;
  CK(cuMemHostGetDevicePointer(&flag, pinned, 0));
  CUevent done = nullptr, start = nullptr;
  CK(cuEventCreate(&done, CU_EVENT_DEFAULT));
  CK(cuEventCreate(&start, CU_EVENT_DEFAULT));
  CK(cuEventRecord(start, T));
  CK(cuEventRecord(done, T));
  CK(cuStreamSynchronize(T));
  // A small executable to launch on T: one memset node.
  CUgraph small = nullptr;
  CK(cuGraphCreate(&small, 0));
  CUDA_MEMSET_NODE_PARAMS ms{};
  ms.dst = buf;
  ms.elementSize = 1;
  ms.width = 4096;
  ms.height = 1;
  ms.value = 0;
  CUgraphNode node = nullptr;
  CK(cuGraphAddMemsetNode(&node, small, nullptr, 0, &ms, ctx));
  CUgraphExec exec = nullptr;
  CK(cuGraphInstantiate(&exec, small, 0));
  // VMM: a reservation, a handle, mapped or not as each case needs.
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t gran = 0;
  CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUdeviceptr va = 0;
  CK(cuMemAddressReserve(&va, gran, 0, 0, 0));
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUmemGenericAllocationHandle handle = 0;
  bool mapped = false;

  std::vector<Case> cases = {
      {"none", [] { return CUDA_SUCCESS; }},
      {"cuStreamQuery(T, idle)", [&] { return cuStreamQuery(T); }},
      {"cuEventQuery(done on T)", [&] { return cuEventQuery(done); }},
      {"cuEventRecord(done, T)", [&] { return cuEventRecord(done, T); }},
      {"cuStreamWaitEvent(T, done)", [&] { return cuStreamWaitEvent(T, done, 0); }},
      {"cuStreamWaitValue32(T, flag >= 0)",
       [&] { return cuStreamWaitValue32(T, flag, 0, CU_STREAM_WAIT_VALUE_GEQ); }},
      {"cuStreamWriteValue32(T, flag = 0)", [&] { return cuStreamWriteValue32(T, flag, 0, 0); }},
      {"cuGraphLaunch(exec, T)", [&] { return cuGraphLaunch(exec, T); }},
      {"cuGraphUpload(exec, T)", [&] { return cuGraphUpload(exec, T); }},
      {"cuMemcpyHtoDAsync(T, pinned)",
       [&] { return cuMemcpyHtoDAsync(buf, static_cast<char*>(pinned) + 4096, 4096, T); }},
      {"cuMemcpyDtoHAsync(T, pinned)",
       [&] { return cuMemcpyDtoHAsync(static_cast<char*>(pinned) + 4096, buf, 4096, T); }},
      {"cuEventElapsedTime(start, done)",
       [&] {
         float ms_ = 0;
         return cuEventElapsedTime(&ms_, start, done);
       }},
      {"cuMemGetInfo",
       [&] {
         size_t f = 0, t = 0;
         return cuMemGetInfo(&f, &t);
       }},
      {"cuEventCreate",
       [&] {
         CUevent e = nullptr;
         const CUresult rc = cuEventCreate(&e, CU_EVENT_DISABLE_TIMING);
         if (rc == CUDA_SUCCESS) cuEventDestroy(e);
         return rc;
       }},
      {"cuStreamCreate",
       [&] {
         CUstream s = nullptr;
         const CUresult rc = cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
         if (rc == CUDA_SUCCESS) cuStreamDestroy(s);
         return rc;
       }},
      {"cuGraphInstantiate(another graph)",
       [&] {
         CUgraphExec e = nullptr;
         const CUresult rc = cuGraphInstantiate(&e, small, 0);
         if (rc == CUDA_SUCCESS) cuGraphExecDestroy(e);
         return rc;
       }},
      {"cuMemCreate",
       [&] {
         CUmemGenericAllocationHandle h = 0;
         const CUresult rc = cuMemCreate(&h, gran, &prop, 0);
         if (rc == CUDA_SUCCESS) cuMemRelease(h);
         return rc;
       }},
      {"cuMemMap + cuMemSetAccess",
       [&] {
         if (handle == 0 && cuMemCreate(&handle, gran, &prop, 0) != CUDA_SUCCESS)
           return CUDA_ERROR_UNKNOWN;
         if (mapped) return CUDA_ERROR_UNKNOWN;
         CUresult rc = cuMemMap(va, gran, 0, handle, 0);
         if (rc == CUDA_SUCCESS) {
           mapped = true;
           rc = cuMemSetAccess(va, gran, &access, 1);
         }
         return rc;
       }},
      {"cuMemUnmap",
       [&] {
         if (!mapped) return CUDA_ERROR_UNKNOWN;
         const CUresult rc = cuMemUnmap(va, gran);
         if (rc == CUDA_SUCCESS) mapped = false;
         return rc;
       }},
      {"cuMemRelease",
       [&] {
         if (handle == 0 || mapped) return CUDA_ERROR_UNKNOWN;
         const CUresult rc = cuMemRelease(handle);
         if (rc == CUDA_SUCCESS) handle = 0;
         return rc;
       }},
      {"cuMemHostAlloc",
       [&] {
         void* p = nullptr;
         const CUresult rc = cuMemHostAlloc(&p, 4096, CU_MEMHOSTALLOC_PORTABLE);
         if (rc == CUDA_SUCCESS) cuMemFreeHost(p);
         return rc;
       }},
      {"cuEventSynchronize(done, complete)", [&] { return cuEventSynchronize(done); }},
      {"cuStreamSynchronize(T, idle)", [&] { return cuStreamSynchronize(T); }},
  };

  for (const int relaxed : {0, 1}) {
    for (const Case& c : cases) {
      // Before each case: T idle, `done` recorded and complete (outside any capture).
      CK(cuStreamSynchronize(T));
      CK(cuEventRecord(done, T));
      CK(cuStreamSynchronize(T));
      CK(cuStreamBeginCapture(S, CU_STREAM_CAPTURE_MODE_GLOBAL));
      CUstreamCaptureMode mode =
          relaxed != 0 ? CU_STREAM_CAPTURE_MODE_RELAXED : CU_STREAM_CAPTURE_MODE_GLOBAL;
      CK(cuThreadExchangeStreamCaptureMode(&mode));
      touch<<<1, 32, 0, S>>>(reinterpret_cast<unsigned*>(buf));
      const CUresult called = c.call();
      touch<<<1, 32, 0, S>>>(reinterpret_cast<unsigned*>(buf));
      CK(cuThreadExchangeStreamCaptureMode(&mode));  // back to what it was
      CUgraph g = nullptr;
      const CUresult ended = cuStreamEndCapture(S, &g);
      if (g != nullptr) cuGraphDestroy(g);
      std::printf("%-8s %-36s call %-40s capture %s\n", relaxed != 0 ? "relaxed" : "global", c.what,
                  result_name(called).c_str(), result_name(ended).c_str());
      std::fflush(stdout);
      cuCtxSynchronize();  // the error of a failed call must not stay for the next case
    }
  }
  return 0;
}
