#include "log.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <cstdlib>

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
