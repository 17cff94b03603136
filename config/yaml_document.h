// A YAML file as vaswap's policy code sees it: scalars with their paths and positions.
// The parsing itself happens in libvaswap_yaml.so, loaded privately on first use.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace vaswap {

// The largest policy document read (file or text): a policy needs a few hundred bytes, and the
// limit keeps a hostile or mistaken input (a log file, /dev/zero) to a bounded parse.
constexpr size_t kMaxPolicyBytes = size_t{1} << 20;

struct YamlScalar {
  std::string path;  // "offload.prefetch", "rules[0].after"
  std::string value;
  int line = 0;    // 1-based
  int column = 0;  // 1-based
};

// Reads `file`. On failure returns false and sets `error` to "file:line:column: what". Anchors,
// aliases, nesting deeper than 32 levels and more than kMaxPolicyBytes are errors.
bool read_yaml_file(const std::string& file, std::vector<YamlScalar>* out, std::string* error);
// The same for a document in memory; `name` stands for the file in messages.
bool read_yaml_text(const std::string& text, const std::string& name, std::vector<YamlScalar>* out,
                    std::string* error);

}  // namespace vaswap
