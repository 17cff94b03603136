// vaswap's log: spdlog, compiled header-only into libvaswap.so with hidden visibility, so the
// host process never sees an spdlog or fmt symbol. Created on first use.
#pragma once

#include <spdlog/spdlog.h>

namespace vaswap {

// Writes to stderr with the prefix "[vaswap]". VASWAP_LOG_LEVEL (trace, debug, info, warn, error,
// off) sets the level; the default is warn.
spdlog::logger& log();

// Applies the policy's log.level and log.destination ("stderr", "stdout" or a file path, with
// %p/%r/%h). VASWAP_LOG_LEVEL, when set, wins over `level`. Called once, at start.
void configure_log(const std::string& level, const std::string& destination);

}  // namespace vaswap
