// The hook table of interpose/hooks.def, as data: for routing (routing.cpp) and for tests.
#pragma once

#include "observe/intercept.h"

namespace vaswap::hooks {

struct Entry {
  const char* symbol;  // the exported ABI name: "cuMemAlloc_v2", "cudaGraphLaunch_ptsz"
  const char* base;    // driver: the name cuGetProcAddress is asked for; runtime: the symbol
  int version;         // driver: the CUDA version of the ABI revision; runtime: 0
  bool per_thread;     // a _ptsz/_ptds twin
  intercept::Api api;
};

// Indices run from 0 to count() - 1.
int count();
const Entry& entry(int index);
// The index of the hook exported as `symbol`, or -1.
int find(const char* symbol);
// vaswap's function for the hook.
void* wrapper(int index);
// The real function the hook stands in for, found on first use; nullptr when this process has
// none (no libcudart loaded yet, or a driver without that revision).
void* real(int index);

// What a cuGetProcAddress-style lookup should hand out instead of `fn`: vaswap's hook when `fn`
// is the real function of a hooked driver entry point, else `fn` itself. `fn` when vaswap is off.
void* route_proc_address(void* fn);
// The same for a dlsym of the hooked export `index` that answered `fn`.
void* route_export(int index, void* fn);

}  // namespace vaswap::hooks
