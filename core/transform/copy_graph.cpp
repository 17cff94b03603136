#include "transform/copy_graph.h"

#include <string>

#include "base/errors.h"

namespace vaswap {

CUDA_MEMCPY3D copy_params(CUdeviceptr va, void* host, size_t bytes, bool to_host) {
  CUDA_MEMCPY3D p{};
  if (to_host) {
    p.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    p.srcDevice = va;
    p.dstMemoryType = CU_MEMORYTYPE_HOST;
    p.dstHost = host;
  } else {
    p.srcMemoryType = CU_MEMORYTYPE_HOST;
    p.srcHost = host;
    p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    p.dstDevice = va;
  }
  p.WidthInBytes = bytes;
  p.srcPitch = bytes;
  p.dstPitch = bytes;
  p.srcHeight = 1;
  p.dstHeight = 1;
  p.Height = 1;
  p.Depth = 1;
  return p;
}

CUgraphExec make_copy_exec(const Driver& driver, CUcontext context, CUstream stream, CUdeviceptr va,
                           void* host, size_t bytes, bool to_host, const std::string& subject) {
  const auto check = [&](CUresult rc, const char* call) {
    if (rc != CUDA_SUCCESS) fail(VASWAP_ERROR_CUDA, cuda_failure(call, rc, subject));
  };
  CUgraph graph = nullptr;
  check(driver.cuGraphCreate(&graph, 0), "cuGraphCreate");
  CUgraphExec exec = nullptr;
  const CUDA_MEMCPY3D params = copy_params(va, host, bytes, to_host);
  CUgraphNode node = nullptr;
  CUresult rc = driver.cuGraphAddMemcpyNode(&node, graph, nullptr, 0, &params, context);
  if (rc == CUDA_SUCCESS) {
    rc = driver.cuGraphInstantiateWithFlags(&exec, graph, 0);
    driver.cuGraphDestroy(graph);
    check(rc, "cuGraphInstantiateWithFlags");
  } else {
    driver.cuGraphDestroy(graph);
    check(rc, "cuGraphAddMemcpyNode");
  }
  rc = driver.cuGraphUpload(exec, stream);
  if (rc != CUDA_SUCCESS) {
    driver.cuGraphExecDestroy(exec);
    check(rc, "cuGraphUpload");
  }
  return exec;
}

}  // namespace vaswap
