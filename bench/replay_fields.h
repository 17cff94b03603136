// Reading the list fields of vaswap's trace events (plan_input, inside_input) for the offline
// replays (bench/plan_replay.cpp, bench/inside_replay.cpp): comma- or semicolon-separated items,
// each read back with yaml-cpp exactly as written (full-precision figures).
#pragma once

#include <yaml-cpp/yaml.h>

#include <sstream>
#include <string>
#include <vector>

namespace vaswap::replay {

// The items of `text` between `separator`s; an empty text has none, a trailing separator ends
// with an empty item.
inline std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> out;
  if (text.empty()) return out;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, separator)) out.push_back(item);
  if (text.back() == separator) out.emplace_back();
  return out;
}

template <class T>
std::vector<T> numbers(const std::string& text) {
  std::vector<T> out;
  for (const std::string& item : split(text, ',')) out.push_back(YAML::Node(item).as<T>());
  return out;
}

}  // namespace vaswap::replay
