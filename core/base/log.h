// vaswap's log: spdlog, compiled header-only into libvaswap.so with hidden visibility, so the
// host process never sees an spdlog or fmt symbol. Created on first use.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace vaswap {

// Writes to stderr with the prefix "[vaswap]". VASWAP_LOG_LEVEL (trace, debug, info, warn, error,
// off; any case) sets the level; the default is warn. Another value keeps warn and says so once,
// naming the valid ones. Secure-execution mode (AT_SECURE) reads no VASWAP_ variable.
spdlog::logger& log();

// Applies the policy's log.level and log.destination ("stderr", "stdout" or a file path, with
// %p/%r/%h). VASWAP_LOG_LEVEL, when set and valid, wins over `level`. Called once, at start.
void configure_log(const std::string& level, const std::string& destination);

// "info" -> spdlog's info, as VASWAP_LOG_LEVEL and log.level name levels. False for anything
// else (spdlog's own from_str would turn an unknown name into off, silencing every error).
bool log_level_from_name(const std::string& name, spdlog::level::level_enum* level);
// The message for a VASWAP_LOG_LEVEL that is not a level.
std::string unknown_log_level(const std::string& value);

}  // namespace vaswap
