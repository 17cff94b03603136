#include "settings.h"

#include <cctype>
#include <cstring>
#include <limits>
#include <vector>

namespace vaswap {

namespace {

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b])) != 0) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1])) != 0) --e;
  return s.substr(b, e - b);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = text.find(separator, start);
    parts.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return parts;
}

bool parse_bool(const std::string& text, bool* value) {
  const std::string t = lower(text);
  if (t == "true" || t == "1" || t == "yes" || t == "on") {
    *value = true;
    return true;
  }
  if (t == "false" || t == "0" || t == "no" || t == "off") {
    *value = false;
    return true;
  }
  return false;
}

// "<source>: <key> must be <expected>, got "<value>""
std::string expected(const std::string& where, const char* what, const std::string& value) {
  std::string message = where;
  message += " must be ";
  message += what;
  message += ", got \"";
  message += value;
  message += '"';
  return message;
}

constexpr const char* kKeys = "mode, selection.min_bytes, selection.captured_only";

}  // namespace

bool parse_size(const std::string& text, uint64_t* bytes) {
  const std::string t = trim(text);
  size_t digits = 0;
  while (digits < t.size() && std::isdigit(static_cast<unsigned char>(t[digits])) != 0) ++digits;
  if (digits == 0 || digits > 19) return false;
  const uint64_t number = std::stoull(t.substr(0, digits));
  std::string unit = lower(trim(t.substr(digits)));
  struct Unit {
    const char* name;
    uint64_t scale;
  };
  static const Unit kUnits[] = {
      {"", 1},
      {"b", 1},
      {"k", 1ULL << 10},
      {"kib", 1ULL << 10},
      {"kb", 1000ULL},
      {"m", 1ULL << 20},
      {"mib", 1ULL << 20},
      {"mb", 1000ULL * 1000},
      {"g", 1ULL << 30},
      {"gib", 1ULL << 30},
      {"gb", 1000ULL * 1000 * 1000},
      {"t", 1ULL << 40},
      {"tib", 1ULL << 40},
      {"tb", 1000ULL * 1000 * 1000 * 1000},
  };
  for (const Unit& u : kUnits) {
    if (unit != u.name) continue;
    if (number > std::numeric_limits<uint64_t>::max() / u.scale) return false;
    *bytes = number * u.scale;
    return true;
  }
  return false;
}

bool apply_conf(const std::string& text, const char* source, Settings* settings,
                std::string* error) {
  Settings result = *settings;
  for (const std::string& raw : split(text, ',')) {
    const std::string item = trim(raw);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      *error = std::string(source) + ": \"" + item +
               "\" is not key=value; write for example mode=off (keys: " + kKeys + ")";
      return false;
    }
    const std::string key = trim(item.substr(0, eq));
    const std::string value = trim(item.substr(eq + 1));
    const std::string where = std::string(source) + ": " + key;
    if (key == "mode") {
      if (value == "off") {
        result.mode = Mode::off;
      } else if (value == "auto") {
        result.mode = Mode::auto_;
      } else {
        *error = expected(where, "off or auto", value);
        return false;
      }
    } else if (key == "selection.min_bytes") {
      if (!parse_size(value, &result.min_bytes)) {
        *error = expected(where, "a size such as 16MiB, 2GB or 4096", value);
        return false;
      }
    } else if (key == "selection.captured_only") {
      if (!parse_bool(value, &result.captured_only)) {
        *error = expected(where, "true or false", value);
        return false;
      }
    } else {
      *error = std::string(source) + ": unknown key \"" + key + "\" (keys: " + kKeys + ")";
      return false;
    }
  }
  *settings = result;
  return true;
}

bool expandable_segments_enabled(const std::string& alloc_conf) {
  bool enabled = false;  // the last occurrence wins, as in PyTorch's parser
  for (const std::string& raw : split(alloc_conf, ',')) {
    const size_t colon = raw.find(':');
    if (colon == std::string::npos) continue;
    if (trim(raw.substr(0, colon)) != "expandable_segments") continue;
    const std::string value = lower(trim(raw.substr(colon + 1)));
    enabled = value == "true" || value == "1";
  }
  return enabled;
}

}  // namespace vaswap
