#include "plan/schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace vaswap::plan {

namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();
// The model is planned with margins: copies run alongside the program's own traffic, and VMM
// calls made while the device computes took up to 3x the copy test's figure on the H200
// (cuMemSetAccess 690 us for a 128 MiB region against 270 us for map and unmap in the test).
constexpr double kCopyMargin = 1.25;
constexpr double kRemapMargin = 3.0;

// One direction of the link, on a circle of one period: it carries one copy at a time (vaswap's
// copies in one direction run on one stream, in order).
class Link {
 public:
  explicit Link(double period_us) : period_us_(period_us) {}

  // The earliest start at or after `ready` (unrolled time) when [start, start + dur) is free.
  double place(double ready, double dur) const {
    if (dur >= period_us_) return kNever;
    double t = ready;
    for (size_t round = 0; round <= 2 * busy_.size() + 1; ++round) {
      bool moved = false;
      const double base = std::floor(t / period_us_) * period_us_;
      for (const auto& [from, to] : busy_) {
        for (double shift : {base - period_us_, base, base + period_us_}) {
          if (from + shift < t + dur && t < to + shift) {
            t = to + shift;
            moved = true;
          }
        }
      }
      if (!moved) return t;
      if (t - ready > period_us_) return kNever;
    }
    return kNever;
  }

  void take(double start, double dur) {
    const double from = std::fmod(start, period_us_);
    busy_.emplace_back(from, from + dur);
  }

 private:
  double period_us_;
  std::vector<std::pair<double, double>> busy_;  // [from, to), from in [0, period)
};

struct Candidate {
  Window window;
  uint64_t bytes = 0;                   // copied
  uint64_t pages = 0;                   // freed
  bool h2d_booked = true;               // the restore's copy has its place on the link
  double away_from = 0, away_to = 0;    // unrolled: released to mapped again
  double d2h_start = 0, h2d_start = 0;  // where the copies sit on the links
  double benefit = 0;
};

class Chooser {
 public:
  Chooser(const Period& period, const Model& model, const Knobs& knobs)
      : p_(period), model_(model), knobs_(knobs), d2h_(period.length_us), h2d_(period.length_us) {}

  double time_of(int unrolled) const {
    const int n = static_cast<int>(p_.start_us.size());
    const int periods = unrolled / n;  // whole periods before it
    return p_.start_us[static_cast<size_t>(unrolled % n)] +
           static_cast<double>(periods) * p_.length_us;
  }

