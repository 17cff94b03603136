#include "plan/schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include <fmt/format.h>

namespace vaswap::plan {

namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();
// The model is planned with margins: copies run alongside the program's own traffic. Before the
// run has seen its own maps, VMM calls are allowed three times the copy test's figure (on the H200
// cuMemSetAccess took 690 us for a 128 MiB region beside the device's work against 270 us for map
// and unmap in the test).
constexpr double kCopyMargin = 1.25;
constexpr double kRemapMargin = 3.0;
// Below this a replayed set's restore time is rounding, not a copy that shows.
constexpr double kShowsNothingUs = 1.0;

// One region's map and unmap as the schedule allows for them. Where the run has seen its own maps
// and unmaps (remap_seen_us, a high quantile of them, beside the run's copies), that figure, or
// the copy test's where it is more: the margin stood for what the seen figure now measures. The
// test's figure (the best of three maps) can itself meet one of learning's D2Hs and read 0.6-1.1 ms
// (cuMemSetAccess waits about 0.74 ms beside a D2H, docs/PERFORMANCE.md fact 6); three times that
// made the schedule plan 2-3 ms remaps where the run's own took 1.1-1.2 ms, take 10-12 windows
// instead of 8-9 and leave 4-6 ms a step exposed (bench/results/remap_margin_session44.md).
// Without a seen figure, the test's with its margin.
double remap_allowed_us(const Model& model) {
  if (model.remap_seen_us > 0) return std::max(model.remap_us, model.remap_seen_us);
  return kRemapMargin * model.remap_us;
}

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
  // Unrolled positions (last use in [0, n)): where the release and the restore are issued, and
  // the next use. The replay reads these.
  int release_pos = 0, restore_pos = 0, use_pos = 0;
};

// What the taken windows do together, replayed in time (Chooser::replay).
struct Replay {
  double exposed_us = 0;     // one steady period's restore time that shows
  std::vector<double> each;  // per window of the set, in its order
};

class Chooser {
 public:
  // `shortest_leads`: every restore is issued prefetch_distance launches ahead of its use, however
  // long its room, map and copy take (see choose()).
  Chooser(const Period& period, const Model& model, const Knobs& knobs, uint64_t total_pages,
          bool shortest_leads = false)
      : p_(period),
        model_(model),
        knobs_(knobs),
        total_pages_(total_pages),
        shortest_leads_(shortest_leads),
        d2h_(period.length_us),
        h2d_(period.length_us) {}

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
    const double half_remap = remap_allowed_us(model_) / 2;
    const double room_us = kCopyMargin * model_.d2h_us(c.bytes) + half_remap;
    int restore = v - knobs_.prefetch_distance;
    const double lead_us = room_us + half_remap + kCopyMargin * model_.h2d_us(c.bytes);
    while (!shortest_leads_ && restore - 1 > release && time_of(v) - time_of(restore) < lead_us) {
      --restore;
    }
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
    for (int at = restore - 1; !shortest_leads_ && chosen.exposed > 0 && at > release; --at) {
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
    c.release_pos = release;
    c.restore_pos = chosen.at;
    c.use_pos = v;
    return c;
  }

