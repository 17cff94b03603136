#include "base/trace.h"

#include <pthread.h>
#include <signal.h>
#include <sys/auxv.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <spdlog/async.h>
#include <spdlog/async_logger.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "base/log.h"
#include "base/trace_file.h"
#include "base/trace_signals.h"

namespace vaswap::trace {

namespace {

const char* const kEventNames[] = {
#define VASWAP_TRACE_NAME(name) #name,
    VASWAP_TRACE_EVENTS(VASWAP_TRACE_NAME)
#undef VASWAP_TRACE_NAME
};

// How long a signal's flush waits for the writer to take the final events.
constexpr auto kSignalFlushWait = std::chrono::milliseconds(1500);

// The open trace. `mutex` orders emit against open/close, so an event is either written whole or
// dropped after close; it is held only to enqueue, never while writing.
struct Writer {
  std::mutex mutex;
  std::shared_ptr<spdlog::details::thread_pool> pool;
  std::shared_ptr<spdlog::async_logger> logger;
  std::shared_ptr<FileSink> sink;
  std::atomic<bool> open{false};
  std::atomic<bool> closing{false};  // close() has begun: a signal adds no second trace_end
  std::string file;
  uint64_t enqueued = 0;  // events given to the logger, under `mutex`
  Losses closed_losses;   // what the last closed trace lost
};

// Leaked on purpose: workers may emit while static destructors run. A forked child gets a new
// one (after_fork_in_child): the parent's may be locked by a thread the child does not have.
Writer* g_writer = new Writer;
Writer& writer() { return *g_writer; }

bool g_forked_child = false;
// VASWAP_TRACE_OWNER as this process found it: 0 when none, -1 when unreadable.
pid_t g_inherited_owner = 0;

// A child made by fork() has none of vaswap's threads: no trace writer, no flusher. It starts
// with the trace closed, without touching a lock a parent's thread may have held at the fork,
// and never writes to the parent's file.
void after_fork_in_child() {
  g_forked_child = true;
  Writer* parent = g_writer;
  g_writer = new Writer;
  if (parent->sink) ::close(parent->sink->fd());
  signals::after_fork_in_child();
}

// At load, before the program's threads start (as a preload): note the trace owner, or become
// it (trace.h, environment_trace), and register the fork handler.
__attribute__((constructor)) void at_load() {
  pthread_atfork(nullptr, nullptr, after_fork_in_child);
  if (getauxval(AT_SECURE) != 0) return;
  if (const char* owner = std::getenv("VASWAP_TRACE_OWNER"); owner != nullptr && *owner != '\0') {
    char* end = nullptr;
    const long pid = std::strtol(owner, &end, 10);
    g_inherited_owner = *end == '\0' && pid > 0 ? static_cast<pid_t>(pid) : -1;
    return;
  }
  for (const char* name : {"VASWAP_TRACE", "VASWAP_POLICY", "VASWAP_CONF"}) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    ::setenv("VASWAP_TRACE_OWNER", std::to_string(::getpid()).c_str(), 0);
    break;
  }
}

}  // namespace

