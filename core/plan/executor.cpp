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
                       std::vector<std::vector<Slot*>> restores) {
  plan_ = id;
  releases_ = std::move(releases);
  restores_ = std::move(restores);
}

void Executor::clear() {
  keys_.clear();
  releases_.clear();
  restores_.clear();
  plan_ = 0;
  position_ = 0;
}

int Executor::locate(CUgraphExec exec, int* expected) {
  *expected = position_;
  const int period = static_cast<int>(keys_.size());
  if (period == 0) return -1;
  for (int k = 0; k < period; ++k) {
    const int q = (position_ + k) % period;
    if (keys_[static_cast<size_t>(q)] == exec) {
      position_ = q;
      return q;
    }
  }
  return -1;
}

const std::vector<Slot*>& Executor::releases() const {
  const auto p = static_cast<size_t>(position_);
  return p < releases_.size() ? releases_[p] : kNothing;
}

const std::vector<Slot*>& Executor::restores() const {
  const auto p = static_cast<size_t>(position_);
  return p < restores_.size() ? restores_[p] : kNothing;
}

void Executor::next() {
  if (!keys_.empty()) position_ = (position_ + 1) % static_cast<int>(keys_.size());
}

bool Executor::knows(CUgraphExec exec) const {
  return std::find(keys_.begin(), keys_.end(), exec) != keys_.end();
}

bool Executor::forget(Slot* slot) {
  bool planned = false;
  for (auto* lists : {&releases_, &restores_}) {
    for (auto& list : *lists) {
      const auto it = std::find(list.begin(), list.end(), slot);
      if (it != list.end()) {
        planned = true;
        list.erase(it);
      }
    }
  }
  return planned;
}

}  // namespace vaswap::planner
