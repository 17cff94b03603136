#include "yaml_document.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "base/private_library.h"
#include "yaml_helper.h"

namespace vaswap {

namespace {

struct YamlHelper {
  decltype(&vaswap_yaml_visit_string) visit_string = nullptr;
  std::string error;
};

const YamlHelper& helper() {
  static YamlHelper h;
  static std::once_flag once;
  std::call_once(once, [] {
    void* library = open_private_library("libvaswap_yaml.so", &h.error);
    if (library != nullptr) {
      h.visit_string = reinterpret_cast<decltype(h.visit_string)>(
          private_symbol(library, "vaswap_yaml_visit_string", &h.error));
    }
  });
  return h;
}

void collect(void* ctx, const char* path, const char* value, int line, int column) {
  static_cast<std::vector<YamlScalar>*>(ctx)->push_back(YamlScalar{path, value, line, column});
}

std::string too_large(const std::string& name, const std::string& size) {
  return name + ": the policy is " + size + ", over the 1 MiB (" + std::to_string(kMaxPolicyBytes) +
         " bytes) vaswap reads; a policy needs a few hundred bytes: check that this is the "
         "policy file";
}

// Reads at most kMaxPolicyBytes + 1 bytes, so that neither a huge file nor an endless one
// (/dev/zero, a pipe) is read whole.
bool read_bounded(const std::string& file, std::string* text, std::string* error) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *error = file + ": cannot open the policy file: " + std::strerror(errno);
    return false;
  }
  text->clear();
  char buffer[65536];
  while (text->size() <= kMaxPolicyBytes) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *error = file + ": cannot read the policy file: " + std::strerror(errno);
      ::close(fd);
      return false;
    }
    if (n == 0) break;
    text->append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  if (text->size() > kMaxPolicyBytes) {
    *error = too_large(file, "more than " + std::to_string(kMaxPolicyBytes) + " bytes");
    return false;
  }
  return true;
}

}  // namespace

bool read_yaml_text(const std::string& text, const std::string& name, std::vector<YamlScalar>* out,
                    std::string* error) {
  if (text.size() > kMaxPolicyBytes) {
    *error = too_large(name, std::to_string(text.size()) + " bytes");
    return false;
  }
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
  std::string text;
  return read_bounded(file, &text, error) && read_yaml_text(text, file, out, error);
}

}  // namespace vaswap