  // The windows of `set` together, as residency carries them out, in time: each release's D2H
  // waits for its release point and for the D2H before it (one link, in order); its pages leave
  // when it ends and the unmap is done. Each restore, in the order issued, maps only once its
  // own release is done and the pages resident would stay within the budget, the map done; its
  // H2D then waits for the one before it. What lands after the next use begins shows. Evaluated
  // one at a time (evaluate()), a restore's room is assumed to come from a release of its size at
  // its own position; here it comes from the releases actually taken, which queue on the link: a
  // restore that counts on the D2Hs of releases issued just before it shows here, not there.
  // Three periods from a steady start (what wraps past the period's end is away at its start);
  // the last one is measured. The device's own timeline is not delayed by a late restore.
  Replay replay(const std::vector<const Candidate*>& set) const {
    struct Release {
      double ready = 0, dur = 0;
      uint64_t pages = 0;
      size_t index = 0;  // into `moves`
    };
    struct Move {  // one window's occurrence in one period
      size_t window = 0;
      int period = 0;
      double released = kNever;  // when its pages left (kNever: released before the replay)
      double issued = 0, need = 0, dur = 0;
      uint64_t pages = 0;
      bool away_at_start = false;
    };
    constexpr int kFirst = -1, kLast = 1;
    const double length = p_.length_us;
    const double start = kFirst * length;
    const double half_remap = remap_allowed_us(model_) / 2;
    std::vector<Move> moves;
    std::vector<Release> releases;
    uint64_t resident = total_pages_;
    for (size_t i = 0; i < set.size(); ++i) {
      const Candidate& c = *set[i];
      for (int k = kFirst - 1; k <= kLast; ++k) {
        const double shift = k * length;
        Move m;
        m.window = i;
        m.period = k;
        m.issued = time_of(c.restore_pos) + shift;
        m.need = time_of(c.use_pos) + shift;
        m.dur = kCopyMargin * model_.h2d_us(c.bytes);
        m.pages = c.pages;
        const double release_at = time_of(c.release_pos) + shift;
        if (m.issued < start) continue;  // back before the replay begins
        if (release_at < start) {
          m.away_at_start = true;
          resident -= std::min(resident, c.pages);
        } else {
          releases.push_back(
              {release_at, kCopyMargin * model_.d2h_us(c.bytes), c.pages, moves.size()});
        }
        moves.push_back(m);
      }
    }
    // Released at one point, the smallest copy first: the order in which residency issues them.
    std::sort(releases.begin(), releases.end(), [](const Release& a, const Release& b) {
      return a.ready != b.ready ? a.ready < b.ready : a.pages < b.pages;
    });
    std::vector<std::pair<double, uint64_t>> freed;  // (when, pages), in time order
    double link = -kNever;
    for (const Release& r : releases) {
      const double begin = std::max(r.ready, link);
      link = begin + r.dur;
      moves[r.index].released = link + half_remap;
      freed.emplace_back(link + half_remap, r.pages);
    }
    std::sort(freed.begin(), freed.end());
    std::vector<size_t> order(moves.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&moves](size_t a, size_t b) {
      return moves[a].issued != moves[b].issued ? moves[a].issued < moves[b].issued
                                                : moves[a].need < moves[b].need;
    });
    Replay out;
    out.each.assign(set.size(), 0.0);
    const uint64_t budget = knobs_.budget_pages;
    size_t next_freed = 0;
    uint64_t freed_sum = 0, mapped_sum = 0;
    double mover = -kNever, h2d_link = -kNever;
    const auto resident_now = [&] {
      const uint64_t held = resident + mapped_sum;
      return held > freed_sum ? held - freed_sum : 0;
    };
    for (size_t index : order) {
      const Move& m = moves[index];
      double t = std::max(m.issued, mover);
      if (!m.away_at_start) t = std::max(t, m.released);
      while (next_freed < freed.size() && freed[next_freed].first <= t) {
        freed_sum += freed[next_freed++].second;
      }
      // Room: wait for the next release to end while these pages would not fit. None left to
      // wait for: residency maps beyond the budget (budget_overshoots), so does the replay.
      while (resident_now() + m.pages > budget && next_freed < freed.size()) {
        t = std::max(t, freed[next_freed].first);
        freed_sum += freed[next_freed++].second;
      }
      mapped_sum += m.pages;
      mover = t;
      const double begin = std::max(t + half_remap, h2d_link);
      h2d_link = begin + m.dur;
      if (m.period == kLast) {
        const double shows = std::max(0.0, h2d_link - m.need);
        out.each[m.window] += shows;
        out.exposed_us += shows;
      }
    }
    return out;
  }

  void take(const Candidate& c) {
    book(c);
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
  void keep_for_room(size_t i) { taken_[i].window.for_room = true; }
  void forget_for_room() {
    for (Candidate& c : taken_) c.window.for_room = false;
  }

  // Takes the i-th window back: the links keep only the others' copies.
  void drop(size_t i) {
    taken_.erase(taken_.begin() + static_cast<std::ptrdiff_t>(i));
    d2h_ = Link(p_.length_us);
    h2d_ = Link(p_.length_us);
    for (const Candidate& c : taken_) book(c);
  }

 private:
  // The window's copies on the links.
  void book(const Candidate& c) {
    d2h_.take(c.d2h_start, kCopyMargin * model_.d2h_us(c.bytes));
    if (c.h2d_booked) h2d_.take(c.h2d_start, kCopyMargin * model_.h2d_us(c.bytes));
  }

  const Period& p_;
  const Model& model_;
  const Knobs& knobs_;
  uint64_t total_pages_;
  bool shortest_leads_;
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

// How windows are taken, each in the sorted order and each only while some position it keeps
// away is still over the budget: `in_order` takes each as it comes; `nothing_shown_first` first
// only those that add nothing to what the taken set shows (replayed together), then the rest;
// `least_shown` each time the one that adds least, the earliest in the order among equals.
enum class Way { in_order, nothing_shown_first, least_shown };

// `least_shown` replays every remaining candidate per window taken.
constexpr size_t kLeastShownCandidates = 512;

struct Selection {
  Chooser chooser;
  std::vector<int64_t> over;  // per position, pages over the budget with the windows taken
  Replay replayed;
  uint64_t moved_bytes = 0;

  int64_t worst() const { return *std::max_element(over.begin(), over.end()); }
  bool better_than(const Selection& other) const {
    const int64_t mine = std::max<int64_t>(0, worst()),
                  theirs = std::max<int64_t>(0, other.worst());
    if (mine != theirs) return mine < theirs;
    if (std::abs(replayed.exposed_us - other.replayed.exposed_us) > kShowsNothingUs) {
      return replayed.exposed_us < other.replayed.exposed_us;
    }
    return moved_bytes < other.moved_bytes;
  }
};

// Windows are taken one by one while a position they keep away is over the budget, so one taken
// early may be needed no longer once later ones cover its positions: it only moves bytes. Each
// window whose positions all stay within the budget without it, and without which the set shows
// no more, is taken back; the one that moves most first, then the one that frees least.
void prune(Selection& s) {
  const int n = static_cast<int>(s.over.size());
  for (bool dropped = true; dropped;) {
    dropped = false;
    // Marked again on each pass: after a drop, a window kept for another's room may be needed for
    // the budget itself, and only the last pass (which drops nothing) says which are which.
    s.chooser.forget_for_room();
    const std::vector<Candidate>& taken = s.chooser.taken();
    std::vector<size_t> order(taken.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&taken](size_t a, size_t b) {
      return taken[a].bytes != taken[b].bytes ? taken[a].bytes > taken[b].bytes
                                              : taken[a].benefit < taken[b].benefit;
    });
    for (size_t i : order) {
      const Candidate& c = taken[i];
      const std::vector<int> away = away_positions(c.window, n);
      const bool needed = std::any_of(away.begin(), away.end(), [&](int q) {
        return s.over[static_cast<size_t>(q)] + static_cast<int64_t>(c.pages) > 0;
      });
      if (needed) continue;
      std::vector<const Candidate*> rest;
      for (size_t k = 0; k < taken.size(); ++k) {
        if (k != i) rest.push_back(&taken[k]);
      }
      Replay replayed = s.chooser.replay(rest);
      if (replayed.exposed_us > s.replayed.exposed_us + kShowsNothingUs) {
        s.chooser.keep_for_room(i);
        continue;
      }
      for (int q : away) s.over[static_cast<size_t>(q)] += static_cast<int64_t>(c.pages);
      s.moved_bytes -= c.bytes;
      s.replayed = std::move(replayed);
      s.chooser.drop(i);
      dropped = true;
      break;  // `taken` changed: order again
    }
  }
}

