// vaswap's log: spdlog, compiled header-only into libvaswap.so with hidden visibility, so the
// host process never sees an spdlog or fmt symbol. Created on first use.
#pragma once

#include <spdlog/spdlog.h>

namespace vaswap {

// Writes to stderr with the prefix "[vaswap]". VASWAP_LOG_LEVEL (trace, debug, info, warn, error,
// off) sets the level; the default is warn.
spdlog::logger& log();

}  // namespace vaswap
