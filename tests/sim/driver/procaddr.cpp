// Simulated driver: per-thread-default-stream entry points and cuGetProcAddress.
//
// The runtime (real or simulated) reaches every driver function through cuGetProcAddress, asking
// for a base name ("cuMemAlloc") and its CUDA version; the driver answers with the newest ABI
// revision not newer than that version (cuMemAlloc_v2), and with the _ptsz/_ptds twin when asked
// for per-thread default-stream semantics. The table below is the single list of what the
// simulated driver offers.
#include <algorithm>
#include <cstring>

#include "state.h"

using namespace vsim;

// -----------------------------------------------------------------------------------------------
// _ptsz / _ptds twins: the same call, with the null stream meaning the per-thread stream.
// -----------------------------------------------------------------------------------------------

#define SIM_PER_THREAD(twin, impl, params, args) \
  CUresult CUDAAPI twin params {                 \
    PerThreadScope scope;                        \
    return impl args;                            \
  }

SIM_PER_THREAD(cuMemcpy_ptds, cuMemcpy, (CUdeviceptr d, CUdeviceptr s, size_t n), (d, s, n))
SIM_PER_THREAD(cuMemcpyHtoD_v2_ptds, cuMemcpyHtoD_v2, (CUdeviceptr d, const void* s, size_t n),
               (d, s, n))
SIM_PER_THREAD(cuMemcpyDtoH_v2_ptds, cuMemcpyDtoH_v2, (void* d, CUdeviceptr s, size_t n), (d, s, n))
SIM_PER_THREAD(cuMemcpyDtoD_v2_ptds, cuMemcpyDtoD_v2, (CUdeviceptr d, CUdeviceptr s, size_t n),
               (d, s, n))
SIM_PER_THREAD(cuMemsetD8_v2_ptds, cuMemsetD8_v2, (CUdeviceptr d, unsigned char v, size_t n),
               (d, v, n))
SIM_PER_THREAD(cuMemsetD32_v2_ptds, cuMemsetD32_v2, (CUdeviceptr d, unsigned int v, size_t n),
               (d, v, n))
SIM_PER_THREAD(cuMemcpyAsync_ptsz, cuMemcpyAsync,
               (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream h), (d, s, n, h))
SIM_PER_THREAD(cuMemcpyHtoDAsync_v2_ptsz, cuMemcpyHtoDAsync_v2,
               (CUdeviceptr d, const void* s, size_t n, CUstream h), (d, s, n, h))
SIM_PER_THREAD(cuMemcpyDtoHAsync_v2_ptsz, cuMemcpyDtoHAsync_v2,
               (void* d, CUdeviceptr s, size_t n, CUstream h), (d, s, n, h))
SIM_PER_THREAD(cuMemcpyDtoDAsync_v2_ptsz, cuMemcpyDtoDAsync_v2,
               (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream h), (d, s, n, h))
SIM_PER_THREAD(cuMemsetD8Async_ptsz, cuMemsetD8Async,
               (CUdeviceptr d, unsigned char v, size_t n, CUstream h), (d, v, n, h))
SIM_PER_THREAD(cuMemsetD32Async_ptsz, cuMemsetD32Async,
               (CUdeviceptr d, unsigned int v, size_t n, CUstream h), (d, v, n, h))
SIM_PER_THREAD(cuMemcpy2D_v2_ptds, cuMemcpy2D_v2, (const CUDA_MEMCPY2D* p), (p))
SIM_PER_THREAD(cuMemcpy2DAsync_v2_ptsz, cuMemcpy2DAsync_v2, (const CUDA_MEMCPY2D* p, CUstream h),
               (p, h))
SIM_PER_THREAD(cuMemcpy3D_v2_ptds, cuMemcpy3D_v2, (const CUDA_MEMCPY3D* p), (p))
SIM_PER_THREAD(cuMemcpy3DAsync_v2_ptsz, cuMemcpy3DAsync_v2, (const CUDA_MEMCPY3D* p, CUstream h),
               (p, h))
