#include "base/symbols.h"

#include <dlfcn.h>

namespace vaswap {

namespace {

using DlsymFn = void* (*)(void*, const char*);

// Everything on the path from vaswap's dlsym to glibc's is uninstrumented and uses no library
// code: AddressSanitizer's runtime resolves its interceptors with dlsym(RTLD_NEXT, ...) before its
// shadow memory exists (ThreadSanitizer's before its thread state does), and in a process where
// libvaswap.so is loaded those lookups come here.
#define VASWAP_UNINSTRUMENTED __attribute__((no_sanitize("address", "undefined", "thread")))

// True when `address` lies in the object this code was linked into (libvaswap.so, or a test).
VASWAP_UNINSTRUMENTED bool in_this_object(void* address) {
  Dl_info mine, theirs;
  return dladdr(reinterpret_cast<void*>(&real_dlsym), &mine) != 0 &&
         dladdr(address, &theirs) != 0 && mine.dli_fbase == theirs.dli_fbase;
}

VASWAP_UNINSTRUMENTED DlsymFn find_glibc_dlsym() {
  // glibc 2.34 moved dlsym into libc.so.6 as dlsym@@GLIBC_2.34; older ones only have the
  // original version node of their architecture. RTLD_NEXT finds it when libvaswap.so is
  // preloaded; when it was dlopen'ed (the Python binding) RTLD_NEXT can miss, and RTLD_DEFAULT can
  // answer with vaswap's own dlsym if another copy is preloaded: skip any answer from this object.
  static const char* const kVersions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
  void* const scopes[] = {RTLD_NEXT, RTLD_DEFAULT};
  for (void* scope : scopes) {
    for (const char* version : kVersions) {
      void* fn = dlvsym(scope, "dlsym", version);
      if (fn != nullptr && !in_this_object(fn)) return reinterpret_cast<DlsymFn>(fn);
    }
  }
  return nullptr;
}

// Written once (racing threads write the same value); no static-local guard, which a lookup made
// while another object is being initialized could re-enter.
DlsymFn g_glibc_dlsym = nullptr;

}  // namespace

VASWAP_UNINSTRUMENTED void* glibc_dlsym() {
  DlsymFn fn = __atomic_load_n(&g_glibc_dlsym, __ATOMIC_ACQUIRE);
  if (fn == nullptr) {
    fn = find_glibc_dlsym();
    if (fn == nullptr) return nullptr;
    __atomic_store_n(&g_glibc_dlsym, fn, __ATOMIC_RELEASE);
  }
  return reinterpret_cast<void*>(fn);
}

VASWAP_UNINSTRUMENTED void* real_dlsym(void* handle, const char* name) {
  void* fn = glibc_dlsym();
  return fn != nullptr ? reinterpret_cast<DlsymFn>(fn)(handle, name) : nullptr;
}

}  // namespace vaswap
