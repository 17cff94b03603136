// Slot lifecycle latency and offload/restore copy bandwidth, beside raw pinned cudaMemcpyAsync
// measured in the same run (DESIGN.md §8: each direction >= 95% of raw, both at once >= 95% of
// raw bidirectional). Built with nvcc (VASWAP_CUDA_EXAMPLES=ON) as bin/slot_bench_cuda.
//
//   slot_bench_cuda [--slots N] [--mib M] [--reps R] [--out FILE]
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <getopt.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "vaswap/vaswap.h"

namespace {

#define CHECK_CUDA(expr)                                                                          \
  do {                                                                                            \
    const cudaError_t rc_ = (expr);                                                               \
    if (rc_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(rc_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

#define CHECK_VASWAP(expr)                                                  \
  do {                                                                      \
    const vaswap_status st_ = (expr);                                       \
    if (st_ != VASWAP_OK) {                                                 \
      std::fprintf(stderr, "%s:%d %s: %s: %s\n", __FILE__, __LINE__, #expr, \
                   vaswap_status_name(st_), vaswap_last_error());           \
      std::exit(1);                                                         \
    }                                                                       \
  } while (0)

constexpr size_t kMiB = size_t{1} << 20;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void wait_released(const std::vector<vaswap_slot>& slots) {
  for (vaswap_slot slot : slots) {
    for (;;) {
      vaswap_slot_info info{};
      CHECK_VASWAP(vaswap_slot_get_info(slot, &info));
      if (info.mapped == 0 && info.release_pending == 0) break;
      std::this_thread::yield();
    }
  }
}

struct Set {
  std::vector<vaswap_slot> slots;
  std::vector<void*> hosts;
  std::vector<void*> raw;  // cudaMalloc buffers of the same sizes, for the baseline
};

Set make_set(int count, size_t bytes) {
  Set set;
  for (int i = 0; i < count; ++i) {
    vaswap_slot slot = nullptr;
    void* host = nullptr;
    void* raw = nullptr;
    CHECK_VASWAP(vaswap_slot_create(0, bytes, &slot));
    CHECK_VASWAP(vaswap_host_alloc(bytes, &host));
    CHECK_CUDA(cudaMalloc(&raw, bytes));
    vaswap_slot_info info{};
    CHECK_VASWAP(vaswap_slot_get_info(slot, &info));
    CHECK_CUDA(cudaMemset(reinterpret_cast<void*>(info.va), 0x5a, bytes));
    CHECK_CUDA(cudaMemset(raw, 0xa5, bytes));
    set.slots.push_back(slot);
    set.hosts.push_back(host);
    set.raw.push_back(raw);
  }
  return set;
}

// Device time between two events recorded around `enqueue` on `stream`.
template <class Fn>
double timed_ms(cudaStream_t stream, Fn&& enqueue) {
  cudaEvent_t start = nullptr, stop = nullptr;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  CHECK_CUDA(cudaEventRecord(start, stream));
  enqueue();
  CHECK_CUDA(cudaEventRecord(stop, stream));
  CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return ms;
}

// Plain cudaMemcpyAsync between the set's host buffers and its slots' addresses (mapped): the
// same memory vaswap moves, without vaswap.
void raw_slot_copies(const Set& set, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  for (size_t i = 0; i < set.slots.size(); ++i) {
    vaswap_slot_info info{};
    CHECK_VASWAP(vaswap_slot_get_info(set.slots[i], &info));
    auto* device = reinterpret_cast<void*>(info.va);
    if (kind == cudaMemcpyDeviceToHost) {
      CHECK_CUDA(cudaMemcpyAsync(set.hosts[i], device, bytes, kind, stream));
    } else {
      CHECK_CUDA(cudaMemcpyAsync(device, set.hosts[i], bytes, kind, stream));
    }
  }
}

void raw_copies(const Set& set, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  for (size_t i = 0; i < set.raw.size(); ++i) {
    if (kind == cudaMemcpyDeviceToHost) {
      CHECK_CUDA(cudaMemcpyAsync(set.hosts[i], set.raw[i], bytes, kind, stream));
    } else {
      CHECK_CUDA(cudaMemcpyAsync(set.raw[i], set.hosts[i], bytes, kind, stream));
    }
  }
}

void restore(const Set& set, cudaStream_t stream) {
  vaswap_remap remap = nullptr;
  CHECK_VASWAP(vaswap_remap_and_copy_after(set.slots.data(), set.hosts.data(), set.slots.size(),
                                           stream, &remap));
  CHECK_VASWAP(vaswap_remap_wait_on_stream(remap, stream));
  CHECK_VASWAP(vaswap_remap_adopt(remap));
  CHECK_VASWAP(vaswap_remap_destroy(remap));
}

// The planner's pattern: remap ahead of time, copy later. Maps every slot (not timed), then
// returns the remap; launch_copies() submits the H2D copies on `stream`.
vaswap_remap remap_ahead(const Set& set, cudaStream_t stream) {
  vaswap_remap remap = nullptr;
  CHECK_VASWAP(vaswap_remap_deferred_after(set.slots.data(), set.hosts.data(), set.slots.size(),
                                           stream, &remap));
  for (vaswap_slot slot : set.slots) {
    for (;;) {
      vaswap_slot_info info{};
      CHECK_VASWAP(vaswap_slot_get_info(slot, &info));
      if (info.mapped == 1 && info.release_pending == 0) break;
      std::this_thread::yield();
    }
  }
  return remap;
}

void launch_copies(vaswap_remap remap, size_t count, cudaStream_t stream) {
  for (size_t i = 0; i < count; ++i) CHECK_VASWAP(vaswap_remap_launch_h2d(remap, i, stream));
}

void finish(vaswap_remap remap) {
  CHECK_VASWAP(vaswap_remap_adopt(remap));
  CHECK_VASWAP(vaswap_remap_destroy(remap));
}

void offload(const Set& set, cudaStream_t stream) {
  CHECK_VASWAP(vaswap_offload_after(set.slots.data(), set.hosts.data(), set.slots.size(), stream));
}

// Both directions at once: `out` is offloaded on stream a while `in` (already offloaded) is
// restored on stream b; the span runs from a common start to the later of the two ends.
double bidirectional_ms(cudaStream_t a, cudaStream_t b, const std::function<void()>& on_a,
                        const std::function<void()>& on_b) {
  cudaEvent_t start = nullptr, end_a = nullptr, end_b = nullptr;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&end_a));
  CHECK_CUDA(cudaEventCreate(&end_b));
  CHECK_CUDA(cudaEventRecord(start, a));
  CHECK_CUDA(cudaStreamWaitEvent(b, start, 0));
  on_a();
  CHECK_CUDA(cudaEventRecord(end_a, a));
  on_b();
  CHECK_CUDA(cudaEventRecord(end_b, b));
  CHECK_CUDA(cudaEventSynchronize(end_a));
  CHECK_CUDA(cudaEventSynchronize(end_b));
  float ms_a = 0, ms_b = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms_a, start, end_a));
  CHECK_CUDA(cudaEventElapsedTime(&ms_b, start, end_b));
  for (cudaEvent_t e : {start, end_a, end_b}) CHECK_CUDA(cudaEventDestroy(e));
  return std::max(ms_a, ms_b);
}

}  // namespace

