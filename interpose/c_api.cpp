// The public C API (include/vaswap/vaswap.h): handle checks and error translation around core/.
// Every entry point catches everything: no C++ exception crosses into the caller.
#include <algorithm>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "base/capture_gate.h"
#include "base/errors.h"
#include "base/trace.h"
#include "observe/intercept.h"
#include "plan/planner.h"
#include "policy.h"
#include "slots/engine.h"
#include "vaswap/vaswap.h"

#define VASWAP_API extern "C" __attribute__((visibility("default")))

namespace {

using vaswap::Engine;
using vaswap::Error;
using vaswap::fail;

thread_local std::string last_error;

template <class Body>
vaswap_status guarded(Body&& body) {
  try {
    body();
    return VASWAP_OK;
  } catch (const Error& e) {
    last_error = e.what();
    return e.status();
  } catch (const std::bad_alloc&) {
    last_error = "out of host memory";
    return VASWAP_ERROR_UNAVAILABLE;
  } catch (const std::exception& e) {
    last_error = std::string("internal error: ") + e.what();
    return VASWAP_ERROR_INVALID_STATE;
  }
}

void require(const void* pointer, const char* call, const char* name) {
  if (pointer == nullptr) {
    fail(VASWAP_ERROR_INVALID_ARGUMENT, std::string(call) + ": " + name + " is NULL");
  }
}

std::vector<vaswap::Slot*> slot_list(Engine& e, const vaswap_slot* slots, size_t count,
                                     const char* call) {
  if (count > 0) require(slots, call, "slots");
  std::vector<vaswap::Slot*> list;
  list.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    if (slots[i] == nullptr) {
      fail(VASWAP_ERROR_INVALID_ARGUMENT,
           std::string(call) + ": slots[" + std::to_string(i) + "] is NULL");
    }
    list.push_back(e.slot_of(slots[i]));
  }
  return list;
}

std::vector<void*> host_list(void* const* hosts, size_t count, const char* call) {
  if (count > 0) require(hosts, call, "host_buffers");
  return std::vector<void*>(hosts, hosts + count);
}

CUstream as_stream(vaswap_stream stream) { return static_cast<CUstream>(stream); }

vaswap_status remap_call(vaswap::RemapKind kind, const char* call, const vaswap_slot* slots,
                         void* const* hosts, size_t count, vaswap_stream stream,
                         vaswap_remap* remap) {
  return guarded([&] {
    require(remap, call, "remap (the output)");
    *remap = nullptr;
    Engine& e = vaswap::engine();
    auto list = slot_list(e, slots, count, call);
    std::vector<void*> host_buffers;
    if (kind != vaswap::RemapKind::remap_only) host_buffers = host_list(hosts, count, call);
    *remap =
        reinterpret_cast<vaswap_remap>(e.remap_after(kind, list, host_buffers, as_stream(stream)));
  });
}

}  // namespace

VASWAP_API const char* vaswap_last_error(void) { return last_error.c_str(); }

VASWAP_API const char* vaswap_status_name(vaswap_status status) {
  switch (status) {
    case VASWAP_OK: return "VASWAP_OK";
    case VASWAP_ERROR_INVALID_ARGUMENT: return "VASWAP_ERROR_INVALID_ARGUMENT";
    case VASWAP_ERROR_INVALID_STATE: return "VASWAP_ERROR_INVALID_STATE";
    case VASWAP_ERROR_HOST_BUFFER: return "VASWAP_ERROR_HOST_BUFFER";
    case VASWAP_ERROR_DEVICE_MISMATCH: return "VASWAP_ERROR_DEVICE_MISMATCH";
    case VASWAP_ERROR_CAPTURING: return "VASWAP_ERROR_CAPTURING";
    case VASWAP_ERROR_CUDA: return "VASWAP_ERROR_CUDA";
    case VASWAP_ERROR_NOT_READY: return "VASWAP_ERROR_NOT_READY";
    case VASWAP_ERROR_NOT_FOUND: return "VASWAP_ERROR_NOT_FOUND";
    case VASWAP_ERROR_UNAVAILABLE: return "VASWAP_ERROR_UNAVAILABLE";
  }
  return "VASWAP_ERROR_UNKNOWN";
}

// ---- Slots ------------------------------------------------------------------------------------

VASWAP_API vaswap_status vaswap_slot_create(int device, size_t bytes, vaswap_slot* slot) {
  return guarded([&] {
    require(slot, "vaswap_slot_create", "slot (the output)");
    *slot = nullptr;
    *slot = reinterpret_cast<vaswap_slot>(vaswap::engine().create_slot(device, bytes));
  });
}

