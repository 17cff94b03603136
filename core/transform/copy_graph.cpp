#include "transform/copy_graph.h"

#include <string>

#include "base/driver.h"
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

namespace {

// A graph of the one node `add` puts in it, instantiated and uploaded on `stream`. Made on the
// application's thread too, while its stream captures (an eviction decided for a copy recorded
// into the capture): instantiating in the global capture mode fails and invalidates that capture
// (torch.compile's graph trees on the H200, bench/results/torch_compile_budget_h200.md).
template <class Add>
CUgraphExec one_node_exec(const Driver& driver, CUstream stream, const char* add_call,
                          const std::string& subject, Add&& add) {
  const RelaxedCapture relaxed(driver);
  const auto check = [&](CUresult rc, const char* call) {
    if (rc != CUDA_SUCCESS) fail_driver(rc, cuda_failure(call, rc, subject));
  };
  CUgraph graph = nullptr;
  check(driver.cuGraphCreate(&graph, 0), "cuGraphCreate");
  CUgraphExec exec = nullptr;
  CUgraphNode node = nullptr;
  CUresult rc = add(graph, &node);
  if (rc == CUDA_SUCCESS) {
    rc = driver.cuGraphInstantiateWithFlags(&exec, graph, 0);
    driver.cuGraphDestroy(graph);
    check(rc, "cuGraphInstantiateWithFlags");
  } else {
    driver.cuGraphDestroy(graph);
    check(rc, add_call);
  }
  rc = driver.cuGraphUpload(exec, stream);
  if (rc != CUDA_SUCCESS) {
    driver.cuGraphExecDestroy(exec);
    check(rc, "cuGraphUpload");
  }
  return exec;
}

CUgraphExec memcpy_exec(const Driver& driver, CUcontext context, CUstream stream,
                        const CUDA_MEMCPY3D& params, const std::string& subject) {
  return one_node_exec(
      driver, stream, "cuGraphAddMemcpyNode", subject, [&](CUgraph graph, CUgraphNode* node) {
        return driver.cuGraphAddMemcpyNode(node, graph, nullptr, 0, &params, context);
      });
}

}  // namespace

CUgraphExec make_copy_exec(const Driver& driver, CUcontext context, CUstream stream, CUdeviceptr va,
                           void* host, size_t bytes, bool to_host, const std::string& subject) {
  return memcpy_exec(driver, context, stream, copy_params(va, host, bytes, to_host), subject);
}

CUgraphExec make_device_copy_exec(const Driver& driver, CUcontext context, CUstream stream,
                                  CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                                  const std::string& subject) {
  CUDA_MEMCPY3D params = copy_params(dst, nullptr, bytes, false);
  params.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  params.srcHost = nullptr;
  params.srcDevice = src;
  return memcpy_exec(driver, context, stream, params, subject);
}

CUgraphExec make_memset_exec(const Driver& driver, CUcontext context, CUstream stream,
                             CUdeviceptr dst, unsigned value, unsigned element, size_t count,
                             const std::string& subject) {
  CUDA_MEMSET_NODE_PARAMS params{};
  params.dst = dst;
  params.value = value;
  params.elementSize = element;
  params.width = count;
  params.height = 1;
  return one_node_exec(
      driver, stream, "cuGraphAddMemsetNode", subject, [&](CUgraph graph, CUgraphNode* node) {
        return driver.cuGraphAddMemsetNode(node, graph, nullptr, 0, &params, context);
      });
}

}  // namespace vaswap
