// Loading vaswap's own helper libraries without exposing them to the host process.
//
// libvaswap.so is preloaded into programs it does not own, so nothing it brings may change how
// the host's symbols resolve (DESIGN.md invariant 9). Debian ships yaml-cpp and libunwind only as
// shared libraries or as non-PIC archives, so they cannot be linked in and hidden. Instead each
// lives behind a small helper library (libvaswap_yaml.so, libvaswap_unwind.so) with a C ABI,
// installed beside libvaswap.so and opened on first need with RTLD_LOCAL: neither the helper nor
// its dependencies join the global scope. RTLD_DEEPBIND additionally makes the helper bind to its
// own yaml-cpp/libunwind even when the host has loaded another version globally (not under
// AddressSanitizer, which refuses DEEPBIND).
#pragma once

#include <string>

namespace vaswap {

// Opens `file_name` from the directory that holds libvaswap.so (or this executable, for tests).
// Returns nullptr and fills `error` with what failed and why.
void* open_private_library(const char* file_name, std::string* error);

// Looks up `symbol` in a library opened by open_private_library.
void* private_symbol(void* library, const char* symbol, std::string* error);

// The directory that contains the object this code was linked into, with a trailing '/'.
std::string own_directory();

}  // namespace vaswap
