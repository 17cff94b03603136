#include "base/trace_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/log.h"

namespace vaswap::trace {

namespace {

std::string symlink_refused(const std::string& file) {
  return "the trace file " + file +
         " is a symbolic link; vaswap does not write a trace through a link (it could replace "
         "whatever the link points at): give the real path";
}

// O_NONBLOCK only for the open itself: a FIFO without a reader fails at once (ENXIO) instead of
// holding the program's first CUDA call; the writes then block as usual.
int open_existing(const std::string& file, int* error_number) {
  const int fd = ::open(file.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  *error_number = errno;
  if (fd >= 0) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

}  // namespace

int open_trace_file(const std::string& file, bool overwrite, const char* key, std::string* error) {
  // Create it if it is not there; O_EXCL never follows a link, and says whether it existed.
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
  if (fd >= 0) return fd;
  int error_number = errno;
  if (error_number == EEXIST) fd = open_existing(file, &error_number);
  if (fd < 0) {
    if (error_number == ELOOP || error_number == EEXIST) {
      *error = symlink_refused(file);
    } else if (error_number == ENXIO) {
      *error = "the trace file " + file + " is a FIFO with no reader; start the reader first";
    } else {
      *error = "cannot create the trace file " + file + ": " + std::strerror(error_number);
    }
    return -1;
  }
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    if (!overwrite) {
      ::close(fd);
      *error = "the trace file " + file + " exists (" + std::to_string(st.st_size) +
               " bytes) and vaswap does not replace a trace: remove it, put %p in the path for "
               "one file per process, or set " +
               key + "=true";
      return -1;
    }
    if (::ftruncate(fd, 0) != 0) {
      *error = "cannot empty the trace file " + file + ": " + std::strerror(errno);
      ::close(fd);
      return -1;
    }
  }
  return fd;
}

FileSink::FileSink(int fd, std::string file) : fd_(fd), file_(std::move(file)) {}

FileSink::~FileSink() {
  if (fd_ >= 0) ::close(fd_);
}

void FileSink::sink_it_(const spdlog::details::log_msg& msg) {
  if (error_number_.load(std::memory_order_relaxed) != 0) {
    lost_.fetch_add(1, std::memory_order_relaxed);
    handled_.fetch_add(1, std::memory_order_release);
    return;
  }
  spdlog::memory_buf_t line;
  line.append(msg.payload.data(), msg.payload.data() + msg.payload.size());
  line.push_back('\n');
  const char* at = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, at, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error_number = n < 0 ? errno : EIO;
      error_number_.store(error_number, std::memory_order_relaxed);
      lost_.fetch_add(1, std::memory_order_relaxed);
      vaswap::log().error(
          "trace: writing {} failed: {} (errno {}); the trace stops here and later events are "
          "lost (the exit summary counts them); the program goes on",
          file_, std::strerror(error_number), error_number);
      break;
    }
    at += n;
    left -= static_cast<size_t>(n);
  }
  handled_.fetch_add(1, std::memory_order_release);
}

}  // namespace vaswap::trace