SIM_PER_THREAD(cuMemcpy3DPeer_ptds, cuMemcpy3DPeer, (const CUDA_MEMCPY3D_PEER* p), (p))
SIM_PER_THREAD(cuMemcpy3DPeerAsync_ptsz, cuMemcpy3DPeerAsync,
               (const CUDA_MEMCPY3D_PEER* p, CUstream h), (p, h))
SIM_PER_THREAD(cuMemcpyPeer_ptds, cuMemcpyPeer,
               (CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n),
               (d, dc, s, sc, n))
SIM_PER_THREAD(cuMemcpyPeerAsync_ptsz, cuMemcpyPeerAsync,
               (CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n, CUstream h),
               (d, dc, s, sc, n, h))
SIM_PER_THREAD(cuMemcpyBatchAsync_v2_ptsz, cuMemcpyBatchAsync_v2,
               (CUdeviceptr * d, CUdeviceptr* s, size_t* n, size_t c, CUmemcpyAttributes* a,
                size_t* i, size_t na, CUstream h),
               (d, s, n, c, a, i, na, h))
SIM_PER_THREAD(cuMemcpy3DBatchAsync_v2_ptsz, cuMemcpy3DBatchAsync_v2,
               (size_t c, CUDA_MEMCPY3D_BATCH_OP* o, unsigned long long f, CUstream h),
               (c, o, f, h))
SIM_PER_THREAD(cuMemcpyDtoA_v2_ptds, cuMemcpyDtoA_v2,
               (CUarray a, size_t o, CUdeviceptr s, size_t n), (a, o, s, n))
SIM_PER_THREAD(cuMemcpyAtoD_v2_ptds, cuMemcpyAtoD_v2,
               (CUdeviceptr d, CUarray a, size_t o, size_t n), (d, a, o, n))
SIM_PER_THREAD(cuMemsetD16_v2_ptds, cuMemsetD16_v2, (CUdeviceptr d, unsigned short v, size_t n),
               (d, v, n))
SIM_PER_THREAD(cuMemsetD16Async_ptsz, cuMemsetD16Async,
               (CUdeviceptr d, unsigned short v, size_t n, CUstream h), (d, v, n, h))
SIM_PER_THREAD(cuMemsetD2D8_v2_ptds, cuMemsetD2D8_v2,
               (CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h), (d, p, v, w, h))
SIM_PER_THREAD(cuMemsetD2D16_v2_ptds, cuMemsetD2D16_v2,
               (CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h), (d, p, v, w, h))
SIM_PER_THREAD(cuMemsetD2D32_v2_ptds, cuMemsetD2D32_v2,
               (CUdeviceptr d, size_t p, unsigned int v, size_t w, size_t h), (d, p, v, w, h))
SIM_PER_THREAD(cuMemsetD2D8Async_ptsz, cuMemsetD2D8Async,
               (CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h, CUstream s),
               (d, p, v, w, h, s))
SIM_PER_THREAD(cuMemsetD2D16Async_ptsz, cuMemsetD2D16Async,
               (CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h, CUstream s),
               (d, p, v, w, h, s))
SIM_PER_THREAD(cuMemsetD2D32Async_ptsz, cuMemsetD2D32Async,
               (CUdeviceptr d, size_t p, unsigned int v, size_t w, size_t h, CUstream s),
               (d, p, v, w, h, s))
SIM_PER_THREAD(cuMemAllocAsync_ptsz, cuMemAllocAsync, (CUdeviceptr * d, size_t n, CUstream h),
               (d, n, h))
SIM_PER_THREAD(cuMemFreeAsync_ptsz, cuMemFreeAsync, (CUdeviceptr d, CUstream h), (d, h))
SIM_PER_THREAD(cuStreamSynchronize_ptsz, cuStreamSynchronize, (CUstream h), (h))
SIM_PER_THREAD(cuStreamQuery_ptsz, cuStreamQuery, (CUstream h), (h))
SIM_PER_THREAD(cuStreamWaitEvent_ptsz, cuStreamWaitEvent, (CUstream h, CUevent e, unsigned f),
               (h, e, f))
