#include "plan/learner.h"

#include <algorithm>
#include <map>

#include "base/driver.h"
#include "base/errors.h"
#include "slots/engine.h"

namespace vaswap::planner {

namespace {

// An event in `stream`'s own context (DESIGN.md invariant 6: events are made on the device of
// what they are recorded on), recorded there now.
CUevent record_on(const Driver& driver, CUstream stream) {
  CUcontext context = nullptr;
  if (driver.cuStreamGetCtx(stream, &context) != CUDA_SUCCESS) driver.cuCtxGetCurrent(&context);
  ContextScope scope(driver, context);
  CUevent event = nullptr;
  const CUresult made = driver.cuEventCreate(&event, CU_EVENT_DEFAULT);
  if (made != CUDA_SUCCESS) {
    fail_driver(made, cuda_failure("cuEventCreate", made, "a planner timing event"));
  }
  const CUresult rc = driver.cuEventRecord(event, stream);
  if (rc != CUDA_SUCCESS) {
    driver.cuEventDestroy(event);
    fail_driver(rc, cuda_failure("cuEventRecord", rc, "a planner timing event"));
  }
  return event;
}

}  // namespace

void drop_events(std::vector<Seen>& seen) {
  const Driver& driver = *load_driver(nullptr);
  for (Seen& s : seen) {
    for (CUevent event : {s.start, s.end, s.asked}) {
      if (event != nullptr) driver.cuEventDestroy(event);
    }
    s.start = s.end = s.asked = nullptr;
    for (const auto& [before, after] : s.tail_waits) {
      driver.cuEventDestroy(before);
      driver.cuEventDestroy(after);
    }
    s.tail_waits.clear();
  }
}

void Learner::ask(CUstream stream) noexcept {
  const Driver& driver = *load_driver(nullptr);
  if (asked_ != nullptr) driver.cuEventDestroy(asked_);  // the launch it was for never came
  // Made before the launch's slots are made resident: a failure here must not keep them from it
  // (the launch would run on unmapped pages). Without the event, that launch's wait stays in the
  // learned times, as it did before they were taken out.
  try {
    asked_ = record_on(driver, stream);
  } catch (const Error&) {
    asked_ = nullptr;
  }
}

CUevent Learner::ask_eager(CUstream stream) noexcept {
  if (seen_.empty() || seen_.back().stream != stream) return nullptr;  // none yet, or aside
  try {
    return record_on(*load_driver(nullptr), stream);
  } catch (const Error&) {
    return nullptr;
  }
}

void Learner::eager_acquired(CUevent before, CUstream stream, bool waited) noexcept {
  const Driver& driver = *load_driver(nullptr);
  if (before == nullptr) return;
  if (!waited || seen_.empty()) {
    driver.cuEventDestroy(before);
    return;
  }
  try {
    seen_.back().tail_waits.emplace_back(before, record_on(driver, stream));
  } catch (const Error&) {
    driver.cuEventDestroy(before);
  }
}

int Learner::observe(CUgraphExec exec, CUstream stream, const std::vector<Slot*>& slots,
                     int repeats) {
  Seen s;
  s.exec = exec;
  s.stream = stream;
  s.uses = slots;
  // Recorded before the asked event changes hands: should it fail, the learner still owns that
  // one (and destroys it), where a Seen that never reaches seen_ would drop it.
  s.start = record_on(*load_driver(nullptr), stream);
  s.asked = asked_;
  asked_ = nullptr;
  seen_.push_back(std::move(s));
  std::vector<CUgraphExec> keys;
  keys.reserve(seen_.size());
  for (const Seen& seen : seen_) keys.push_back(seen.exec);
  return plan::find_period(keys, repeats);
}

void Learner::launched(CUgraphExec exec, CUstream stream) {
  if (seen_.empty() || seen_.back().exec != exec || seen_.back().end != nullptr) return;
  seen_.back().end = record_on(*load_driver(nullptr), stream);
}

void Learner::also_uses(const std::vector<Slot*>& slots) {
  if (seen_.empty()) return;
  Seen& last = seen_.back();
  for (auto at = slots.begin(); at != slots.end(); ++at) {
    Slot* slot = *at;
    if (std::find(last.uses.begin(), last.uses.end(), slot) == last.uses.end()) {
      last.uses.push_back(slot);
    }
    if (std::find(slots.begin(), at, slot) != at) continue;  // named twice: one call, one use
    auto it = std::find_if(last.tail.begin(), last.tail.end(),
                           [slot](const auto& entry) { return entry.first == slot; });
    if (it == last.tail.end()) {
      last.tail.emplace_back(slot, 1);
    } else {
      ++it->second;
    }
  }
}

std::map<int, int> agreed_tail_calls(const std::vector<std::map<int, int>>& periods) {
  std::map<int, int> agreed;
  for (const auto& counts : periods) {
    for (const auto& [region, calls] : counts) agreed.emplace(region, calls);
  }
  for (auto& [region, calls] : agreed) {
    for (const auto& counts : periods) {
      const auto it = counts.find(region);
      if ((it == counts.end() ? 0 : it->second) != calls) calls = -1;
    }
  }
  return agreed;
}

std::shared_ptr<Learned> Learner::take(int period, int repeats) {
  auto learned = std::make_shared<Learned>();
  const size_t n = seen_.size();
  const size_t first = n - 1 - static_cast<size_t>(period);
  // Uses per position: the union over every period observed in the repeat.
  std::map<Slot*, int> index;
  learned->period.uses.resize(static_cast<size_t>(period));
  // Per position, each period's tail counts (by region), merged below.
  std::vector<std::vector<std::map<int, int>>> tails(static_cast<size_t>(period));
  for (size_t k = 1; static_cast<int64_t>(k) * period <= static_cast<int64_t>(n - 1) &&
                     static_cast<int>(k) <= repeats;
       ++k) {
    for (int i = 0; i < period; ++i) {
      const Seen& s = seen_[n - 1 - k * static_cast<size_t>(period) + static_cast<size_t>(i)];
      auto& uses = learned->period.uses[static_cast<size_t>(i)];
      for (Slot* slot : s.uses) {
        auto [it, added] = index.emplace(slot, static_cast<int>(learned->regions.size()));
        if (added) {
          learned->regions.push_back(slot);
          learned->devices.push_back(slot->device);
          learned->ids.push_back(slot->id);
          learned->period.region_bytes.push_back(slot->bytes);
          learned->period.region_pages.push_back(slot->mapped_bytes);
        }
        if (std::find(uses.begin(), uses.end(), it->second) == uses.end()) {
          uses.push_back(it->second);
        }
      }
      std::map<int, int>& tail = tails[static_cast<size_t>(i)].emplace_back();
      for (const auto& [slot, calls] : s.tail) tail[index.at(slot)] = calls;
    }
  }
  for (const auto& periods : tails) learned->tail_calls.push_back(agreed_tail_calls(periods));
  learned->device = learned->regions.empty() ? 0 : learned->regions[0]->device;
  for (size_t i = first; i < n; ++i) {
    learned->window.push_back(seen_[i]);
    seen_[i].start = seen_[i].end = seen_[i].asked = nullptr;  // the window owns these now
    seen_[i].tail_waits.clear();
  }
  clear();
  return learned;
}

bool Learner::saw(CUgraphExec exec) const {
  return std::any_of(seen_.begin(), seen_.end(), [exec](const Seen& s) { return s.exec == exec; });
}

void Learner::forget(Slot* slot) {
  for (Seen& s : seen_) {
    s.uses.erase(std::remove(s.uses.begin(), s.uses.end(), slot), s.uses.end());
    s.tail.erase(std::remove_if(s.tail.begin(), s.tail.end(),
                                [slot](const auto& entry) { return entry.first == slot; }),
                 s.tail.end());
  }
}

void Learner::clear() {
  drop_events(seen_);
  seen_.clear();
  if (asked_ != nullptr) load_driver(nullptr)->cuEventDestroy(asked_);
  asked_ = nullptr;
}

double period_without_waits(const std::vector<LaunchClock>& window, plan::Period* period) {
  const size_t n = window.size() - 1;
  // The waits before positions 1..n (position 0's comes before the origin) move each position
  // earlier by all those before and at it; a position without an end event ends where the next
  // begins, before that one's wait.
  double shift = 0;
  for (size_t i = 0; i < n; ++i) {
    const LaunchClock& at = window[i];
    if (i > 0) shift += at.waited_us;
    period->start_us.push_back(at.start_us - shift);
    period->end_us.push_back(at.end_us >= 0
                                 ? at.end_us - shift
                                 : window[i + 1].start_us - shift - window[i + 1].waited_us);
  }
  shift += window[n].waited_us;
  period->length_us = window[n].start_us - shift;
  return shift;
}

void learned_times(Learned& learned) {
  const Driver& driver = *load_driver(nullptr);
  driver.cuEventSynchronize(learned.window.back().start);
  const CUevent origin = learned.window[0].start;
  std::vector<LaunchClock> clock;
  double tail_waited_us = 0;  // the eager calls' waits after the launch before: before this one
  for (const Seen& s : learned.window) {
    LaunchClock c;
    if (s.asked != nullptr) c.waited_us = std::max(0.0, elapsed_us(driver, s.asked, s.start));
    c.waited_us += tail_waited_us;
    c.start_us = elapsed_us(driver, origin, s.start);
    if (s.end != nullptr) c.end_us = elapsed_us(driver, origin, s.end);
    clock.push_back(c);
    tail_waited_us = 0;
    for (const auto& [before, after] : s.tail_waits) {
      tail_waited_us += std::max(0.0, elapsed_us(driver, before, after));
    }
  }
  learned.parked_us = period_without_waits(clock, &learned.period);
  drop_events(learned.window);
}

}  // namespace vaswap::planner
