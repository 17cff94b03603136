// Probe: what the driver checks when work names a reserved address whose pages are not mapped
// yet (they are mapped by another thread before the work runs, while the stream waits on a flag).
//   1. an eager cudaMemcpyAsync / cudaMemsetAsync into it: checked at the call?
//   2. a graph whose memcpy and memset nodes were captured while it was mapped, launched while
//      it is not: checked at cuGraphLaunch, or only when the node runs?
//   3. the same for a kernel node.
//   4. changing the memcpy and memset nodes of an executable (cudaGraphExec*NodeSetParams, with
//      the parameters they have) and updating it from its graph (cudaGraphExecUpdate) while the
//      address is not mapped: checked at the call?
//   5. the graph instantiated over a placeholder (one granule of pages mapped at each of the
//      address's granules), then launched on pages of its own: correct?
//   6. a graph built node by node: adding a memcpy or memset node that names the address, and
//      giving a graph's (not an executable's) copy or memset node new parameters that name it,
//      while it is unmapped: checked at the call?
// Each case: the stream first waits on a flag in pinned host memory; the host maps the pages,
// then writes the flag; the result must be what the work wrote.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "probe_check.h"

__global__ void fill(unsigned* p, unsigned v, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = v;
}

namespace {

constexpr size_t kBytes = 8u << 20;  // four granules on an H100 or H200

struct Pages {
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle h = 0;
  int map() {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CK(cuMemCreate(&h, kBytes, &prop, 0));
    CK(cuMemMap(va, kBytes, 0, h, 0));
    CK(cuMemSetAccess(va, kBytes, &access, 1));
    return 0;
  }
  int unmap() {
    CK(cuMemUnmap(va, kBytes));
    CK(cuMemRelease(h));
    return 0;
  }
};

const char* name(cudaError_t e) { return cudaGetErrorName(e); }

}  // namespace

