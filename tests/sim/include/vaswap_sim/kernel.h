// One kernel source for a real GPU and for the simulated device.
//
//   VSK_GLOBAL void scale(float* y, const float* x, float a, uint32_t n) {
//     VSK_FOR(i, n) { y[i] = a * x[i]; }
//   }
//   VSK_REGISTER(scale)
//
// A helper the kernels call is declared VSK_DEVICE (a __device__ function under nvcc).
//
//   void* args[] = {&y, &x, &a, &n};
//   cudaLaunchKernel((const void*)scale, grid, block, args, 0, stream);
//
// Under nvcc the kernel is an ordinary __global__ function with a grid-stride loop. Under a host
// compiler it is a host function that the simulated driver runs once per launch (the loop covers
// the whole grid); VSK_REGISTER registers it with its parameter layout through
// __cudaRegisterFatBinary / __cudaRegisterFunction, exactly as nvcc's generated code registers a
// real kernel, so the program links against the real libcudart and runs on the simulator when
// LD_LIBRARY_PATH selects it. Only element-wise kernels fit this model: no shared memory, no
// barriers, no atomics across iterations.
#ifndef VASWAP_SIM_KERNEL_H
#define VASWAP_SIM_KERNEL_H

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)

#define VSK_GLOBAL __global__
#define VSK_DEVICE __device__ inline
#define VSK_FOR(i, n)                                                             \
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)(n); \
       i += (size_t)blockDim.x * gridDim.x)
#define VSK_REGISTER(kernel)

#else  // host compiler: the simulated device

#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include <vector_types.h>

#include "vaswap_sim/abi.h"

extern "C" {
void** __cudaRegisterFatBinary(void* fatCubin);
void __cudaRegisterFatBinaryEnd(void** fatCubinHandle);
void __cudaRegisterFunction(void** fatCubinHandle, const char* hostFun, char* deviceFun,
                            const char* deviceName, int thread_limit, uint3* tid, uint3* bid,
                            dim3* bDim, dim3* gDim, int* wSize);
}

#define VSK_GLOBAL
#define VSK_DEVICE inline
#define VSK_FOR(i, n) for (size_t i = 0; i < (size_t)(n); ++i)
#define VSK_REGISTER(kernel)                                                                     \
  static const ::vaswap_sim::KernelRegistrar<decltype(&kernel), &kernel> vsk_registrar_##kernel{ \
      #kernel};

namespace vaswap_sim {

template <class F, F Fn>
struct KernelRegistrar;

// CUDA's kernel ABI: each parameter at the next offset aligned to its own alignment.
template <class... Args>
struct ParamLayout {
  static constexpr size_t count = sizeof...(Args);
  uint32_t offsets[count ? count : 1] = {};
  uint32_t sizes[count ? count : 1] = {};
  uint32_t bytes = 0;
  constexpr ParamLayout() {
    const size_t sz[] = {sizeof(Args)..., 0};
    const size_t al[] = {alignof(Args)..., 1};
    size_t at = 0;
    for (size_t i = 0; i < count; ++i) {
      at = (at + al[i] - 1) / al[i] * al[i];
      offsets[i] = static_cast<uint32_t>(at);
      sizes[i] = static_cast<uint32_t>(sz[i]);
      at += sz[i];
    }
    bytes = static_cast<uint32_t>(at);
  }
};

template <class... Args, void (*Fn)(Args...)>
struct KernelRegistrar<void (*)(Args...), Fn> {
  static constexpr ParamLayout<std::decay_t<Args>...> layout{};

  template <class T>
  static T load(const void* args, size_t i) {
    T value;
    std::memcpy(static_cast<void*>(&value), static_cast<const char*>(args) + layout.offsets[i],
                sizeof(T));
    return value;
  }
  template <size_t... I>
  static void call(const void* args, std::index_sequence<I...>) {
    Fn(load<std::decay_t<Args> >(args, I)...);
  }
  static void entry(const void* args, const vaswap_sim_dims*) {
    call(args, std::index_sequence_for<Args...>{});
  }

  explicit KernelRegistrar(const char* name) {
    desc_ = {name,           &entry,       static_cast<uint32_t>(sizeof...(Args)),
             layout.offsets, layout.sizes, layout.bytes};
    image_ = {VASWAP_SIM_IMAGE_MAGIC, VASWAP_SIM_IMAGE_VERSION, 1, &desc_};
    wrapper_ = {static_cast<int>(VASWAP_SIM_IMAGE_MAGIC), 1, &image_, nullptr};
    void** handle = __cudaRegisterFatBinary(&wrapper_);
    __cudaRegisterFunction(handle, reinterpret_cast<const char*>(Fn), const_cast<char*>(name), name,
                           -1, nullptr, nullptr, nullptr, nullptr, nullptr);
    __cudaRegisterFatBinaryEnd(handle);
  }

 private:
  vaswap_sim_kernel_desc desc_{};
  vaswap_sim_image image_{};
  vaswap_sim_fatbin_wrapper wrapper_{};
};

}  // namespace vaswap_sim

#endif  // __CUDACC__
#endif  // VASWAP_SIM_KERNEL_H
