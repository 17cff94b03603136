// docs/TRACE.md lists exactly the events core/base/trace.h can emit (one source of truth per fact).
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "base/trace.h"

namespace {

std::set<std::string> documented_events(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::set<std::string> names;
  std::string line;
  bool in_events = false;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) in_events = line == "## Events";
    if (!in_events || line.rfind("| `", 0) != 0) continue;
    const size_t end = line.find('`', 3);
    names.insert(line.substr(3, end - 3));
  }
  return names;
}

TEST(TraceDoc, EventTableMatchesTheCode) {
  std::set<std::string> code;
#define VASWAP_TRACE_NAME(name) code.insert(#name);
  VASWAP_TRACE_EVENTS(VASWAP_TRACE_NAME)
#undef VASWAP_TRACE_NAME
  EXPECT_EQ(documented_events(VASWAP_SOURCE_DIR "/docs/TRACE.md"), code);
}

TEST(TraceDoc, EventNamesComeFromTheTable) {
  EXPECT_STREQ(vaswap::trace::event_name(vaswap::trace::Event::trace_begin), "trace_begin");
  EXPECT_STREQ(vaswap::trace::event_name(vaswap::trace::Event::remap_discard), "remap_discard");
}

}  // namespace