  // The window's times with the links as they are now; freed_us <= 0 when it frees nothing.
  Candidate evaluate(int region, int u, int v) const {
    const int n = static_cast<int>(p_.start_us.size());
    Candidate c;
    c.bytes = p_.region_bytes[static_cast<size_t>(region)];
    c.pages = p_.region_pages.empty() ? c.bytes : p_.region_pages[static_cast<size_t>(region)];
    Window& w = c.window;
    w.region = region;
    w.last_use = u;
    w.next_use = v % n;
    const int release = u + 1 + knobs_.release_lag;
    // Under a budget a restore maps into pages a release gives back, at the latest one issued at
    // the restore's own position: that release's D2H starts there and its unmap follows it. So
    // the restore is issued at least prefetch_distance launches ahead, and further while the
    // positions in between are shorter than the room's copy and unmap, its own map and its own
    // copy (the model's times, with margins; a release of the same size stands for the room).
    // Then further still while its copy, placed on the link behind those already booked, would
    // end after the use: the latest position that hides it, else the one that shows least.
    // Never at the release's own position: a window too short for its lead keeps the slot away
    // one position, and the model says how much of its restore shows.
    const double half_remap = kRemapMargin * model_.remap_us / 2;
    const double room_us = kCopyMargin * model_.d2h_us(c.bytes) + half_remap;
    int restore = v - knobs_.prefetch_distance;
    const double lead_us = room_us + half_remap + kCopyMargin * model_.h2d_us(c.bytes);
    while (restore - 1 > release && time_of(v) - time_of(restore) < lead_us) --restore;
    w.release_at = release % n;
    w.restore_at = ((restore % n) + n) % n;
    if (release > restore || restore <= u) {
      w.freed_us = -1;
      return c;
    }
    const double t_release = time_of(release);
    const double d2h = kCopyMargin * model_.d2h_us(c.bytes);
    const double d2h_start = d2h_.place(t_release, d2h);
    if (d2h_start == kNever) {  // the period's link has no room left for this offload
      w.freed_us = -1;
      return c;
    }
    const double released = d2h_start + d2h + half_remap;
    const double h2d = kCopyMargin * model_.h2d_us(c.bytes);
    const double need = time_of(v);
    // The restore issued at `at`: when its pages are mapped, and where its copy starts (kNever:
    // no room on the link in the period).
    struct Restore {
      int at = 0;
      double mapped = 0, h2d_start = kNever, exposed = kNever;
    };
    auto issued_at = [&](int at) {
      Restore r;
      r.at = at;
      r.mapped = std::max(time_of(at) + room_us, released) + half_remap;
      r.h2d_start = h2d_.place(std::max(r.mapped, time_of(at)), h2d);
      // No room on the link: the restore runs on demand, when the slot is needed, and all of its
      // copy is exposed.
      const double start = r.h2d_start != kNever ? r.h2d_start : std::max(r.mapped, need);
      r.exposed = std::max(0.0, start + h2d - need);
      return r;
    };
    Restore chosen = issued_at(restore);
    for (int at = restore - 1; chosen.exposed > 0 && at > release; --at) {
      const Restore earlier = issued_at(at);
      if (earlier.exposed < chosen.exposed) chosen = earlier;
    }
    w.restore_at = ((chosen.at % n) + n) % n;
    c.h2d_booked = chosen.h2d_start != kNever;
    const double h2d_start = c.h2d_booked ? chosen.h2d_start : std::max(chosen.mapped, need);
    w.gap_us = need - t_release;
    w.d2h_us = d2h_start + d2h - t_release;
    w.h2d_us = h2d_start + h2d - chosen.mapped;
    w.freed_us = chosen.mapped - released;
    w.exposed_us = chosen.exposed;
    c.away_from = released;
    c.away_to = chosen.mapped;
    c.benefit = static_cast<double>(c.pages) * std::max(0.0, w.freed_us);
    c.d2h_start = d2h_start;
    c.h2d_start = h2d_start;
    return c;
  }

  void take(const Candidate& c) {
    d2h_.take(c.d2h_start, kCopyMargin * model_.d2h_us(c.bytes));
    if (c.h2d_booked) h2d_.take(c.h2d_start, kCopyMargin * model_.h2d_us(c.bytes));
    taken_.push_back(c);
  }

  // Most bytes away at once, on the circle, with `extra` added.
  uint64_t peak_with(const Candidate* extra) const {
    std::vector<const Candidate*> all;
    for (const Candidate& c : taken_) all.push_back(&c);
    if (extra != nullptr) all.push_back(extra);
    const double period = p_.length_us;
    auto covers = [period](const Candidate& c, double t) {
      const double from = std::fmod(c.away_from, period);
      const double to = from + (c.away_to - c.away_from);
      return (from <= t && t < to) || (from <= t + period && t + period < to);
    };
    uint64_t peak = 0;
    for (const Candidate* at : all) {
      const double t = std::fmod(at->away_from, period);
      uint64_t bytes = 0;
      for (const Candidate* c : all) {
        if (covers(*c, t)) bytes += c->pages;
      }
      peak = std::max(peak, bytes);
    }
    return peak;
  }

  const std::vector<Candidate>& taken() const { return taken_; }

 private:
  const Period& p_;
  const Model& model_;
  const Knobs& knobs_;
  Link d2h_, h2d_;
  std::vector<Candidate> taken_;
};

}  // namespace

namespace {

// The positions at which a window's region is away: from its release to its restore (circular).
std::vector<int> away_positions(const Window& w, int n) {
  std::vector<int> out;
  const int length = ((w.restore_at - w.release_at) % n + n) % n;
  out.reserve(static_cast<size_t>(length));
  for (int k = 0; k < length; ++k) out.push_back((w.release_at + k) % n);
  return out;
}

}  // namespace