Selection select(const Period& period, const Model& model, const Knobs& knobs, uint64_t total_pages,
                 const std::vector<Candidate>& sorted, Way way, bool shortest_leads) {
  const int n = static_cast<int>(period.start_us.size());
  Selection s{Chooser(period, model, knobs, total_pages, shortest_leads),
              std::vector<int64_t>(static_cast<size_t>(n),
                                   static_cast<int64_t>(total_pages - knobs.budget_pages)),
              {},
              0};
  std::vector<const Candidate*> set;  // s.chooser.taken(), as the replay reads it
  // The candidate placed on the links as they are now; nullopt when it frees nothing or keeps
  // away no position still over the budget.
  const auto placed = [&](const Candidate& first) -> std::optional<Candidate> {
    const int v = first.window.next_use <= first.window.last_use ? first.window.next_use + n
                                                                 : first.window.next_use;
    Candidate c = s.chooser.evaluate(first.window.region, first.window.last_use, v);
    if (c.window.freed_us <= 0) return std::nullopt;
    const std::vector<int> away = away_positions(c.window, n);
    const bool helps = std::any_of(away.begin(), away.end(),
                                   [&s](int q) { return s.over[static_cast<size_t>(q)] > 0; });
    if (!helps) return std::nullopt;
    return c;
  };
  const auto shown_with = [&](const Candidate& c) {
    std::vector<const Candidate*> with = set;
    with.push_back(&c);
    return s.chooser.replay(with);
  };
  const auto take = [&](const Candidate& c, const Replay& replayed) {
    s.chooser.take(c);
    set.clear();  // taken() grew: its elements may have moved
    for (const Candidate& taken : s.chooser.taken()) set.push_back(&taken);
    s.replayed = replayed;
    s.moved_bytes += c.bytes;
    for (int q : away_positions(c.window, n)) {
      s.over[static_cast<size_t>(q)] -= static_cast<int64_t>(c.pages);
    }
  };
  if (way == Way::least_shown) {
    std::vector<bool> used(sorted.size(), false);
    for (;;) {
      std::optional<Candidate> pick;
      Replay pick_replayed;
      size_t pick_index = 0;
      for (size_t i = 0; i < sorted.size(); ++i) {
        if (used[i]) continue;
        std::optional<Candidate> c = placed(sorted[i]);
        if (!c) continue;
        Replay replayed = shown_with(*c);
        if (!pick || replayed.exposed_us < pick_replayed.exposed_us - kShowsNothingUs) {
          pick = c;
          pick_replayed = std::move(replayed);
          pick_index = i;
        }
      }
      if (!pick) break;
      used[pick_index] = true;
      take(*pick, pick_replayed);
    }
    prune(s);
    return s;
  }
  std::vector<size_t> deferred;
  for (size_t i = 0; i < sorted.size(); ++i) {
    std::optional<Candidate> c = placed(sorted[i]);
    if (!c) continue;
    Replay replayed = shown_with(*c);
    if (way == Way::nothing_shown_first &&
        replayed.exposed_us > s.replayed.exposed_us + kShowsNothingUs) {
      deferred.push_back(i);
      continue;
    }
    take(*c, replayed);
  }
  for (size_t i : deferred) {
    std::optional<Candidate> c = placed(sorted[i]);
    if (c) take(*c, shown_with(*c));
  }
  prune(s);
  return s;
}

