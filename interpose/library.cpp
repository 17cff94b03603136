// libvaswap.so entry points that are not CUDA hooks.
#include "vaswap/vaswap.h"

#define VASWAP_API extern "C" __attribute__((visibility("default")))

#define VASWAP_STR2(x) #x
#define VASWAP_STR(x) VASWAP_STR2(x)

VASWAP_API const char* vaswap_version(void) {
  return VASWAP_STR(VASWAP_VERSION_MAJOR) "." VASWAP_STR(VASWAP_VERSION_MINOR) "." VASWAP_STR(
      VASWAP_VERSION_PATCH);
}
