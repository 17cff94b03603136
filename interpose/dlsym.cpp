// dlsym, routed: lookups of hooked CUDA entry points get vaswap's hooks.
//
// A program that dlopen()s libcuda and dlsym()s cuGetProcAddress or cuMemAlloc_v2 from it (a
// static cudart does; so do JAX and NCCL) would otherwise never reach a hook. vaswap's dlsym asks
// glibc's for the answer and swaps it for the hook when it is the real function of a hooked entry
// point (hooks.h, route_export).
//
// Every other lookup must behave exactly as glibc's own, and glibc's dlsym looks at its return
// address: RTLD_NEXT means "the next object after the caller", and RTLD_DEFAULT searches the
// caller's scope (which, for a library loaded RTLD_LOCAL, includes its own dependencies). Calling
// glibc's dlsym from C++ here would make libvaswap.so the caller, and break every RTLD_NEXT
// interposer loaded after vaswap (AddressSanitizer's runtime is one; HAMi-core reported this
// class of bug). So the entry point is a few instructions of assembly: ask vaswap_dlsym_route
// whether the name is ours, and if not, jump (not call) to glibc's dlsym with the caller's return
// address still on the stack.
#include <dlfcn.h>

#include <cstring>

#include "base/symbols.h"
#include "hooks.h"
#include "observe/intercept.h"

namespace {

// A lookup of a cu* or cuda* name: answered here (true) when it is a hooked entry point.
bool route_cuda_name(void* handle, const char* name, void** out) {
  if (!vaswap::intercept::routing_on()) return false;
  const int index = vaswap::hooks::find(name);
  if (index < 0) return false;
  // Relative to libvaswap.so for RTLD_NEXT/RTLD_DEFAULT; for a hooked CUDA name that finds the
  // same function as from the caller unless the caller itself defines the name.
  *out = vaswap::hooks::route_export(index, vaswap::real_dlsym(handle, name));
  return true;
}

}  // namespace

// Returns 1 when it has answered the lookup (in *out); 0 when glibc's dlsym must answer it, with
// that function's address in *out. Hidden: only the stub below calls it. Uninstrumented up to the
// name test: AddressSanitizer's runtime looks up its interceptors through here before its shadow
// memory exists, ThreadSanitizer's before its thread state does (those names never start with
// "cu").
extern "C"
    __attribute__((visibility("hidden"), used, no_sanitize("address", "undefined", "thread"))) int
    vaswap_dlsym_route(void* handle, const char* name, void** out) {
  if (name != nullptr && name[0] == 'c' && name[1] == 'u' && route_cuda_name(handle, name, out)) {
    return 1;
  }
  *out = vaswap::glibc_dlsym();
  if (*out == nullptr) return 1;  // no glibc dlsym found: answer "not found" rather than crash
  return 0;
}

#if defined(__x86_64__)
// System V x86-64. Entry: %rdi handle, %rsi name, (%rsp) the caller's return address, %rsp = 8
// mod 16. The route call needs %rsp = 0 mod 16 and one slot for *out.
asm(R"(
  .text
  .globl dlsym
  .type dlsym, @function
  .p2align 4
dlsym:
  .cfi_startproc
  pushq %rdi
  .cfi_adjust_cfa_offset 8
  pushq %rsi
  .cfi_adjust_cfa_offset 8
  subq $24, %rsp
  .cfi_adjust_cfa_offset 24
  movq %rsp, %rdx
  call vaswap_dlsym_route
  movq (%rsp), %r11
  addq $24, %rsp
  .cfi_adjust_cfa_offset -24
  popq %rsi
  .cfi_adjust_cfa_offset -8
  popq %rdi
  .cfi_adjust_cfa_offset -8
  testl %eax, %eax
  jz 1f
  movq %r11, %rax
  ret
1:
  jmp *%r11
  .cfi_endproc
  .size dlsym, .-dlsym
)");
#else
// Other architectures: the same routing from C++. Lookups vaswap does not route are answered
// relative to libvaswap.so rather than to their caller (see above); add this architecture's stub.
extern "C" __attribute__((visibility("default"))) void* dlsym(void* handle, const char* name) {
  void* out = nullptr;
  if (vaswap_dlsym_route(handle, name, &out) != 0) return out;
  return reinterpret_cast<void* (*)(void*, const char*)>(out)(handle, name);
}
#endif
