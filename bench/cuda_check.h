// What the GPU probes share. CK(expr): the check of a CUDA driver or runtime call; on failure it
// names the file, line, call and status on stderr and ends the probe with exit status 1.
// device_pages(): the properties of VMM pages on a device, as vaswap's slots have them, and
// read_write(): access to them from that device.
#pragma once

#include <cuda.h>

#include <cstdio>
#include <cstdlib>

#define CK(expr)                                                               \
  do {                                                                         \
    const auto rc_ = (expr);                                                   \
    if (static_cast<int>(rc_) != 0) {                                          \
      std::fprintf(stderr, "%s:%d %s failed: %d\n", __FILE__, __LINE__, #expr, \
                   static_cast<int>(rc_));                                     \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

inline CUmemAllocationProp device_pages(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

inline CUmemAccessDesc read_write(const CUmemAllocationProp& prop) {
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return access;
}
