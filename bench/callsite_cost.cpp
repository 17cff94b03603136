// The cost of one call-site check (selection.include/exclude): walking the stack with libunwind
// (through libvaswap_unwind.so), naming each frame (dladdr, the symbol table, demangling), and
// matching the patterns. vaswap pays it once per allocation that the size, capture and device
// rules already selected (a few dozen per training job). CPU-only: runs anywhere.
//
//   callsite_cost [DEPTH] [ITERATIONS]    prints a Markdown table
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "observe/callsite.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Sample {
  double walk_us = 0, match_us = 0;
  size_t frames = 0;
};

// Recurse to `depth` frames, then measure there. noinline keeps each level a real frame.
__attribute__((noinline)) Sample at_depth(int depth) {
  if (depth > 0) {
    Sample s = at_depth(depth - 1);
    asm volatile("" ::: "memory");  // not a tail call
    return s;
  }
  Sample s;
  std::string error;
  const auto t0 = Clock::now();
  const std::vector<vaswap::Frame> stack = vaswap::call_stack(48, &error);
  const auto t1 = Clock::now();
  const std::vector<std::string> patterns = {"libtorch_cuda.so", "*TransformerEncoderLayer*",
                                             "libnccl*", "*cublas*"};
  volatile bool hit = vaswap::stack_matches(stack, patterns);
  (void)hit;
  const auto t2 = Clock::now();
  if (stack.empty()) {
    std::fprintf(stderr, "no stack: %s\n", error.c_str());
    std::exit(1);
  }
  s.walk_us = std::chrono::duration<double, std::micro>(t1 - t0).count();
  s.match_us = std::chrono::duration<double, std::micro>(t2 - t1).count();
  s.frames = stack.size();
  return s;
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  const int depth = argc > 1 ? std::atoi(argv[1]) : 30;
  const int iterations = argc > 2 ? std::atoi(argv[2]) : 2000;
  const Sample first = at_depth(depth);  // loads libvaswap_unwind.so
  std::vector<double> walk, match;
  size_t frames = 0;
  for (int i = 0; i < iterations; ++i) {
    const Sample s = at_depth(depth);
    walk.push_back(s.walk_us);
    match.push_back(s.match_us);
    frames = s.frames;
  }
  std::printf("| | median (us) | p99 (us) |\n|---|---:|---:|\n");
  std::printf(
      "| first check at a call site (loads libvaswap_unwind.so, names every frame) | %.1f | |\n",
      first.walk_us + first.match_us);
  std::printf(
      "| later checks at the same site: stack walk, %zu frames, names cached | %.1f | %.1f |\n",
      frames, percentile(walk, 0.5), percentile(walk, 0.99));
  std::printf("| matching 4 patterns | %.1f | %.1f |\n", percentile(match, 0.5),
              percentile(match, 0.99));
  return 0;
}
