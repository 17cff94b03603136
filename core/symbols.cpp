#include "symbols.h"

#include <dlfcn.h>

#include <atomic>
#include <initializer_list>

namespace vaswap {

namespace {

using DlsymFn = void* (*)(void*, const char*);

// True when `address` lies in the object this code was linked into (libvaswap.so, or a test).
bool in_this_object(void* address) {
  Dl_info mine{}, theirs{};
  return dladdr(reinterpret_cast<void*>(&real_dlsym), &mine) != 0 &&
         dladdr(address, &theirs) != 0 && mine.dli_fbase == theirs.dli_fbase;
}

DlsymFn find_glibc_dlsym() {
  // glibc 2.34 moved dlsym into libc.so.6 as dlsym@@GLIBC_2.34; older ones only have the
  // original version node of their architecture. RTLD_NEXT finds it when libvaswap.so is
  // preloaded; when it was dlopen'ed (the Python binding) RTLD_NEXT can miss, and RTLD_DEFAULT can
  // answer with vaswap's own dlsym if another copy is preloaded: skip any answer from this object.
  for (void* scope : {RTLD_NEXT, RTLD_DEFAULT}) {
    for (const char* version : {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"}) {
      void* fn = dlvsym(scope, "dlsym", version);
      if (fn != nullptr && !in_this_object(fn)) return reinterpret_cast<DlsymFn>(fn);
    }
  }
  return nullptr;
}

}  // namespace

void* glibc_dlsym() {
  // No static-local guard here: this runs inside dlsym calls made while other objects are being
  // initialized, where a guard re-entered from the same thread would deadlock.
  static std::atomic<DlsymFn> cached{nullptr};
  DlsymFn fn = cached.load(std::memory_order_acquire);
  if (fn == nullptr) {
    fn = find_glibc_dlsym();
    if (fn == nullptr) return nullptr;
    cached.store(fn, std::memory_order_release);
  }
  return reinterpret_cast<void*>(fn);
}

void* real_dlsym(void* handle, const char* name) {
  void* fn = glibc_dlsym();
  return fn != nullptr ? reinterpret_cast<DlsymFn>(fn)(handle, name) : nullptr;
}

}  // namespace vaswap
