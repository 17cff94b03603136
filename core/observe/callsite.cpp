#include "observe/callsite.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <fnmatch.h>

#include <dirent.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
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
    frame.offset = ip - reinterpret_cast<uintptr_t>(info.dli_fbase);
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

namespace {

// The one thread_stacks() call in progress: the thread asked (its handler claims the request by
// negating it, so that only a thread still asked writes), and where its handler writes.
constexpr int kMaxDumpFrames = 64;
std::atomic<int> asked_tid{0};
std::atomic<int> answered_frames{-1};
uintptr_t answered_ips[kMaxDumpFrames + 1];
std::atomic<decltype(&vaswap_unwind_backtrace)> dump_backtrace{nullptr};

void answer(int /*signo*/) {
  const int saved = errno;
  int me = static_cast<int>(syscall(SYS_gettid));
  if (asked_tid.compare_exchange_strong(me, -me)) {
    auto backtrace = dump_backtrace.load();
    answered_frames.store(backtrace != nullptr ? backtrace(answered_ips, kMaxDumpFrames + 1) : 0);
  }
  errno = saved;
}

std::string thread_name(int tid) {
  std::ifstream comm("/proc/self/task/" + std::to_string(tid) + "/comm");
  std::string name;
  std::getline(comm, name);
  return name;
}

// Whether thread `tid` blocks `signo` (its SigBlk mask in /proc): such a thread cannot answer, and
// is not asked (vaswap's trace writer blocks every signal, and so may the driver's threads).
bool blocks(int tid, int signo) {
  std::ifstream status("/proc/self/task/" + std::to_string(tid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("SigBlk:", 0) != 0) continue;
    const unsigned long long mask = std::strtoull(line.c_str() + 7, nullptr, 16);
    return signo >= 1 && signo <= 64 && ((mask >> (signo - 1)) & 1ULL) != 0;
  }
  return false;
}

}  // namespace

std::string describe(const Frame& frame) {
  if (!frame.function.empty()) {
    return frame.object.empty() ? frame.function : frame.function + " (" + frame.object + ")";
  }
  std::ostringstream out;
  out << (frame.object.empty() ? "?" : frame.object) << "+0x" << std::hex << frame.offset;
  return out.str();
}

std::vector<ThreadStack> thread_stacks(int max_frames, int wait_ms, std::string* error) {
  const Unwinder& u = unwinder();
  if (u.backtrace == nullptr || u.procedure == nullptr) {
    if (error != nullptr) *error = u.error;
    return {};
  }
  static std::mutex one_at_a_time;
  std::lock_guard<std::mutex> lock(one_at_a_time);
  max_frames = std::clamp(max_frames, 1, kMaxDumpFrames);
  dump_backtrace.store(u.backtrace);
  uintptr_t warm[2];
  u.backtrace(warm, 2);  // libunwind's first use sets itself up here, not in a handler
  const int signo = SIGRTMIN + 5;
  struct sigaction ours {
  }, theirs{};
  ours.sa_handler = answer;
  sigemptyset(&ours.sa_mask);
  ours.sa_flags = SA_RESTART;
  sigaction(signo, &ours, &theirs);
  const int self = static_cast<int>(syscall(SYS_gettid));
  std::vector<int> tids;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (const dirent* entry = readdir(dir)) {
      if (entry->d_name[0] >= '0' && entry->d_name[0] <= '9') {
        tids.push_back(std::atoi(entry->d_name));
      }
    }
    closedir(dir);
  }
  std::sort(tids.begin(), tids.end());
  std::vector<ThreadStack> stacks;
  // Threads that block the signal are not asked. Once one that could answer has not (it sits
  // where the signal is not taken), the rest get a short wait: the process still ends promptly.
  constexpr int kAfterSilenceMs = 10;
  int limit_ms = wait_ms;
  const auto wait_for_answer = [](int ms) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (answered_frames.load() < 0 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  };
  for (int tid : tids) {
    if (tid == self) continue;
    ThreadStack stack;
    stack.tid = tid;
    stack.name = thread_name(tid);
    if (blocks(tid, signo)) {
      stacks.push_back(std::move(stack));
      continue;
    }
    answered_frames.store(-1);
    asked_tid.store(tid);
    const bool sent = syscall(SYS_tgkill, getpid(), tid, signo) == 0;  // fails: it has exited
    if (sent) wait_for_answer(limit_ms);
    // Withdrawn: a handler that claimed it meanwhile is writing, and is waited for; one that
    // comes later finds the request gone and writes nothing.
    const bool claimed = asked_tid.exchange(0) == -tid;
    if (claimed) wait_for_answer(wait_ms);
    const int n = answered_frames.load();
    if (sent && n < 0) limit_ms = std::min(limit_ms, kAfterSilenceMs);
    if (n >= 0) {
      stack.answered = true;
      // Frame 0 is the handler's unwinder call, frame 1 the signal trampoline.
      for (int i = 2; i < n && static_cast<int>(stack.frames.size()) < max_frames; ++i) {
        stack.frames.push_back(name_frame(u, answered_ips[i] - 1));
      }
    }
    stacks.push_back(std::move(stack));
    // Still unwinding after its claim: its handler may yet write the shared frames, so no other
    // thread is asked.
    if (claimed && n < 0) break;
  }
  // A signal still pending on a thread that did not answer in time is discarded before the
  // program's disposition comes back (by default it would end the process by that signal).
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(signo, &ignore, nullptr);
  sigaction(signo, &theirs, nullptr);
  return stacks;
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
