// The contract between simulated kernels, the simulated runtime and the simulated driver.
//
// A "device image" in the simulator is a vaswap_sim_image instead of a fatbinary: the runtime
// receives it through __cudaRegisterFatBinary (as nvcc-generated code hands a real fatbinary to
// the real runtime) and the driver loads it through cuModuleLoadData. Each kernel is a host
// function plus its parameter layout, so cuFuncGetParamInfo and packed `extra` buffers behave as
// on a GPU.
#ifndef VASWAP_SIM_ABI_H
#define VASWAP_SIM_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VASWAP_SIM_IMAGE_MAGIC 0x4d495356u /* "VSIM" */
#define VASWAP_SIM_IMAGE_VERSION 1u

typedef struct vaswap_sim_dims {
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t shared_bytes;
} vaswap_sim_dims;

/* Runs the whole grid of one launch. `args` is the packed parameter buffer: parameter i lives at
 * param_offsets[i] and spans param_sizes[i] bytes (CUDA's kernel ABI). */
typedef void (*vaswap_sim_kernel_entry)(const void* args, const vaswap_sim_dims* dims);

typedef struct vaswap_sim_kernel_desc {
  const char* name;
  vaswap_sim_kernel_entry entry;
  uint32_t num_params;
  const uint32_t* param_offsets;
  const uint32_t* param_sizes;
  uint32_t args_bytes; /* size of the packed buffer */
} vaswap_sim_kernel_desc;

typedef struct vaswap_sim_image {
  uint32_t magic; /* VASWAP_SIM_IMAGE_MAGIC */
  uint32_t version;
  uint32_t num_kernels;
  const vaswap_sim_kernel_desc* kernels;
} vaswap_sim_image;

/* Layout of the wrapper handed to __cudaRegisterFatBinary: the same shape as nvcc's
 * __fatBinC_Wrapper_t, with our magic and `data` pointing at a vaswap_sim_image. */
typedef struct vaswap_sim_fatbin_wrapper {
  int magic;
  int version;
  const vaswap_sim_image* data;
  void* unused;
} vaswap_sim_fatbin_wrapper;

/* Simulator controls, exported by the simulated libcuda.so.1 and also reachable through
 * cuGetProcAddress (so the simulated runtime needs no link-time dependency on the driver). */

/* Arms a fault: the `nth` call (1 = the next one) of `function` returns `error` instead of running.
 * Counts from the moment of arming. Returns 0, or 1 when the arguments are invalid. Two names are
 * not functions: "device" faults the device at the nth kernel to run (`error` becomes sticky),
 * and "copy_stall" holds the nth copy to run for `error` milliseconds. For a function (driver or
 * runtime), a negative `error` holds its nth call for -error milliseconds, then runs it (a call
 * that blocks). */
int vaswapSimInjectFault(const char* function, unsigned long long nth, int error);
/* Disarms every fault and clears a device fault's sticky error (a test's reset; a GPU needs a new
 * process). */
void vaswapSimClearFaults(void);
/* Counts one call of `function` and returns the armed error for it, or 0. */
int vaswapSimFaultCheck(const char* function);
/* CUDA calls attempted from inside host functions since the process started (each was refused
 * with CUDA_ERROR_NOT_PERMITTED). */
unsigned long long vaswapSimHostFnViolations(void);
/* Physical bytes currently created on a device (handles, cuMemAlloc, async allocations). */
unsigned long long vaswapSimPhysicalBytes(int device);
/* Events created and not yet destroyed, in the whole process (a leak shows as a count that does
 * not return to where it was). */
unsigned long long vaswapSimLiveEvents(void);
/* What CUDA_DEVICE_MAX_CONNECTIONS=1 gives: one hardware queue per device (1), or one per stream
 * (0, the default). Affects work submitted afterwards; set it while the device is idle. */
void vaswapSimSetSingleQueue(int single);
/* Stream memory operations supported (1, the default) or not (0, as VASWAP_SIM_MEMOPS=0). */
void vaswapSimSetMemopsSupported(int supported);
/* Device memory each stream made from now on holds until destroyed (as VASWAP_SIM_STREAM_BYTES;
 * 0, the default, makes streams free). A creation the device cannot hold is out of memory. */
void vaswapSimSetStreamBytes(unsigned long long bytes);
/* Device memory that cuMemGetInfo reports free but no allocation (cuMemCreate, cuMemAlloc*,
 * arrays) can have, from now on (as VASWAP_SIM_HOLDBACK; 0, the default, holds nothing back). */
void vaswapSimSetHoldback(unsigned long long bytes);
/* Pinned host memory cuMemHostAlloc may hold in all, from now on (as VASWAP_SIM_PINNED_LIMIT;
 * ~0, the default, sets no limit): past it every call is out of memory, as on a host whose memory
 * the program's own pinned buffers fill. What is held already stays. */
void vaswapSimSetPinnedLimit(unsigned long long bytes);
/* Pinned host memory cuMemHostAlloc holds now (each allocation rounded up to 4 KiB). */
unsigned long long vaswapSimPinnedBytes(void);

#ifdef __cplusplus
}
#endif

#endif /* VASWAP_SIM_ABI_H */