uint64_t pages_used(const Period& period) {
  std::vector<bool> used(period.region_bytes.size(), false);
  for (const std::vector<int>& at : period.uses) {
    for (int region : at) used[static_cast<size_t>(region)] = true;
  }
  uint64_t pages = 0;
  for (size_t r = 0; r < used.size(); ++r) {
    if (used[r])
      pages += period.region_pages.empty() ? period.region_bytes[r] : period.region_pages[r];
  }
  return pages;
}

}  // namespace

bool fits(const Period& period, const Knobs& knobs) {
  return knobs.budget_pages == 0 ||
         pages_used(period) <= std::max(knobs.budget_pages, knobs.limit_pages);
}

std::vector<size_t> restore_order(const std::vector<Window>& windows, int period,
                                  const std::vector<uint64_t>& region_bytes) {
  // Positions from the restore to its use, 1..period: a use at the restore's own position is the
  // next period's.
  const auto lead = [period](const Window& w) {
    return ((w.next_use - w.restore_at) % period + period - 1) % period + 1;
  };
  std::vector<size_t> order(windows.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const Window& wa = windows[a];
    const Window& wb = windows[b];
    if (wa.restore_at != wb.restore_at) return wa.restore_at < wb.restore_at;
    if (lead(wa) != lead(wb)) return lead(wa) < lead(wb);
    return region_bytes[static_cast<size_t>(wa.region)] <
           region_bytes[static_cast<size_t>(wb.region)];
  });
  return order;
}