VASWAP_API vaswap_status vaswap_slot_create_strided(int device, int ndim, const int64_t* shape,
                                                    const int64_t* strides, size_t element_bytes,
                                                    vaswap_slot* slot) {
  return guarded([&] {
    const char* call = "vaswap_slot_create_strided";
    require(slot, call, "slot (the output)");
    *slot = nullptr;
    if (ndim < 0) fail(VASWAP_ERROR_INVALID_ARGUMENT, std::string(call) + ": ndim must be >= 0");
    if (ndim > 0) require(shape, call, "shape");
    if (element_bytes == 0) {
      fail(VASWAP_ERROR_INVALID_ARGUMENT, std::string(call) + ": element_bytes must be > 0");
    }
    // Extent = 1 + the largest offset any index reaches; contiguous strides when none given.
    unsigned __int128 last = 0;
    unsigned __int128 contiguous = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      if (shape[i] <= 0) {
        fail(VASWAP_ERROR_INVALID_ARGUMENT, std::string(call) + ": shape[" + std::to_string(i) +
                                                "] is " + std::to_string(shape[i]) +
                                                "; every dimension must be > 0");
      }
      const int64_t stride = strides != nullptr ? strides[i] : static_cast<int64_t>(contiguous);
      if (stride < 0) {
        fail(VASWAP_ERROR_INVALID_ARGUMENT, std::string(call) + ": strides[" + std::to_string(i) +
                                                "] is negative; slots hold non-negative strides");
      }
      last += static_cast<unsigned __int128>(shape[i] - 1) * static_cast<uint64_t>(stride);
      contiguous *= static_cast<uint64_t>(shape[i]);
    }
    const unsigned __int128 bytes = (last + 1) * element_bytes;
    if (bytes > std::numeric_limits<size_t>::max()) {
      fail(VASWAP_ERROR_INVALID_ARGUMENT, std::string(call) + ": the tensor's extent overflows");
    }
    *slot = reinterpret_cast<vaswap_slot>(
        vaswap::engine().create_slot(device, static_cast<size_t>(bytes)));
  });
}

VASWAP_API vaswap_status vaswap_slot_destroy(vaswap_slot slot) {
  return guarded([&] {
    Engine& e = vaswap::engine();
    vaswap::Slot* s = e.slot_of(slot);
    if (s->intercepted) {
      vaswap::fail(VASWAP_ERROR_INVALID_STATE,
                   "vaswap_slot_destroy: " + s->describe() +
                       " backs an allocation of the program (cudaMalloc/cuMemAlloc); the "
                       "program's cudaFree/cuMemFree of that pointer frees it");
    }
    // Destroying synchronizes the device, which would invalidate an open capture.
    const vaswap::capture_gate::Exclusive gate;
    if (!gate) {
      vaswap::fail(VASWAP_ERROR_INVALID_STATE,
                   "vaswap_slot_destroy: " + s->describe() +
                       " cannot be destroyed while a stream capture is open in this process (its "
                       "device-wide synchronize would invalidate the capture); destroy it after "
                       "the capture ends");
    }
    e.destroy_slot(s);
  });
}

VASWAP_API vaswap_status vaswap_slot_get_info(vaswap_slot slot, vaswap_slot_info* info) {
  return guarded([&] {
    require(info, "vaswap_slot_get_info", "info");
    Engine& e = vaswap::engine();
    *info = e.info(e.slot_of(slot));
  });
}

// ---- Offload ----------------------------------------------------------------------------------

VASWAP_API vaswap_status vaswap_release_after(const vaswap_slot* slots, size_t count,
                                              vaswap_stream stream) {
  return guarded([&] {
    Engine& e = vaswap::engine();
    e.release_after(slot_list(e, slots, count, "vaswap_release_after"), as_stream(stream));
  });
}

VASWAP_API vaswap_status vaswap_offload_after(const vaswap_slot* slots, void* const* host_buffers,
                                              size_t count, vaswap_stream stream) {
  return guarded([&] {
    const char* call = "vaswap_offload_after";
    Engine& e = vaswap::engine();
    auto list = slot_list(e, slots, count, call);
    e.offload_after(list, host_list(host_buffers, count, call), as_stream(stream));
  });
}

// ---- Restore ----------------------------------------------------------------------------------

VASWAP_API vaswap_status vaswap_remap_after(const vaswap_slot* slots, size_t count,
                                            vaswap_stream stream, vaswap_remap* remap) {
  return remap_call(vaswap::RemapKind::remap_only, "vaswap_remap_after", slots, nullptr, count,
                    stream, remap);
}

VASWAP_API vaswap_status vaswap_remap_and_copy_after(const vaswap_slot* slots,
                                                     void* const* host_buffers, size_t count,
                                                     vaswap_stream stream, vaswap_remap* remap) {
  return remap_call(vaswap::RemapKind::copy, "vaswap_remap_and_copy_after", slots, host_buffers,
                    count, stream, remap);
}

