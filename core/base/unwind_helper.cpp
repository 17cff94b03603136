// libvaswap_unwind.so: call-site unwinding through libunwind, behind a C ABI.
#define UNW_LOCAL_ONLY
#include "unwind_helper.h"

#include <libunwind.h>

#define VASWAP_HELPER_API extern "C" __attribute__((visibility("default")))

VASWAP_HELPER_API int vaswap_unwind_backtrace(uintptr_t* ips, int max_frames) {
  unw_context_t context;
  unw_cursor_t cursor;
  if (ips == nullptr || max_frames <= 0) return -1;
  if (unw_getcontext(&context) != 0 || unw_init_local(&cursor, &context) != 0) return -1;
  int count = 0;
  while (count < max_frames && unw_step(&cursor) > 0) {  // the first step skips this function
    unw_word_t ip = 0;
    if (unw_get_reg(&cursor, UNW_REG_IP, &ip) != 0) break;
    ips[count++] = static_cast<uintptr_t>(ip);
  }
  return count;
}

VASWAP_HELPER_API int vaswap_unwind_procedure(uintptr_t ip, char* name, size_t name_bytes,
                                              uintptr_t* offset) {
  if (name == nullptr || name_bytes == 0) return -1;
  unw_word_t off = 0;
  // Local-only lookups by address: libunwind resolves through the ELF symbol tables.
  unw_accessors_t* accessors = unw_get_accessors(unw_local_addr_space);
  if (accessors == nullptr || accessors->get_proc_name == nullptr) return -1;
  if (accessors->get_proc_name(unw_local_addr_space, static_cast<unw_word_t>(ip), name, name_bytes,
                               &off, nullptr) != 0) {
    return -1;
  }
  if (offset != nullptr) *offset = static_cast<uintptr_t>(off);
  return 0;
}
