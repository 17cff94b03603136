// What the preload is told to do, from the environment. Knows nothing of CUDA.
//
// Issue 5 grows this into the full policy (YAML file + VASWAP_CONF); today it holds what the
// interposer needs to decide whether it is on and which allocations become slots.
#pragma once

#include <cstdint>
#include <string>

namespace vaswap {

enum class Mode { off, auto_ };

struct Settings {
  Mode mode = Mode::auto_;
  // Allocations at least this large can become slots. A slot costs one VMM handle and about
  // 0.1-0.6 ms to create (docs/PERFORMANCE.md), so small segments are not worth one.
  uint64_t min_bytes = uint64_t{16} << 20;
  // Only allocations made while the allocating thread captures a graph: graph-pool segments.
  bool captured_only = true;
};

// Applies "key=value,key=value" (VASWAP_CONF) on top of `settings`. Keys: mode (off|auto),
// selection.min_bytes (a size: 16MiB, 2GB, 4096), selection.captured_only (true|false).
// On the first error returns false, leaves `settings` unchanged, and sets `error` to a message
// that names the source, the key, what was expected and what was given.
bool apply_conf(const std::string& text, const char* source, Settings* settings,
                std::string* error);

// "16MiB", "2GB", "512k", "4096" -> bytes. Binary (KiB, MiB, GiB, TiB; also K, M, G, T) and
// decimal (kB, MB, GB, TB) units, optional B. Returns false on anything else or on overflow.
bool parse_size(const std::string& text, uint64_t* bytes);

// True when PyTorch's allocator config (PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF syntax:
// "key:value,key:value") turns expandable segments on.
bool expandable_segments_enabled(const std::string& alloc_conf);

}  // namespace vaswap
