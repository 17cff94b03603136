#include "base/log.h"

#include <sys/auxv.h>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <cctype>
#include <cstdlib>

#include "base/trace.h"

namespace vaswap {

namespace {

constexpr spdlog::level::level_enum kDefaultLevel = spdlog::level::warn;

// VASWAP_LOG_LEVEL, unless in secure-execution mode; nullptr when not set.
const char* level_variable() {
  if (getauxval(AT_SECURE) != 0) return nullptr;
  const char* value = std::getenv("VASWAP_LOG_LEVEL");
  return value != nullptr && *value != '\0' ? value : nullptr;
}

}  // namespace

bool log_level_from_name(const std::string& name, spdlog::level::level_enum* level) {
  struct Name {
    const char* name;
    spdlog::level::level_enum level;
  };
  static const Name kNames[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},
      {"info", spdlog::level::info},   {"warn", spdlog::level::warn},
      {"error", spdlog::level::err},   {"off", spdlog::level::off},
  };
  std::string lowered;
  for (const char c : name)
    lowered += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const Name& n : kNames) {
    if (lowered != n.name) continue;
    *level = n.level;
    return true;
  }
  return false;
}

std::string unknown_log_level(const std::string& value) {
  return "VASWAP_LOG_LEVEL must be trace, debug, info, warn, error or off, got \"" + value +
         "\"; the log stays at warn";
}

spdlog::logger& log() {
  // Leaked on purpose: hooks may log from atexit handlers and stream threads.
  static spdlog::logger* logger = [] {
    auto* l = new spdlog::logger("vaswap", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    l->set_pattern("[vaswap] %l: %v");
    spdlog::level::level_enum level = kDefaultLevel;
    const char* value = level_variable();
    const bool known = value == nullptr || log_level_from_name(value, &level);
    l->set_level(known ? level : kDefaultLevel);
    if (!known) l->error("{}", unknown_log_level(value));
    return l;
  }();
  return *logger;
}

void configure_log(const std::string& level, const std::string& destination) {
  spdlog::logger& l = log();
  spdlog::level::level_enum from_policy = kDefaultLevel;
  spdlog::level::level_enum from_variable = kDefaultLevel;
  const char* value = level_variable();
  if (value == nullptr || !log_level_from_name(value, &from_variable)) {
    if (log_level_from_name(level, &from_policy)) l.set_level(from_policy);
  }
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
