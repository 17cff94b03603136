#include "trace.h"

#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <spdlog/async.h>
#include <spdlog/async_logger.h>
#include <spdlog/sinks/basic_file_sink.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>

#include "log.h"

namespace vaswap::trace {

namespace {

const char* const kEventNames[] = {
#define VASWAP_TRACE_NAME(name) #name,
    VASWAP_TRACE_EVENTS(VASWAP_TRACE_NAME)
#undef VASWAP_TRACE_NAME
};

// The open trace. `mutex` orders emit against open/close, so an event is either written whole or
// dropped after close; it is held only to enqueue, never while writing.
struct Writer {
  std::mutex mutex;
  std::shared_ptr<spdlog::details::thread_pool> pool;
  std::shared_ptr<spdlog::async_logger> logger;
  std::atomic<bool> open{false};
};

Writer& writer() {
  static auto* w = new Writer;  // leaked: workers may emit while static destructors run
  return *w;
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
}

void close_at_exit() { close(); }

}  // namespace

const char* event_name(Event event) { return kEventNames[static_cast<int>(event)]; }

bool enabled() { return writer().open.load(std::memory_order_relaxed); }

uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

bool open(const std::string& path, std::string* error) {
  const std::string file = expand_path(path);
  std::shared_ptr<spdlog::sinks::basic_file_sink_mt> sink;
  try {
    sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(file, /*truncate=*/true);
  } catch (const spdlog::spdlog_ex& e) {
    if (error != nullptr) *error = "cannot open the trace file " + file + ": " + e.what();
    return false;
  }
  // Blocking overflow: a full queue slows the emitter rather than losing events.
  auto pool = std::make_shared<spdlog::details::thread_pool>(16384, 1);
  auto logger = std::make_shared<spdlog::async_logger>("vaswap-trace", sink, pool,
                                                       spdlog::async_overflow_policy::block);
  logger->set_pattern("%v");
  logger->set_level(spdlog::level::info);
  Writer& w = writer();
  {
    std::lock_guard<std::mutex> lock(w.mutex);
    close_locked(w);
    w.pool = std::move(pool);
    w.logger = std::move(logger);
    w.open.store(true);
  }
  static std::once_flag registered;
  std::call_once(registered, [] { std::atexit(close_at_exit); });
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

void open_from_environment(const std::string& policy_path) {
  static std::once_flag once;
  std::call_once(once, [&] {
    const char* env = std::getenv("VASWAP_TRACE");
    const bool from_env = env != nullptr && *env != '\0';
    const std::string path = from_env ? env : policy_path;
    if (path.empty() || enabled()) return;
    std::string error;
    if (!open(path, &error)) {
      log().error("{} (from {}); tracing is off", error, from_env ? "VASWAP_TRACE" : "trace.path");
    }
  });
}

void close() {
  Writer& w = writer();
  if (w.open.load()) Record(Event::trace_end).emit();
  std::lock_guard<std::mutex> lock(w.mutex);
  close_locked(w);
}

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
  std::lock_guard<std::mutex> lock(w.mutex);
  if (w.logger) w.logger->info(std::string_view(line.data(), line.size()));
}

}  // namespace vaswap::trace
