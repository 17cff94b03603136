// How core/ reports failure: an Error carries the C API's status and a message that says what
// failed, with which value, and what to do; for a failed driver call, also the driver's code. The C
// API boundary (interpose/c_api.cpp) turns it into a vaswap_status and vaswap_last_error(); nothing
// else lets it escape.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <exception>
#include <string>

#include "vaswap/vaswap.h"

namespace vaswap {

class Error : public std::exception {
 public:
  Error(vaswap_status status, std::string message, CUresult driver_result = CUDA_SUCCESS,
        const char* driver_call = nullptr)
      : status_(status),
        driver_result_(driver_result),
        driver_call_(driver_call),
        message_(std::move(message)) {}
  vaswap_status status() const { return status_; }
  // The failed driver call's code (fail_driver); CUDA_SUCCESS where no driver call failed.
  CUresult driver_result() const { return driver_result_; }
  // The failed driver call's name where the thrower gave it (a string literal), else nullptr.
  const char* driver_call() const { return driver_call_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  vaswap_status status_;
  CUresult driver_result_;
  const char* driver_call_;
  std::string message_;
};

[[noreturn]] inline void fail(vaswap_status status, std::string message) {
  throw Error(status, std::move(message));
}

// A driver call that failed: VASWAP_ERROR_CUDA, the message (cuda_failure names the call, the code
// and the subject, and may go on with what to do), and the code, for callers that act on it.
[[noreturn]] inline void fail_driver(CUresult result, std::string message,
                                     const char* call = nullptr) {
  throw Error(VASWAP_ERROR_CUDA, std::move(message), result, call);
}

// "0x7f3a00000000"
std::string hex(uint64_t value);
// "64 MiB", "3.5 GiB", "4096 B": exact for whole units, one decimal otherwise.
std::string byte_size(uint64_t bytes);
// "cuMemCreate failed with CUDA_ERROR_OUT_OF_MEMORY for <subject>"
std::string cuda_failure(const char* call, CUresult result, const std::string& subject);

}  // namespace vaswap