VASWAP_API vaswap_status vaswap_remap_deferred_after(const vaswap_slot* slots,
                                                     void* const* host_buffers, size_t count,
                                                     vaswap_stream stream, vaswap_remap* remap) {
  return remap_call(vaswap::RemapKind::deferred, "vaswap_remap_deferred_after", slots, host_buffers,
                    count, stream, remap);
}

VASWAP_API vaswap_status vaswap_remap_launch_h2d(vaswap_remap remap, size_t index,
                                                 vaswap_stream stream) {
  return guarded([&] {
    Engine& e = vaswap::engine();
    e.launch_h2d(e.remap_of(remap), index, as_stream(stream));
  });
}

VASWAP_API vaswap_status vaswap_remap_wait_slot_submitted(vaswap_remap remap, size_t index) {
  return guarded([&] {
    Engine& e = vaswap::engine();
    e.wait_submitted(e.remap_of(remap), index);
  });
}

VASWAP_API vaswap_status vaswap_remap_wait_slot_on_stream(vaswap_remap remap, size_t index,
                                                          vaswap_stream stream) {
  return guarded([&] {
    Engine& e = vaswap::engine();
    vaswap::RemapBatch* batch = e.remap_of(remap);
    if (index >= batch->entries.size()) {
      fail(VASWAP_ERROR_INVALID_ARGUMENT, "vaswap_remap_wait_slot_on_stream: index " +
                                              std::to_string(index) +
                                              " is out of range: the remap has " +
                                              std::to_string(batch->entries.size()) + " slot(s)");
    }
    e.wait_on_stream(batch, index, as_stream(stream));
  });
}

VASWAP_API vaswap_status vaswap_remap_wait_on_stream(vaswap_remap remap, vaswap_stream stream) {
  return guarded([&] {
    Engine& e = vaswap::engine();
    e.wait_on_stream(e.remap_of(remap), SIZE_MAX, as_stream(stream));
  });
}

VASWAP_API vaswap_status vaswap_remap_try_wait_on_stream(vaswap_remap remap, vaswap_stream stream) {
  bool ready = false;
  const vaswap_status status = guarded([&] {
    Engine& e = vaswap::engine();
    ready = e.try_wait_on_stream(e.remap_of(remap), as_stream(stream));
  });
  if (status != VASWAP_OK || ready) return status;
  last_error = "vaswap_remap_try_wait_on_stream: some H2D of the remap is not submitted yet";
  return VASWAP_ERROR_NOT_READY;
}

VASWAP_API vaswap_status vaswap_remap_adopt(vaswap_remap remap) {
  return guarded([&] {
    Engine& e = vaswap::engine();
    e.adopt(e.remap_of(remap));
  });
}

VASWAP_API vaswap_status vaswap_remap_destroy(vaswap_remap remap) {
  return guarded([&] {
    Engine& e = vaswap::engine();
    vaswap::RemapBatch* batch = e.remap_of(remap);
    // Discarding pages synchronizes the device, which would invalidate an open capture.
    const vaswap::capture_gate::Exclusive gate;
    e.destroy_remap(batch, static_cast<bool>(gate));
  });
}

// ---- Synchronous fallbacks --------------------------------------------------------------------

VASWAP_API vaswap_status vaswap_slot_unmap_and_release(vaswap_slot slot) {
  return guarded([&] {
    Engine& e = vaswap::engine();
    e.unmap_and_release(e.slot_of(slot));
  });
}

VASWAP_API vaswap_status vaswap_slot_create_and_remap(vaswap_slot slot) {
  return guarded([&] {
    Engine& e = vaswap::engine();
    e.create_and_remap(e.slot_of(slot));
  });
}

// ---- Pinned host buffers ----------------------------------------------------------------------

VASWAP_API vaswap_status vaswap_host_alloc(size_t bytes, void** host_buffer) {
  return guarded([&] {
    require(host_buffer, "vaswap_host_alloc", "host_buffer (the output)");
    *host_buffer = nullptr;
    *host_buffer = vaswap::engine().host_alloc(bytes);
  });
}

VASWAP_API vaswap_status vaswap_host_free(void* host_buffer) {
  return guarded([&] { vaswap::engine().host_free(host_buffer); });
}

// ---- Diagnostics and worker policy --------------------------------------------------------------

VASWAP_API vaswap_status vaswap_driver_memory_info(int device, size_t* free_bytes,
                                                   size_t* total_bytes) {
  return guarded([&] {
    require(free_bytes, "vaswap_driver_memory_info", "free_bytes");
    require(total_bytes, "vaswap_driver_memory_info", "total_bytes");
    vaswap::engine().memory_info(device, free_bytes, total_bytes);
  });
}

VASWAP_API vaswap_status vaswap_workers_init(int device) {
  return guarded([&] { vaswap::engine().init_workers(device); });
}

