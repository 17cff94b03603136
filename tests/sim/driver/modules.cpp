// Simulated driver: modules (vaswap_sim_image instead of cubin), functions, kernel launches.
#include <chrono>
#include <cstring>
#include <thread>

#include "state.h"

namespace vsim {

namespace {

std::mutex& module_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::set<Module*>& module_registry() {
  static auto* s = new std::set<Module*>;
  return *s;
}

}  // namespace

Function* lookup_function(CUfunction h) {
  auto* f = reinterpret_cast<Function*>(h);
  return f != nullptr && f->magic == Function::kMagic ? f : nullptr;
}

CUresult make_kernel_node(CUfunction hf, const vaswap_sim_dims& dims, void** params, void** extra,
                          std::unique_ptr<Node>* out) {
  Function* f = lookup_function(hf);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  const vaswap_sim_kernel_desc* d = f->desc;
  if (dims.grid[0] * dims.grid[1] * dims.grid[2] == 0 ||
      dims.block[0] * dims.block[1] * dims.block[2] == 0 ||
      dims.block[0] * dims.block[1] * dims.block[2] > 1024) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto node = std::make_unique<Node>();
  node->type = CU_GRAPH_NODE_TYPE_KERNEL;
  node->function = f;
  node->dims = dims;
  node->args.assign(d->args_bytes, 0);
  if (params != nullptr && extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (params != nullptr) {
    for (uint32_t i = 0; i < d->num_params; ++i) {
      std::memcpy(node->args.data() + d->param_offsets[i], params[i], d->param_sizes[i]);
    }
  } else if (extra != nullptr) {
    const void* buffer = nullptr;
    size_t bytes = 0;
    for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) {
        buffer = extra[i + 1];
      } else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) {
        bytes = *static_cast<const size_t*>(extra[i + 1]);
      } else {
        return CUDA_ERROR_INVALID_VALUE;
      }
    }
    if (buffer == nullptr || bytes < d->args_bytes) return CUDA_ERROR_INVALID_VALUE;
    std::memcpy(node->args.data(), buffer, d->args_bytes);
    node->via_extra = true;
  } else if (d->num_params > 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *out = std::move(node);
  return CUDA_SUCCESS;
}

}  // namespace vsim

using namespace vsim;

CUresult CUDAAPI cuModuleLoadData(CUmodule* module, const void* image) {
  SIM_ENTER();
  if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const auto* img = static_cast<const vaswap_sim_image*>(image);
  if (img->magic != VASWAP_SIM_IMAGE_MAGIC || img->version != VASWAP_SIM_IMAGE_VERSION) {
    return CUDA_ERROR_INVALID_IMAGE;
  }
  int dev = 0;
  SIM_TRY(current_device(&dev));
  const DeviceWideWork loading(dev);
  auto* m = new Module;
  m->image = img;
  for (uint32_t i = 0; i < img->num_kernels; ++i) {
    auto f = std::make_unique<Function>();
    f->desc = &img->kernels[i];
    f->module = m;
    m->functions[img->kernels[i].name] = std::move(f);
  }
  std::lock_guard<std::mutex> lock(module_mutex());
  module_registry().insert(m);
  *module = reinterpret_cast<CUmodule>(m);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleUnload(CUmodule hm) {
  SIM_ENTER();
  std::lock_guard<std::mutex> lock(module_mutex());
  auto* m = reinterpret_cast<Module*>(hm);
  if (module_registry().erase(m) == 0) return CUDA_ERROR_INVALID_HANDLE;
  delete m;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleGetFunction(CUfunction* out, CUmodule hm, const char* name) {
  SIM_ENTER();
  if (out == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  int dev = 0;
  SIM_TRY(current_device(&dev));
  Function* f = nullptr;
  {
    std::lock_guard<std::mutex> lock(module_mutex());
    auto* m = reinterpret_cast<Module*>(hm);
    if (module_registry().count(m) == 0) return CUDA_ERROR_INVALID_HANDLE;
    auto it = m->functions.find(name);
    if (it == m->functions.end()) return CUDA_ERROR_NOT_FOUND;
    f = it->second.get();
    if (f->loaded) {
      *out = reinterpret_cast<CUfunction>(f);
      return CUDA_SUCCESS;
    }
  }
  // Lazy loading (CUDA's default): a function's first lookup loads it.
  const DeviceWideWork loading(dev);
  std::lock_guard<std::mutex> lock(module_mutex());
  f->loaded = true;
  *out = reinterpret_cast<CUfunction>(f);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuFuncGetParamInfo(CUfunction hf, size_t index, size_t* offset, size_t* bytes) {
  SIM_ENTER();
  Function* f = lookup_function(hf);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (index >= f->desc->num_params || offset == nullptr || bytes == nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *offset = f->desc->param_offsets[index];
  *bytes = f->desc->param_sizes[index];
  return CUDA_SUCCESS;
}

// The simulator has no library kernels: a CUkernel is never valid here.
CUresult CUDAAPI cuKernelGetParamInfo(CUkernel, size_t, size_t*, size_t*) {
  SIM_ENTER();
  return CUDA_ERROR_INVALID_HANDLE;
}

CUresult CUDAAPI cuFuncGetName(const char** name, CUfunction hf) {
  SIM_ENTER();
  Function* f = lookup_function(hf);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *name = f->desc->name;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                unsigned int bx, unsigned int by, unsigned int bz,
                                unsigned int shared_bytes, CUstream hs, void** params,
                                void** extra) {
  SIM_ENTER();
  std::unique_ptr<Node> node;
  SIM_TRY(make_kernel_node(f, vaswap_sim_dims{{gx, gy, gz}, {bx, by, bz}, shared_bytes}, params,
                           extra, &node));
  return submit(hs, std::move(node));
}

CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** params,
                                  void** extra) {
  SIM_ENTER();
  if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::unique_ptr<Node> node;
  SIM_TRY(
      make_kernel_node(f,
                       vaswap_sim_dims{{config->gridDimX, config->gridDimY, config->gridDimZ},
                                       {config->blockDimX, config->blockDimY, config->blockDimZ},
                                       config->sharedMemBytes},
                       params, extra, &node));
  return submit(config->hStream, std::move(node));
}
