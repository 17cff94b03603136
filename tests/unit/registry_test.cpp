// The region registry: interior lookups, overlap rejection, capture tags, concurrent readers.
#include "observe/registry.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace vaswap {
namespace {

Region region(uintptr_t base, size_t bytes) {
  Region r;
  r.base = base;
  r.bytes = bytes;
  return r;
}

TEST(RegionRegistry, FindsARegionFromAnyInteriorAddress) {
  RegionRegistry registry;
  std::string error;
  ASSERT_TRUE(registry.insert(region(0x10000, 0x3000), &error)) << error;
  for (uintptr_t address : {0x10000u, 0x10001u, 0x11234u, 0x12fffu}) {
    auto found = registry.find(address);
    ASSERT_TRUE(found.has_value()) << std::hex << address;
    EXPECT_EQ(found->base, 0x10000u);
    EXPECT_EQ(found->bytes, 0x3000u);
  }
  EXPECT_FALSE(registry.find(0x13000).has_value());  // one past the end
  EXPECT_FALSE(registry.find(0xffff).has_value());   // one before the start
}

TEST(RegionRegistry, RejectsOverlapAndNamesTheRegionInTheWay) {
  RegionRegistry registry;
  std::string error;
  ASSERT_TRUE(registry.insert(region(0x10000, 0x1000), &error));
  EXPECT_FALSE(registry.insert(region(0x10800, 0x1000), &error));
  EXPECT_EQ(error, "region [0x10800, 0x11800) overlaps the registered region [0x10000, 0x11000)");
  EXPECT_FALSE(registry.insert(region(0xf000, 0x1001), &error));
  EXPECT_EQ(error, "region [0xf000, 0x10001) overlaps the registered region [0x10000, 0x11000)");
  EXPECT_FALSE(registry.insert(region(0x20000, 0), &error));
  EXPECT_EQ(registry.size(), 1u);
}

TEST(RegionRegistry, AdjacentRegionsAreSeparate) {
  RegionRegistry registry;
  std::string error;
  ASSERT_TRUE(registry.insert(region(0x10000, 0x1000), &error));
  ASSERT_TRUE(registry.insert(region(0x11000, 0x1000), &error)) << error;
  ASSERT_TRUE(registry.insert(region(0xf000, 0x1000), &error)) << error;
  EXPECT_EQ(registry.find(0x10fff)->base, 0x10000u);
  EXPECT_EQ(registry.find(0x11000)->base, 0x11000u);
  EXPECT_EQ(registry.find(0xffff)->base, 0xf000u);
}

TEST(RegionRegistry, EraseTakesTheBaseOnly) {
  RegionRegistry registry;
  std::string error;
  ASSERT_TRUE(registry.insert(region(0x10000, 0x1000), &error));
  EXPECT_FALSE(registry.erase(0x10010).has_value());
  auto erased = registry.erase(0x10000);
  ASSERT_TRUE(erased.has_value());
  EXPECT_EQ(erased->bytes, 0x1000u);
  EXPECT_FALSE(registry.find(0x10000).has_value());
  EXPECT_EQ(registry.size(), 0u);
}

TEST(RegionRegistry, OverlappingListsEveryIntersectingRegion) {
  RegionRegistry registry;
  std::string error;
  for (uintptr_t base : {0x10000u, 0x12000u, 0x14000u}) {
    ASSERT_TRUE(registry.insert(region(base, 0x1000), &error));
  }
  auto hit = registry.overlapping(0x10800, 0x12001);
  ASSERT_EQ(hit.size(), 2u);
  EXPECT_EQ(hit[0].base, 0x10000u);
  EXPECT_EQ(hit[1].base, 0x12000u);
  EXPECT_TRUE(registry.overlapping(0x11000, 0x12000).empty());
  EXPECT_EQ(registry.overlapping(0x0, 0x100000).size(), 3u);
}

TEST(RegionRegistry, KeepsTheCaptureAnAllocationWasMadeIn) {
  RegionRegistry registry;
  std::string error;
  Region r = region(0x10000, 0x1000);
  r.capture = CaptureTag{4242, 0xabc0, 7};
  ASSERT_TRUE(registry.insert(r, &error));
  ASSERT_TRUE(registry.insert(region(0x20000, 0x1000), &error));
  auto captured = registry.find(0x10100);
  ASSERT_TRUE(captured->capture.has_value());
  EXPECT_EQ(captured->capture->thread, 4242u);
  EXPECT_EQ(captured->capture->stream, 0xabc0u);
  EXPECT_EQ(captured->capture->sequence, 7u);
  EXPECT_FALSE(registry.find(0x20000)->capture.has_value());
}

// Readers run while a writer inserts and erases: a found region always contains the address.
TEST(RegionRegistry, ConcurrentReadersSeeWholeRegions) {
  RegionRegistry registry;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> found{0}, wrong{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; ++t) {
    readers.emplace_back([&, t] {
      uintptr_t address = 0x100000 + static_cast<uintptr_t>(t) * 0x777;
      while (!stop.load()) {
        if (auto r = registry.find(address)) {
          found.fetch_add(1);
          if (address < r->base || address >= r->base + r->bytes) wrong.fetch_add(1);
        }
        address = 0x100000 + (address * 2654435761u) % 0x100000;
      }
    });
  }
  // Write until the readers have looked often enough (bounded), however the threads are paced.
  std::string error;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (int round = 0;
       round < 2000 || (found.load() < 1000 && std::chrono::steady_clock::now() < deadline);
       ++round) {
    const uintptr_t base = 0x100000 + static_cast<uintptr_t>(round % 64) * 0x4000;
    if (!registry.erase(base).has_value()) registry.insert(region(base, 0x4000), &error);
  }
  stop.store(true);
  for (std::thread& t : readers) t.join();
  EXPECT_GE(found.load(), 1000u);
  EXPECT_EQ(wrong.load(), 0u);
}

}  // namespace
}  // namespace vaswap