int main() {
  CK(cuInit(0));
  cudaSetDevice(0);
  cudaFree(nullptr);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  unsigned* flag = nullptr;
  cudaHostAlloc(reinterpret_cast<void**>(&flag), 64, cudaHostAllocMapped);
  Pages dst, src;
  CK(cuMemAddressReserve(&dst.va, kBytes, 0, 0, 0));
  CK(cuMemAddressReserve(&src.va, kBytes, 0, 0, 0));
  if (src.map()) return 1;
  cudaMemsetAsync(reinterpret_cast<void*>(src.va), 7, kBytes, s);
  cudaStreamSynchronize(s);
  std::vector<unsigned char> host(kBytes);
  unsigned value = 1;

  auto park = [&] {
    *flag = 0;
    CK(cuStreamWaitValue32(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(flag),
                           value, CU_STREAM_WAIT_VALUE_GEQ));
    return 0;
  };
  auto release = [&]() -> int {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (dst.map()) return 1;
    __atomic_store_n(flag, value, __ATOMIC_RELEASE);
    return 0;
  };
  auto check = [&](const char* what, unsigned char want) {
    cudaError_t e = cudaStreamSynchronize(s);
    cudaMemcpy(host.data(), reinterpret_cast<void*>(dst.va), kBytes, cudaMemcpyDeviceToHost);
    size_t bad = 0;
    for (unsigned char b : host) bad += b != want;
    std::printf("%-44s sync %s, %zu bytes wrong\n", what, name(e), bad);
  };

  // After a launch that copies src's 7s into the target's first half and sets its second half to
  // 3: how many bytes are right.
  auto copied_and_set = [&](const char* what, cudaError_t launched) {
    cudaStreamSynchronize(s);
    cudaMemcpy(host.data(), reinterpret_cast<void*>(dst.va), kBytes, cudaMemcpyDeviceToHost);
    size_t copied = 0, set = 0;
    for (size_t i = 0; i < kBytes; ++i)
      (i < kBytes / 2 ? copied : set) += host[i] == (i < kBytes / 2 ? 7 : 3);
    std::printf("%s: %s, %zu of %zu copied and %zu of %zu set bytes right\n", what, name(launched),
                copied, kBytes / 2, set, kBytes / 2);
  };

  // 1. eager copy and memset into the unmapped address
  if (park()) return 1;
  cudaError_t e = cudaMemcpyAsync(reinterpret_cast<void*>(dst.va), reinterpret_cast<void*>(src.va),
                                  kBytes, cudaMemcpyDeviceToDevice, s);
  std::printf("eager cudaMemcpyAsync into an unmapped VA: %s\n", name(e));
  cudaGetLastError();
  e = cudaMemsetAsync(reinterpret_cast<void*>(dst.va), 3, kBytes, s);
  std::printf("eager cudaMemsetAsync into an unmapped VA: %s\n", name(e));
  cudaGetLastError();
  if (release()) return 1;
  cudaStreamSynchronize(s);
  if (dst.unmap()) return 1;

  // 2. graph with memcpy + memset nodes captured while mapped, launched while not
  if (dst.map()) return 1;
  cudaGraph_t g;
  cudaGraphExec_t x;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
  cudaMemsetAsync(reinterpret_cast<void*>(dst.va), 3, kBytes, s);
  cudaMemcpyAsync(reinterpret_cast<void*>(dst.va), reinterpret_cast<void*>(src.va), kBytes / 2,
                  cudaMemcpyDeviceToDevice, s);
  e = cudaStreamEndCapture(s, &g);
  std::printf("capture of memset+memcpy nodes (mapped): %s\n", name(e));
  e = cudaGraphInstantiate(&x, g, 0);
  std::printf("instantiate: %s\n", name(e));
  if (dst.unmap()) return 1;
  ++value;
  if (park()) return 1;
  e = cudaGraphLaunch(x, s);
  std::printf("cudaGraphLaunch with its memcpy/memset target unmapped: %s\n", name(e));
  if (release()) return 1;
  cudaStreamSynchronize(s);
  cudaMemcpy(host.data(), reinterpret_cast<void*>(dst.va), kBytes, cudaMemcpyDeviceToHost);
  size_t copied = 0, set = 0;
  for (size_t i = 0; i < kBytes; ++i)
    (i < kBytes / 2 ? copied : set) += host[i] == (i < kBytes / 2 ? 7 : 3);
  std::printf("graph result: %zu of %zu copied bytes right, %zu of %zu set bytes right\n", copied,
              kBytes / 2, set, kBytes / 2);
  if (dst.unmap()) return 1;

  // 4. the executable's nodes changed, and the executable updated, while the address is unmapped
  size_t count = 0;
  cudaGraphGetNodes(g, nullptr, &count);
  std::vector<cudaGraphNode_t> nodes(count);
  cudaGraphGetNodes(g, nodes.data(), &count);
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    cudaGraphNodeGetType(node, &type);
    if (type == cudaGraphNodeTypeMemset) {
      cudaMemsetParams p{};
      cudaGraphMemsetNodeGetParams(node, &p);
      e = cudaGraphExecMemsetNodeSetParams(x, node, &p);
      std::printf("cudaGraphExecMemsetNodeSetParams, target unmapped: %s\n", name(e));
      cudaGetLastError();
    } else if (type == cudaGraphNodeTypeMemcpy) {
      cudaMemcpy3DParms p{};
      cudaGraphMemcpyNodeGetParams(node, &p);
      e = cudaGraphExecMemcpyNodeSetParams(x, node, &p);
      std::printf("cudaGraphExecMemcpyNodeSetParams, target unmapped: %s\n", name(e));
      cudaGetLastError();
    }
  }
  cudaGraphExecUpdateResultInfo info{};
  e = cudaGraphExecUpdate(x, g, &info);
  std::printf("cudaGraphExecUpdate from its graph, target unmapped: %s (result %d)\n", name(e),
              static_cast<int>(info.result));
  cudaGetLastError();
  cudaGraphExec_t x2 = nullptr;
  e = cudaGraphInstantiate(&x2, g, 0);
  std::printf("cudaGraphInstantiate of that graph, target unmapped: %s\n", name(e));
  cudaGetLastError();

  // 5. a placeholder: one granule of pages mapped at each granule of the target (vaswap's
  //    Engine::map_placeholder), for the instantiation only; then the launch on pages of its own
  {
    size_t granule = 0;
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CK(cuMemGetAllocationGranularity(&granule, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUmemGenericAllocationHandle one = 0;
    CK(cuMemCreate(&one, granule, &prop, 0));
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CUresult r = CUDA_SUCCESS;
    for (size_t at = 0; at < kBytes && r == CUDA_SUCCESS; at += granule)
      r = cuMemMap(dst.va + at, granule, 0, one, 0);
    if (r == CUDA_SUCCESS) r = cuMemSetAccess(dst.va, kBytes, &access, 1);
    const char* rn = nullptr;
    cuGetErrorName(r, &rn);
    std::printf("placeholder (%zu granules of one %zu-byte handle): %s\n", kBytes / granule,
                granule, rn);
    cudaGraphExec_t x3 = nullptr;
    e = cudaGraphInstantiate(&x3, g, 0);
    std::printf("cudaGraphInstantiate over the placeholder: %s\n", name(e));
    cudaGetLastError();
    for (size_t at = 0; at < kBytes; at += granule) CK(cuMemUnmap(dst.va + at, granule));
    CK(cuMemRelease(one));
    if (x3 != nullptr) {
      if (dst.map()) return 1;
      copied_and_set("its launch on the target's own pages", cudaGraphLaunch(x3, s));
      if (dst.unmap()) return 1;
    }
  }

  // 6. a graph built node by node while the address is unmapped
  {
    cudaGraph_t b = nullptr;
    cudaGraphCreate(&b, 0);
    void* to = reinterpret_cast<void*>(dst.va);
    void* from = reinterpret_cast<void*>(src.va);
    cudaMemsetParams set_params{};
    set_params.dst = to;
    set_params.value = 3;
    set_params.elementSize = 1;
    set_params.width = kBytes;
    set_params.height = 1;
    cudaGraphNode_t n = nullptr;
    e = cudaGraphAddMemcpyNode1D(&n, b, nullptr, 0, to, from, kBytes, cudaMemcpyDeviceToDevice);
    std::printf("cudaGraphAddMemcpyNode1D, target unmapped: %s\n", name(e));
    cudaGetLastError();
    n = nullptr;
    e = cudaGraphAddMemsetNode(&n, b, nullptr, 0, &set_params);
    std::printf("cudaGraphAddMemsetNode, target unmapped: %s\n", name(e));
    cudaGetLastError();
    CUDA_MEMSET_NODE_PARAMS dset{};
    dset.dst = dst.va;
    dset.value = 3;
    dset.elementSize = 1;
    dset.width = kBytes;
    dset.height = 1;
    CUcontext ctx = nullptr;
    cuCtxGetCurrent(&ctx);
    CUgraphNode dn = nullptr;
    CUresult r = cuGraphAddMemsetNode(&dn, reinterpret_cast<CUgraph>(b), nullptr, 0, &dset, ctx);
    const char* rn = nullptr;
    cuGetErrorName(r, &rn);
    std::printf("cuGraphAddMemsetNode, target unmapped: %s\n", rn);
    // nodes added while mapped, then given the same parameters while unmapped
    cudaGraph_t c = nullptr;
    cudaGraphCreate(&c, 0);
    if (dst.map()) return 1;
    cudaGraphNode_t copy_node = nullptr, set_node = nullptr;
    e = cudaGraphAddMemsetNode(&set_node, c, nullptr, 0, &set_params);
    cudaError_t e2 = cudaGraphAddMemcpyNode1D(&copy_node, c, &set_node, 1, to, from, kBytes / 2,
                                              cudaMemcpyDeviceToDevice);
    std::printf("the same nodes added while mapped: %s, %s\n", name(e), name(e2));
    if (dst.unmap()) return 1;
    e = cudaGraphMemcpyNodeSetParams1D(copy_node, to, from, kBytes / 2, cudaMemcpyDeviceToDevice);
    std::printf("cudaGraphMemcpyNodeSetParams1D, target unmapped: %s\n", name(e));
    cudaGetLastError();
    e = cudaGraphMemsetNodeSetParams(set_node, &set_params);
    std::printf("cudaGraphMemsetNodeSetParams, target unmapped: %s\n", name(e));
    cudaGetLastError();
    cudaGraphNodeParams generic{};
    generic.type = cudaGraphNodeTypeMemset;
    generic.memset.dst = set_params.dst;
    generic.memset.value = set_params.value;
    generic.memset.elementSize = set_params.elementSize;
    generic.memset.width = set_params.width;
    generic.memset.height = set_params.height;
    e = cudaGraphNodeSetParams(set_node, &generic);
    std::printf("cudaGraphNodeSetParams (a memset), target unmapped: %s\n", name(e));
    cudaGetLastError();
    if (dst.map()) return 1;
    cudaGraphExec_t cx = nullptr;
    e = cudaGraphInstantiate(&cx, c, 0);
    if (e == cudaSuccess) e = cudaGraphLaunch(cx, s);
    copied_and_set("that graph instantiated and launched, mapped", e);
    if (dst.unmap()) return 1;
  }

  // 3. kernel node
  cudaGraph_t kg;
  cudaGraphExec_t kx;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
  fill<<<64, 256, 0, s>>>(reinterpret_cast<unsigned*>(dst.va), 0x09090909u, kBytes / 4);
  cudaStreamEndCapture(s, &kg);
  cudaGraphInstantiate(&kx, kg, 0);
  ++value;
  if (park()) return 1;
  e = cudaGraphLaunch(kx, s);
  std::printf("cudaGraphLaunch of a kernel node, target unmapped: %s\n", name(e));
  if (release()) return 1;
  check("kernel node after the flag", 9);
  return 0;
}
