#include "plan/executor.h"

#include <algorithm>
#include <utility>

namespace vaswap::planner {

namespace {
const std::vector<Slot*> kNothing;
}  // namespace

void Executor::follow(std::vector<CUgraphExec> keys) {
  clear();
  keys_ = std::move(keys);
  position_ = keys_.empty() ? 0 : 1 % static_cast<int>(keys_.size());
}

void Executor::install(uint64_t id, std::vector<std::vector<Slot*>> releases,
                       std::vector<std::vector<Slot*>> restores,
                       std::vector<std::vector<int>> after_calls) {
  plan_ = id;
  releases_ = std::move(releases);
  restores_ = std::move(restores);
  after_calls_ = std::move(after_calls);
  after_calls_.resize(releases_.size());
  for (size_t p = 0; p < releases_.size(); ++p) after_calls_[p].resize(releases_[p].size(), -1);
  reset_early();
}

void Executor::clear() {
  keys_.clear();
  releases_.clear();
  restores_.clear();
  after_calls_.clear();
  plan_ = 0;
  position_ = 0;
  reset_early();
}

void Executor::reset_early() {
  const auto p = static_cast<size_t>(position_);
  const size_t n = p < releases_.size() ? releases_[p].size() : 0;
  calls_.assign(n, 0);
  issued_.assign(n, false);
  issued_count_ = 0;
}

int Executor::locate(CUgraphExec exec, int* expected) {
  *expected = position_;
  const int period = static_cast<int>(keys_.size());
  if (period == 0) return -1;
  for (int k = 0; k < period; ++k) {
    const int q = (position_ + k) % period;
    if (keys_[static_cast<size_t>(q)] == exec) {
      // Out of order: what was issued early belonged to the position expected. The launch found
      // issues its own releases (those a skipped position released early stay released).
      if (q != position_) {
        position_ = q;
        reset_early();
      }
      return q;
    }
  }
  return -1;
}

const std::vector<Slot*>& Executor::releases() const {
  const auto p = static_cast<size_t>(position_);
  if (p >= releases_.size()) return kNothing;
  if (issued_count_ == 0) return releases_[p];  // the common case: nothing issued early
  left_.clear();
  for (size_t i = 0; i < releases_[p].size(); ++i) {
    if (!issued_[i]) left_.push_back(releases_[p][i]);
  }
  return left_;
}

template <class Due>
std::vector<Slot*> Executor::take_due(Due due) {
  const auto p = static_cast<size_t>(position_);
  std::vector<Slot*> out;
  if (p >= releases_.size() || issued_count_ == releases_[p].size()) return out;
  for (size_t i = 0; i < releases_[p].size(); ++i) {
    if (issued_[i] || !due(i)) continue;
    issued_[i] = true;
    ++issued_count_;
    out.push_back(releases_[p][i]);
  }
  return out;
}

std::vector<Slot*> Executor::due_after_launch() {
  const auto p = static_cast<size_t>(position_);
  return take_due([&](size_t i) { return after_calls_[p][i] == 0; });
}

std::vector<Slot*> Executor::due_after_eager(const std::vector<Slot*>& used) {
  const auto p = static_cast<size_t>(position_);
  return take_due([&](size_t i) {
    if (after_calls_[p][i] <= 0) return false;
    if (std::find(used.begin(), used.end(), releases_[p][i]) == used.end()) return false;
    return ++calls_[i] == after_calls_[p][i];
  });
}

const std::vector<Slot*>& Executor::restores() const {
  const auto p = static_cast<size_t>(position_);
  return p < restores_.size() ? restores_[p] : kNothing;
}

void Executor::next() {
  if (!keys_.empty()) position_ = (position_ + 1) % static_cast<int>(keys_.size());
  reset_early();
}

bool Executor::knows(CUgraphExec exec) const {
  return std::find(keys_.begin(), keys_.end(), exec) != keys_.end();
}

bool Executor::forget(Slot* slot) {
  bool planned = false;
  for (size_t p = 0; p < releases_.size(); ++p) {
    auto& list = releases_[p];
    const auto it = std::find(list.begin(), list.end(), slot);
    if (it == list.end()) continue;
    planned = true;
    const auto i = static_cast<size_t>(it - list.begin());
    after_calls_[p].erase(after_calls_[p].begin() + static_cast<std::ptrdiff_t>(i));
    if (p == static_cast<size_t>(position_)) {
      if (issued_[i]) --issued_count_;
      calls_.erase(calls_.begin() + static_cast<std::ptrdiff_t>(i));
      issued_.erase(issued_.begin() + static_cast<std::ptrdiff_t>(i));
    }
    list.erase(it);
  }
  for (auto& list : restores_) {
    const auto it = std::find(list.begin(), list.end(), slot);
    if (it != list.end()) {
      planned = true;
      list.erase(it);
    }
  }
  return planned;
}

}  // namespace vaswap::planner
