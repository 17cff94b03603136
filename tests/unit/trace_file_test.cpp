// The trace's file and where it comes from (core/base/trace_file.h, core/base/trace.h): no symbolic
// links, no replaced traces, close-on-exec, a full disk counted and said once, and the environment
// read only outside secure-execution mode, with one file per process.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>

#include "base/trace.h"
#include "base/trace_file.h"

namespace vaswap::trace {
namespace {

std::string scratch(const std::string& name) {
  return ::testing::TempDir() + "trace_file_" + std::to_string(::getpid()) + "_" + name;
}

std::string contents(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// ---------------------------------------------------------------------------------------------
// Opening the file
// ---------------------------------------------------------------------------------------------

TEST(TraceFile, ASymbolicLinkIsRefusedAndItsTargetKept) {
  const std::string target = scratch("target"), link = scratch("link");
  write_file(target, "precious\n");
  ::unlink(link.c_str());
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  for (const bool overwrite : {false, true}) {
    std::string error;
    EXPECT_EQ(open_trace_file(link, overwrite, "trace.overwrite", &error), -1);
    EXPECT_EQ(error, "the trace file " + link +
                         " is a symbolic link; vaswap does not write a trace through a link (it "
                         "could replace whatever the link points at): give the real path");
  }
  EXPECT_EQ(contents(target), "precious\n");
  ::unlink(link.c_str());
  ASSERT_EQ(::symlink((target + ".missing").c_str(), link.c_str()), 0);  // dangling
  std::string error;
  EXPECT_EQ(open_trace_file(link, true, "trace.overwrite", &error), -1);
  EXPECT_NE(error.find("is a symbolic link"), std::string::npos) << error;
  EXPECT_NE(::access((target + ".missing").c_str(), F_OK), 0) << "created through the link";
  ::unlink(link.c_str());
  ::unlink(target.c_str());
}

TEST(TraceFile, AnExistingTraceIsKeptUnlessOverwriteIsSet) {
  const std::string path = scratch("existing.jsonl");
  write_file(path, "{\"ev\":\"trace_begin\"}\n");
  std::string error;
  EXPECT_EQ(open_trace_file(path, false, "trace.overwrite", &error), -1);
  EXPECT_EQ(error, "the trace file " + path +
                       " exists (21 bytes) and vaswap does not replace a trace: remove it, put %p "
                       "in the path for one file per process, or set trace.overwrite=true");
  EXPECT_EQ(contents(path), "{\"ev\":\"trace_begin\"}\n");
  const int fd = open_trace_file(path, true, "trace.overwrite", &error);
  ASSERT_GE(fd, 0) << error;
  ::close(fd);
  EXPECT_EQ(contents(path), "");
  ::unlink(path.c_str());
}

TEST(TraceFile, AnEmptyFileOrADeviceIsWrittenAsItIs) {
  const std::string path = scratch("empty.jsonl");
  write_file(path, "");
  std::string error;
  for (const std::string& file : {path, std::string("/dev/null")}) {
    const int fd = open_trace_file(file, false, "trace.overwrite", &error);
    EXPECT_GE(fd, 0) << file << ": " << error;
    if (fd >= 0) ::close(fd);
  }
  ::unlink(path.c_str());
}

TEST(TraceFile, IsOpenedCloseOnExecWithTheUmask) {
  const std::string path = scratch("cloexec.jsonl");
  ::unlink(path.c_str());
  const mode_t mask = ::umask(022);
  std::string error;
  const int fd = open_trace_file(path, false, "trace.overwrite", &error);
  ::umask(mask);
  ASSERT_GE(fd, 0) << error;
  EXPECT_EQ(::fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  ::close(fd);
  ::unlink(path.c_str());
}

TEST(TraceFile, AFullDiskStopsTheTraceAndCountsWhatIsLost) {
  // /dev/full: every write fails with ENOSPC, as on a full file system.
  std::string error;
  ASSERT_TRUE(open("/dev/full", &error)) << error;
  for (int i = 0; i < 9; ++i) Record(Event::notice).add("message", "lost").emit();
  close();  // drains the queue: trace_begin, 9 notices, trace_end
  const Losses lost = losses();
  EXPECT_EQ(lost.events, 11u);
  EXPECT_EQ(lost.error_number, ENOSPC);
  EXPECT_EQ(lost.file, "/dev/full");
}

TEST(TraceFile, WritesWholeLinesUntilClosed) {
  const std::string path = scratch("lines.jsonl");
  ::unlink(path.c_str());
  std::string error;
  ASSERT_TRUE(open(path, &error)) << error;
  for (int i = 0; i < 100; ++i) Record(Event::notice).add("message", std::to_string(i)).emit();
  close();
  std::istringstream text(contents(path));
  std::string line;
  int lines = 0;
  std::string last;
  while (std::getline(text, line)) {
    ++lines;
    last = line;
  }
  EXPECT_EQ(lines, 102);
  EXPECT_NE(last.find("\"ev\":\"trace_end\""), std::string::npos) << last;
  EXPECT_EQ(losses().events, 0u);
  ::unlink(path.c_str());
}

TEST(TraceFile, AFigureThatIsNotFiniteIsWrittenAsNull) {
  // JSON has no infinity: a plan that cannot hide a copy once wrote "exposed_us":inf, and every
  // reader of the trace stopped at that line.
  const std::string path = scratch("finite.jsonl");
  ::unlink(path.c_str());
  std::string error;
  ASSERT_TRUE(open(path, &error)) << error;
  Record(Event::notice)
      .add("inf", std::numeric_limits<double>::infinity())
      .add("nan", std::numeric_limits<double>::quiet_NaN())
      .add("us", 1.5)
      .emit();
  close();
  const std::string text = contents(path);
  EXPECT_NE(text.find("\"inf\":null,\"nan\":null,\"us\":1.500"), std::string::npos) << text;
  EXPECT_EQ(text.find("inf,"), std::string::npos) << text;
  ::unlink(path.c_str());
}

// ---------------------------------------------------------------------------------------------
// The environment
// ---------------------------------------------------------------------------------------------

EnvironmentTrace from(bool secure, const std::map<std::string, std::string>& vars,
                      const std::string& policy_path = "", pid_t owner = 0, pid_t self = 42) {
  return environment_trace(
      secure,
      [&](const char* name) -> const char* {
        auto it = vars.find(name);
        return it != vars.end() ? it->second.c_str() : nullptr;
      },
      policy_path, owner, self);
}

TEST(TraceEnvironment, SecureExecutionReadsNoTracePath) {
  // The C API path (vaswap_slot_create and the rest) opens the trace from here too: a setuid
  // program must not write wherever its caller's VASWAP_TRACE says.
  const EnvironmentTrace t = from(true, {{"VASWAP_TRACE", "/tmp/owned.jsonl"}}, "/tmp/p.jsonl");
  EXPECT_EQ(t.file, "");
  EXPECT_EQ(t.notice, "");
}

TEST(TraceEnvironment, VaswapTraceWinsOverThePolicy) {
  EXPECT_EQ(from(false, {{"VASWAP_TRACE", "/d/t.jsonl"}}, "/d/p.jsonl").file, "/d/t.jsonl");
  EXPECT_EQ(from(false, {{"VASWAP_TRACE", "/d/t.jsonl"}}, "/d/p.jsonl").source, "VASWAP_TRACE");
  EXPECT_EQ(from(false, {}, "/d/p.jsonl").file, "/d/p.jsonl");
  EXPECT_EQ(from(false, {}, "/d/p.jsonl").source, "trace.path");
  EXPECT_EQ(from(false, {{"VASWAP_TRACE", ""}}, "").file, "");
}

TEST(TraceEnvironment, AnotherOwnersPathGetsThePidBeforeTheExtension) {
  const std::map<std::string, std::string> cases = {
      {"/d/trace.jsonl", "/d/trace.42.jsonl"},
      {"/d.x/trace", "/d.x/trace.42"},
      {"/d/.trace", "/d/.trace.42"},
      {"rel.jsonl", "rel.42.jsonl"},
  };
  for (const auto& [path, file] : cases) {
    const EnvironmentTrace t = from(false, {{"VASWAP_TRACE", path}}, "", 7);
    EXPECT_EQ(t.file, file) << path;
  }
  EXPECT_EQ(from(false, {{"VASWAP_TRACE", "/d/t.jsonl"}}, "", 7).notice,
            "trace: VASWAP_TRACE /d/t.jsonl has no %p and process 7 (VASWAP_TRACE_OWNER) was "
            "given it first, so this process (42) writes /d/t.42.jsonl; put %p in the path to "
            "name each process's file yourself");
}

TEST(TraceEnvironment, TheOwnerOrAPathWithPidKeepsThePath) {
  EXPECT_EQ(from(false, {{"VASWAP_TRACE", "/d/t.jsonl"}}, "", 0).file, "/d/t.jsonl");
  EXPECT_EQ(from(false, {{"VASWAP_TRACE", "/d/t.jsonl"}}, "", 42).file, "/d/t.jsonl");
  const EnvironmentTrace with_pid = from(false, {{"VASWAP_TRACE", "/d/t_%p.jsonl"}}, "", 7);
  EXPECT_EQ(with_pid.file, "/d/t_" + std::to_string(::getpid()) + ".jsonl");
  EXPECT_EQ(with_pid.notice, "");
  // "%%p" is a percent sign and a p, not the pid.
  EXPECT_EQ(from(false, {{"VASWAP_TRACE", "/d/t%%p.jsonl"}}, "", 7).file, "/d/t%p.42.jsonl");
}

}  // namespace
}  // namespace vaswap::trace