SIM_PER_THREAD(cuStreamGetFlags_ptsz, cuStreamGetFlags, (CUstream h, unsigned* f), (h, f))
SIM_PER_THREAD(cuStreamGetPriority_ptsz, cuStreamGetPriority, (CUstream h, int* p), (h, p))
SIM_PER_THREAD(cuStreamGetId_ptsz, cuStreamGetId, (CUstream h, unsigned long long* id), (h, id))
SIM_PER_THREAD(cuStreamGetDevice_ptsz, cuStreamGetDevice, (CUstream h, CUdevice* d), (h, d))
SIM_PER_THREAD(cuStreamGetCtx_ptsz, cuStreamGetCtx, (CUstream h, CUcontext* c), (h, c))
SIM_PER_THREAD(cuEventRecord_ptsz, cuEventRecord, (CUevent e, CUstream h), (e, h))
SIM_PER_THREAD(cuEventRecordWithFlags_ptsz, cuEventRecordWithFlags,
               (CUevent e, CUstream h, unsigned f), (e, h, f))
SIM_PER_THREAD(cuLaunchKernel_ptsz, cuLaunchKernel,
               (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                unsigned bz, unsigned shm, CUstream h, void** p, void** x),
               (f, gx, gy, gz, bx, by, bz, shm, h, p, x))
SIM_PER_THREAD(cuLaunchKernelEx_ptsz, cuLaunchKernelEx,
               (const CUlaunchConfig* c, CUfunction f, void** p, void** x), (c, f, p, x))
SIM_PER_THREAD(cuLaunchHostFunc_ptsz, cuLaunchHostFunc, (CUstream h, CUhostFn fn, void* d),
               (h, fn, d))
SIM_PER_THREAD(cuStreamBeginCapture_v2_ptsz, cuStreamBeginCapture_v2,
               (CUstream h, CUstreamCaptureMode m), (h, m))
SIM_PER_THREAD(cuStreamBeginCaptureToGraph_ptsz, cuStreamBeginCaptureToGraph,
               (CUstream h, CUgraph g, const CUgraphNode* d, const CUgraphEdgeData* e, size_t n,
                CUstreamCaptureMode m),
               (h, g, d, e, n, m))
SIM_PER_THREAD(cuStreamEndCapture_ptsz, cuStreamEndCapture, (CUstream h, CUgraph* g), (h, g))
SIM_PER_THREAD(cuStreamIsCapturing_ptsz, cuStreamIsCapturing,
               (CUstream h, CUstreamCaptureStatus* s), (h, s))
SIM_PER_THREAD(cuStreamGetCaptureInfo_v3_ptsz, cuStreamGetCaptureInfo_v3,
               (CUstream h, CUstreamCaptureStatus* s, cuuint64_t* id, CUgraph* g,
                const CUgraphNode** d, const CUgraphEdgeData** e, size_t* n),
               (h, s, id, g, d, e, n))
SIM_PER_THREAD(cuGraphLaunch_ptsz, cuGraphLaunch, (CUgraphExec g, CUstream h), (g, h))
SIM_PER_THREAD(cuStreamWaitValue32_v2_ptsz, cuStreamWaitValue32_v2,
               (CUstream h, CUdeviceptr a, cuuint32_t v, unsigned f), (h, a, v, f))
SIM_PER_THREAD(cuStreamWaitValue64_v2_ptsz, cuStreamWaitValue64_v2,
               (CUstream h, CUdeviceptr a, cuuint64_t v, unsigned f), (h, a, v, f))
SIM_PER_THREAD(cuStreamWriteValue32_v2_ptsz, cuStreamWriteValue32_v2,
               (CUstream h, CUdeviceptr a, cuuint32_t v, unsigned f), (h, a, v, f))
SIM_PER_THREAD(cuStreamWriteValue64_v2_ptsz, cuStreamWriteValue64_v2,
               (CUstream h, CUdeviceptr a, cuuint64_t v, unsigned f), (h, a, v, f))
