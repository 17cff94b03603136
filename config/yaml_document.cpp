#include "yaml_document.h"

#include <mutex>

#include "private_library.h"
#include "yaml_helper.h"

namespace vaswap {

namespace {

struct YamlHelper {
  decltype(&vaswap_yaml_visit_file) visit_file = nullptr;
  std::string error;
};

const YamlHelper& helper() {
  static YamlHelper h;
  static std::once_flag once;
  std::call_once(once, [] {
    void* library = open_private_library("libvaswap_yaml.so", &h.error);
    if (library != nullptr) {
      h.visit_file = reinterpret_cast<decltype(h.visit_file)>(
          private_symbol(library, "vaswap_yaml_visit_file", &h.error));
    }
  });
  return h;
}

}  // namespace

bool read_yaml_file(const std::string& file, std::vector<YamlScalar>* out, std::string* error) {
  const YamlHelper& h = helper();
  if (h.visit_file == nullptr) {
    *error = h.error;
    return false;
  }
  char message[1024] = {};
  auto visit = [](void* ctx, const char* path, const char* value, int line, int column) {
    static_cast<std::vector<YamlScalar>*>(ctx)->push_back(YamlScalar{path, value, line, column});
  };
  if (h.visit_file(file.c_str(), visit, out, message, sizeof(message)) != 0) {
    *error = message;
    return false;
  }
  return true;
}

}  // namespace vaswap
