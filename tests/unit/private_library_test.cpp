// YAML and libunwind reach vaswap through privately loaded helpers, never the global scope.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "base/private_library.h"
#include "base/unwind_helper.h"
#include "yaml_document.h"

namespace {

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(YamlDocumentTest, ScalarsCarryTheirPathAndPosition) {
  const std::string path = write_file("policy.yaml",
                                      "mode: auto\n"
                                      "offload:\n"
                                      "  prefetch: 2\n"
                                      "rules:\n"
                                      "  - after: fwd_3\n"
                                      "    restore: bwd_3\n");
  std::vector<vaswap::YamlScalar> scalars;
  std::string error;
  ASSERT_TRUE(vaswap::read_yaml_file(path, &scalars, &error)) << error;
  ASSERT_EQ(4u, scalars.size());
  EXPECT_EQ("mode", scalars[0].path);
  EXPECT_EQ("auto", scalars[0].value);
  EXPECT_EQ(1, scalars[0].line);
  EXPECT_EQ("offload.prefetch", scalars[1].path);
  EXPECT_EQ("2", scalars[1].value);
  EXPECT_EQ(3, scalars[1].line);
  EXPECT_EQ(13, scalars[1].column);
  EXPECT_EQ("rules[0].restore", scalars[3].path);
  EXPECT_EQ("bwd_3", scalars[3].value);
  EXPECT_EQ(6, scalars[3].line);
}

TEST(YamlDocumentTest, MalformedFileNamesFileLineAndColumn) {
  const std::string path = write_file("broken.yaml", "mode: auto\noffload: [1, 2\n");
  std::vector<vaswap::YamlScalar> scalars;
  std::string error;
  EXPECT_FALSE(vaswap::read_yaml_file(path, &scalars, &error));
  EXPECT_EQ(0u, error.find(path + ":")) << error;
  EXPECT_NE(std::string::npos, error.find("end of sequence")) << error;
}

TEST(YamlDocumentTest, YamlSymbolsStayOutOfTheGlobalScope) {
  std::vector<vaswap::YamlScalar> scalars;
  std::string error;
  ASSERT_TRUE(vaswap::read_yaml_file(write_file("ok.yaml", "a: 1\n"), &scalars, &error)) << error;
  // The helper and yaml-cpp are loaded now, yet the host's lookups cannot see them.
  EXPECT_EQ(nullptr, dlsym(RTLD_DEFAULT, "vaswap_yaml_visit_string"));
  EXPECT_EQ(nullptr,
            dlsym(RTLD_DEFAULT,
                  "_ZN4YAML8LoadFileERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"));
}

TEST(PrivateLibraryTest, MissingHelperIsAClearError) {
  std::string error;
  EXPECT_EQ(nullptr, vaswap::open_private_library("libvaswap_missing.so", &error));
  EXPECT_NE(std::string::npos, error.find(vaswap::own_directory() + "libvaswap_missing.so"))
      << error;
  EXPECT_NE(std::string::npos, error.find("reinstall vaswap")) << error;
}

__attribute__((noinline)) int capture_here(uintptr_t* ips, int max) {
  std::string error;
  static void* lib = vaswap::open_private_library("libvaswap_unwind.so", &error);
  EXPECT_NE(nullptr, lib) << error;
  auto backtrace = reinterpret_cast<decltype(&vaswap_unwind_backtrace)>(
      vaswap::private_symbol(lib, "vaswap_unwind_backtrace", &error));
  EXPECT_NE(nullptr, backtrace) << error;
  return backtrace(ips, max);
}

TEST(PrivateLibraryTest, UnwindHelperReturnsTheCallersFrames) {
  uintptr_t ips[16] = {};
  const int n = capture_here(ips, 16);
  ASSERT_GE(n, 2);
  // The innermost frame is inside capture_here: within a few hundred bytes after its start.
  const auto start = reinterpret_cast<uintptr_t>(&capture_here);
  EXPECT_GT(ips[0], start);
  EXPECT_LT(ips[0], start + 4096);
  EXPECT_EQ(nullptr, dlsym(RTLD_DEFAULT, "unw_backtrace")) << "libunwind leaked into global scope";
  EXPECT_EQ(nullptr, dlsym(RTLD_DEFAULT, "_ULx86_64_init_local"));
}

}  // namespace
