// The trace's file. Opened close-on-exec (a program's children never hold it), never through a
// symbolic link, and never replacing a trace that is there unless asked; written with write(2)
// by the trace's writer thread, one line per event, so that every event the writer has taken is
// in the file even if the process dies. A failed write (a full disk, an I/O error) stops the
// writing: the log says so once, with the file and the error, and every later event is counted
// as lost, for the exit summary; the program is not disturbed.
#pragma once

#include <spdlog/sinks/base_sink.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

namespace vaswap::trace {

// Opens `file` for the trace and returns its descriptor, or -1 with `error` set. A regular file
// that exists and is not empty is replaced only with `overwrite`; a symbolic link is refused
// either way; a device or FIFO (/dev/null, a reader's pipe) is written as it is. `key` names the
// setting that allows replacing, for the message.
int open_trace_file(const std::string& file, bool overwrite, const char* key, std::string* error);

// Writes each message, with a newline, to a descriptor it owns.
class FileSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  FileSink(int fd, std::string file);
  ~FileSink() override;
  FileSink(const FileSink&) = delete;
  FileSink& operator=(const FileSink&) = delete;

  int fd() const { return fd_; }
  // Events handled (written or lost): what a flush waits for.
  uint64_t handled() const { return handled_.load(std::memory_order_acquire); }
  uint64_t lost() const { return lost_.load(std::memory_order_relaxed); }
  int error_number() const { return error_number_.load(std::memory_order_relaxed); }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override;
  void flush_() override {}

 private:
  int fd_;
  std::string file_;
  std::atomic<uint64_t> handled_{0}, lost_{0};
  std::atomic<int> error_number_{0};
};

}  // namespace vaswap::trace
