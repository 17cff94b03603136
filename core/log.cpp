#include "log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <cstdlib>

#include "trace.h"

namespace vaswap {

spdlog::logger& log() {
  // Leaked on purpose: hooks may log from atexit handlers and stream threads.
  static spdlog::logger* logger = [] {
    auto* l = new spdlog::logger("vaswap", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    l->set_pattern("[vaswap] %l: %v");
    const char* level = std::getenv("VASWAP_LOG_LEVEL");
    l->set_level(level != nullptr ? spdlog::level::from_str(level) : spdlog::level::warn);
    return l;
  }();
  return *logger;
}

}  // namespace vaswap

namespace vaswap {

void configure_log(const std::string& level, const std::string& destination) {
  spdlog::logger& l = log();
  if (std::getenv("VASWAP_LOG_LEVEL") == nullptr) l.set_level(spdlog::level::from_str(level));
  if (destination == "stderr") return;
  spdlog::sink_ptr sink;
  try {
    if (destination == "stdout") {
      sink = std::make_shared<spdlog::sinks::stdout_sink_mt>();
    } else {
      sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(trace::expand_path(destination));
    }
  } catch (const spdlog::spdlog_ex& e) {
    l.error("log.destination {}: {}; logging to stderr", destination, e.what());
    return;
  }
  // Once, before vaswap's own threads exist; the sinks vector is not guarded against loggers.
  l.sinks().assign(1, sink);
}

}  // namespace vaswap
