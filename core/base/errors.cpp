#include "base/errors.h"

#include <cinttypes>
#include <cstdio>

#include "base/driver.h"

namespace vaswap {

std::string hex(uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%" PRIx64, value);
  return text;
}

std::string byte_size(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  uint64_t whole = bytes;
  while (unit < 4 && whole >= 1024 && whole % 1024 == 0) {
    whole /= 1024;
    ++unit;
  }
  if (whole < 1024 || unit == 4) return std::to_string(whole) + " " + kUnits[unit];
  double value = static_cast<double>(bytes);
  unit = 0;
  while (unit < 4 && value >= 1024.0) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %s", value, kUnits[unit]);
  return text;
}

std::string cuda_failure(const char* call, CUresult result, const std::string& subject) {
  return std::string(call) + " failed with " + cuda_error_name(result) + " for " + subject;
}

}  // namespace vaswap
