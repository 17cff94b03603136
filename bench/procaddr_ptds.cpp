// What cuGetProcAddress answers for the per-thread-default-stream twins (_ptds, _ptsz) of the
// driver calls vaswap hooks, asked at the CUDA version of each call's revision (as vaswap asked
// before 2026-12-06: 3020 for cuMemcpyHtoD_v2) and at 7000 (CUDA 7.0, which introduced per-thread
// default streams), and, for comparison, the legacy-stream form. Prints one line per query: the
// result, the query status, and the symbol the address belongs to (dladdr). Without vaswap.
// Build: nvcc -O2 bench/procaddr_ptds.cpp -o procaddr_ptds -lcuda -ldl (bench/CMakeLists.txt).
#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>
#include <initializer_list>

namespace {

struct Query {
  const char* base;
  int version;  // the revision's version, as vaswap's hook table names it
};

const char* status_name(CUdriverProcAddressQueryResult s) {
  switch (s) {
    case CU_GET_PROC_ADDRESS_SUCCESS: return "SUCCESS";
    case CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: return "SYMBOL_NOT_FOUND";
    case CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: return "VERSION_NOT_SUFFICIENT";
    default: return "?";
  }
}

}  // namespace

int main() {
  if (cuInit(0) != CUDA_SUCCESS) {
    std::fprintf(stderr, "procaddr_ptds: cuInit failed\n");
    return 1;
  }
  int driver = 0;
  cuDriverGetVersion(&driver);
  std::printf("driver version %d\n", driver);
  const Query queries[] = {{"cuMemcpyHtoD", 3020},         {"cuMemsetD8", 3020},
                           {"cuMemcpyDtoA", 3020},         {"cuMemcpyAsync", 4000},
                           {"cuLaunchKernel", 4000},       {"cuGraphLaunch", 10000},
                           {"cuMemcpy3DBatchAsync", 13000}};
  for (const Query& q : queries) {
    for (const int version : {q.version, 7000, 13000}) {
      for (const bool per_thread : {false, true}) {
        void* fn = nullptr;
        CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        const CUresult rc =
            cuGetProcAddress(q.base, &fn, version,
                             per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                        : CU_GET_PROC_ADDRESS_LEGACY_STREAM,
                             &status);
        Dl_info info{};
        const char* name = "-";
        if (fn != nullptr && dladdr(fn, &info) != 0 && info.dli_sname != nullptr) {
          name = info.dli_sname;
        }
        std::printf("%-22s %5d %-10s rc %3d status %-22s %s\n", q.base, version,
                    per_thread ? "per-thread" : "legacy", static_cast<int>(rc), status_name(status),
                    name);
      }
    }
  }
  return 0;
}
