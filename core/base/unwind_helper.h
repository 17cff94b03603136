// C ABI of libvaswap_unwind.so, the only object that links libunwind (see private_library.h).
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Fills `ips` with up to `max_frames` return addresses of the calling thread, innermost first,
 * starting at the caller of this function. Returns the number written, or -1 on failure. */
int vaswap_unwind_backtrace(uintptr_t* ips, int max_frames);

/* Writes the name of the procedure containing `ip` (mangled, NUL-terminated) and the offset of
 * `ip` within it. Returns 0, or -1 when no name is known. */
int vaswap_unwind_procedure(uintptr_t ip, char* name, size_t name_bytes, uintptr_t* offset);

#ifdef __cplusplus
}
#endif
