#include "plan/graph_windows.h"

#include <algorithm>

namespace vaswap::windows {

namespace {

// A gap a window could take: its candidate, where it is, and the positions it keeps the slot
// away (`from` to `to`, wrapping past the end for a wrap window).
struct Gap {
  Window window;
  size_t from = 0, to = 0;  // away from `from` through `to` (to < from: wraps)
  size_t length = 0;
};

// Every gap of every candidate that is long enough.
std::vector<Gap> gaps_of(const std::vector<Candidate>& candidates, size_t positions,
                         const Settings& s) {
  std::vector<Gap> gaps;
  for (size_t c = 0; c < candidates.size(); ++c) {
    const std::vector<size_t>& uses = candidates[c].uses;
    if (uses.empty()) continue;
    for (size_t i = 0; i + 1 < uses.size(); ++i) {
      const size_t last = uses[i], next = uses[i + 1];
      if (next < last + 1 + s.lead) continue;  // no room to map ahead of the next use
      const size_t trigger = next - s.lead;
      // Away (pages given back) from `lag` positions after the last use through the trigger:
      // for fewer than min_gap positions, not worth a window.
      if (trigger < last + s.lag + s.min_gap) continue;
      Gap g;
      g.window.candidate = c;
      g.window.release_after = last;
      g.window.restore_before = next;
      g.window.trigger = trigger;
      g.from = last + 1 + s.lag;
      g.to = trigger;
      g.length = trigger - last - s.lag;
      gaps.push_back(g);
    }
    // The wrap: after the last use (and the lag) to the end, then from the start to the
    // trigger; a lag longer than the tail runs on into the next launch's head.
    const size_t first = uses.front(), last = uses.back();
    const size_t tail = positions - 1 - last;
    const bool at_start = first < s.lead;
    const size_t head = at_start ? 0 : first - s.lead + 1;
    const size_t tail_away = tail > s.lag ? tail - s.lag : 0;
    const size_t lag_in_head = s.lag > tail ? s.lag - tail : 0;
    const size_t head_away = head > lag_in_head ? head - lag_in_head : 0;
    if (tail_away + head_away < s.min_gap || tail_away + head_away == 0) continue;
    Gap g;
    g.window.candidate = c;
    g.window.wrap = true;
    g.window.release_after = last;
    g.window.restore_before = first;
    g.window.trigger_at_start = at_start;
    g.window.trigger = at_start ? 0 : first - s.lead;
    g.from = tail_away > 0 ? last + 1 + s.lag : lag_in_head;
    g.to = at_start ? positions - 1 : g.window.trigger;
    g.length = tail_away + head_away;
    gaps.push_back(g);
  }
  return gaps;
}

}  // namespace

bool counts_on(const Window& w, const Window& r, size_t lag) {
  return !w.trigger_at_start && r.release_after + lag < w.trigger;
}

namespace {

bool covers(const Gap& g, size_t t) {
  return g.from <= g.to ? g.from <= t && t <= g.to : t >= g.from || t <= g.to;
}

// What the candidates hold at each position with `chosen` taken.
std::vector<uint64_t> held(const std::vector<Candidate>& candidates, const std::vector<Gap>& gaps,
                           const std::vector<bool>& chosen, size_t positions) {
  uint64_t total = 0;
  for (const Candidate& c : candidates) total += c.bytes;
  std::vector<int64_t> delta(positions + 1, 0);
  auto away = [&](size_t from, size_t to, uint64_t bytes) {
    delta[from] -= static_cast<int64_t>(bytes);
    delta[to + 1] += static_cast<int64_t>(bytes);
  };
  for (size_t i = 0; i < gaps.size(); ++i) {
    if (!chosen[i]) continue;
    const Gap& g = gaps[i];
    const uint64_t bytes = candidates[g.window.candidate].bytes;
    if (g.from <= g.to) {
      away(g.from, g.to, bytes);
    } else {
      away(g.from, positions - 1, bytes);
      away(0, g.to, bytes);
    }
  }
  std::vector<uint64_t> out(positions);
  int64_t running = static_cast<int64_t>(total);
  for (size_t t = 0; t < positions; ++t) {
    running += delta[t];
    out[t] = static_cast<uint64_t>(running);
  }
  return out;
}

// The uses before and after each chosen window of one candidate, in launch order.
void segment(const Candidate& c, std::vector<Window>* ws) {
  std::sort(ws->begin(), ws->end(), [](const Window& a, const Window& b) {
    return a.wrap != b.wrap ? a.wrap : a.release_after < b.release_after;
  });
  // Boundaries of the launch's segments: a segment runs from a restore (or the first use) to
  // the next release (or the last use).
  std::vector<const Window*> inner;
  const Window* wrap = nullptr;
  for (const Window& w : *ws) {
    if (w.wrap) {
      wrap = &w;
    } else {
      inner.push_back(&w);
    }
  }
  auto uses_in = [&](size_t lo, size_t hi) {
    std::vector<size_t> out;
    for (size_t u : c.uses) {
      if (lo <= u && u <= hi) out.push_back(u);
    }
    return out;
  };
  for (Window& w : *ws) {
    if (w.wrap) continue;
    // Before: since the previous inner window's restore, or the first use.
    size_t lo = c.uses.front();
    size_t hi = c.uses.back();
    for (const Window* o : inner) {
      if (o->restore_before <= w.release_after) lo = std::max(lo, o->restore_before);
      if (o->release_after >= w.restore_before) hi = std::min(hi, o->release_after);
    }
    w.before = uses_in(lo, w.release_after);
    w.after = uses_in(w.restore_before, hi);
  }
  if (wrap != nullptr) {
    Window& w = ws->front();  // the wrap sorts first
    size_t lo = c.uses.front(), hi = c.uses.back();
    for (const Window* o : inner) {
      lo = std::max(lo, o->restore_before);
      hi = std::min(hi, o->release_after);
    }
    w.before = uses_in(lo, c.uses.back());
    w.after = uses_in(c.uses.front(), hi);
  }
}

}  // namespace

Choice choose(const std::vector<Candidate>& candidates, size_t positions,
              const Settings& settings) {
  Choice choice;
  choice.lag = settings.lag;
  for (const Candidate& c : candidates) choice.total_bytes += c.bytes;
  if (positions == 0) return choice;
  const std::vector<Gap> gaps = gaps_of(candidates, positions, settings);
  std::vector<bool> chosen(gaps.size(), settings.target == 0);
  if (settings.target > 0) {
    // Each round takes the window that removes the most excess (bytes held over the target,
    // summed over the positions it covers) per byte it moves: every byte a window keeps away
    // costs that byte each way on the link, once per launch.
    std::vector<size_t> positions_of;  // the positions each window covers, flattened
    std::vector<size_t> first(gaps.size() + 1, 0);
    for (size_t i = 0; i < gaps.size(); ++i) {
      first[i] = positions_of.size();
      for (size_t t = 0; t < positions; ++t) {
        if (covers(gaps[i], t)) positions_of.push_back(t);
      }
    }
    first[gaps.size()] = positions_of.size();
    for (;;) {
      const std::vector<uint64_t> now = held(candidates, gaps, chosen, positions);
      size_t best = gaps.size();
      double best_score = 0;
      for (size_t i = 0; i < gaps.size(); ++i) {
        if (chosen[i]) continue;
        const uint64_t bytes = candidates[gaps[i].window.candidate].bytes;
        double excess = 0;
        for (size_t k = first[i]; k < first[i + 1]; ++k) {
          const uint64_t at = now[positions_of[k]];
          if (at > settings.target)
            excess += static_cast<double>(std::min(bytes, at - settings.target));
        }
        const double score = excess / static_cast<double>(bytes);
        if (score > best_score) {
          best_score = score;
          best = i;
        }
      }
      if (best == gaps.size()) break;  // at or under the target, or as low as windows go
      chosen[best] = true;
    }
    // A window taken early can be left with nothing to do once later ones cover its positions:
    // it would only move its bytes each way every launch. Each whose positions all stay within
    // the target without it is taken back, the one that moves most first. Where the target
    // cannot be met (a position stays above it with every window that covers it taken), within
    // the peak reached instead: pushing the other positions down to a target the peak misses
    // anyway only moves bytes (on random training-step graphs the choice moved up to 8.9 times
    // the bytes an exact solver needs for the same peak; within 1.2 times after this).
    std::vector<uint64_t> now = held(candidates, gaps, chosen, positions);
    const uint64_t within = std::max(settings.target, *std::max_element(now.begin(), now.end()));
    std::vector<size_t> order;
    for (size_t i = 0; i < gaps.size(); ++i) {
      if (chosen[i]) order.push_back(i);
    }
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return candidates[gaps[a].window.candidate].bytes >
             candidates[gaps[b].window.candidate].bytes;
    });
    for (size_t i : order) {
      const uint64_t bytes = candidates[gaps[i].window.candidate].bytes;
      bool needed = false;
      for (size_t k = first[i]; k < first[i + 1] && !needed; ++k) {
        needed = now[positions_of[k]] + bytes > within;
      }
      if (needed) continue;
      chosen[i] = false;
      for (size_t k = first[i]; k < first[i + 1]; ++k) now[positions_of[k]] += bytes;
    }
  }
  const std::vector<uint64_t> now = held(candidates, gaps, chosen, positions);
  choice.peak_bytes = *std::max_element(now.begin(), now.end());
  std::vector<std::vector<Window>> by_candidate(candidates.size());
  for (size_t i = 0; i < gaps.size(); ++i) {
    if (chosen[i]) by_candidate[gaps[i].window.candidate].push_back(gaps[i].window);
  }
  for (size_t c = 0; c < candidates.size(); ++c) {
    if (by_candidate[c].empty()) continue;
    segment(candidates[c], &by_candidate[c]);
    choice.moved_bytes += candidates[c].bytes * by_candidate[c].size();
    for (Window& w : by_candidate[c]) choice.windows.push_back(std::move(w));
  }
  return choice;
}

}  // namespace vaswap::windows