VASWAP_API vaswap_status vaswap_set_serial_driver_calls(int serial) {
  return guarded([&] { vaswap::engine().set_serial_driver_calls(serial != 0); });
}

VASWAP_API vaswap_status vaswap_set_page_reuse(uint64_t bytes_per_device) {
  return guarded([&] { vaswap::engine().set_page_reuse(bytes_per_device); });
}

VASWAP_API vaswap_status vaswap_trace_open(const char* path) {
  return guarded([&] {
    require(path, "vaswap_trace_open", "path");
    std::string error;
    if (!vaswap::trace::open(path, &error)) fail(VASWAP_ERROR_INVALID_ARGUMENT, error);
  });
}

VASWAP_API vaswap_status vaswap_trace_close(void) {
  return guarded([] { vaswap::trace::close(); });
}

VASWAP_API vaswap_status vaswap_get_stats(vaswap_stats* stats) {
  return guarded([&] {
    require(stats, "vaswap_get_stats", "stats");
    *stats = vaswap::engine().stats();
    const vaswap::intercept::Counters seen = vaswap::intercept::counters();
    stats->allocations_seen = seen.allocations;
    stats->frees_seen = seen.frees;
    stats->slots_selected = seen.slots;
    stats->captures_seen = seen.captures;
    stats->instantiations_seen = seen.instantiations;
    stats->graph_launches_seen = seen.launches;
    const vaswap::planner::Counters planned = vaswap::planner::counters();
    stats->plans = planned.plans;
    stats->regions_offloaded = planned.regions_offloaded;
    stats->planned_offloads = planned.planned_offloads;
    stats->planned_restores = planned.planned_restores;
    stats->on_demand_restores = planned.on_demand_restores;
    stats->guard_hits = planned.guard_hits;
    stats->deviations = planned.deviations;
    stats->restore_waits = planned.stalls;
    stats->restore_wait_ns = static_cast<uint64_t>(planned.stall_us * 1e3);
  });
}

VASWAP_API vaswap_status vaswap_slot_find(const void* address, vaswap_slot* slot) {
  return guarded([&] {
    require(slot, "vaswap_slot_find", "slot (the output)");
    *slot = nullptr;
    const auto region = vaswap::intercept::find_region(reinterpret_cast<uintptr_t>(address));
    if (!region || region->kind != vaswap::RegionKind::slot) {
      fail(VASWAP_ERROR_NOT_FOUND,
           "vaswap_slot_find: no slot contains " +
               vaswap::hex(reinterpret_cast<uintptr_t>(address)) +
               (region ? " (the preload saw its allocation but did not select it)"
                       : " (the preload has not seen an allocation there)"));
    }
    *slot = static_cast<vaswap_slot>(region->slot);
  });
}

namespace {

void copy_text(const std::string& from, char* text, size_t text_bytes) {
  const size_t n = std::min(from.size(), text_bytes - 1);
  std::memcpy(text, from.data(), n);
  text[n] = '\0';
}

}  // namespace

VASWAP_API vaswap_status vaswap_policy_check(const char* file, const char* conf, char* text,
                                             size_t text_bytes, int* errors) {
  return guarded([&] {
    require(text, "vaswap_policy_check", "text");
    require(errors, "vaswap_policy_check", "errors");
    if (text_bytes == 0)
      fail(VASWAP_ERROR_INVALID_ARGUMENT, "vaswap_policy_check: text_bytes is 0");
    const vaswap::PolicyLoad load =
        vaswap::load_policy(file != nullptr ? file : "", conf != nullptr ? conf : "");
    std::string out;
    if (load.ok()) {
      out = vaswap::explain(load);
    } else {
      for (const std::string& e : load.errors) out += e + "\n";
    }
    *errors = static_cast<int>(load.errors.size());
    copy_text(out, text, text_bytes);
  });
}

VASWAP_API vaswap_status vaswap_policy_schema(char* text, size_t text_bytes) {
  return guarded([&] {
    require(text, "vaswap_policy_schema", "text");
    if (text_bytes == 0)
      fail(VASWAP_ERROR_INVALID_ARGUMENT, "vaswap_policy_schema: text_bytes is 0");
    std::string out = "| key | type | default | meaning |\n|---|---|---|---|\n";
    auto cell = [](std::string value) {  // a | inside a cell would end it
      for (size_t i = value.find('|'); i != std::string::npos; i = value.find('|', i + 2)) {
        value.replace(i, 1, "\\|");
      }
      return value;
    };
    for (const vaswap::KeyDoc& k : vaswap::schema_docs()) {
      out += "| `" + k.key + "` | " + cell(k.type) + " | " + cell(k.default_value) + " | " +
             cell(k.meaning) + " |\n";
    }
    copy_text(out, text, text_bytes);
  });
}