int main(int argc, char** argv) {
  int count = 8;
  size_t mib = 256;
  int reps = 5;
  std::string out;
  static const option options[] = {{"slots", required_argument, nullptr, 's'},
                                   {"mib", required_argument, nullptr, 'm'},
                                   {"reps", required_argument, nullptr, 'r'},
                                   {"out", required_argument, nullptr, 'o'},
                                   {nullptr, 0, nullptr, 0}};
  for (int c; (c = getopt_long(argc, argv, "", options, nullptr)) != -1;) {
    switch (c) {
      case 's': count = std::atoi(optarg); break;
      case 'm': mib = std::strtoull(optarg, nullptr, 10); break;
      case 'r': reps = std::atoi(optarg); break;
      case 'o': out = optarg; break;
      default:
        std::fprintf(stderr, "usage: %s [--slots N] [--mib M] [--reps R] [--out FILE]\n", argv[0]);
        return 2;
    }
  }
  const size_t bytes = mib * kMiB;
  const double set_gb = static_cast<double>(bytes) * count / 1e9;
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_VASWAP(vaswap_workers_init(0));
  cudaStream_t a = nullptr, b = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  Set one = make_set(count, bytes);
  Set two = make_set(count, bytes);
  CHECK_CUDA(cudaDeviceSynchronize());

  // Warm-up: one of each, so first-touch costs stay out of the numbers.
  timed_ms(a, [&] { raw_copies(one, bytes, cudaMemcpyDeviceToHost, a); });
  timed_ms(a, [&] { raw_copies(one, bytes, cudaMemcpyHostToDevice, a); });
  offload(one, a);
  restore(one, a);
  CHECK_CUDA(cudaStreamSynchronize(a));

  std::vector<double> raw_d2h, raw_h2d, vs_d2h, vs_h2d, raw_bi, vs_bi, freed_us, ahead_h2d,
      ahead_bi, ahead_bi_swapped, slot_d2h, slot_h2d, slot_bi, fresh_h2d, kept_h2d, kept_bi,
      kept_cold;
  for (int r = 0; r < reps; ++r) {
    raw_d2h.push_back(timed_ms(a, [&] { raw_copies(one, bytes, cudaMemcpyDeviceToHost, a); }));
    raw_h2d.push_back(timed_ms(a, [&] { raw_copies(one, bytes, cudaMemcpyHostToDevice, a); }));
    raw_bi.push_back(bidirectional_ms(
        a, b, [&] { raw_copies(one, bytes, cudaMemcpyDeviceToHost, a); },
        [&] { raw_copies(two, bytes, cudaMemcpyHostToDevice, b); }));
    slot_d2h.push_back(
        timed_ms(a, [&] { raw_slot_copies(one, bytes, cudaMemcpyDeviceToHost, a); }));
    slot_h2d.push_back(
        timed_ms(a, [&] { raw_slot_copies(two, bytes, cudaMemcpyHostToDevice, a); }));
    slot_bi.push_back(bidirectional_ms(
        a, b, [&] { raw_slot_copies(one, bytes, cudaMemcpyDeviceToHost, a); },
        [&] { raw_slot_copies(two, bytes, cudaMemcpyHostToDevice, b); }));

    const double t0 = now_us();
    vs_d2h.push_back(timed_ms(a, [&] { offload(one, a); }));
    wait_released(one.slots);
    freed_us.push_back(now_us() - t0);
    vs_h2d.push_back(timed_ms(a, [&] { restore(one, a); }));

    // Copies of slots remapped ahead (the planner's pattern), alone and beside an offload.
    offload(one, a);
    vaswap_remap remap = remap_ahead(one, a);
    ahead_h2d.push_back(timed_ms(a, [&] { launch_copies(remap, one.slots.size(), a); }));
    finish(remap);

    offload(two, b);
    wait_released(two.slots);
    vs_bi.push_back(bidirectional_ms(
        a, b, [&] { offload(one, a); }, [&] { restore(two, b); }));
    wait_released(one.slots);
    restore(one, a);
    CHECK_CUDA(cudaDeviceSynchronize());

    offload(two, b);
    remap = remap_ahead(two, b);
    double t_a = 0, t_b = 0;
    ahead_bi.push_back(bidirectional_ms(
        a, b,
        [&] {
          const double t = now_us();
          offload(one, a);
          t_a = now_us() - t;
        },
        [&] {
          const double t = now_us();
          launch_copies(remap, two.slots.size(), b);
          t_b = now_us() - t;
        }));
    finish(remap);
    std::fprintf(stderr, "diag: ahead bidir host us: offload %.0f, launch_copies %.0f\n", t_a, t_b);
    wait_released(one.slots);
    restore(one, a);
    CHECK_CUDA(cudaDeviceSynchronize());
    // Raw H2D into pages mapped just before the copy (new cuMemCreate handles, as every restore
    // gets): the driver's cost of fresh pages, apart from vaswap's submission.
    for (vaswap_slot slot : one.slots) {
      CHECK_VASWAP(vaswap_slot_unmap_and_release(slot));
      CHECK_VASWAP(vaswap_slot_create_and_remap(slot));
    }
    fresh_h2d.push_back(
        timed_ms(a, [&] { raw_slot_copies(one, bytes, cudaMemcpyHostToDevice, a); }));
    CHECK_CUDA(cudaDeviceSynchronize());
    // The planner's pattern again with page reuse (vaswap_set_page_reuse): each restore maps the
    // handles its offload kept instead of new ones.
    CHECK_VASWAP(vaswap_set_page_reuse(2 * static_cast<uint64_t>(count) * bytes));
    offload(one, a);
    remap = remap_ahead(one, a);
    kept_h2d.push_back(timed_ms(a, [&] { launch_copies(remap, one.slots.size(), a); }));
    finish(remap);
    offload(two, b);
    remap = remap_ahead(two, b);
    kept_bi.push_back(bidirectional_ms(
        a, b, [&] { offload(one, a); }, [&] { launch_copies(remap, two.slots.size(), b); }));
    finish(remap);
    wait_released(one.slots);
    restore(one, a);
    CHECK_CUDA(cudaDeviceSynchronize());
    // A cold restore (the remap on the path) into kept pages.
    offload(one, a);
    wait_released(one.slots);
    kept_cold.push_back(timed_ms(a, [&] { restore(one, a); }));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_VASWAP(vaswap_set_page_reuse(0));
    if (std::getenv("SLOT_BENCH_DIAG") != nullptr) {
      // Which part of a restore-copy submission holds the H2D back behind an offload's D2H on
      // another stream (docs/PERFORMANCE.md)? Each variant times both directions at once.
      static const char* const kVariant[] = {
          "",
          "raw D2H; vaswap_remap_launch_h2d copies",
          "vaswap offload; raw cudaMemcpyAsync H2D into the slots",
          "vaswap offload; vaswap_remap_launch_h2d 3 ms later",
          "raw D2H; driver cuMemcpyHtoDAsync into the slots",
          "raw D2H; vaswap_remap_launch_h2d from another thread",
          "as 4, with cuStreamGetDevice before each H2D",
          "as 4, with a timing event before and events after each H2D",
          "as 7, with a thread that synchronizes on each end event",
          "as 4, with only a timing event before each H2D",
          "as 4, with only a blocking-sync timing event after each H2D",
          "as 4, with only an untimed event after each H2D",
          "as 7, the copies on a side stream ordered by events",
      };
      using HtoD = CUresult (*)(CUdeviceptr, const void*, size_t, CUstream);
      HtoD htod = nullptr;
      cudaDriverEntryPointQueryResult found{};
      CHECK_CUDA(cudaGetDriverEntryPointByVersion(
          "cuMemcpyHtoDAsync", reinterpret_cast<void**>(&htod), 3020, cudaEnableDefault, &found));
      using GetDevice = CUresult (*)(CUstream, CUdevice*);
      GetDevice get_device = nullptr;
      CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuStreamGetDevice",
                                                  reinterpret_cast<void**>(&get_device), 12080,
                                                  cudaEnableDefault, &found));
      std::vector<cudaEvent_t> ev_start(two.slots.size()), ev_end(two.slots.size()),
          ev_done(two.slots.size());
      for (size_t i = 0; i < two.slots.size(); ++i) {
        CHECK_CUDA(cudaEventCreate(&ev_start[i]));
        CHECK_CUDA(cudaEventCreateWithFlags(&ev_end[i], cudaEventBlockingSync));
        CHECK_CUDA(cudaEventCreateWithFlags(&ev_done[i], cudaEventDisableTiming));
      }
      cudaStream_t side = nullptr;
      CHECK_CUDA(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
      cudaEvent_t ready = nullptr;
      CHECK_CUDA(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
      for (int variant = 1; variant <= 12; ++variant) {
        offload(two, b);
        remap = remap_ahead(two, b);
        std::vector<uint64_t> vas;
        for (vaswap_slot slot : two.slots) {
          vaswap_slot_info info{};
          CHECK_VASWAP(vaswap_slot_get_info(slot, &info));
          vas.push_back(info.va);
        }
        const double ms = bidirectional_ms(
            a, b,
            [&] {
              if (variant == 1 || variant >= 4) {
                raw_copies(one, bytes, cudaMemcpyDeviceToHost, a);
              } else {
                offload(one, a);
              }
            },
            [&] {
              if (variant == 3) std::this_thread::sleep_for(std::chrono::milliseconds(3));
              if (variant == 4 || variant >= 6) {  // raw D2H; driver cuMemcpyHtoDAsync
                std::thread waiter;
                for (size_t i = 0; i < vas.size(); ++i) {
                  CUdevice dev = 0;
                  if (variant == 6 && get_device(b, &dev) != CUDA_SUCCESS) std::exit(4);
                  cudaStream_t on = b;
                  if (variant == 12) {
                    CHECK_CUDA(cudaEventRecord(ready, b));
                    CHECK_CUDA(cudaStreamWaitEvent(side, ready, 0));
                    on = side;
                  }
                  if (variant == 7 || variant == 8 || variant == 9 || variant == 12) {
                    CHECK_CUDA(cudaEventRecord(ev_start[i], on));
                  }
                  if (htod(vas[i], two.hosts[i], bytes, on) != CUDA_SUCCESS) std::exit(3);
                  if (variant == 7 || variant == 8 || variant == 10 || variant == 12) {
                    CHECK_CUDA(cudaEventRecord(ev_end[i], on));
                  }
                  if (variant == 7 || variant == 8 || variant == 11 || variant == 12) {
                    CHECK_CUDA(cudaEventRecord(ev_done[i], on));
                  }
                  if (variant == 12) CHECK_CUDA(cudaStreamWaitEvent(b, ev_done[i], 0));
                }
                if (variant == 8) {  // a completion thread, as vaswap's
                  waiter = std::thread([&] {
                    for (size_t i = 0; i < vas.size(); ++i) {
                      CHECK_CUDA(cudaEventSynchronize(ev_end[i]));
                      float ms = 0;
                      CHECK_CUDA(cudaEventElapsedTime(&ms, ev_start[i], ev_end[i]));
                    }
                  });
                  waiter.detach();
                }
              } else if (variant == 5) {  // raw D2H; launch_copies from another thread
                std::thread t([&] { launch_copies(remap, two.slots.size(), b); });
                t.join();
              } else if (variant == 2) {
                for (size_t i = 0; i < vas.size(); ++i) {
                  CHECK_CUDA(cudaMemcpyAsync(reinterpret_cast<void*>(vas[i]), two.hosts[i], bytes,
                                             cudaMemcpyHostToDevice, b));
                }
              } else {
                launch_copies(remap, two.slots.size(), b);
              }
            });
        if (variant == 2 || variant == 4 || variant >= 6) {
          launch_copies(remap, two.slots.size(), b);  // so the remap can finish
        }
        finish(remap);
        std::fprintf(stderr, "diag: E%d (%s): both directions %.2f GB/s\n", variant,
                     kVariant[variant], 2 * set_gb / (ms / 1e3));
        if (variant == 2 || variant == 3) {
          wait_released(one.slots);
          restore(one, a);
        }
        CHECK_CUDA(cudaDeviceSynchronize());
      }
    }
    // The same with the copies submitted before the offload.
    offload(two, b);
    remap = remap_ahead(two, b);
    ahead_bi_swapped.push_back(bidirectional_ms(
        b, a, [&] { launch_copies(remap, two.slots.size(), b); }, [&] { offload(one, a); }));
    finish(remap);
    wait_released(one.slots);
    restore(one, a);
    CHECK_CUDA(cudaDeviceSynchronize());
  }

  // Lifecycle latency (host wall time, median of 50) for one slot of `mib` MiB.
  std::vector<double> create_us, release_us, remap_us, destroy_us, async_us;
  for (int i = 0; i < 50; ++i) {
    vaswap_slot slot = nullptr;
    double t = now_us();
    CHECK_VASWAP(vaswap_slot_create(0, bytes, &slot));
    create_us.push_back(now_us() - t);
    t = now_us();
    CHECK_VASWAP(vaswap_slot_unmap_and_release(slot));
    release_us.push_back(now_us() - t);
    t = now_us();
    CHECK_VASWAP(vaswap_slot_create_and_remap(slot));
    remap_us.push_back(now_us() - t);
    // Asynchronous round trip without copies: release callback, worker unmap, remap, adopt.
    t = now_us();
    CHECK_VASWAP(vaswap_release_after(&slot, 1, a));
    vaswap_remap remap = nullptr;
    CHECK_VASWAP(vaswap_remap_after(&slot, 1, a, &remap));
    CHECK_VASWAP(vaswap_remap_adopt(remap));
    async_us.push_back(now_us() - t);
    CHECK_VASWAP(vaswap_remap_destroy(remap));
    t = now_us();
    CHECK_VASWAP(vaswap_slot_destroy(slot));
    destroy_us.push_back(now_us() - t);
  }

  auto gbps = [&](const std::vector<double>& ms, double gb) { return gb / (median(ms) / 1e3); };
  const double d2h = gbps(raw_d2h, set_gb), h2d = gbps(raw_h2d, set_gb),
               bi = gbps(raw_bi, 2 * set_gb);
  const double sd2h = gbps(slot_d2h, set_gb), sh2d = gbps(slot_h2d, set_gb),
               sbi = gbps(slot_bi, 2 * set_gb);
  struct Line {
    std::string what;
    double value;
    std::string unit;
    double raw, raw_slots;  // baselines; 0: none
  };
  const std::vector<Line> rows = {
      {"D2H raw cudaMemcpyAsync (cudaMalloc memory)", d2h, "GB/s", 0, 0},
      {"D2H raw cudaMemcpyAsync (the slots' memory)", sd2h, "GB/s", 0, 0},
      {"D2H vaswap_offload_after", gbps(vs_d2h, set_gb), "GB/s", d2h, sd2h},
      {"H2D raw cudaMemcpyAsync (cudaMalloc memory)", h2d, "GB/s", 0, 0},
      {"H2D raw cudaMemcpyAsync (the slots' memory)", sh2d, "GB/s", 0, 0},
      {"H2D raw cudaMemcpyAsync (the slots' memory, pages mapped just before)",
       gbps(fresh_h2d, set_gb), "GB/s", h2d, sh2d},
      {"H2D vaswap restore copies (remapped ahead)", gbps(ahead_h2d, set_gb), "GB/s", h2d, sh2d},
      {"H2D vaswap restore copies (remapped ahead, kept pages: vaswap_set_page_reuse)",
       gbps(kept_h2d, set_gb), "GB/s", h2d, sh2d},
      {"H2D vaswap_remap_and_copy_after (cold: remap on the path)", gbps(vs_h2d, set_gb), "GB/s",
       h2d, sh2d},
      {"H2D vaswap_remap_and_copy_after (cold, kept pages)", gbps(kept_cold, set_gb), "GB/s", h2d,
       sh2d},
      {"both raw (cudaMalloc memory)", bi, "GB/s", 0, 0},
      {"both raw (the slots' memory)", sbi, "GB/s", 0, 0},
      {"both vaswap: offload + restore copies (remapped ahead)", gbps(ahead_bi, 2 * set_gb), "GB/s",
       bi, sbi},
      {"both vaswap: offload + restore copies (remapped ahead, kept pages)",
       gbps(kept_bi, 2 * set_gb), "GB/s", bi, sbi},
      {"both vaswap: restore copies submitted first, then offload",
       gbps(ahead_bi_swapped, 2 * set_gb), "GB/s", bi, sbi},
      {"both vaswap: offload + remap_and_copy (cold)", gbps(vs_bi, 2 * set_gb), "GB/s", bi, sbi},
      {"offload until pages freed", median(freed_us) / 1e3, "ms", 0, 0},
      {"slot_create (reserve+map)", median(create_us), "us", 0, 0},
      {"slot_unmap_and_release", median(release_us), "us", 0, 0},
      {"slot_create_and_remap", median(remap_us), "us", 0, 0},
      {"release_after+remap_after+adopt", median(async_us), "us", 0, 0},
      {"slot_destroy", median(destroy_us), "us", 0, 0},
  };
  char header[256];
  std::snprintf(header, sizeof header,
                "vaswap slot bench: %d slots x %zu MiB (%.2f GB a set), %d reps (median)\n", count,
                mib, set_gb, reps);
  std::string table = header;
  table +=
      "| measurement | value | unit | vs raw | vs raw on the slots' memory |\n"
      "|---|---:|---|---:|---:|\n";
  for (const Line& row : rows) {
    char line[400];
    if (row.raw > 0) {
      std::snprintf(line, sizeof line, "| %s | %.2f | %s | %.1f%% | %.1f%% |\n", row.what.c_str(),
                    row.value, row.unit.c_str(), 100.0 * row.value / row.raw,
                    100.0 * row.value / row.raw_slots);
    } else {
      std::snprintf(line, sizeof line, "| %s | %.2f | %s | | |\n", row.what.c_str(), row.value,
                    row.unit.c_str());
    }
    table += line;
  }
  std::fputs(table.c_str(), stdout);
  if (!out.empty()) {
    FILE* f = std::fopen(out.c_str(), "w");
    if (f == nullptr) return 1;
    std::fputs(table.c_str(), f);
    std::fclose(f);
  }
  for (Set* set : {&one, &two}) {
    for (size_t i = 0; i < set->slots.size(); ++i) {
      CHECK_VASWAP(vaswap_slot_destroy(set->slots[i]));
      CHECK_VASWAP(vaswap_host_free(set->hosts[i]));
      CHECK_CUDA(cudaFree(set->raw[i]));
    }
  }
  return 0;
}
