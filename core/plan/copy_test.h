// The copy test (DESIGN.md section 5): what one device's link and map path give, measured once
// before the device's first plan, for the schedule's model (schedule.h). One slot of up to
// 64 MiB (a quarter of what the device has free, when that is less), D2H then H2D nine times on a
// stream of its own, spread over about 100 ms, then three unmaps and maps of its pages; the best
// of each after the first round counts (the program's copies and vaswap's own may share the link
// meanwhile: sharing only slows them, and spreading the rounds finds a moment when they do not).
//
// Runs on the planning worker, with the device's context current or not.
#pragma once

#include "plan/schedule.h"

namespace vaswap::planner {

// The measured model; where nothing could be measured, `given` (the policy's figures) with its
// source saying so, or, when those are missing too, a PCIe 3 x16 link's.
plan::Model copy_test(int device, const plan::Model& given);

}  // namespace vaswap::planner
