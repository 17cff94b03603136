// The simulated runtime: kernels registered like nvcc's, errors, devices, and its path to the
// driver through cuGetProcAddress.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include "sim_test.h"
#include "vaswap_sim/kernel.h"

VSK_GLOBAL void rt_scale(uint32_t* y, const uint32_t* x, uint32_t a, uint32_t n) {
  VSK_FOR(i, n) { y[i] = a * x[i]; }
}
VSK_REGISTER(rt_scale)

VSK_GLOBAL void rt_mixed(uint8_t tag, double d, uint32_t* out) {
  out[0] = tag + static_cast<uint32_t>(d);
}
VSK_REGISTER(rt_mixed)

namespace {

#define ASSERT_RT(call) ASSERT_EQ(cudaSuccess, (call)) << #call << " -> " << cudaGetErrorName(call)

class RuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_RT(cudaSetDevice(0));
    vaswapSimClearFaults();
    cudaGetLastError();
  }
  void TearDown() override { vaswapSimClearFaults(); }
};

TEST_F(RuntimeTest, LaunchesAKernelRegisteredLikeNvccDoes) {
  uint32_t *x = nullptr, *y = nullptr;
  ASSERT_RT(cudaMalloc(reinterpret_cast<void**>(&x), 1000 * sizeof(uint32_t)));
  ASSERT_RT(cudaMalloc(reinterpret_cast<void**>(&y), 1000 * sizeof(uint32_t)));
  std::vector<uint32_t> host(1000);
  for (uint32_t i = 0; i < 1000; ++i) host[i] = i;
  ASSERT_RT(cudaMemcpy(x, host.data(), 4000, cudaMemcpyHostToDevice));
  uint32_t a = 3, n = 1000;
  void* args[] = {&y, &x, &a, &n};
  ASSERT_RT(cudaLaunchKernel(reinterpret_cast<const void*>(rt_scale), dim3(4), dim3(256), args, 0,
                             nullptr));
  ASSERT_RT(cudaMemcpy(host.data(), y, 4000, cudaMemcpyDeviceToHost));
  for (uint32_t i = 0; i < 1000; ++i) ASSERT_EQ(3 * i, host[i]);
  ASSERT_RT(cudaFree(x));
  ASSERT_RT(cudaFree(y));
}

TEST_F(RuntimeTest, KernelParametersFollowTheCudaAbiLayout) {
  uint32_t* out = nullptr;
  ASSERT_RT(cudaMallocHost(reinterpret_cast<void**>(&out), sizeof(uint32_t)));
  uint8_t tag = 7;
  double d = 35.0;
  void* args[] = {&tag, &d, &out};
  cudaStream_t s = nullptr;
  ASSERT_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(1);
  config.blockDim = dim3(1);
  config.stream = s;
  ASSERT_RT(cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(rt_mixed), args));
  ASSERT_RT(cudaStreamSynchronize(s));
  EXPECT_EQ(42u, *out);
  ASSERT_RT(cudaStreamDestroy(s));
  ASSERT_RT(cudaFreeHost(out));
}

TEST_F(RuntimeTest, UnregisteredFunctionIsAnInvalidDeviceFunction) {
  int not_a_kernel = 0;
  EXPECT_EQ(cudaErrorInvalidDeviceFunction,
            cudaLaunchKernel(&not_a_kernel, dim3(1), dim3(1), nullptr, 0, nullptr));
  EXPECT_EQ(cudaErrorInvalidDeviceFunction, cudaGetLastError());
  EXPECT_EQ(cudaSuccess, cudaGetLastError()) << "cudaGetLastError resets";
}

TEST_F(RuntimeTest, PeekKeepsTheLastErrorAndNamesDescribeIt) {
  EXPECT_EQ(cudaErrorInvalidDevice, cudaSetDevice(7));
  EXPECT_EQ(cudaErrorInvalidDevice, cudaPeekAtLastError());
  EXPECT_EQ(cudaErrorInvalidDevice, cudaPeekAtLastError());
  EXPECT_STREQ("cudaErrorInvalidDevice", cudaGetErrorName(cudaErrorInvalidDevice));
  EXPECT_STREQ("invalid device ordinal", cudaGetErrorString(cudaErrorInvalidDevice));
  EXPECT_STREQ("unrecognized error code", cudaGetErrorString(static_cast<cudaError_t>(12345)));
  cudaGetLastError();
}

TEST_F(RuntimeTest, InjectedFaultOnARuntimeCallReturnsTheChosenError) {
  ASSERT_EQ(0, vaswapSimInjectFault("cudaMalloc", 1, cudaErrorMemoryAllocation));
  void* p = nullptr;
  EXPECT_EQ(cudaErrorMemoryAllocation, cudaMalloc(&p, 4096));
  ASSERT_RT(cudaMalloc(&p, 4096));
  ASSERT_RT(cudaFree(p));
}

