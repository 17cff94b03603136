// The C API path in secure-execution mode (tests/integration/process_life_test.sh): run setuid,
// it loads the simulated driver and libvaswap.so by absolute path (a setuid program's loader
// ignores LD_LIBRARY_PATH and LD_PRELOAD) and creates a slot, which opens the trace from the
// environment as any C API program does. Prints "secure N slot ok" (N: AT_SECURE).
//   secure_probe LIBCUDA LIBVASWAP
#include <dlfcn.h>
#include <sys/auxv.h>

#include <cstdio>

#include "vaswap/vaswap.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: secure_probe LIBCUDA LIBVASWAP\n");
    return 64;
  }
  // Loaded first and global: the engine's dlopen("libcuda.so.1") finds it by its soname.
  if (dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL) == nullptr || dlopen(argv[2], RTLD_NOW) == nullptr) {
    std::fprintf(stderr, "secure_probe: %s\n", dlerror());
    return 1;
  }
  void* vaswap = dlopen(argv[2], RTLD_NOW | RTLD_NOLOAD);
  auto create =
      reinterpret_cast<decltype(&vaswap_slot_create)>(dlsym(vaswap, "vaswap_slot_create"));
  auto destroy =
      reinterpret_cast<decltype(&vaswap_slot_destroy)>(dlsym(vaswap, "vaswap_slot_destroy"));
  if (create == nullptr || destroy == nullptr) {
    std::fprintf(stderr, "secure_probe: no vaswap_slot_create in %s\n", argv[2]);
    return 1;
  }
  vaswap_slot slot = nullptr;
  const vaswap_status status = create(0, 2u << 20, &slot);
  std::printf("secure %lu slot %s\n", getauxval(AT_SECURE), status == VASWAP_OK ? "ok" : "failed");
  if (status == VASWAP_OK) destroy(slot);
  return status == VASWAP_OK ? 0 : 1;
}