std::string expand_path(const std::string& path) {
  std::string out;
  for (size_t i = 0; i < path.size(); ++i) {
    const char next = i + 1 < path.size() ? path[i + 1] : '\0';
    if (path[i] != '%' || std::string("prh%").find(next) == std::string::npos || next == '\0') {
      out += path[i];
      continue;
    }
    ++i;
    if (next == 'p') {
      out += std::to_string(::getpid());
    } else if (next == 'r') {  // the launcher's rank: torchrun, MPI and Slurm name it so
      const char* rank = nullptr;
      for (const char* name : {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
        if ((rank = std::getenv(name)) != nullptr) break;
      }
      out += rank != nullptr ? rank : "0";
    } else if (next == 'h') {
      char host[256] = "";
      gethostname(host, sizeof host - 1);
      out += host;
    } else {
      out += '%';
    }
  }
  return out;
}

namespace {

bool has_pid(const std::string& path) {
  for (size_t i = 0; i + 1 < path.size(); ++i) {
    if (path[i] != '%') continue;
    if (path[i + 1] == 'p') return true;
    ++i;  // "%%" is a percent sign
  }
  return false;
}

// "dir/trace.jsonl" -> "dir/trace.<pid>.jsonl"; "trace" -> "trace.<pid>".
std::string with_pid(const std::string& file, pid_t pid) {
  const size_t base = file.rfind('/') == std::string::npos ? 0 : file.rfind('/') + 1;
  const size_t dot = file.rfind('.');
  const std::string tag = "." + std::to_string(pid);
  if (dot == std::string::npos || dot <= base) return file + tag;
  return file.substr(0, dot) + tag + file.substr(dot);
}

void append_escaped(fmt::memory_buffer& out, const std::string& value) {
  for (const char c : value) {
    switch (c) {
      case '"': out.append(std::string_view("\\\"")); break;
      case '\\': out.append(std::string_view("\\\\")); break;
      case '\n': out.append(std::string_view("\\n")); break;
      case '\t': out.append(std::string_view("\\t")); break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          fmt::format_to(std::back_inserter(out), "\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out.push_back(c);
        }
    }
  }
}

void close_locked(Writer& w) {
  if (!w.open.load()) return;
  w.open.store(false);
  w.logger->flush();
  // Destroying the pool drains its queue and joins its thread: nothing queued is lost.
  w.logger.reset();
  w.pool.reset();
  w.closed_losses = Losses{w.sink->lost(), w.sink->error_number(), w.file};
  w.sink.reset();  // closes the file
}

void close_at_exit() { close(); }

const char* signal_name(int signo) {
  switch (signo) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    default: return "signal";
  }
}

// On the flusher thread (trace_signals.h): the final events, then a bounded wait until the
// writer has taken them. A fatal signal ends the trace here; the writer is left running, as the
// process ends at once.
void finish_for_signal(int signo, bool fatal) {
  Writer& w = writer();
  if (!w.open.load()) return;
  if (w.closing.load()) {
    // The program is closing the trace itself (exiting): its trace_end is queued; only wait.
  } else if (fatal) {
    Record(Event::trace_end).add("signal", signal_name(signo)).emit();
  } else {
    Record(Event::signal).add("signal", signal_name(signo)).emit();
  }
  std::shared_ptr<FileSink> sink;
  uint64_t target = 0;
  {
    signals::LockScope scope;
    std::lock_guard<std::mutex> lock(w.mutex);
    sink = w.sink;
    target = w.enqueued;
    if (fatal) w.open.store(false);
  }
  if (!sink) return;
  const auto deadline = std::chrono::steady_clock::now() + kSignalFlushWait;
  while (sink->handled() < target && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

bool open_file(const std::string& file, bool overwrite, const char* overwrite_key,
               std::string* error) {
  std::string why;
  const int fd = open_trace_file(file, overwrite, overwrite_key, &why);
  if (fd < 0) {
    if (error != nullptr) *error = why;
    return false;
  }
  auto sink = std::make_shared<FileSink>(fd, file);
  std::shared_ptr<spdlog::details::thread_pool> pool;
  try {
    // The writer thread inherits a mask without the flush signals: a handler there could not
    // wait for the queue it drains.
    signals::BlockedScope blocked;
    pool = std::make_shared<spdlog::details::thread_pool>(16384, 1);
  } catch (const std::exception& e) {  // std::system_error (no thread) or spdlog's own error
    if (error != nullptr) {
      *error = "the trace " + file + ": its writer thread could not be started: " + e.what();
    }
    return false;
  }
  // Blocking overflow: a full queue slows the emitter rather than losing events.
  auto logger = std::make_shared<spdlog::async_logger>("vaswap-trace", sink, pool,
                                                       spdlog::async_overflow_policy::block);
  logger->set_level(spdlog::level::info);
  Writer& w = writer();
  {
    signals::LockScope scope;
    std::lock_guard<std::mutex> lock(w.mutex);
    close_locked(w);
    w.pool = std::move(pool);
    w.logger = std::move(logger);
    w.sink = std::move(sink);
    w.file = file;
    w.open.store(true);
  }
  static std::once_flag registered;
  std::call_once(registered, [] { std::atexit(close_at_exit); });
  signals::install(finish_for_signal);
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  Record(Event::trace_begin)
      .add("format", "vaswap-trace")
      .add("version", kFormatVersion)
      .add("pid", static_cast<int64_t>(::getpid()))
      .add("host", std::string(host))
      .add("clock", "CLOCK_MONOTONIC")
      .emit();
  return true;
}

}  // namespace

const char* event_name(Event event) { return kEventNames[static_cast<int>(event)]; }

bool enabled() { return writer().open.load(std::memory_order_relaxed); }

uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

bool open(const std::string& path, std::string* error, bool overwrite) {
  return open_file(expand_path(path), overwrite, nullptr, error);
}

EnvironmentTrace environment_trace(bool secure,
                                   const std::function<const char*(const char*)>& variable,
                                   const std::string& policy_path, pid_t inherited_owner,
                                   pid_t self) {
  EnvironmentTrace t;
  if (secure) return t;
  const char* env = variable("VASWAP_TRACE");
  const bool from_env = env != nullptr && *env != '\0';
  const std::string path = from_env ? env : policy_path;
  if (path.empty()) return t;
  t.source = from_env ? "VASWAP_TRACE" : "trace.path";
  t.file = expand_path(path);
  if (inherited_owner != 0 && inherited_owner != self && !has_pid(path)) {
    const std::string mine = with_pid(t.file, self);
    t.notice = "trace: " + t.source + " " + path + " has no %p and process " +
               (inherited_owner > 0 ? std::to_string(inherited_owner) : std::string("?")) +
               " (VASWAP_TRACE_OWNER) was given it first, so this process (" +
               std::to_string(self) + ") writes " + mine +
               "; put %p in the path to name each process's file yourself";
    t.file = mine;
  }
  return t;
}

void open_from_environment(const std::string& policy_path, bool overwrite) {
  static std::once_flag once;
  std::call_once(once, [&] {
    if (enabled()) return;
    const EnvironmentTrace t = environment_trace(
        getauxval(AT_SECURE) != 0, [](const char* name) { return std::getenv(name); }, policy_path,
        g_inherited_owner, ::getpid());
    if (t.file.empty()) return;
    if (!t.notice.empty()) log().warn("{}", t.notice);
    std::string error;
    if (!open_file(t.file, overwrite, "trace.overwrite", &error)) {
      log().error("{} (from {}); tracing is off", error, t.source);
    }
  });
}

void close() {
  Writer& w = writer();
  w.closing.store(true);
  if (w.open.load()) Record(Event::trace_end).emit();
  {
    signals::LockScope scope;
    std::lock_guard<std::mutex> lock(w.mutex);
    close_locked(w);
  }
  w.closing.store(false);
  signals::remove();
}

Losses losses() {
  Writer& w = writer();
  signals::LockScope scope;
  std::lock_guard<std::mutex> lock(w.mutex);
  if (w.sink) return Losses{w.sink->lost(), w.sink->error_number(), w.file};
  return w.closed_losses;
}

bool forked_child() { return g_forked_child; }

Record::Record(Event event) : event_(event), t_ns_(now_ns()) {}

Record& Record::at(uint64_t t_ns) {
  t_ns_ = t_ns;
  return *this;
}

Record& Record::add(const char* key, uint64_t value) {
  fmt::format_to(std::back_inserter(fields_), ",\"{}\":{}", key, value);
  return *this;
}

Record& Record::add(const char* key, int64_t value) {
  fmt::format_to(std::back_inserter(fields_), ",\"{}\":{}", key, value);
  return *this;
}

Record& Record::add(const char* key, double value) {
  // JSON has no infinity or NaN: a figure that is not finite is written as null.
  if (!std::isfinite(value)) {
    fmt::format_to(std::back_inserter(fields_), ",\"{}\":null", key);
    return *this;
  }
  fmt::format_to(std::back_inserter(fields_), ",\"{}\":{:.3f}", key, value);
  return *this;
}

Record& Record::add(const char* key, bool value) {
  fmt::format_to(std::back_inserter(fields_), ",\"{}\":{}", key, value ? "true" : "false");
  return *this;
}

Record& Record::add(const char* key, const std::string& value) {
  fmt::format_to(std::back_inserter(fields_), ",\"{}\":\"", key);
  append_escaped(fields_, value);
  fields_.push_back('"');
  return *this;
}

Record& Record::hex(const char* key, uint64_t value) {
  fmt::format_to(std::back_inserter(fields_), ",\"{}\":\"0x{:x}\"", key, value);
  return *this;
}

void Record::emit() {
  Writer& w = writer();
  if (!w.open.load(std::memory_order_relaxed)) return;
  static thread_local const long tid = syscall(SYS_gettid);
  fmt::memory_buffer line;
  fmt::format_to(std::back_inserter(line), "{{\"t_ns\":{},\"ev\":\"{}\",\"tid\":{}", t_ns_,
                 event_name(event_), tid);
  line.append(fields_.data(), fields_.data() + fields_.size());
  line.push_back('}');
  signals::LockScope scope;
  std::lock_guard<std::mutex> lock(w.mutex);
  if (!w.open.load(std::memory_order_relaxed) || !w.logger) return;
  w.logger->info(std::string_view(line.data(), line.size()));
  ++w.enqueued;
}

}  // namespace vaswap::trace