TEST_F(RuntimeTest, RuntimeCallsReachTheDriverThroughItsResolvedEntryPoints) {
  // cudaMalloc runs the driver's cuMemAlloc_v2, the function cuGetProcAddress returned for
  // "cuMemAlloc": a fault armed on that symbol surfaces as the runtime's error.
  ASSERT_EQ(0, vaswapSimInjectFault("cuMemAlloc_v2", 1, CUDA_ERROR_OUT_OF_MEMORY));
  void* p = nullptr;
  EXPECT_EQ(cudaErrorMemoryAllocation, cudaMalloc(&p, 4096));
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored \
    "-Wdeprecated-declarations"  // deprecated, yet programs still call it
  ASSERT_RT(cudaGetDriverEntryPoint("cuMemAlloc", &fn, cudaEnableDefault, &status));
#pragma GCC diagnostic pop
  EXPECT_EQ(cudaDriverEntryPointSuccess, status);
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(nullptr, lib);
  EXPECT_EQ(dlsym(lib, "cuMemAlloc_v2"), fn);
  ASSERT_RT(cudaGetDriverEntryPointByVersion("cuLaunchKernel", &fn, 13000,
                                             cudaEnablePerThreadDefaultStream, &status));
  EXPECT_EQ(dlsym(lib, "cuLaunchKernel_ptsz"), fn);
  dlclose(lib);
}

TEST_F(RuntimeTest, SetDeviceSelectsWhereMemoryLives) {
  ASSERT_RT(cudaSetDevice(1));
  size_t free_bytes = 0, total = 0;
  ASSERT_RT(cudaMemGetInfo(&free_bytes, &total));
  EXPECT_EQ(512 * kMiB, total);
  void* p = nullptr;
  ASSERT_RT(cudaMalloc(&p, 3 * kMiB));
  size_t after = 0;
  ASSERT_RT(cudaMemGetInfo(&after, &total));
  EXPECT_EQ(free_bytes - 4 * kMiB, after);
  cudaPointerAttributes attr{};
  ASSERT_RT(cudaPointerGetAttributes(&attr, p));
  EXPECT_EQ(cudaMemoryTypeDevice, attr.type);
  EXPECT_EQ(1, attr.device);
  ASSERT_RT(cudaFree(p));
  int device = -1;
  ASSERT_RT(cudaGetDevice(&device));
  EXPECT_EQ(1, device);
  int count = 0;
  ASSERT_RT(cudaGetDeviceCount(&count));
  EXPECT_EQ(2, count);
  ASSERT_RT(cudaSetDevice(0));
}

TEST_F(RuntimeTest, CaptureAndReplayThroughTheRuntime) {
  cudaStream_t s = nullptr;
  ASSERT_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  uint32_t *x = nullptr, *y = nullptr;
  ASSERT_RT(cudaMalloc(reinterpret_cast<void**>(&x), 64 * sizeof(uint32_t)));
  ASSERT_RT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  ASSERT_RT(cudaThreadExchangeStreamCaptureMode(&mode));
  ASSERT_RT(cudaMalloc(reinterpret_cast<void**>(&y), 64 * sizeof(uint32_t)));  // PyTorch-style
  ASSERT_RT(cudaThreadExchangeStreamCaptureMode(&mode));
  uint32_t a = 2, n = 64;
  void* args[] = {&y, &x, &a, &n};
  ASSERT_RT(
      cudaLaunchKernel(reinterpret_cast<const void*>(rt_scale), dim3(1), dim3(64), args, 0, s));
  cudaGraph_t g = nullptr;
  ASSERT_RT(cudaStreamEndCapture(s, &g));
  cudaGraphNode_t node = nullptr;
  size_t count = 1;
  ASSERT_RT(cudaGraphGetNodes(g, &node, &count));
  cudaKernelNodeParams p{};
  ASSERT_RT(cudaGraphKernelNodeGetParams(node, &p));
  EXPECT_EQ(reinterpret_cast<void*>(rt_scale), p.func) << "the runtime maps back to the host stub";
  cudaGraphExec_t exec = nullptr;
  ASSERT_RT(cudaGraphInstantiate(&exec, g, 0));
  for (uint32_t round = 1; round <= 3; ++round) {
    ASSERT_RT(cudaMemsetAsync(x, static_cast<int>(round), 64 * sizeof(uint32_t), s));
    ASSERT_RT(cudaGraphLaunch(exec, s));
    uint32_t last = 0;
    ASSERT_RT(cudaMemcpyAsync(&last, y + 63, sizeof(last), cudaMemcpyDeviceToHost, s));
    ASSERT_RT(cudaStreamSynchronize(s));
    EXPECT_EQ(2u * round * 0x01010101u, last);
  }
  ASSERT_RT(cudaGraphExecDestroy(exec));
  ASSERT_RT(cudaGraphDestroy(g));
  ASSERT_RT(cudaFree(x));
  ASSERT_RT(cudaFree(y));
  ASSERT_RT(cudaStreamDestroy(s));
}

}  // namespace
