#include "base/private_library.h"

#include <dlfcn.h>

namespace vaswap {

namespace {

// dladdr of a symbol in this object names the file it was loaded from.
void marker() {}

// GCC says __SANITIZE_ADDRESS__; clang (the fuzzer's compiler) says __has_feature.
#if defined(__SANITIZE_ADDRESS__)
#define VASWAP_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define VASWAP_UNDER_ASAN 1
#endif
#endif

int private_open_flags() {
  int flags = RTLD_NOW | RTLD_LOCAL;
#if !defined(VASWAP_UNDER_ASAN)
  flags |= RTLD_DEEPBIND;  // AddressSanitizer refuses it
#endif
  return flags;
}

}  // namespace

std::string own_directory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&marker), &info) == 0 || info.dli_fname == nullptr) return "";
  std::string path(info.dli_fname);
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string("./") : path.substr(0, slash + 1);
}

void* open_private_library(const char* file_name, std::string* error) {
  const std::string path = own_directory() + file_name;
  void* library = dlopen(path.c_str(), private_open_flags());
  if (library == nullptr && error != nullptr) {
    const char* why = dlerror();
    *error = "cannot load " + path + ": " + (why != nullptr ? why : "unknown dlopen error") +
             " (it is installed beside libvaswap.so; reinstall vaswap if it is missing)";
  }
  return library;
}

void* private_symbol(void* library, const char* symbol, std::string* error) {
  dlerror();
  void* address = dlsym(library, symbol);
  if (address == nullptr && error != nullptr) {
    const char* why = dlerror();
    *error =
        std::string("helper library lacks ") + symbol + ": " + (why != nullptr ? why : "not found");
  }
  return address;
}

}  // namespace vaswap
