// C ABI of libvaswap_yaml.so, the only object that links yaml-cpp (see
// core/base/private_library.h).
#pragma once

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Called once per scalar, in document order. `path` names it from the root: "a.b",
 * "rules[2].after". `line` and `column` are 1-based. */
typedef void (*vaswap_yaml_visit_fn)(void* context, const char* path, const char* value, int line,
                                     int column);

/* Parses the first YAML document of `text` and visits every scalar. Returns 0, or -1 with a
 * message of the form "name:line:column: what" in `error` (`name` stands for the file). Anchors
 * and aliases are errors, as is nesting deeper than 32 levels. The caller bounds the size
 * (config/yaml_document.cpp). */
int vaswap_yaml_visit_string(const char* text, size_t size, const char* name,
                             vaswap_yaml_visit_fn visit, void* context, char* error,
                             size_t error_bytes);

#ifdef __cplusplus
}
#endif