SIM_PER_THREAD(cuStreamBatchMemOp_v2_ptsz, cuStreamBatchMemOp_v2,
               (CUstream h, unsigned n, CUstreamBatchMemOpParams* p, unsigned f), (h, n, p, f))
SIM_PER_THREAD(cuGraphUpload_ptsz, cuGraphUpload, (CUgraphExec g, CUstream h), (g, h))
SIM_PER_THREAD(cuGraphInstantiateWithParams_ptsz, cuGraphInstantiateWithParams,
               (CUgraphExec * e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS* p), (e, g, p))

CUresult CUDAAPI cuGetExportTable(const void** table, const CUuuid* id) {
  (void)id;
  if (table != nullptr) *table = nullptr;
  return CUDA_ERROR_NOT_SUPPORTED;  // the private tables of NVIDIA's runtime do not exist here
}

// -----------------------------------------------------------------------------------------------
// The table
// -----------------------------------------------------------------------------------------------

namespace {

struct Entry {
  const char* name;  // base name, as cuGetProcAddress is asked for it
  int version;       // the CUDA version that introduced this ABI revision
  void* fn;          // legacy default-stream semantics
  void* per_thread;  // _ptsz/_ptds twin, or nullptr when the call takes no stream
};

#define FN(f) reinterpret_cast<void*>(&(f))
#define E(name, version, f) \
  { name, version, FN(f), nullptr }
#define EP(name, version, f, twin) \
  { name, version, FN(f), FN(twin) }

const Entry kEntries[] = {
    E("cuInit", 2000, cuInit),
    E("cuDriverGetVersion", 2020, cuDriverGetVersion),
    E("cuGetProcAddress", 11030, cuGetProcAddress),
    E("cuGetProcAddress", 12000, cuGetProcAddress_v2),
    E("cuGetExportTable", 3000, cuGetExportTable),
    E("cuGetErrorName", 6000, cuGetErrorName),
    E("cuGetErrorString", 6000, cuGetErrorString),
    E("cuDeviceGet", 2000, cuDeviceGet),
    E("cuDeviceGetCount", 2000, cuDeviceGetCount),
    E("cuDeviceGetName", 2000, cuDeviceGetName),
    E("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    E("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    E("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
    E("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    E("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    E("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState),
    E("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    E("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    E("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
    E("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
    E("cuCtxGetDevice", 2000, cuCtxGetDevice),
    E("cuDeviceCanAccessPeer", 4000, cuDeviceCanAccessPeer),
    E("cuCtxEnablePeerAccess", 4000, cuCtxEnablePeerAccess),
    E("cuCtxGetDevice", 13000, cuCtxGetDevice_v2),
    E("cuCtxSynchronize", 2000, cuCtxSynchronize),
    E("cuCtxSynchronize", 13000, cuCtxSynchronize_v2),
    E("cuMemAlloc", 3020, cuMemAlloc_v2),
    E("cuMemFree", 3020, cuMemFree_v2),
    EP("cuMemAllocAsync", 11020, cuMemAllocAsync, cuMemAllocAsync_ptsz),
    EP("cuMemFreeAsync", 11020, cuMemFreeAsync, cuMemFreeAsync_ptsz),
    E("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    E("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2),
    E("cuMemHostAlloc", 2020, cuMemHostAlloc),
    E("cuMemAllocHost", 3020, cuMemAllocHost_v2),
    E("cuMemFreeHost", 2000, cuMemFreeHost),
    E("cuMemHostGetFlags", 2030, cuMemHostGetFlags),
    E("cuMemHostGetDevicePointer", 3020, cuMemHostGetDevicePointer_v2),
    E("cuPointerGetAttribute", 4000, cuPointerGetAttribute),
    E("cuPointerGetAttributes", 7000, cuPointerGetAttributes),
    E("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    E("cuMemAddressReserve", 10020, cuMemAddressReserve),
    E("cuMemAddressFree", 10020, cuMemAddressFree),
    E("cuMemCreate", 10020, cuMemCreate),
    E("cuMemRelease", 10020, cuMemRelease),
    E("cuMemMap", 10020, cuMemMap),
    E("cuMemUnmap", 10020, cuMemUnmap),
    E("cuMemSetAccess", 10020, cuMemSetAccess),
    E("cuMemGetAllocationPropertiesFromHandle", 10020, cuMemGetAllocationPropertiesFromHandle),
    EP("cuMemcpy", 4000, cuMemcpy, cuMemcpy_ptds),
    EP("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds),
    EP("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds),
    EP("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds),
    EP("cuMemcpyAsync", 4000, cuMemcpyAsync, cuMemcpyAsync_ptsz),
    EP("cuMemcpyHtoDAsync", 3020, cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz),
    EP("cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz),
    EP("cuMemcpyDtoDAsync", 3020, cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz),
    EP("cuMemsetD8", 3020, cuMemsetD8_v2, cuMemsetD8_v2_ptds),
    EP("cuMemsetD32", 3020, cuMemsetD32_v2, cuMemsetD32_v2_ptds),
    EP("cuMemsetD8Async", 3020, cuMemsetD8Async, cuMemsetD8Async_ptsz),
    EP("cuMemsetD32Async", 3020, cuMemsetD32Async, cuMemsetD32Async_ptsz),
    EP("cuMemcpy2D", 3020, cuMemcpy2D_v2, cuMemcpy2D_v2_ptds),
    EP("cuMemcpy2DAsync", 3020, cuMemcpy2DAsync_v2, cuMemcpy2DAsync_v2_ptsz),
    EP("cuMemcpy3D", 3020, cuMemcpy3D_v2, cuMemcpy3D_v2_ptds),
    EP("cuMemcpy3DAsync", 3020, cuMemcpy3DAsync_v2, cuMemcpy3DAsync_v2_ptsz),
    EP("cuMemcpy3DPeer", 4000, cuMemcpy3DPeer, cuMemcpy3DPeer_ptds),
    EP("cuMemcpy3DPeerAsync", 4000, cuMemcpy3DPeerAsync, cuMemcpy3DPeerAsync_ptsz),
    EP("cuMemcpyPeer", 4000, cuMemcpyPeer, cuMemcpyPeer_ptds),
    EP("cuMemcpyPeerAsync", 4000, cuMemcpyPeerAsync, cuMemcpyPeerAsync_ptsz),
    E("cuMemcpyBatchAsync", 12080, cuMemcpyBatchAsync_sim_v1),
    EP("cuMemcpyBatchAsync", 13000, cuMemcpyBatchAsync_v2, cuMemcpyBatchAsync_v2_ptsz),
    E("cuMemcpy3DBatchAsync", 12080, cuMemcpy3DBatchAsync_sim_v1),
    EP("cuMemcpy3DBatchAsync", 13000, cuMemcpy3DBatchAsync_v2, cuMemcpy3DBatchAsync_v2_ptsz),
    EP("cuMemcpyDtoA", 3020, cuMemcpyDtoA_v2, cuMemcpyDtoA_v2_ptds),
    EP("cuMemcpyAtoD", 3020, cuMemcpyAtoD_v2, cuMemcpyAtoD_v2_ptds),
    E("cuArrayCreate", 3020, cuArrayCreate_v2),
    E("cuArrayDestroy", 2000, cuArrayDestroy),
    EP("cuMemsetD16", 3020, cuMemsetD16_v2, cuMemsetD16_v2_ptds),
    EP("cuMemsetD16Async", 3020, cuMemsetD16Async, cuMemsetD16Async_ptsz),
    EP("cuMemsetD2D8", 3020, cuMemsetD2D8_v2, cuMemsetD2D8_v2_ptds),
    EP("cuMemsetD2D16", 3020, cuMemsetD2D16_v2, cuMemsetD2D16_v2_ptds),
    EP("cuMemsetD2D32", 3020, cuMemsetD2D32_v2, cuMemsetD2D32_v2_ptds),
    EP("cuMemsetD2D8Async", 3020, cuMemsetD2D8Async, cuMemsetD2D8Async_ptsz),
    EP("cuMemsetD2D16Async", 3020, cuMemsetD2D16Async, cuMemsetD2D16Async_ptsz),
    EP("cuMemsetD2D32Async", 3020, cuMemsetD2D32Async, cuMemsetD2D32Async_ptsz),
    E("cuStreamCreate", 2000, cuStreamCreate),
    E("cuStreamCreateWithPriority", 5050, cuStreamCreateWithPriority),
    E("cuStreamDestroy", 4000, cuStreamDestroy_v2),
    EP("cuStreamSynchronize", 2000, cuStreamSynchronize, cuStreamSynchronize_ptsz),
    EP("cuStreamQuery", 2000, cuStreamQuery, cuStreamQuery_ptsz),
    EP("cuStreamWaitEvent", 3020, cuStreamWaitEvent, cuStreamWaitEvent_ptsz),
    EP("cuStreamGetFlags", 5050, cuStreamGetFlags, cuStreamGetFlags_ptsz),
    EP("cuStreamGetPriority", 5050, cuStreamGetPriority, cuStreamGetPriority_ptsz),
    EP("cuStreamGetId", 12000, cuStreamGetId, cuStreamGetId_ptsz),
    EP("cuStreamGetDevice", 12080, cuStreamGetDevice, cuStreamGetDevice_ptsz),
    EP("cuStreamGetCtx", 9020, cuStreamGetCtx, cuStreamGetCtx_ptsz),
    EP("cuLaunchHostFunc", 10000, cuLaunchHostFunc, cuLaunchHostFunc_ptsz),
    EP("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz),
    EP("cuStreamBeginCaptureToGraph", 12030, cuStreamBeginCaptureToGraph,
       cuStreamBeginCaptureToGraph_ptsz),
    EP("cuStreamEndCapture", 10000, cuStreamEndCapture, cuStreamEndCapture_ptsz),
    EP("cuStreamIsCapturing", 10000, cuStreamIsCapturing, cuStreamIsCapturing_ptsz),
    EP("cuStreamGetCaptureInfo", 12030, cuStreamGetCaptureInfo_v3, cuStreamGetCaptureInfo_v3_ptsz),
    E("cuThreadExchangeStreamCaptureMode", 10010, cuThreadExchangeStreamCaptureMode),
    E("cuEventCreate", 2000, cuEventCreate),
    E("cuEventDestroy", 4000, cuEventDestroy_v2),
    EP("cuEventRecord", 2000, cuEventRecord, cuEventRecord_ptsz),
    EP("cuEventRecordWithFlags", 11010, cuEventRecordWithFlags, cuEventRecordWithFlags_ptsz),
    E("cuEventQuery", 2000, cuEventQuery),
    E("cuEventSynchronize", 2000, cuEventSynchronize),
    E("cuEventElapsedTime", 12080, cuEventElapsedTime_v2),
    E("cuModuleLoadData", 2000, cuModuleLoadData),
    E("cuModuleUnload", 2000, cuModuleUnload),
    E("cuModuleGetFunction", 2000, cuModuleGetFunction),
    E("cuFuncGetParamInfo", 12040, cuFuncGetParamInfo),
    E("cuKernelGetParamInfo", 12040, cuKernelGetParamInfo),
    E("cuFuncGetName", 12030, cuFuncGetName),
    EP("cuLaunchKernel", 4000, cuLaunchKernel, cuLaunchKernel_ptsz),
    EP("cuLaunchKernelEx", 11060, cuLaunchKernelEx, cuLaunchKernelEx_ptsz),
    E("cuGraphCreate", 10000, cuGraphCreate),
    E("cuGraphDestroy", 10000, cuGraphDestroy),
    E("cuGraphAddEmptyNode", 10000, cuGraphAddEmptyNode),
    E("cuGraphAddKernelNode", 12000, cuGraphAddKernelNode_v2),
    E("cuGraphAddMemcpyNode", 10000, cuGraphAddMemcpyNode),
    E("cuGraphAddMemsetNode", 10000, cuGraphAddMemsetNode),
    E("cuGraphAddHostNode", 10000, cuGraphAddHostNode),
    E("cuGraphAddChildGraphNode", 10000, cuGraphAddChildGraphNode),
    E("cuGraphGetNodes", 10000, cuGraphGetNodes),
    E("cuGraphNodeGetType", 10000, cuGraphNodeGetType),
    E("cuGraphNodeGetDependencies", 12030, cuGraphNodeGetDependencies_v2),
    E("cuGraphAddDependencies", 12030, cuGraphAddDependencies_v2),
    E("cuGraphClone", 10000, cuGraphClone),
    E("cuGraphNodeFindInClone", 10000, cuGraphNodeFindInClone),
    E("cuGraphKernelNodeGetParams", 12000, cuGraphKernelNodeGetParams_v2),
    E("cuGraphMemcpyNodeGetParams", 10000, cuGraphMemcpyNodeGetParams),
    E("cuGraphMemsetNodeGetParams", 10000, cuGraphMemsetNodeGetParams),
    E("cuGraphKernelNodeSetParams", 12000, cuGraphKernelNodeSetParams_v2),
    E("cuGraphMemcpyNodeSetParams", 10000, cuGraphMemcpyNodeSetParams),
    E("cuGraphMemsetNodeSetParams", 10000, cuGraphMemsetNodeSetParams),
    E("cuGraphHostNodeGetParams", 10000, cuGraphHostNodeGetParams),
    E("cuGraphChildGraphNodeGetGraph", 10000, cuGraphChildGraphNodeGetGraph),
    E("cuGraphInstantiate", 10000, cuGraphInstantiate_v2),  // the 5-argument ABI, as NVIDIA's
    E("cuGraphInstantiate", 11000, cuGraphInstantiate_v2),
    E("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
    EP("cuGraphInstantiateWithParams", 12000, cuGraphInstantiateWithParams,
       cuGraphInstantiateWithParams_ptsz),
    E("cuGraphExecDestroy", 10000, cuGraphExecDestroy),
    EP("cuGraphLaunch", 10000, cuGraphLaunch, cuGraphLaunch_ptsz),
    EP("cuGraphUpload", 11010, cuGraphUpload, cuGraphUpload_ptsz),
    E("cuGraphExecUpdate", 10020, cuGraphExecUpdate),
    E("cuGraphExecUpdate", 12000, cuGraphExecUpdate_v2),
    E("cuGraphExecKernelNodeSetParams", 10010, cuGraphExecKernelNodeSetParams),
    E("cuGraphExecKernelNodeSetParams", 12000, cuGraphExecKernelNodeSetParams_v2),
    E("cuGraphExecMemcpyNodeSetParams", 10020, cuGraphExecMemcpyNodeSetParams),
    E("cuGraphExecMemsetNodeSetParams", 10020, cuGraphExecMemsetNodeSetParams),
    E("cuGraphExecChildGraphNodeSetParams", 11010, cuGraphExecChildGraphNodeSetParams),
    E("cuGraphExecNodeSetParams", 12020, cuGraphExecNodeSetParams),
    E("cuGraphNodeSetEnabled", 11060, cuGraphNodeSetEnabled),
    E("cuGraphNodeGetEnabled", 11060, cuGraphNodeGetEnabled),
    E("cuGraphAddBatchMemOpNode", 11070, cuGraphAddBatchMemOpNode),
    E("cuGraphBatchMemOpNodeGetParams", 11070, cuGraphBatchMemOpNodeGetParams),
    E("cuGraphExecBatchMemOpNodeSetParams", 11070, cuGraphExecBatchMemOpNodeSetParams),
    EP("cuStreamWaitValue32", 8000, cuStreamWaitValue32, cuStreamWaitValue32_v2_ptsz),
    EP("cuStreamWaitValue32", 11070, cuStreamWaitValue32_v2, cuStreamWaitValue32_v2_ptsz),
    EP("cuStreamWaitValue64", 9000, cuStreamWaitValue64, cuStreamWaitValue64_v2_ptsz),
    EP("cuStreamWaitValue64", 11070, cuStreamWaitValue64_v2, cuStreamWaitValue64_v2_ptsz),
    EP("cuStreamWriteValue32", 8000, cuStreamWriteValue32, cuStreamWriteValue32_v2_ptsz),
    EP("cuStreamWriteValue32", 11070, cuStreamWriteValue32_v2, cuStreamWriteValue32_v2_ptsz),
    EP("cuStreamWriteValue64", 9000, cuStreamWriteValue64, cuStreamWriteValue64_v2_ptsz),
    EP("cuStreamWriteValue64", 11070, cuStreamWriteValue64_v2, cuStreamWriteValue64_v2_ptsz),
    EP("cuStreamBatchMemOp", 8000, cuStreamBatchMemOp, cuStreamBatchMemOp_v2_ptsz),
    EP("cuStreamBatchMemOp", 11070, cuStreamBatchMemOp_v2, cuStreamBatchMemOp_v2_ptsz),
    // Simulator controls (not CUDA): reachable the same way, so the simulated runtime needs no
    // link-time dependency on the simulated driver.
    E("vaswapSimInjectFault", 0, vaswapSimInjectFault),
    E("vaswapSimClearFaults", 0, vaswapSimClearFaults),
    E("vaswapSimFaultCheck", 0, vaswapSimFaultCheck),
    E("vaswapSimPhysicalBytes", 0, vaswapSimPhysicalBytes),
    E("vaswapSimLiveEvents", 0, vaswapSimLiveEvents),
    E("vaswapSimHostFnViolations", 0, vaswapSimHostFnViolations),
    E("vaswapSimSetSingleQueue", 0, vaswapSimSetSingleQueue),
    E("vaswapSimSetMemopsSupported", 0, vaswapSimSetMemopsSupported),
    E("vaswapSimSetStreamBytes", 0, vaswapSimSetStreamBytes),
    E("vaswapSimSetPinnedLimit", 0, vaswapSimSetPinnedLimit),
    E("vaswapSimPinnedBytes", 0, vaswapSimPinnedBytes),
};

#undef E
#undef EP
#undef FN

CUresult lookup(const char* symbol, void** pfn, int version, cuuint64_t flags,
                CUdriverProcAddressQueryResult* status) {
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  constexpr cuuint64_t kKnown =
      CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  if ((flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
  const Entry* best = nullptr;
  bool exists = false;
  for (const Entry& e : kEntries) {
    if (std::strcmp(e.name, symbol) != 0) continue;
    exists = true;
    if (e.version <= std::min(version, driver_version()) &&
        (best == nullptr || e.version > best->version)) {
      best = &e;
    }
  }
  *pfn = nullptr;
  // A symbol asked at a version older than its first revision, or a per-thread twin asked below
  // CUDA 7.0 (which introduced them): no function, CUDA_SUCCESS and VERSION_NOT_SUFFICIENT, as
  // driver 580 answers (bench/results/procaddr_ptds_h100.txt). An unknown name:
  // CUDA_ERROR_NOT_FOUND.
  const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  if (best == nullptr || (per_thread && best->per_thread != nullptr && version < 7000)) {
    if (status != nullptr) {
      *status = exists ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                       : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    }
    return exists ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
  }
  *pfn = per_thread && best->per_thread != nullptr ? best->per_thread : best->fn;
  if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}

}  // namespace

// Works before cuInit, as NVIDIA's does.
CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                     CUdriverProcAddressQueryResult* status) {
  if (CUresult f = fault_check(__func__)) return f;
  return lookup(symbol, pfn, version, flags, status);
}

// The CUDA 11.3-12.x ABI, without the status argument.
CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  if (CUresult f = fault_check(__func__)) return f;
  return lookup(symbol, pfn, version, flags, nullptr);
}
