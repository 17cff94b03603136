#include "observe/callsite.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <fnmatch.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "base/private_library.h"
#include "base/unwind_helper.h"

namespace vaswap {

namespace {

struct Unwinder {
  decltype(&vaswap_unwind_backtrace) backtrace = nullptr;
  decltype(&vaswap_unwind_procedure) procedure = nullptr;
  std::string error;
};

const Unwinder& unwinder() {
  static Unwinder u;
  static std::once_flag once;
  std::call_once(once, [] {
    void* library = open_private_library("libvaswap_unwind.so", &u.error);
    if (library == nullptr) return;
    u.backtrace = reinterpret_cast<decltype(u.backtrace)>(
        private_symbol(library, "vaswap_unwind_backtrace", &u.error));
    u.procedure = reinterpret_cast<decltype(u.procedure)>(
        private_symbol(library, "vaswap_unwind_procedure", &u.error));
  });
  return u;
}

std::string demangle(const char* name) {
  int status = 0;
  char* plain = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || plain == nullptr) return name;
  std::string out(plain);
  std::free(plain);
  return out;
}

Frame name_frame(const Unwinder& u, uintptr_t ip) {
  Frame frame;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(ip), &info) != 0 && info.dli_fname != nullptr) {
    const char* slash = std::strrchr(info.dli_fname, '/');
    frame.object = slash != nullptr ? slash + 1 : info.dli_fname;
  }
  char name[512];
  uintptr_t offset = 0;
  if (u.procedure(ip, name, sizeof name, &offset) == 0) frame.function = demangle(name);
  return frame;
}

}  // namespace

std::vector<Frame> call_stack(int max_frames, std::string* error) {
  const Unwinder& u = unwinder();
  if (u.backtrace == nullptr || u.procedure == nullptr) {
    if (error != nullptr) *error = u.error;
    return {};
  }
  // Naming a frame reads the object's symbol table (about 60 us a frame); the walk itself is
  // cheap. Allocations come from a handful of call sites, so names are kept by address.
  static std::mutex names_mutex;
  static auto* names = new std::unordered_map<uintptr_t, Frame>;  // never freed: used until exit
  std::vector<uintptr_t> ips(static_cast<size_t>(max_frames) + 1);
  const int n = u.backtrace(ips.data(), max_frames + 1);
  std::vector<Frame> stack;
  for (int i = 1; i < n; ++i) {  // frame 0 is this function
    // A return address points after the call; look up the byte before it.
    const uintptr_t ip = ips[static_cast<size_t>(i)] - 1;
    {
      std::lock_guard<std::mutex> lock(names_mutex);
      auto it = names->find(ip);
      if (it != names->end()) {
        stack.push_back(it->second);
        continue;
      }
    }
    Frame frame = name_frame(u, ip);
    {
      std::lock_guard<std::mutex> lock(names_mutex);
      names->emplace(ip, frame);
    }
    stack.push_back(std::move(frame));
  }
  return stack;
}

bool stack_matches(const std::vector<Frame>& stack, const std::vector<std::string>& patterns) {
  for (const Frame& frame : stack) {
    for (const std::string& p : patterns) {
      if ((!frame.object.empty() && fnmatch(p.c_str(), frame.object.c_str(), 0) == 0) ||
          (!frame.function.empty() && fnmatch(p.c_str(), frame.function.c_str(), 0) == 0)) {
        return true;
      }
    }
  }
  return false;
}

}  // namespace vaswap
