// Simulated driver: stream memory operations (cuStreamWaitValue32/64, cuStreamWriteValue32/64,
// cuStreamBatchMemOp), as the driver documents them.
//
// A wait is an operation of its stream that polls its address until the condition holds (GEQ is
// the driver's cyclic comparison: (int32_t)(*addr - value) >= 0); a write stores the value once
// the work before it on the stream is done. The address may be device memory or pinned host
// memory: both are host memory here. Captured, the operations become one batch memory-op node.
// VASWAP_SIM_MEMOPS=0 models a system without them: every call and node is
// CUDA_ERROR_NOT_SUPPORTED.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "state.h"

namespace vsim {

namespace {

constexpr unsigned kWaitConditions = 0xf;  // GEQ, EQ, AND, NOR live in the low bits

template <class T>
bool holds(T now, T value, unsigned condition) {
  using Signed = std::make_signed_t<T>;
  switch (condition) {
    case CU_STREAM_WAIT_VALUE_GEQ: return static_cast<Signed>(now - value) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ: return now == value;
    case CU_STREAM_WAIT_VALUE_AND: return (now & value) != 0;
    case CU_STREAM_WAIT_VALUE_NOR: return static_cast<T>(~(now | value)) != 0;
    default: return false;
  }
}

template <class T>
T load(CUdeviceptr address) {
  return __atomic_load_n(reinterpret_cast<const T*>(address), __ATOMIC_ACQUIRE);
}

template <class T>
void store(CUdeviceptr address, T value) {
  __atomic_store_n(reinterpret_cast<T*>(address), value, __ATOMIC_RELEASE);
}

template <class T>
void wait_for(CUdeviceptr address, T value, unsigned flags) {
  const unsigned condition = flags & kWaitConditions;
  if (holds(load<T>(address), value, condition)) return;
  // Parked: counted on the device whose stream runs the wait (a module load waits for none to be).
  struct Parked {
    std::atomic<int>* count = tls_worker_device >= 0
                                  ? &devices()[static_cast<size_t>(tls_worker_device)].parked
                                  : nullptr;
    Parked() {
      if (count != nullptr) count->fetch_add(1);
    }
    ~Parked() {
      if (count != nullptr) count->fetch_sub(1);
    }
    Parked(const Parked&) = delete;
    Parked& operator=(const Parked&) = delete;
  } parked;
  // Polls, backing off to 50 us: a waiting stream costs a GPU nothing, and here it should cost
  // the host little.
  auto pause = std::chrono::microseconds(1);
  while (!holds(load<T>(address), value, condition)) {
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(50));
  }
}

}  // namespace

namespace {
std::atomic<bool>& memops_setting() {
  static std::atomic<bool> supported{[] {
    const char* setting = std::getenv("VASWAP_SIM_MEMOPS");
    return setting == nullptr || std::string(setting) != "0";
  }()};
  return supported;
}
}  // namespace

bool memops_supported() { return memops_setting().load(std::memory_order_relaxed); }

