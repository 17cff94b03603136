// vaswap's own threads (workers, watchdogs, the gatekeeper) mark themselves at their start, so
// that what runs on them can tell: a failure at the process's exit stops such a thread instead of
// ending the process (residency::end_process). The name is for debuggers and the trace's tid;
// the mark is what counts, whatever the program names its own threads.
#pragma once

#include <string>

namespace vaswap {

// Names the calling thread (at most 15 characters are kept) and marks it as vaswap's.
void become_own_thread(const std::string& name);
// Whether the calling thread marked itself with become_own_thread.
bool on_own_thread();

}  // namespace vaswap