Plan choose(const Period& period, const Model& model, const Knobs& knobs) {
  Plan plan;
  const int n = static_cast<int>(period.start_us.size());
  if (n == 0 || period.length_us <= 0 || model.h2d_gbps <= 0 || model.d2h_gbps <= 0) {
    plan.reason = "no period or no model";
    return plan;
  }
  // Each region's uses, in position order; a region used nowhere is never offloaded by the plan
  // (residency evicts it first when room is needed).
  std::vector<std::vector<int>> uses(period.region_bytes.size());
  for (int i = 0; i < n; ++i) {
    for (int region : period.uses[static_cast<size_t>(i)]) {
      auto& list = uses[static_cast<size_t>(region)];
      if (list.empty() || list.back() != i) list.push_back(i);
    }
  }
  auto pages_of = [&](size_t r) {
    return period.region_pages.empty() ? period.region_bytes[r] : period.region_pages[r];
  };
  for (size_t r = 0; r < uses.size(); ++r) {
    if (!uses[r].empty()) plan.total_pages += pages_of(r);
  }
  plan.resident_peak = plan.total_pages;
  if (knobs.budget_pages == 0 ||
      plan.total_pages <= std::max(knobs.budget_pages, knobs.limit_pages)) {
    plan.reason = "the period's slots fit the budget: nothing has to leave";
    return plan;
  }
  Chooser chooser(period, model, knobs);
  std::vector<Candidate> candidates;
  for (size_t r = 0; r < uses.size(); ++r) {
    const auto& list = uses[r];
    for (size_t k = 0; k < list.size(); ++k) {
      const int u = list[k];
      const int v = k + 1 < list.size() ? list[k + 1] : list[0] + n;
      Candidate c = chooser.evaluate(static_cast<int>(r), u, v);
      ++plan.candidates;
      if (c.window.freed_us > 0) candidates.push_back(c);
    }
  }
  // Windows the link hides before those it cannot; among each, the most pages away for the
  // longest first. Each is placed on the links as they fill, and taken while some position it
  // covers is still over the budget.
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) {
                     const bool ha = a.window.exposed_us > 0, hb = b.window.exposed_us > 0;
                     return ha != hb ? !ha : a.benefit > b.benefit;
                   });
  std::vector<int64_t> over(static_cast<size_t>(n),
                            static_cast<int64_t>(plan.total_pages - knobs.budget_pages));
  for (const Candidate& first : candidates) {
    const Candidate c =
        chooser.evaluate(first.window.region, first.window.last_use,
                         first.window.next_use <= first.window.last_use ? first.window.next_use + n
                                                                        : first.window.next_use);
    if (c.window.freed_us <= 0) continue;
    const std::vector<int> away = away_positions(c.window, n);
    const bool helps = std::any_of(away.begin(), away.end(),
                                   [&over](int q) { return over[static_cast<size_t>(q)] > 0; });
    if (!helps) continue;
    chooser.take(c);
    plan.exposed_us += c.window.exposed_us;
    for (int q : away) over[static_cast<size_t>(q)] -= static_cast<int64_t>(c.pages);
  }
  for (const Candidate& c : chooser.taken()) plan.windows.push_back(c.window);
  std::sort(plan.windows.begin(), plan.windows.end(), [](const Window& a, const Window& b) {
    return a.region != b.region ? a.region < b.region : a.last_use < b.last_use;
  });
  plan.peak_bytes = chooser.peak_with(nullptr);
  const int64_t worst = *std::max_element(over.begin(), over.end());
  plan.resident_peak = static_cast<uint64_t>(static_cast<int64_t>(knobs.budget_pages) + worst);
  if (worst > 0) {
    plan.short_pages = static_cast<uint64_t>(worst);
    plan.reason = fmt::format(
        "with every window taken, a position still holds {} bytes more than the budget of {}: "
        "the rest is evicted when it is needed, on demand",
        worst, knobs.budget_pages);
  } else if (plan.exposed_us > 0) {
    plan.reason =
        fmt::format("the budget needs {:.0f} us of copies the link cannot hide", plan.exposed_us);
  }
  return plan;
}

}  // namespace vaswap::plan
