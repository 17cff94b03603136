// Probe: while one stream is parked on a wait-value whose flag the host writes, does copy work
// enqueued afterwards on another stream run? (vaswap's device handshake parks the launching
// stream on a restore's flag while a worker enqueues the D2H copies that make room for it.)
// Each case: stream S parks on a flag (and, in some cases, has work queued behind the wait);
// then stream O gets one piece of work and an event; the host waits up to 2 s for the event,
// then writes the flag either way. Prints whether O's work completed while S was parked.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

__global__ void spin(unsigned* p) {
  if (threadIdx.x == 0) atomicAdd(p, 1u);
}

namespace {

constexpr size_t kBytes = 32u << 20;

bool wait_event(cudaEvent_t e, double seconds) {
  const auto start = std::chrono::steady_clock::now();
  while (cudaEventQuery(e) == cudaErrorNotReady) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds)
      return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

}  // namespace

int main() {
  cudaSetDevice(0);
  cudaFree(nullptr);
  const char* connections = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  std::printf("CUDA_DEVICE_MAX_CONNECTIONS=%s\n", connections ? connections : "(unset)");
  unsigned* flag = nullptr;
  cudaHostAlloc(reinterpret_cast<void**>(&flag), 64, cudaHostAllocMapped);
  void* host = nullptr;
  cudaHostAlloc(&host, kBytes, cudaHostAllocDefault);
  void *dev_a = nullptr, *dev_b = nullptr;
  cudaMalloc(&dev_a, kBytes);
  cudaMalloc(&dev_b, kBytes);
  unsigned* counter = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&counter), 4);
  cudaStream_t s, o;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&o, cudaStreamNonBlocking);
  // A graph of one kernel, as the launch behind the wait.
  cudaGraph_t g;
  cudaGraphExec_t x;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
  spin<<<1, 32, 0, s>>>(counter);
  cudaStreamEndCapture(s, &g);
  cudaGraphInstantiate(&x, g, 0);
  cudaEvent_t done;
  cudaEventCreateWithFlags(&done, cudaEventDisableTiming);

  const char* behinds[] = {"nothing", "an eager kernel", "a graph launch", "a D2D copy"};
  const char* works[] = {"D2H copy", "H2D copy", "D2D copy", "kernel"};
  unsigned value = 0;
  for (int behind = 0; behind < 4; ++behind) {
    for (int work = 0; work < 4; ++work) {
      ++value;
      cuStreamWaitValue32(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(flag), value,
                          CU_STREAM_WAIT_VALUE_GEQ);
      if (behind == 1) spin<<<1, 32, 0, s>>>(counter);
      if (behind == 2) cudaGraphLaunch(x, s);
      if (behind == 3) cudaMemcpyAsync(dev_b, dev_a, kBytes, cudaMemcpyDeviceToDevice, s);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      if (work == 0) cudaMemcpyAsync(host, dev_a, kBytes, cudaMemcpyDeviceToHost, o);
      if (work == 1) cudaMemcpyAsync(dev_a, host, kBytes, cudaMemcpyHostToDevice, o);
      if (work == 2) cudaMemcpyAsync(dev_a, dev_b, kBytes, cudaMemcpyDeviceToDevice, o);
      if (work == 3) spin<<<1, 32, 0, o>>>(counter);
      cudaEventRecord(done, o);
      const bool ran = wait_event(done, 2.0);
      __atomic_store_n(flag, value, __ATOMIC_RELEASE);
      cudaStreamSynchronize(s);
      cudaStreamSynchronize(o);
      std::printf("S parked, %-15s behind the wait; O's %-9s %s\n", behinds[behind], works[work],
                  ran ? "ran" : "DID NOT RUN until the flag was written");
    }
  }
  std::printf("last error: %s\n", cudaGetErrorName(cudaGetLastError()));
  return 0;
}