Plan choose(const Period& period, const Model& model, const Knobs& knobs) {
  Plan plan;
  const int n = static_cast<int>(period.start_us.size());
  plan.total_pages = pages_used(period);
  plan.resident_peak = plan.total_pages;
  if (n > 0 && fits(period, knobs)) {
    plan.reason = "the period's slots fit the budget: nothing has to leave";
    return plan;
  }
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
  for (const auto& list : uses) plan.candidates += list.size();  // one per gap
  // Every window's candidate with the restore issued as the model says it must be to hide its
  // room, map and copy (or `shortest_leads`: prefetch_distance ahead), sorted: those the link
  // hides alone before those it cannot; among each, the most pages away for the longest first.
  const auto candidates_for = [&](bool shortest_leads) {
    const Chooser first(period, model, knobs, plan.total_pages, shortest_leads);
    std::vector<Candidate> candidates;
    for (size_t r = 0; r < uses.size(); ++r) {
      const auto& list = uses[r];
      for (size_t k = 0; k < list.size(); ++k) {
        const int u = list[k];
        const int v = k + 1 < list.size() ? list[k + 1] : list[0] + n;
        Candidate c = first.evaluate(static_cast<int>(r), u, v);
        if (c.window.freed_us > 0) candidates.push_back(c);
      }
    }
    std::stable_sort(candidates.begin(), candidates.end(),
                     [](const Candidate& a, const Candidate& b) {
                       const bool ha = a.window.exposed_us > 0, hb = b.window.exposed_us > 0;
                       return ha != hb ? !ha : a.benefit > b.benefit;
                     });
    return candidates;
  };
  // Each way of choosing gives a set that meets the budget where it can; the replay says what each
  // set shows together, and the one that leaves least over the budget, then shows least, then
  // moves least, is the plan. No one way is best for every period: taking first what shows
  // nothing can leave the budget's last positions to windows that show more.
  std::vector<Selection> tried;
  const auto try_ways = [&](bool shortest_leads) {
    const std::vector<Candidate> candidates = candidates_for(shortest_leads);
    for (const Way way : {Way::in_order, Way::nothing_shown_first, Way::least_shown}) {
      if (way == Way::least_shown && candidates.size() > kLeastShownCandidates) continue;
      tried.push_back(
          select(period, model, knobs, plan.total_pages, candidates, way, shortest_leads));
    }
  };
  const auto best_tried = [&tried] {
    size_t best = 0;
    for (size_t i = 1; i < tried.size(); ++i) {
      if (tried[i].better_than(tried[best])) best = i;
    }
    return best;
  };
  try_ways(false);
  // A restore issued further ahead holds its pages from there. Where the windows, so issued, still
  // leave a position over the budget, the rest is evicted and restored on demand, with the whole
  // of its copies in the step; restores issued later show part of theirs instead. So the same
  // choice is made again with every restore prefetch_distance ahead, and the set that leaves
  // least over the budget, then shows least, is taken. (On the H200, the per-layer PyTorch job at
  // 2816 MiB planned 192-352 MiB short without it and ran +25.7%, against +19.2% for the library
  // before; with it, within the budget, +20.5% against +19.1%: bench/results/
  // overhead_torch_layers_session40_*2816MiB_h200.md.)
  if (tried[best_tried()].worst() > 0) try_ways(true);
  const size_t best = best_tried();
  const Selection& chosen = tried[best];
  plan.exposed_us = chosen.replayed.exposed_us;
  for (size_t i = 0; i < chosen.chooser.taken().size(); ++i) {
    Window w = chosen.chooser.taken()[i].window;
    w.exposed_us = chosen.replayed.each[i];  // what it shows with the others: the replay's
    plan.windows.push_back(w);
  }
  std::sort(plan.windows.begin(), plan.windows.end(), [](const Window& a, const Window& b) {
    return a.region != b.region ? a.region < b.region : a.last_use < b.last_use;
  });
  plan.peak_bytes = chosen.chooser.peak_with(nullptr);
  for (const Window& w : plan.windows) {
    plan.moved_bytes += period.region_bytes[static_cast<size_t>(w.region)];
  }
  const int64_t worst = chosen.worst();
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