CUresult check_memop(const CUstreamBatchMemOpParams& op) {
  if (!memops_supported()) return CUDA_ERROR_NOT_SUPPORTED;
  switch (op.operation) {
    case CU_STREAM_MEM_OP_WAIT_VALUE_32:
    case CU_STREAM_MEM_OP_WAIT_VALUE_64: {
      const unsigned condition = op.waitValue.flags & kWaitConditions;
      const unsigned rest = op.waitValue.flags & ~(kWaitConditions | CU_STREAM_WAIT_VALUE_FLUSH);
      if (condition > CU_STREAM_WAIT_VALUE_NOR || rest != 0) return CUDA_ERROR_INVALID_VALUE;
      const size_t align = op.operation == CU_STREAM_MEM_OP_WAIT_VALUE_32 ? 4 : 8;
      if (op.waitValue.address == 0 || op.waitValue.address % align != 0) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      return CUDA_SUCCESS;
    }
    case CU_STREAM_MEM_OP_WRITE_VALUE_32:
    case CU_STREAM_MEM_OP_WRITE_VALUE_64: {
      if ((op.writeValue.flags & ~unsigned(CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER)) != 0) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      const size_t align = op.operation == CU_STREAM_MEM_OP_WRITE_VALUE_32 ? 4 : 8;
      if (op.writeValue.address == 0 || op.writeValue.address % align != 0) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      return CUDA_SUCCESS;
    }
    case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES:
    case CU_STREAM_MEM_OP_BARRIER: return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

void run_memops(const std::vector<CUstreamBatchMemOpParams>& ops) {
  for (const CUstreamBatchMemOpParams& op : ops) {
    switch (op.operation) {
      case CU_STREAM_MEM_OP_WAIT_VALUE_32:
        wait_for<cuuint32_t>(op.waitValue.address, op.waitValue.value, op.waitValue.flags);
        break;
      case CU_STREAM_MEM_OP_WAIT_VALUE_64:
        wait_for<cuuint64_t>(op.waitValue.address, op.waitValue.value64, op.waitValue.flags);
        break;
      case CU_STREAM_MEM_OP_WRITE_VALUE_32:
        store<cuuint32_t>(op.writeValue.address, op.writeValue.value);
        break;
      case CU_STREAM_MEM_OP_WRITE_VALUE_64:
        store<cuuint64_t>(op.writeValue.address, op.writeValue.value64);
        break;
      default: {
        // A flush (CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES): order this stream's writes before
        // what follows. A full barrier through an atomic read-modify-write, which ThreadSanitizer
        // understands (it does not model atomic_thread_fence).
        static std::atomic<int> barrier{0};
        barrier.fetch_add(1, std::memory_order_seq_cst);
        break;
      }
    }
  }
}

}  // namespace vsim

using namespace vsim;

namespace {

CUresult submit_memops(CUstream h, const CUstreamBatchMemOpParams* ops, unsigned count) {
  if (count == 0 || ops == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto node = std::make_unique<Node>();
  node->type = CU_GRAPH_NODE_TYPE_BATCH_MEM_OP;
  for (unsigned i = 0; i < count; ++i) {
    SIM_TRY(check_memop(ops[i]));
    node->memops.push_back(ops[i]);
  }
  return submit(h, std::move(node));
}

CUstreamBatchMemOpParams wait_op(CUstreamBatchMemOpType kind, CUdeviceptr address, cuuint64_t value,
                                 unsigned flags) {
  CUstreamBatchMemOpParams op{};
  op.waitValue.operation = kind;
  op.waitValue.address = address;
  if (kind == CU_STREAM_MEM_OP_WAIT_VALUE_32) {
    op.waitValue.value = static_cast<cuuint32_t>(value);
  } else {
    op.waitValue.value64 = value;
  }
  op.waitValue.flags = flags;
  return op;
}

CUstreamBatchMemOpParams write_op(CUstreamBatchMemOpType kind, CUdeviceptr address,
                                  cuuint64_t value, unsigned flags) {
  CUstreamBatchMemOpParams op{};
  op.writeValue.operation = kind;
  op.writeValue.address = address;
  if (kind == CU_STREAM_MEM_OP_WRITE_VALUE_32) {
    op.writeValue.value = static_cast<cuuint32_t>(value);
  } else {
    op.writeValue.value64 = value;
  }
  op.writeValue.flags = flags;
  return op;
}

}  // namespace

extern "C" void vaswapSimSetMemopsSupported(int supported) {
  memops_setting().store(supported != 0);
}

CUresult CUDAAPI cuStreamWaitValue32_v2(CUstream h, CUdeviceptr address, cuuint32_t value,
                                        unsigned int flags) {
  SIM_ENTER();
  const auto op = wait_op(CU_STREAM_MEM_OP_WAIT_VALUE_32, address, value, flags);
  return submit_memops(h, &op, 1);
}

CUresult CUDAAPI cuStreamWaitValue64_v2(CUstream h, CUdeviceptr address, cuuint64_t value,
                                        unsigned int flags) {
  SIM_ENTER();
  const auto op = wait_op(CU_STREAM_MEM_OP_WAIT_VALUE_64, address, value, flags);
  return submit_memops(h, &op, 1);
}

CUresult CUDAAPI cuStreamWriteValue32_v2(CUstream h, CUdeviceptr address, cuuint32_t value,
                                         unsigned int flags) {
  SIM_ENTER();
  const auto op = write_op(CU_STREAM_MEM_OP_WRITE_VALUE_32, address, value, flags);
  return submit_memops(h, &op, 1);
}

CUresult CUDAAPI cuStreamWriteValue64_v2(CUstream h, CUdeviceptr address, cuuint64_t value,
                                         unsigned int flags) {
  SIM_ENTER();
  const auto op = write_op(CU_STREAM_MEM_OP_WRITE_VALUE_64, address, value, flags);
  return submit_memops(h, &op, 1);
}

CUresult CUDAAPI cuStreamBatchMemOp_v2(CUstream h, unsigned int count,
                                       CUstreamBatchMemOpParams* ops, unsigned int flags) {
  SIM_ENTER();
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return submit_memops(h, ops, count);
}

// The CUDA 8-11.6 names: the same ABI.
CUresult CUDAAPI cuStreamWaitValue32(CUstream h, CUdeviceptr a, cuuint32_t v, unsigned int f) {
  return cuStreamWaitValue32_v2(h, a, v, f);
}
CUresult CUDAAPI cuStreamWaitValue64(CUstream h, CUdeviceptr a, cuuint64_t v, unsigned int f) {
  return cuStreamWaitValue64_v2(h, a, v, f);
}
CUresult CUDAAPI cuStreamWriteValue32(CUstream h, CUdeviceptr a, cuuint32_t v, unsigned int f) {
  return cuStreamWriteValue32_v2(h, a, v, f);
}
CUresult CUDAAPI cuStreamWriteValue64(CUstream h, CUdeviceptr a, cuuint64_t v, unsigned int f) {
  return cuStreamWriteValue64_v2(h, a, v, f);
}
CUresult CUDAAPI cuStreamBatchMemOp(CUstream h, unsigned int n, CUstreamBatchMemOpParams* ops,
                                    unsigned int f) {
  return cuStreamBatchMemOp_v2(h, n, ops, f);
}
