// Call sites: which code an allocation came from, for the policy's selection.include/exclude.
//
// The stack is walked with libunwind, reached only through the private libvaswap_unwind.so
// (loaded on first need, RTLD_LOCAL: invisible to the host), and only for allocations that would
// otherwise become slots, so programs whose policy names no pattern never load it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vaswap {

// One frame: the object file's base name ("libtorch_cuda.so") and the function's name, demangled
// when it is C++ ("at::native::empty_cuda(...)"); either may be empty when unknown.
struct Frame {
  std::string object;
  std::string function;
  uintptr_t offset = 0;  // of the address within `object`
};

// The calling thread's stack, innermost first, up to `max_frames` frames, starting at this
// function's caller. Empty (and `error` set) when libvaswap_unwind.so cannot be loaded.
std::vector<Frame> call_stack(int max_frames, std::string* error);

// Where one thread of the process was: its id, its name (/proc), and its stack, innermost first
// (empty when it did not answer).
struct ThreadStack {
  int tid = 0;
  std::string name;
  std::vector<Frame> frames;
  bool answered = false;
};

// Every other thread's stack, for a process vaswap is about to end (DESIGN.md invariant 12): each
// thread is sent a real-time signal whose handler (installed for this call only) unwinds its own
// stack with libunwind, which is async-signal-safe; a thread that has the signal blocked (not
// asked), or does not answer within `wait_ms` (10 ms for every thread after the first that could
// have answered and did not), is listed without frames; one that began to answer and did not
// finish ends the list. A signal left pending is discarded before the program's handler returns.
// Not for a process that goes on: the program's handler for that signal is put back, but a signal
// it counted on may be consumed.
std::vector<ThreadStack> thread_stacks(int max_frames, int wait_ms, std::string* error);

// "function (object)", or "object+0x..." for a frame with no known function.
std::string describe(const Frame& frame);

// True when some frame's object or function name matches some pattern (fnmatch).
bool stack_matches(const std::vector<Frame>& stack, const std::vector<std::string>& patterns);

}  // namespace vaswap
