// Symbol lookup that bypasses vaswap's own dlsym.
//
// libvaswap.so exports dlsym so that programs which look up libcuda's functions themselves get
// vaswap's hooks (interpose/routing.cpp). Inside vaswap, every lookup that must reach the real
// driver or runtime goes through real_dlsym instead: a plain dlsym("cuGetProcAddress_v2") from
// core/ would be routed back to vaswap's own wrapper.
#pragma once

namespace vaswap {

// glibc's dlsym, found by version with dlvsym (which vaswap does not interpose), so the lookup
// can never come back to vaswap. RTLD_NEXT and RTLD_DEFAULT are relative to libvaswap.so.
void* real_dlsym(void* handle, const char* name);

// glibc's dlsym itself, for interpose/dlsym.cpp to jump to; nullptr if it cannot be found.
void* glibc_dlsym();

}  // namespace vaswap
