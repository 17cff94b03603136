// Call sites: which code an allocation came from, for the policy's selection.include/exclude.
//
// The stack is walked with libunwind, reached only through the private libvaswap_unwind.so
// (loaded on first need, RTLD_LOCAL: invisible to the host), and only for allocations that would
// otherwise become slots, so programs whose policy names no pattern never load it.
#pragma once

#include <string>
#include <vector>

namespace vaswap {

// One frame: the object file's base name ("libtorch_cuda.so") and the function's name, demangled
// when it is C++ ("at::native::empty_cuda(...)"); either may be empty when unknown.
struct Frame {
  std::string object;
  std::string function;
};

// The calling thread's stack, innermost first, up to `max_frames` frames, starting at this
// function's caller. Empty (and `error` set) when libvaswap_unwind.so cannot be loaded.
std::vector<Frame> call_stack(int max_frames, std::string* error);

// True when some frame's object or function name matches some pattern (fnmatch).
bool stack_matches(const std::vector<Frame>& stack, const std::vector<std::string>& patterns);

}  // namespace vaswap
