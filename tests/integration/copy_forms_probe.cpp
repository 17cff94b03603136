// Copies that name device memory through the driver's less common forms: to and from a CUDA
// array (cuMemcpyDtoA, cuMemcpyAtoD) and in batches of 3D copies (cuMemcpy3DBatchAsync, with
// pointer and array operands). Two 4 MiB buffers; under vaswap with a residency.budget that holds
// one of them, touching one evicts the other, so each copy below names a buffer that is away and
// must be brought back before the driver sees it (the driver refuses a copy from or into unmapped
// pages); and a graph whose copy and memset nodes name b is instantiated, and its nodes are given
// new parameters, while b is away (the driver checks those addresses at both); and a graph built
// node by node names b in a memset node and a copy node added, then given new parameters, while b
// is away (the simulator checks those calls as it checks a captured copy). Prints "copy forms:
// <checksum of both buffers and the host copy>"; exit 0. The same checksum is printed without
// vaswap.
#include <cuda.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

constexpr size_t kBuffer = 4u << 20;
constexpr size_t kArray = 64u << 10;  // a 1D array of bytes

#define CHECK(call)                                                                                \
  do {                                                                                             \
    const CUresult rc_ = (call);                                                                   \
    if (rc_ != CUDA_SUCCESS) {                                                                     \
      std::fprintf(stderr, "copy_forms_probe: %s failed with %d\n", #call, static_cast<int>(rc_)); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

uint64_t fnv1a(const std::vector<uint8_t>& bytes, uint64_t h = 1469598103934665603ull) {
  for (uint8_t b : bytes) h = (h ^ b) * 1099511628211ull;
  return h;
}

CUmemcpy3DOperand pointer(CUdeviceptr p, size_t row_length = 0) {
  CUmemcpy3DOperand o{};
  o.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
  o.op.ptr.ptr = p;
  o.op.ptr.rowLength = row_length;
  return o;
}

CUmemcpy3DOperand array_at(CUarray array, size_t x) {
  CUmemcpy3DOperand o{};
  o.type = CU_MEMCPY_OPERAND_TYPE_ARRAY;
  o.op.array.array = array;
  o.op.array.offset = {x, 0, 0};
  return o;
}

}  // namespace

int main() {
  CHECK(cuInit(0));
  CUdevice device = 0;
  CHECK(cuDeviceGet(&device, 0));
  CUcontext context = nullptr;
  CHECK(cuDevicePrimaryCtxRetain(&context, device));
  CHECK(cuCtxSetCurrent(context));
  CUstream stream = nullptr;
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CUdeviceptr a = 0, b = 0;
  CHECK(cuMemAlloc(&a, kBuffer));
  CHECK(cuMemAlloc(&b, kBuffer));
  CUDA_ARRAY_DESCRIPTOR d{};
  d.Width = kArray;
  d.Format = CU_AD_FORMAT_UNSIGNED_INT8;
  d.NumChannels = 1;
  CUarray array = nullptr;
  CHECK(cuArrayCreate(&array, &d));

  std::vector<uint8_t> pattern(kBuffer);
  for (size_t i = 0; i < kBuffer; ++i) pattern[i] = static_cast<uint8_t>((i * 131) >> 3);
  CHECK(cuMemcpyHtoD(a, pattern.data(), kBuffer));
  CHECK(cuMemsetD8(b, 0x5b, kBuffer));  // under vaswap: a is evicted for b

  // a (away) into the array, then the array into b (away by then) at 64 KiB.
  CHECK(cuMemcpyDtoA(array, 0, a + 12345, kArray));
  CHECK(cuMemcpyAtoD(b + kArray, array, 0, kArray));

  // A box of a (away: 4 rows of 1 KiB, 8 KiB apart, from byte 4096) into packed host memory.
  std::vector<uint8_t> host(4u << 10, 0);
  CUDA_MEMCPY3D_BATCH_OP op{};
  op.src = pointer(a + 4096, 8192);
  op.dst = pointer(reinterpret_cast<CUdeviceptr>(host.data()));
  op.extent = {1024, 4, 1};
  op.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  CHECK(cuMemcpy3DBatchAsync(1, &op, 0, stream));
  CHECK(cuStreamSynchronize(stream));
  // The array's second half into b (away again) near its end.
  op = CUDA_MEMCPY3D_BATCH_OP{};
  op.src = array_at(array, kArray / 2);
  op.dst = pointer(b + kBuffer - kArray);
  op.extent = {kArray / 2, 1, 1};
  op.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  CHECK(cuMemcpy3DBatchAsync(1, &op, 0, stream));
  CHECK(cuStreamSynchronize(stream));
  // a (away again) read during the call (CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL: the driver
  // may read it out of stream order, so a stream's wait for its restore would not do).
  std::vector<uint8_t> during(8u << 10, 0);
  op = CUDA_MEMCPY3D_BATCH_OP{};
  op.src = pointer(a + 100000);
  op.dst = pointer(reinterpret_cast<CUdeviceptr>(during.data()));
  op.extent = {during.size(), 1, 1};
  op.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL;
  CHECK(cuMemcpy3DBatchAsync(1, &op, 0, stream));
  CHECK(cuStreamSynchronize(stream));

  // A graph whose copy and memset nodes name b, instantiated while b is away: the driver checks
  // those nodes' addresses at the instantiation (a GPU refuses one without pages).
  CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED));
  CHECK(cuMemcpyDtoDAsync(b + (1u << 20), b + kArray, kArray, stream));
  CHECK(cuMemsetD8Async(b + (2u << 20), 0x77, kArray, stream));
  CUgraph graph = nullptr;
  CHECK(cuStreamEndCapture(stream, &graph));
  uint8_t first = 0;
  CHECK(cuMemcpyDtoH(&first, a, 1));  // under vaswap: b is evicted for a
  CUgraphExec exec = nullptr;
  CHECK(cuGraphInstantiate(&exec, graph, 0));
  CHECK(cuGraphLaunch(exec, stream));
  CHECK(cuStreamSynchronize(stream));
  // Its copy and memset given new parameters while b is away again (checked at the call too): the
  // copy now from b's array part at 3 MiB, the memset of 0x78; launched again.
  CUgraphNode nodes[2] = {};
  size_t count = 2;
  CHECK(cuGraphGetNodes(graph, nodes, &count));
  CHECK(cuMemcpyDtoH(&first, a, 1));  // under vaswap: b is evicted for a
  for (size_t i = 0; i < count; ++i) {
    CUgraphNodeType type{};
    CHECK(cuGraphNodeGetType(nodes[i], &type));
    if (type == CU_GRAPH_NODE_TYPE_MEMCPY) {
      CUDA_MEMCPY3D copy{};
      CHECK(cuGraphMemcpyNodeGetParams(nodes[i], &copy));
      copy.dstDevice = b + (3u << 20);
      CHECK(cuGraphExecMemcpyNodeSetParams(exec, nodes[i], &copy, context));
    } else {
      CUDA_MEMSET_NODE_PARAMS set{};
      CHECK(cuGraphMemsetNodeGetParams(nodes[i], &set));
      set.value = 0x78;
      CHECK(cuGraphExecMemsetNodeSetParams(exec, nodes[i], &set, context));
    }
  }
  CHECK(cuGraphLaunch(exec, stream));
  CHECK(cuStreamSynchronize(stream));
  CHECK(cuGraphExecDestroy(exec));
  CHECK(cuGraphDestroy(graph));

  // A graph built node by node while b is away: a memset of 0x79 at 3 MiB + 64 KiB, then a copy
  // of b's array part to 3 MiB + 128 KiB; then, b away again, the memset given 0x7a and the copy
  // moved to 3 MiB + 192 KiB. Launched once.
  constexpr CUdeviceptr kSetAt = (3u << 20) + kArray;
  CUgraph built = nullptr;
  CHECK(cuGraphCreate(&built, 0));
  CHECK(cuMemcpyDtoH(&first, a, 1));  // under vaswap: b is evicted for a
  CUDA_MEMSET_NODE_PARAMS set{};
  set.dst = b + kSetAt;
  set.value = 0x79;
  set.elementSize = 1;
  set.width = kArray;
  set.height = 1;
  CUgraphNode set_node = nullptr;
  CHECK(cuGraphAddMemsetNode(&set_node, built, nullptr, 0, &set, context));
  CUDA_MEMCPY3D copy{};
  copy.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  copy.srcDevice = b + kArray;
  copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  copy.dstDevice = b + kSetAt + kArray;
  copy.WidthInBytes = kArray;
  copy.Height = 1;
  copy.Depth = 1;
  CUgraphNode copy_node = nullptr;
  CHECK(cuGraphAddMemcpyNode(&copy_node, built, &set_node, 1, &copy, context));
  CHECK(cuMemcpyDtoH(&first, a, 1));  // under vaswap: b is evicted for a
  set.value = 0x7a;
  CHECK(cuGraphMemsetNodeSetParams(set_node, &set));
  copy.dstDevice = b + kSetAt + 2 * kArray;
  CHECK(cuGraphMemcpyNodeSetParams(copy_node, &copy));
  CHECK(cuGraphInstantiate(&exec, built, 0));
  CHECK(cuGraphLaunch(exec, stream));
  CHECK(cuStreamSynchronize(stream));
  CHECK(cuGraphExecDestroy(exec));
  CHECK(cuGraphDestroy(built));

  std::vector<uint8_t> got_a(kBuffer), got_b(kBuffer);
  CHECK(cuMemcpyDtoH(got_a.data(), a, kBuffer));
  CHECK(cuMemcpyDtoH(got_b.data(), b, kBuffer));
  // What the copies must have made, checked here so that a wrong copy names itself.
  for (size_t i = 0; i < kArray; ++i) {
    if (got_b[kArray + i] != pattern[12345 + i]) {
      std::fprintf(stderr, "copy_forms_probe: b[%zu] is not a[%zu] (through the array)\n",
                   kArray + i, 12345 + i);
      return 1;
    }
    if (i >= kArray / 2 && got_b[kBuffer - kArray + i - kArray / 2] != pattern[12345 + i]) {
      std::fprintf(stderr, "copy_forms_probe: b's tail is not the array's second half\n");
      return 1;
    }
  }
  for (size_t i = 0; i < kArray; ++i) {
    if (got_b[(1u << 20) + i] != pattern[12345 + i] ||
        got_b[(3u << 20) + i] != pattern[12345 + i] || got_b[(2u << 20) + i] != 0x78) {
      std::fprintf(stderr, "copy_forms_probe: b[%zu] is not what the graph copied or set\n", i);
      return 1;
    }
    if (got_b[kSetAt + i] != 0x7a || got_b[kSetAt + kArray + i] != 0x5b ||
        got_b[kSetAt + 2 * kArray + i] != pattern[12345 + i]) {
      std::fprintf(stderr, "copy_forms_probe: b[%zu] is not what the built graph set or copied\n",
                   i);
      return 1;
    }
  }
  for (size_t i = 0; i < host.size(); ++i) {
    if (host[i] != pattern[4096 + (i / 1024) * 8192 + i % 1024]) {
      std::fprintf(stderr, "copy_forms_probe: host[%zu] is not a's box\n", i);
      return 1;
    }
  }
  if (!std::equal(during.begin(), during.end(), pattern.begin() + 100000)) {
    std::fprintf(stderr, "copy_forms_probe: what was read during the call is not a's\n");
    return 1;
  }
  if (got_a != pattern) {
    std::fprintf(stderr, "copy_forms_probe: a changed\n");
    return 1;
  }
  std::printf("copy forms: %016" PRIx64 "\n",
              fnv1a(during, fnv1a(host, fnv1a(got_b, fnv1a(got_a)))));
  CHECK(cuArrayDestroy(array));
  CHECK(cuMemFree(a));
  CHECK(cuMemFree(b));
  CHECK(cuStreamDestroy(stream));
  CHECK(cuDevicePrimaryCtxRelease(device));
  return 0;
}
