#include "yaml_document.h"

#include <mutex>

#include "private_library.h"
#include "yaml_helper.h"

namespace vaswap {

namespace {

struct YamlHelper {
  decltype(&vaswap_yaml_visit_file) visit_file = nullptr;
  decltype(&vaswap_yaml_visit_string) visit_string = nullptr;
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
      h.visit_string = reinterpret_cast<decltype(h.visit_string)>(
          private_symbol(library, "vaswap_yaml_visit_string", &h.error));
    }
  });
  return h;
}

void collect(void* ctx, const char* path, const char* value, int line, int column) {
  static_cast<std::vector<YamlScalar>*>(ctx)->push_back(YamlScalar{path, value, line, column});
}

}  // namespace

bool read_yaml_text(const std::string& text, const std::string& name, std::vector<YamlScalar>* out,
                    std::string* error) {
  const YamlHelper& h = helper();
  if (h.visit_string == nullptr) {
    *error = h.error;
    return false;
  }
  char message[1024] = {};
  if (h.visit_string(text.data(), text.size(), name.c_str(), collect, out, message,
                     sizeof(message)) != 0) {
    *error = message;
    return false;
  }
  return true;
}

bool read_yaml_file(const std::string& file, std::vector<YamlScalar>* out, std::string* error) {
  const YamlHelper& h = helper();
  if (h.visit_file == nullptr) {
    *error = h.error;
    return false;
  }
  char message[1024] = {};
  if (h.visit_file(file.c_str(), collect, out, message, sizeof(message)) != 0) {
    *error = message;
    return false;
  }
  return true;
}

}  // namespace vaswap
