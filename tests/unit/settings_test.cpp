// VASWAP_CONF, sizes, PyTorch's allocator setting, and what the preload reads from the
// environment (config/settings.h, core/intercept.h).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "intercept.h"
#include "settings.h"

namespace vaswap {
namespace {

TEST(Sizes, AcceptEveryUnitForm) {
  const std::map<std::string, uint64_t> cases = {
      {"4096", 4096},          {"0", 0},
      {"512B", 512},           {"2k", 2048},
      {"2KiB", 2048},          {"2kB", 2000},
      {"16MiB", 16ull << 20},  {"16M", 16ull << 20},
      {"16MB", 16000000},      {"2GiB", 2ull << 30},
      {"2G", 2ull << 30},      {"2GB", 2000000000},
      {"1TiB", 1ull << 40},    {"1TB", 1000000000000},
      {" 8 mib ", 8ull << 20},
  };
  for (const auto& [text, bytes] : cases) {
    uint64_t got = 1;
    EXPECT_TRUE(parse_size(text, &got)) << text;
    EXPECT_EQ(got, bytes) << text;
  }
}

TEST(Sizes, RejectWhatIsNotASize) {
  for (const char* text :
       {"", "MiB", "-1", "1.5GiB", "16 MiBs", "0x10", "99999999999999999999", "20000000TiB"}) {
    uint64_t got = 7;
    EXPECT_FALSE(parse_size(text, &got)) << text;
    EXPECT_EQ(got, 7u) << text;
  }
}

TEST(Conf, SetsEveryKey) {
  Settings s;
  std::string error;
  ASSERT_TRUE(apply_conf("mode=off, selection.min_bytes=64MiB,selection.captured_only=false",
                         "VASWAP_CONF", &s, &error))
      << error;
  EXPECT_EQ(s.mode, Mode::off);
  EXPECT_EQ(s.min_bytes, 64ull << 20);
  EXPECT_FALSE(s.captured_only);
  ASSERT_TRUE(apply_conf("mode=auto", "VASWAP_CONF", &s, &error));
  EXPECT_EQ(s.mode, Mode::auto_);
  EXPECT_EQ(s.min_bytes, 64ull << 20);  // untouched keys keep their value
}

TEST(Conf, EmptyKeepsDefaults) {
  Settings s;
  std::string error;
  ASSERT_TRUE(apply_conf("", "VASWAP_CONF", &s, &error));
  EXPECT_EQ(s.mode, Mode::auto_);
  EXPECT_EQ(s.min_bytes, 16ull << 20);
  EXPECT_TRUE(s.captured_only);
}

TEST(Conf, ErrorsNameKeyExpectationAndValueAndChangeNothing) {
  const std::map<std::string, std::string> cases = {
      {"mode=on", "VASWAP_CONF: mode must be off or auto, got \"on\""},
      {"selection.min_bytes=big",
       "VASWAP_CONF: selection.min_bytes must be a size such as 16MiB, 2GB or 4096, got \"big\""},
      {"selection.captured_only=maybe",
       "VASWAP_CONF: selection.captured_only must be true or false, got \"maybe\""},
      {"mode",
       "VASWAP_CONF: \"mode\" is not key=value; write for example mode=off (keys: mode, "
       "selection.min_bytes, selection.captured_only)"},
      {"mode=off,min_bytes=1",
       "VASWAP_CONF: unknown key \"min_bytes\" (keys: mode, selection.min_bytes, "
       "selection.captured_only)"},
  };
  for (const auto& [text, message] : cases) {
    Settings s;
    std::string error;
    EXPECT_FALSE(apply_conf(text, "VASWAP_CONF", &s, &error)) << text;
    EXPECT_EQ(error, message);
    EXPECT_EQ(s.mode, Mode::auto_) << text << ": a failed conf must leave the settings alone";
  }
}

TEST(AllocConf, FindsExpandableSegments) {
  EXPECT_TRUE(expandable_segments_enabled("expandable_segments:True"));
  EXPECT_TRUE(expandable_segments_enabled("max_split_size_mb:128, expandable_segments:true"));
  EXPECT_FALSE(expandable_segments_enabled("expandable_segments:False"));
  EXPECT_FALSE(expandable_segments_enabled("expandable_segments:True,expandable_segments:False"));
  EXPECT_FALSE(expandable_segments_enabled("max_split_size_mb:128"));
  EXPECT_FALSE(expandable_segments_enabled(""));
}

intercept::Environment read(bool secure, const std::map<std::string, std::string>& vars) {
  return intercept::read_environment(secure, [&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it != vars.end() ? it->second.c_str() : nullptr;
  });
}

TEST(Environment, OnByDefault) {
  const auto e = read(false, {});
  EXPECT_TRUE(e.on);
  EXPECT_TRUE(e.notices.empty());
}

TEST(Environment, SecureExecutionIgnoresEverything) {
  const auto e = read(true, {{"VASWAP_CONF", "mode=auto,selection.min_bytes=1"},
                             {"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"}});
  EXPECT_FALSE(e.on);
  EXPECT_TRUE(e.notices.empty());
  EXPECT_EQ(e.settings.min_bytes, Settings{}.min_bytes);
}

TEST(Environment, MalformedConfTurnsItOffAndSaysWhy) {
  const auto e = read(false, {{"VASWAP_CONF", "mode=sometimes"}});
  EXPECT_FALSE(e.on);
  ASSERT_EQ(e.notices.size(), 1u);
  EXPECT_EQ(e.notices[0],
            "VASWAP_CONF: mode must be off or auto, got \"sometimes\"; vaswap is passing every "
            "call through");
}

TEST(Environment, ExpandableSegmentsIsReportedForEitherVariable) {
  for (const char* name : {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"}) {
    const auto e = read(false, {{name, "expandable_segments:True"}});
    EXPECT_TRUE(e.on);
    ASSERT_EQ(e.notices.size(), 1u) << name;
    EXPECT_EQ(e.notices[0].rfind(std::string(name) + " has expandable_segments:True", 0), 0u);
  }
}

TEST(Environment, OffMeansOff) {
  const auto e = read(false, {{"VASWAP_CONF", "mode=off"}});
  EXPECT_FALSE(e.on);
  EXPECT_TRUE(e.notices.empty());
}

}  // namespace
}  // namespace vaswap
