/* vaswap public C API. One include; every call is prefixed vaswap_. */
#ifndef VASWAP_VASWAP_H
#define VASWAP_VASWAP_H

#ifdef __cplusplus
extern "C" {
#endif

#define VASWAP_VERSION_MAJOR 0
#define VASWAP_VERSION_MINOR 1
#define VASWAP_VERSION_PATCH 0

/* The library's version, "MAJOR.MINOR.PATCH". */
const char* vaswap_version(void);

#ifdef __cplusplus
}
#endif

#endif /* VASWAP_VASWAP_H */
