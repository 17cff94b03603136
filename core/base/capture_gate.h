// Stream captures and vaswap's device-wide synchronizes exclude each other. Measured on the H200
// (bench/results/copy_h200.md): a cuCtxSynchronize from any thread while a stream of the device
// captures, in any capture mode, fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates
// that capture. vaswap synchronizes a whole context where the program's own call would have (a
// free, as cudaFree does) and before a rewritten graph's first launch; it does so only while it
// holds the gate, and a capture that begins meanwhile waits at its BeginCapture hook until the
// synchronize is over. A free that finds a capture open does not wait: the slot is retired and
// destroyed once the last capture has ended (core/observe/intercept.cpp).
//
// Captures are counted for the whole process (every device), as the hooks see them begin and end:
// from before the driver's BeginCapture to after its EndCapture. This is the one count of open
// captures: the interception (whether a stream may be capturing) and residency (whether a use's
// mark can be recorded) read it too.
#pragma once

#include <cstdint>

namespace vaswap::capture_gate {

// A capture is about to begin (before the driver's BeginCapture): waits while the gate is held,
// then counts the capture open.
void beginning();
// A capture counted by beginning() is not open any more: the driver refused to begin it, or it
// ended (successfully or not), or a device reset dropped it.
void closed(int count = 1);
// Captures open now (or about to begin). Lock-free: read on the launch path.
int open();

// Holds the gate for its lifetime: while it is held no capture opens. Waits for another holder,
// and up to `wait_ns` for the captures open to end; empty (false) when some are still open then
// (0: do not wait for them).
class Exclusive {
 public:
  explicit Exclusive(uint64_t wait_ns = 0);
  ~Exclusive();
  Exclusive(const Exclusive&) = delete;
  Exclusive& operator=(const Exclusive&) = delete;
  explicit operator bool() const { return held_; }

 private:
  bool held_ = false;
};

}  // namespace vaswap::capture_gate
