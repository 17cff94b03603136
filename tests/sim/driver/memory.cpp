// Simulated driver: device and pinned host allocations, VMM, copies, memsets, pointer queries.
//
// Device memory is host memory. cuMemAlloc maps anonymous pages; VMM is built on mmap:
//   reserve  = mmap(PROT_NONE)             physical handle = memfd
//   map      = mmap(MAP_FIXED|MAP_SHARED)  set access      = mprotect
//   unmap    = back to PROT_NONE anonymous pages
// so a touch of an unmapped VA faults (SIGSEGV), as a GPU faults with an illegal address, and a
// remap of another handle at the same VA shows that handle's contents. Physical bytes (what
// cuMemGetInfo reports as used) are charged per allocation, rounded to the 2 MiB granularity.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include <chrono>

#include "state.h"

namespace vsim {

namespace {

// kArray: a CUDA array's storage (rows of row_bytes, rows per layer, layers), device memory that
// no device pointer names: its CUarray handle is its start address.
enum class Kind { kDevice, kHost, kReservation, kArray };

struct Range {
  Kind kind;
  size_t bytes;
  int device;
  unsigned flags;
  size_t charged;                                           // physical bytes charged to the device
  size_t row_bytes = 0, rows = 0, layers = 0, element = 0;  // kArray only
};

struct PhysicalHandle {
  int fd = -1;
  size_t bytes = 0;
  int device = 0;
  int mappings = 0;
  bool released = false;
};

struct Mapping {
  size_t bytes;
  PhysicalHandle* handle;
  size_t offset;
  int prot;
  uint64_t access = 0;  // the devices given access (bit N: device N), by cuMemSetAccess
};

std::mutex& memory_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
// Pinned host memory: what cuMemHostAlloc holds now, and what it may hold in all (no limit unless
// VASWAP_SIM_PINNED_LIMIT or vaswapSimSetPinnedLimit sets one). A host that cannot pin more (its
// memory full of the program's own pinned buffers) refuses every later call, not one.
size_t g_pinned_bytes = 0;  // under memory_mutex()
std::atomic<unsigned long long>& pinned_limit() {
  static auto* limit = new std::atomic<unsigned long long>([] {
    const char* v = std::getenv("VASWAP_SIM_PINNED_LIMIT");
    return v != nullptr ? static_cast<unsigned long long>(parse_bytes(v, ~size_t{0})) : ~0ULL;
  }());
  return *limit;
}

std::map<uintptr_t, Range>& ranges() {  // allocations and reservations by start address
  static auto* m = new std::map<uintptr_t, Range>;
  return *m;
}
std::map<uintptr_t, Mapping>& mappings() {  // VMM mappings by start address
  static auto* m = new std::map<uintptr_t, Mapping>;
  return *m;
}
std::unordered_map<CUmemGenericAllocationHandle, PhysicalHandle*>& handles() {
  static auto* m = new std::unordered_map<CUmemGenericAllocationHandle, PhysicalHandle*>;
  return *m;
}

// The range that contains [p, p + bytes), or ranges().end(). Caller holds memory_mutex().
std::map<uintptr_t, Range>::iterator find_range(uintptr_t p, size_t bytes = 1) {
  auto& r = ranges();
  auto it = r.upper_bound(p);
  if (it == r.begin()) return r.end();
  --it;
  if (p + bytes > it->first + it->second.bytes) return r.end();
  return it;
}

void* map_anonymous(size_t bytes, int prot) {
  void* p = mmap(nullptr, bytes, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

CUresult alloc_device(CUdeviceptr* dptr, size_t bytes, int device) {
  if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  const size_t charged = round_up(bytes, kGranularity);
  SIM_TRY(charge_allocation(device, charged));
  void* p = map_anonymous(round_up(bytes, kPage), PROT_READ | PROT_WRITE);
  if (p == nullptr) {
    refund_physical(device, charged);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  std::lock_guard<std::mutex> lock(memory_mutex());
  ranges()[reinterpret_cast<uintptr_t>(p)] = Range{Kind::kDevice, bytes, device, 0, charged};
  *dptr = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}

CUresult free_range(uintptr_t p, Kind kind) {
  Range r{};
  {
    std::lock_guard<std::mutex> lock(memory_mutex());
    auto it = ranges().find(p);
    if (it == ranges().end() || it->second.kind != kind) return CUDA_ERROR_INVALID_VALUE;
    r = it->second;
    ranges().erase(it);
    if (kind == Kind::kHost) g_pinned_bytes -= round_up(r.bytes, kPage);
  }
  munmap(reinterpret_cast<void*>(p), round_up(r.bytes, kPage));
  if (r.charged != 0) refund_physical(r.device, r.charged);
  return CUDA_SUCCESS;
}

// An asynchronous copy from pageable memory up to this size is copied into the driver's own
// buffer when it is enqueued, and the call returns at once; a larger one waits for the stream's
// earlier work first (finish_staged). CUDA documents only that such a copy "might be
// synchronous"; small pageable copies behind unfinished work return at once on real GPUs.
constexpr size_t kInlineCopy = 64u << 10;

// Host memory vaswap_sim did not allocate or register: pageable (malloc, the stack).
bool pageable(const void* p) {
  std::lock_guard<std::mutex> lock(memory_mutex());
  return find_range(reinterpret_cast<uintptr_t>(p)) == ranges().end();
}

CUmemorytype memory_type(uintptr_t p) {
  std::lock_guard<std::mutex> lock(memory_mutex());
  auto it = find_range(p);
  if (it == ranges().end()) return CU_MEMORYTYPE_HOST;  // pageable host memory
  return it->second.kind == Kind::kHost ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
}

}  // namespace

// Copies and memsets are checked against their addresses when they are enqueued or recorded into
// a capture (measured on the H200, bench/results/launch_unmapped_h200.txt): a span inside a
// reservation must be mapped, with access for the device of the stream doing the work, from end to
// end, else CUDA_ERROR_INVALID_VALUE (measured on two H200s: a copy on one device's stream into
// another device's VMM pages without access for the first fails so; bench/results/capacity).
// Kernels are not checked, and graph nodes are not checked again at launch: they may name pages
// that are mapped only before they run.
CUresult check_span(uintptr_t p, size_t bytes, CUstream hs) {
  int device = -1;  // a stream that does not resolve fails at submit
  std::shared_ptr<Stream> stream;
  if (resolve_stream(hs, &stream) == CUDA_SUCCESS) device = stream->device;
  std::lock_guard<std::mutex> lock(memory_mutex());
  auto it = find_range(p);
  if (it == ranges().end() || it->second.kind != Kind::kReservation) return CUDA_SUCCESS;
  const uintptr_t end = p + std::max<size_t>(bytes, 1);
  uintptr_t at = p;
  auto m = mappings().upper_bound(at);
  if (m == mappings().begin()) return CUDA_ERROR_INVALID_VALUE;
  --m;
  while (at < end) {
    if (m == mappings().end() || m->first > at || m->first + m->second.bytes <= at ||
        m->second.prot == PROT_NONE || (device >= 0 && (m->second.access >> device & 1) == 0)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    at = m->first + m->second.bytes;
    ++m;
  }
  return CUDA_SUCCESS;
}

namespace {

void release_if_unused(PhysicalHandle* h) {  // caller holds memory_mutex()
  if (!h->released || h->mappings > 0) return;
  close(h->fd);
  refund_physical(h->device, h->bytes);
  delete h;
}

}  // namespace

CUDA_MEMCPY3D linear_copy(void* dst, CUmemorytype dst_type, const void* src, CUmemorytype src_type,
                          size_t bytes) {
  CUDA_MEMCPY3D c{};
  c.srcMemoryType = src_type;
  c.dstMemoryType = dst_type;
  if (src_type == CU_MEMORYTYPE_HOST) {
    c.srcHost = src;
  } else {
    c.srcDevice = reinterpret_cast<CUdeviceptr>(src);
  }
  if (dst_type == CU_MEMORYTYPE_HOST) {
    c.dstHost = dst;
  } else {
    c.dstDevice = reinterpret_cast<CUdeviceptr>(dst);
  }
  c.WidthInBytes = bytes;
  c.Height = 1;
  c.Depth = 1;
  return c;
}

static const char* copy_base(CUmemorytype t, const void* host, CUdeviceptr dev) {
  return t == CU_MEMORYTYPE_HOST ? static_cast<const char*>(host)
                                 : reinterpret_cast<const char*>(dev);
}

void run_copy(const CUDA_MEMCPY3D& c) {
  // The armed "copy_stall" fault holds this copy for that many milliseconds (a stalled engine).
  if (const int stall_ms = vaswapSimFaultCheck("copy_stall")) {
    std::this_thread::sleep_for(std::chrono::milliseconds(stall_ms));
  }
  const char* src = copy_base(c.srcMemoryType, c.srcHost, c.srcDevice);
  char* dst = const_cast<char*>(copy_base(c.dstMemoryType, c.dstHost, c.dstDevice));
  const size_t height = c.Height ? c.Height : 1;
  const size_t depth = c.Depth ? c.Depth : 1;
  const size_t src_pitch = c.srcPitch ? c.srcPitch : c.WidthInBytes;
  const size_t dst_pitch = c.dstPitch ? c.dstPitch : c.WidthInBytes;
  const size_t src_slice = (c.srcHeight ? c.srcHeight : height) * src_pitch;
  const size_t dst_slice = (c.dstHeight ? c.dstHeight : height) * dst_pitch;
  src += c.srcXInBytes + c.srcY * src_pitch + c.srcZ * src_slice;
  dst += c.dstXInBytes + c.dstY * dst_pitch + c.dstZ * dst_slice;
  for (size_t z = 0; z < depth; ++z) {
    for (size_t y = 0; y < height; ++y) {
      std::memmove(dst + z * dst_slice + y * dst_pitch, src + z * src_slice + y * src_pitch,
                   c.WidthInBytes);
    }
  }
}

void run_memset(const CUDA_MEMSET_NODE_PARAMS& m) {
  char* base = reinterpret_cast<char*>(m.dst);
  const size_t height = m.height ? m.height : 1;
  const size_t pitch = m.pitch ? m.pitch : m.width * m.elementSize;
  for (size_t y = 0; y < height; ++y) {
    char* row = base + y * pitch;
    for (size_t x = 0; x < m.width; ++x) {
      switch (m.elementSize) {
        case 1: row[x] = static_cast<char>(m.value); break;
        case 2: {
          const auto v = static_cast<uint16_t>(m.value);
          std::memcpy(row + 2 * x, &v, 2);
          break;
        }
        default: std::memcpy(row + 4 * x, &m.value, 4); break;
      }
    }
  }
}

}  // namespace vsim

using namespace vsim;

// -----------------------------------------------------------------------------------------------
// Device allocations
// -----------------------------------------------------------------------------------------------

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
  SIM_ENTER();
  int dev = 0;
  SIM_TRY(current_device(&dev));
  SIM_TRY(check_capture_safety());
  return alloc_device(dptr, bytes, dev);
}

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  SIM_ENTER();
  int dev = 0;
  SIM_TRY(current_device(&dev));
  SIM_TRY(check_capture_safety());
  {
    std::lock_guard<std::mutex> lock(memory_mutex());
    auto it = ranges().find(static_cast<uintptr_t>(dptr));
    if (it == ranges().end() || it->second.kind != Kind::kDevice) return CUDA_ERROR_INVALID_VALUE;
    dev = it->second.device;
  }
  synchronize_device(dev);  // cuMemFree synchronizes, as on a GPU
  return free_range(static_cast<uintptr_t>(dptr), Kind::kDevice);
}

CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr* dptr, size_t bytes, CUstream hs) {
  SIM_ENTER();
  std::shared_ptr<Stream> s;
  SIM_TRY(resolve_stream(hs, &s));
  {
    std::lock_guard<std::mutex> lock(capture_mutex());
    if (s->capture != nullptr) return CUDA_ERROR_NOT_SUPPORTED;  // no memory nodes (see docs)
  }
  return alloc_device(dptr, bytes, s->device);
}

CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hs) {
  SIM_ENTER();
  {
    std::lock_guard<std::mutex> lock(memory_mutex());
    auto it = ranges().find(static_cast<uintptr_t>(dptr));
    if (it == ranges().end() || it->second.kind != Kind::kDevice) return CUDA_ERROR_INVALID_VALUE;
  }
  auto node = std::make_unique<Node>();
  node->type = CU_GRAPH_NODE_TYPE_HOST;
  node->host_fn = [](void* p) { free_range(reinterpret_cast<uintptr_t>(p), Kind::kDevice); };
  node->host_data = reinterpret_cast<void*>(dptr);
  return submit(hs, std::move(node));
}

CUresult CUDAAPI cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  SIM_ENTER();
  if (free_bytes == nullptr || total_bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  int dev = 0;
  SIM_TRY(current_device(&dev));
  const Device& d = devices()[static_cast<size_t>(dev)];
  *total_bytes = d.capacity_bytes;
  *free_bytes = d.capacity_bytes - d.physical_bytes.load();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* bytes, CUdeviceptr dptr) {
  SIM_ENTER();
  std::lock_guard<std::mutex> lock(memory_mutex());
  auto it = find_range(static_cast<uintptr_t>(dptr));
  if (it == ranges().end() || it->second.kind != Kind::kDevice) return CUDA_ERROR_NOT_FOUND;
  if (base != nullptr) *base = static_cast<CUdeviceptr>(it->first);
  if (bytes != nullptr) *bytes = it->second.bytes;
  return CUDA_SUCCESS;
}

// -----------------------------------------------------------------------------------------------
// Pinned host memory
// -----------------------------------------------------------------------------------------------

CUresult CUDAAPI cuMemHostAlloc(void** pp, size_t bytes, unsigned int flags) {
  SIM_ENTER();
  constexpr unsigned kKnown =
      CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  if (pp == nullptr || bytes == 0 || (flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
  int dev = 0;
  SIM_TRY(current_device(&dev));
  SIM_TRY(check_capture_safety());
  const size_t pages = round_up(bytes, kPage);
  {
    std::lock_guard<std::mutex> lock(memory_mutex());
    if (g_pinned_bytes + pages > pinned_limit().load()) return CUDA_ERROR_OUT_OF_MEMORY;
    g_pinned_bytes += pages;  // held for this call, so two at once cannot pass the limit
  }
  void* p = map_anonymous(pages, PROT_READ | PROT_WRITE);
  std::lock_guard<std::mutex> lock(memory_mutex());
  if (p == nullptr) {
    g_pinned_bytes -= pages;
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  ranges()[reinterpret_cast<uintptr_t>(p)] = Range{Kind::kHost, bytes, dev, flags, 0};
  *pp = p;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAllocHost_v2(void** pp, size_t bytes) { return cuMemHostAlloc(pp, bytes, 0); }

CUresult CUDAAPI cuMemFreeHost(void* p) {
  SIM_ENTER();
  SIM_TRY(check_capture_safety());
  return free_range(reinterpret_cast<uintptr_t>(p), Kind::kHost);
}

// Unified addressing: pinned host memory has the same address on the device.
CUresult CUDAAPI cuMemHostGetDevicePointer_v2(CUdeviceptr* dptr, void* p, unsigned int flags) {
  SIM_ENTER();
  if (dptr == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(memory_mutex());
  auto it = find_range(reinterpret_cast<uintptr_t>(p));
  if (it == ranges().end() || it->second.kind != Kind::kHost) return CUDA_ERROR_INVALID_VALUE;
  *dptr = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostGetFlags(unsigned int* flags, void* p) {
  SIM_ENTER();
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(memory_mutex());
  auto it = find_range(reinterpret_cast<uintptr_t>(p));
  if (it == ranges().end() || it->second.kind != Kind::kHost) return CUDA_ERROR_INVALID_VALUE;
  *flags = it->second.flags;
  return CUDA_SUCCESS;
}

// -----------------------------------------------------------------------------------------------
// Pointer attributes
// -----------------------------------------------------------------------------------------------

CUresult CUDAAPI cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  SIM_ENTER();
  if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(memory_mutex());
  const auto p = static_cast<uintptr_t>(ptr);
  uintptr_t start = 0;
  size_t bytes = 0;
  int device = 0;
  CUmemorytype type = CU_MEMORYTYPE_DEVICE;
  auto mit = mappings().upper_bound(p);
  if (mit != mappings().begin() && p < std::prev(mit)->first + std::prev(mit)->second.bytes) {
    --mit;
    start = mit->first;
    bytes = mit->second.bytes;
    device = mit->second.handle->device;
  } else {
    auto it = find_range(p);
    if (it == ranges().end() || it->second.kind == Kind::kReservation ||
        it->second.kind == Kind::kArray) {
      return CUDA_ERROR_INVALID_VALUE;  // unregistered host memory, an unmapped VA, an array
    }
    start = it->first;
    bytes = it->second.bytes;
    device = it->second.device;
    type = it->second.kind == Kind::kHost ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
  }
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *static_cast<unsigned*>(data) = type; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *static_cast<int*>(data) = device; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *static_cast<CUdeviceptr*>(data) = ptr; break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      *static_cast<void**>(data) =
          type == CU_MEMORYTYPE_HOST ? reinterpret_cast<void*>(ptr) : nullptr;
      break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *static_cast<CUdeviceptr*>(data) = start; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *static_cast<size_t*>(data) = bytes; break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *static_cast<unsigned*>(data) = 0; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *static_cast<int*>(data) = 1; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

// -----------------------------------------------------------------------------------------------
// Virtual memory management
// -----------------------------------------------------------------------------------------------

// Several attributes at once. Unlike the single query, an address that is not a CUDA pointer is
// no error: every attribute gets its null value, and the call succeeds (as the driver documents).
CUresult CUDAAPI cuPointerGetAttributes(unsigned int count, CUpointer_attribute* attributes,
                                        void** data, CUdeviceptr ptr) {
  SIM_ENTER();
  if (attributes == nullptr || data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned int i = 0; i < count; ++i) {
    if (data[i] == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (cuPointerGetAttribute(data[i], attributes[i], ptr) == CUDA_SUCCESS) continue;
    switch (attributes[i]) {
      case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      case CU_POINTER_ATTRIBUTE_IS_MANAGED: *static_cast<unsigned*>(data[i]) = 0; break;
      case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *static_cast<int*>(data[i]) = -2; break;
      case CU_POINTER_ATTRIBUTE_MAPPED: *static_cast<int*>(data[i]) = 0; break;
      case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *static_cast<size_t*>(data[i]) = 0; break;
      case CU_POINTER_ATTRIBUTE_CONTEXT:
      case CU_POINTER_ATTRIBUTE_HOST_POINTER: *static_cast<void**>(data[i]) = nullptr; break;
      case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *static_cast<CUdeviceptr*>(data[i]) = 0; break;
      default: return CUDA_ERROR_INVALID_VALUE;
    }
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                               CUmemAllocationGranularity_flags option) {
  SIM_ENTER();
  (void)option;  // minimum and recommended granularity are both 2 MiB
  if (granularity == nullptr || prop == nullptr || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (prop->location.id < 0 || prop->location.id >= device_count())
    return CUDA_ERROR_INVALID_DEVICE;
  *granularity = kGranularity;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr* ptr, size_t bytes, size_t alignment,
                                     CUdeviceptr addr, unsigned long long flags) {
  SIM_ENTER();
  (void)addr;  // a hint only
  if (ptr == nullptr || bytes == 0 || bytes % kGranularity != 0 || flags != 0 ||
      (alignment & (alignment - 1)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  SIM_TRY(check_capture_safety());
  const size_t align = std::max(alignment, kGranularity);
  char* raw = static_cast<char*>(map_anonymous(bytes + align, PROT_NONE));
  if (raw == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  const auto start = round_up(reinterpret_cast<uintptr_t>(raw), align);
  const size_t head = start - reinterpret_cast<uintptr_t>(raw);
  if (head > 0) munmap(raw, head);
  if (align - head > 0) munmap(reinterpret_cast<char*>(start) + bytes, align - head);
  std::lock_guard<std::mutex> lock(memory_mutex());
  ranges()[start] = Range{Kind::kReservation, bytes, -1, 0, 0};
  *ptr = static_cast<CUdeviceptr>(start);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t bytes) {
  SIM_ENTER();
  SIM_TRY(check_capture_safety());
  std::lock_guard<std::mutex> lock(memory_mutex());
  const auto p = static_cast<uintptr_t>(ptr);
  auto it = ranges().find(p);
  if (it == ranges().end() || it->second.kind != Kind::kReservation || it->second.bytes != bytes) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto m = mappings().lower_bound(p);
  if (m != mappings().end() && m->first < p + bytes)
    return CUDA_ERROR_ILLEGAL_STATE;  // still mapped
  munmap(reinterpret_cast<void*>(p), bytes);
  ranges().erase(it);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t bytes,
                             const CUmemAllocationProp* prop, unsigned long long flags) {
  SIM_ENTER();
  if (handle == nullptr || prop == nullptr || flags != 0 || bytes == 0 ||
      bytes % kGranularity != 0 || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (prop->location.id < 0 || prop->location.id >= device_count())
    return CUDA_ERROR_INVALID_DEVICE;
  SIM_TRY(check_capture_safety());
  SIM_TRY(charge_allocation(prop->location.id, bytes));
  const int fd = memfd_create("vaswap-sim-physical", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    if (fd >= 0) close(fd);
    refund_physical(prop->location.id, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  auto* h = new PhysicalHandle{fd, bytes, prop->location.id, 0, false};
  std::lock_guard<std::mutex> lock(memory_mutex());
  const auto id = reinterpret_cast<CUmemGenericAllocationHandle>(h);
  handles()[id] = h;
  *handle = id;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  SIM_ENTER();
  SIM_TRY(check_capture_safety());
  std::lock_guard<std::mutex> lock(memory_mutex());
  auto it = handles().find(handle);
  if (it == handles().end()) return CUDA_ERROR_INVALID_VALUE;
  PhysicalHandle* h = it->second;
  handles().erase(it);
  h->released = true;
  release_if_unused(h);  // physical memory goes once the last mapping is gone too
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t bytes, size_t offset,
                          CUmemGenericAllocationHandle handle, unsigned long long flags) {
  SIM_ENTER();
  const auto p = static_cast<uintptr_t>(ptr);
  if (flags != 0 || bytes == 0 || p % kGranularity != 0 || bytes % kGranularity != 0 ||
      offset % kGranularity != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  SIM_TRY(check_capture_safety());
  // Not while the device is held (a staged copy's wait, a load: Device::loading), as on the H200,
  // where vaswap's mover waited for the driver's lock meanwhile.
  int device = -1;
  {
    std::lock_guard<std::mutex> lock(memory_mutex());
    auto hit = handles().find(handle);
    if (hit != handles().end()) device = hit->second->device;
  }
  std::shared_lock<std::shared_mutex> held;
  if (device >= 0) {
    held = std::shared_lock<std::shared_mutex>(devices()[static_cast<size_t>(device)].loading);
  }
  std::lock_guard<std::mutex> lock(memory_mutex());
  auto hit = handles().find(handle);
  if (hit == handles().end()) return CUDA_ERROR_INVALID_HANDLE;
  PhysicalHandle* h = hit->second;
  if (offset + bytes > h->bytes) return CUDA_ERROR_INVALID_VALUE;
  auto r = find_range(p, bytes);
  if (r == ranges().end() || r->second.kind != Kind::kReservation) return CUDA_ERROR_INVALID_VALUE;
  auto m = mappings().lower_bound(p);
  if (m != mappings().end() && m->first < p + bytes) return CUDA_ERROR_ALREADY_MAPPED;
  if (m != mappings().begin() && std::prev(m)->first + std::prev(m)->second.bytes > p) {
    return CUDA_ERROR_ALREADY_MAPPED;
  }
  void* at = mmap(reinterpret_cast<void*>(p), bytes, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd,
                  static_cast<off_t>(offset));
  if (at == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  ++h->mappings;
  mappings()[p] = Mapping{bytes, h, offset, PROT_NONE};
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t bytes) {
  SIM_ENTER();
  SIM_TRY(check_capture_safety());
  std::lock_guard<std::mutex> lock(memory_mutex());
  const auto p = static_cast<uintptr_t>(ptr);
  // The range must be covered exactly by whole mappings.
  std::vector<std::map<uintptr_t, Mapping>::iterator> covered;
  uintptr_t at = p;
  while (at < p + bytes) {
    auto m = mappings().find(at);
    if (m == mappings().end()) return CUDA_ERROR_INVALID_VALUE;
    covered.push_back(m);
    at += m->second.bytes;
  }
  if (at != p + bytes || covered.empty()) return CUDA_ERROR_INVALID_VALUE;
  // Back to an inaccessible reservation: later touches fault.
  void* res = mmap(reinterpret_cast<void*>(p), bytes, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (res == MAP_FAILED) return CUDA_ERROR_UNKNOWN;
  for (auto m : covered) {
    PhysicalHandle* h = m->second.handle;
    mappings().erase(m);
    --h->mappings;
    release_if_unused(h);
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t bytes, const CUmemAccessDesc* desc,
                                size_t count) {
  SIM_ENTER();
  if (desc == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  SIM_TRY(check_capture_safety());
  // Each descriptor sets one device's access and leaves the others' as they were; the pages'
  // protection is the widest any device has.
  int prot = PROT_NONE;
  uint64_t granted = 0, revoked = 0;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
        desc[i].location.id >= device_count()) {
      return CUDA_ERROR_INVALID_DEVICE;
    }
    const uint64_t bit = uint64_t{1} << desc[i].location.id;
    if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_NONE) revoked |= bit;
    if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) prot = PROT_READ | PROT_WRITE;
    if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ && prot == PROT_NONE) prot = PROT_READ;
    if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE) granted |= bit;
  }
  std::lock_guard<std::mutex> lock(memory_mutex());
  const auto p = static_cast<uintptr_t>(ptr);
  uintptr_t at = p;
  std::vector<std::pair<uintptr_t, Mapping*>> covered;
  while (at < p + bytes) {
    auto m = mappings().upper_bound(at);
    if (m == mappings().begin()) return CUDA_ERROR_INVALID_VALUE;
    --m;
    if (at >= m->first + m->second.bytes) return CUDA_ERROR_INVALID_VALUE;  // a hole
    covered.emplace_back(m->first, &m->second);
    at = m->first + m->second.bytes;
  }
  if (covered.empty()) return CUDA_ERROR_INVALID_VALUE;
  for (auto& [start, m] : covered) {
    const uint64_t access = (m->access & ~revoked) | granted;
    const int widest = access == 0                   ? PROT_NONE
                       : (m->access & ~revoked) != 0 ? (m->prot | prot)
                                                     : prot;
    if (mprotect(reinterpret_cast<void*>(start), m->bytes, widest) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    m->access = access;
    m->prot = widest;
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                        CUmemGenericAllocationHandle handle) {
  SIM_ENTER();
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(memory_mutex());
  auto it = handles().find(handle);
  if (it == handles().end()) return CUDA_ERROR_INVALID_VALUE;
  *prop = CUmemAllocationProp{};
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = it->second->device;
  return CUDA_SUCCESS;
}

// -----------------------------------------------------------------------------------------------
// Copies and memsets. Synchronous forms run on the legacy stream and wait; they are "potentially
// unsafe" during capture. Asynchronous forms become memcpy/memset nodes when captured.
// -----------------------------------------------------------------------------------------------

static CUresult copy_async(void* dst, const void* src, size_t bytes, CUstream hs,
                           CUmemorytype dst_t, CUmemorytype src_t) {
  if (dst_t == CU_MEMORYTYPE_DEVICE) {
    SIM_TRY(check_span(reinterpret_cast<uintptr_t>(dst), bytes, hs));
  }
  if (src_t == CU_MEMORYTYPE_DEVICE) {
    SIM_TRY(check_span(reinterpret_cast<uintptr_t>(src), bytes, hs));
  }
  auto node = std::make_unique<Node>();
  node->type = CU_GRAPH_NODE_TYPE_MEMCPY;
  node->copy = linear_copy(dst, dst_t, src, src_t, bytes);
  SIM_TRY(submit(hs, std::move(node)));
  const bool to_host = dst_t == CU_MEMORYTYPE_HOST && pageable(dst);
  const bool staged =
      to_host || (src_t == CU_MEMORYTYPE_HOST && bytes > kInlineCopy && pageable(src));
  return staged ? finish_staged(hs, to_host) : CUDA_SUCCESS;
}

static CUresult copy_sync(void* dst, const void* src, size_t bytes, CUmemorytype dst_t,
                          CUmemorytype src_t) {
  SIM_TRY(check_capture_safety());
  // The null stream: legacy, or the per-thread stream when called through a _ptds entry point.
  SIM_TRY(copy_async(dst, src, bytes, nullptr, dst_t, src_t));
  return sync_or_query(nullptr, true);
}

static CUmemorytype unified_type(const void* p) {
  return memory_type(reinterpret_cast<uintptr_t>(p)) == CU_MEMORYTYPE_DEVICE ? CU_MEMORYTYPE_DEVICE
                                                                             : CU_MEMORYTYPE_HOST;
}

#define SIM_DPTR(p) reinterpret_cast<void*>(p)

CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream hs) {
  SIM_ENTER();
  return copy_async(SIM_DPTR(dst), SIM_DPTR(src), bytes, hs, unified_type(SIM_DPTR(dst)),
                    unified_type(SIM_DPTR(src)));
}
CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes, CUstream hs) {
  SIM_ENTER();
  return copy_async(SIM_DPTR(dst), src, bytes, hs, CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_HOST);
}
CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes, CUstream hs) {
  SIM_ENTER();
  return copy_async(dst, SIM_DPTR(src), bytes, hs, CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_DEVICE);
}
CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream hs) {
  SIM_ENTER();
  return copy_async(SIM_DPTR(dst), SIM_DPTR(src), bytes, hs, CU_MEMORYTYPE_DEVICE,
                    CU_MEMORYTYPE_DEVICE);
}
CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  SIM_ENTER();
  return copy_sync(SIM_DPTR(dst), SIM_DPTR(src), bytes, unified_type(SIM_DPTR(dst)),
                   unified_type(SIM_DPTR(src)));
}
CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes) {
  SIM_ENTER();
  return copy_sync(SIM_DPTR(dst), src, bytes, CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_HOST);
}
CUresult CUDAAPI cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t bytes) {
  SIM_ENTER();
  return copy_sync(dst, SIM_DPTR(src), bytes, CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_DEVICE);
}
CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  SIM_ENTER();
  return copy_sync(SIM_DPTR(dst), SIM_DPTR(src), bytes, CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_DEVICE);
}

// 2D and 3D copies: one CUDA_MEMCPY3D each (a 2D copy is one slice); the device side of each is
// checked over its whole extent, from its first byte to its last row's end.
// An array side of a copy becomes the array's storage, addressed as host memory vaswap_sim
// allocated (not pageable, never checked against mappings), once the copy is known to fit in it.
static CUresult resolve_array(CUarray array, size_t x, size_t y, size_t z, size_t width,
                              size_t height, size_t depth, const void** base, size_t* pitch,
                              size_t* rows) {
  std::lock_guard<std::mutex> lock(memory_mutex());
  auto it = ranges().find(reinterpret_cast<uintptr_t>(array));
  if (array == nullptr || it == ranges().end() || it->second.kind != Kind::kArray) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  const Range& r = it->second;
  if (x + width > r.row_bytes || y + height > r.rows || z + depth > r.layers) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *base = reinterpret_cast<const void*>(it->first);
  *pitch = r.row_bytes;
  *rows = r.rows;
  return CUDA_SUCCESS;
}

static CUresult resolve_arrays(CUDA_MEMCPY3D* c) {
  const size_t height = c->Height ? c->Height : 1;
  const size_t depth = c->Depth ? c->Depth : 1;
  if (c->srcMemoryType == CU_MEMORYTYPE_ARRAY) {
    const void* base = nullptr;
    SIM_TRY(resolve_array(c->srcArray, c->srcXInBytes, c->srcY, c->srcZ, c->WidthInBytes, height,
                          depth, &base, &c->srcPitch, &c->srcHeight));
    c->srcMemoryType = CU_MEMORYTYPE_HOST;
    c->srcHost = base;
  }
  if (c->dstMemoryType == CU_MEMORYTYPE_ARRAY) {
    const void* base = nullptr;
    SIM_TRY(resolve_array(c->dstArray, c->dstXInBytes, c->dstY, c->dstZ, c->WidthInBytes, height,
                          depth, &base, &c->dstPitch, &c->dstHeight));
    c->dstMemoryType = CU_MEMORYTYPE_HOST;
    c->dstHost = const_cast<void*>(base);
  }
  return CUDA_SUCCESS;
}

// Resolves a copy's array and unified sides and checks its device sides for work on `hs`.
static CUresult prepare3d(CUDA_MEMCPY3D* copy, CUstream hs) {
  CUDA_MEMCPY3D& c = *copy;
  SIM_TRY(resolve_arrays(&c));
  // Unified: the pointer is in the *Device field, and is host or device memory.
  if (c.srcMemoryType == CU_MEMORYTYPE_UNIFIED) {
    c.srcMemoryType = memory_type(c.srcDevice) == CU_MEMORYTYPE_DEVICE ? CU_MEMORYTYPE_DEVICE
                                                                       : CU_MEMORYTYPE_HOST;
    if (c.srcMemoryType == CU_MEMORYTYPE_HOST) c.srcHost = reinterpret_cast<void*>(c.srcDevice);
  }
  if (c.dstMemoryType == CU_MEMORYTYPE_UNIFIED) {
    c.dstMemoryType = memory_type(c.dstDevice) == CU_MEMORYTYPE_DEVICE ? CU_MEMORYTYPE_DEVICE
                                                                       : CU_MEMORYTYPE_HOST;
    if (c.dstMemoryType == CU_MEMORYTYPE_HOST) c.dstHost = reinterpret_cast<void*>(c.dstDevice);
  }
  const size_t height = c.Height ? c.Height : 1;
  const size_t depth = c.Depth ? c.Depth : 1;
  const auto check = [&](CUdeviceptr base, size_t x, size_t y, size_t z, size_t pitch,
                         size_t rows) {
    pitch = pitch ? pitch : c.WidthInBytes;
    rows = rows ? rows : height;
    const size_t start = x + y * pitch + z * rows * pitch;
    const size_t bytes = (depth - 1) * rows * pitch + (height - 1) * pitch + c.WidthInBytes;
    return check_span(base + start, bytes, hs);
  };
  if (c.srcMemoryType == CU_MEMORYTYPE_DEVICE) {
    SIM_TRY(check(c.srcDevice, c.srcXInBytes, c.srcY, c.srcZ, c.srcPitch, c.srcHeight));
  }
  if (c.dstMemoryType == CU_MEMORYTYPE_DEVICE) {
    SIM_TRY(check(c.dstDevice, c.dstXInBytes, c.dstY, c.dstZ, c.dstPitch, c.dstHeight));
  }
  return CUDA_SUCCESS;
}

// Enqueues a prepared copy (pageable host memory on either side may make it wait).
static CUresult submit3d(const CUDA_MEMCPY3D& c, CUstream hs) {
  auto node = std::make_unique<Node>();
  node->type = CU_GRAPH_NODE_TYPE_MEMCPY;
  node->copy = c;
  SIM_TRY(submit(hs, std::move(node)));
  const bool to_host = c.dstMemoryType == CU_MEMORYTYPE_HOST && pageable(c.dstHost);
  const bool staged =
      to_host ||
      (c.srcMemoryType == CU_MEMORYTYPE_HOST &&
       c.WidthInBytes * c.Height * (c.Depth ? c.Depth : 1) > kInlineCopy && pageable(c.srcHost));
  return staged ? finish_staged(hs, to_host) : CUDA_SUCCESS;
}

static CUresult copy3d_async(CUDA_MEMCPY3D c, CUstream hs) {
  SIM_TRY(prepare3d(&c, hs));
  return submit3d(c, hs);
}

// The synchronous forms: on the null stream, then waited for.
static CUresult copy3d_sync(const CUDA_MEMCPY3D& c) {
  SIM_TRY(check_capture_safety());
  SIM_TRY(copy3d_async(c, nullptr));
  return sync_or_query(nullptr, true);
}

static CUDA_MEMCPY3D from_2d(const CUDA_MEMCPY2D& p) {
  CUDA_MEMCPY3D c{};
  c.srcXInBytes = p.srcXInBytes;
  c.srcY = p.srcY;
  c.srcMemoryType = p.srcMemoryType;
  c.srcHost = p.srcHost;
  c.srcDevice = p.srcDevice;
  c.srcArray = p.srcArray;
  c.srcPitch = p.srcPitch;
  c.dstXInBytes = p.dstXInBytes;
  c.dstY = p.dstY;
  c.dstMemoryType = p.dstMemoryType;
  c.dstHost = p.dstHost;
  c.dstDevice = p.dstDevice;
  c.dstArray = p.dstArray;
  c.dstPitch = p.dstPitch;
  c.WidthInBytes = p.WidthInBytes;
  c.Height = p.Height;
  c.Depth = 1;
  return c;
}

CUresult CUDAAPI cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D* p, CUstream hs) {
  SIM_ENTER();
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return copy3d_async(*p, hs);
}
CUresult CUDAAPI cuMemcpy3D_v2(const CUDA_MEMCPY3D* p) {
  SIM_ENTER();
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return copy3d_sync(*p);
}
CUresult CUDAAPI cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D* p, CUstream hs) {
  SIM_ENTER();
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return copy3d_async(from_2d(*p), hs);
}
CUresult CUDAAPI cuMemcpy2D_v2(const CUDA_MEMCPY2D* p) {
  SIM_ENTER();
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return copy3d_sync(from_2d(*p));
}
// 3D peer copies: as cuMemcpy3D, the contexts aside (every device is host memory here).
static CUDA_MEMCPY3D from_peer(const CUDA_MEMCPY3D_PEER& p) {
  CUDA_MEMCPY3D c{};
  c.srcXInBytes = p.srcXInBytes;
  c.srcY = p.srcY;
  c.srcZ = p.srcZ;
  c.srcLOD = p.srcLOD;
  c.srcMemoryType = p.srcMemoryType;
  c.srcHost = p.srcHost;
  c.srcDevice = p.srcDevice;
  c.srcArray = p.srcArray;
  c.srcPitch = p.srcPitch;
  c.srcHeight = p.srcHeight;
  c.dstXInBytes = p.dstXInBytes;
  c.dstY = p.dstY;
  c.dstZ = p.dstZ;
  c.dstLOD = p.dstLOD;
  c.dstMemoryType = p.dstMemoryType;
  c.dstHost = p.dstHost;
  c.dstDevice = p.dstDevice;
  c.dstArray = p.dstArray;
  c.dstPitch = p.dstPitch;
  c.dstHeight = p.dstHeight;
  c.WidthInBytes = p.WidthInBytes;
  c.Height = p.Height;
  c.Depth = p.Depth;
  return c;
}
CUresult CUDAAPI cuMemcpy3DPeerAsync(const CUDA_MEMCPY3D_PEER* p, CUstream hs) {
  SIM_ENTER();
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return copy3d_async(from_peer(*p), hs);
}
CUresult CUDAAPI cuMemcpy3DPeer(const CUDA_MEMCPY3D_PEER* p) {
  SIM_ENTER();
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return copy3d_sync(from_peer(*p));
}

// Peer copies: every device is host memory here, so a peer copy is a device-to-device copy.
CUresult CUDAAPI cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext, CUdeviceptr src, CUcontext,
                                   size_t bytes, CUstream hs) {
  SIM_ENTER();
  return copy_async(SIM_DPTR(dst), SIM_DPTR(src), bytes, hs, CU_MEMORYTYPE_DEVICE,
                    CU_MEMORYTYPE_DEVICE);
}
CUresult CUDAAPI cuMemcpyPeer(CUdeviceptr dst, CUcontext, CUdeviceptr src, CUcontext,
                              size_t bytes) {
  SIM_ENTER();
  return copy_sync(SIM_DPTR(dst), SIM_DPTR(src), bytes, CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_DEVICE);
}

// A batch of linear copies (CUDA 12.8; the CUDA 13 revision has no failure index): each copy as
// cuMemcpyAsync would make it, in order on the stream. As the driver documents: a batch has at
// least one copy and one attribute set, attrsIdxs[0] is 0, the indices rise and stay below
// count, and the legacy NULL stream is refused.
CUresult CUDAAPI cuMemcpyBatchAsync_v2(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes,
                                       size_t count, CUmemcpyAttributes* attrs, size_t* attrsIdxs,
                                       size_t numAttrs, CUstream hs) {
  SIM_ENTER();
  if (count == 0 || dsts == nullptr || srcs == nullptr || sizes == nullptr || numAttrs == 0 ||
      numAttrs > count || attrs == nullptr || attrsIdxs == nullptr || attrsIdxs[0] != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (size_t i = 1; i < numAttrs; ++i) {
    if (attrsIdxs[i] <= attrsIdxs[i - 1] || attrsIdxs[i] >= count) return CUDA_ERROR_INVALID_VALUE;
  }
  for (size_t i = 0; i < numAttrs; ++i) {  // every attribute set names a valid source order
    if (attrs[i].srcAccessOrder == CU_MEMCPY_SRC_ACCESS_ORDER_INVALID ||
        attrs[i].srcAccessOrder > CU_MEMCPY_SRC_ACCESS_ORDER_ANY) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  if (hs == CU_STREAM_LEGACY || (hs == nullptr && !tls_null_is_per_thread)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // All or nothing: every copy's device addresses are checked before any copy is enqueued.
  for (size_t i = 0; i < count; ++i) {
    for (const CUdeviceptr p : {dsts[i], srcs[i]}) {
      if (unified_type(SIM_DPTR(p)) == CU_MEMORYTYPE_DEVICE) {
        SIM_TRY(check_span(static_cast<uintptr_t>(p), sizes[i], hs));
      }
    }
  }
  for (size_t i = 0; i < count; ++i) {
    SIM_TRY(copy_async(SIM_DPTR(dsts[i]), SIM_DPTR(srcs[i]), sizes[i], hs,
                       unified_type(SIM_DPTR(dsts[i])), unified_type(SIM_DPTR(srcs[i]))));
  }
  return CUDA_SUCCESS;
}

// CUDA 12.8's revision (asked for at 12080): the same, with the index of the copy that failed
// (SIZE_MAX when none did) before the stream. Reached only through cuGetProcAddress.
CUresult CUDAAPI cuMemcpyBatchAsync_sim_v1(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes,
                                           size_t count, CUmemcpyAttributes* attrs,
                                           size_t* attrsIdxs, size_t numAttrs, size_t* failIdx,
                                           CUstream hs) {
  if (failIdx != nullptr) *failIdx = SIZE_MAX;
  const CUresult rc =
      cuMemcpyBatchAsync_v2(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, hs);
  if (rc != CUDA_SUCCESS && failIdx != nullptr) *failIdx = 0;
  return rc;
}

// -----------------------------------------------------------------------------------------------
// CUDA arrays: linear storage charged to the device (no texture layout); copies reach them
// through cuMemcpy2D/3D, cuMemcpyDtoA/AtoD and cuMemcpy3DBatchAsync.
// -----------------------------------------------------------------------------------------------

static size_t format_bytes(CUarray_format f) {
  switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: return 4;
    default: return 0;
  }
}

CUresult CUDAAPI cuArrayCreate_v2(CUarray* array, const CUDA_ARRAY_DESCRIPTOR* d) {
  SIM_ENTER();
  if (array == nullptr || d == nullptr || d->Width == 0) return CUDA_ERROR_INVALID_VALUE;
  const size_t element = format_bytes(d->Format) * d->NumChannels;
  if (element == 0 || (d->NumChannels != 1 && d->NumChannels != 2 && d->NumChannels != 4)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  int dev = 0;
  SIM_TRY(current_device(&dev));
  const size_t rows = d->Height ? d->Height : 1;
  const size_t bytes = d->Width * element * rows;
  const size_t charged = round_up(bytes, kGranularity);
  SIM_TRY(charge_allocation(dev, charged));
  void* p = map_anonymous(round_up(bytes, kPage), PROT_READ | PROT_WRITE);
  if (p == nullptr) {
    refund_physical(dev, charged);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  Range r{Kind::kArray, bytes, dev, 0, charged};
  r.row_bytes = d->Width * element;
  r.rows = rows;
  r.layers = 1;
  r.element = element;
  std::lock_guard<std::mutex> lock(memory_mutex());
  ranges()[reinterpret_cast<uintptr_t>(p)] = r;
  *array = reinterpret_cast<CUarray>(p);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuArrayDestroy(CUarray array) {
  SIM_ENTER();
  int dev = -1;
  {
    std::lock_guard<std::mutex> lock(memory_mutex());
    auto it = ranges().find(reinterpret_cast<uintptr_t>(array));
    if (array == nullptr || it == ranges().end() || it->second.kind != Kind::kArray) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
    dev = it->second.device;
  }
  synchronize_device(dev);
  return free_range(reinterpret_cast<uintptr_t>(array), Kind::kArray);
}

// Whether `array` is a live 1D array (cuMemcpyDtoA/AtoD take only those).
static bool one_dimensional(CUarray array) {
  std::lock_guard<std::mutex> lock(memory_mutex());
  auto it = ranges().find(reinterpret_cast<uintptr_t>(array));
  return it == ranges().end() || it->second.kind != Kind::kArray || it->second.rows == 1;
}

// Device memory to a 1D array and back: synchronous, `offset` bytes into the array.
CUresult CUDAAPI cuMemcpyDtoA_v2(CUarray dst, size_t offset, CUdeviceptr src, size_t bytes) {
  SIM_ENTER();
  if (!one_dimensional(dst)) return CUDA_ERROR_INVALID_VALUE;
  CUDA_MEMCPY3D c =
      linear_copy(nullptr, CU_MEMORYTYPE_HOST, SIM_DPTR(src), CU_MEMORYTYPE_DEVICE, bytes);
  c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  c.dstHost = nullptr;
  c.dstArray = dst;
  c.dstXInBytes = offset;
  return copy3d_sync(c);
}
CUresult CUDAAPI cuMemcpyAtoD_v2(CUdeviceptr dst, CUarray src, size_t offset, size_t bytes) {
  SIM_ENTER();
  if (!one_dimensional(src)) return CUDA_ERROR_INVALID_VALUE;
  CUDA_MEMCPY3D c =
      linear_copy(SIM_DPTR(dst), CU_MEMORYTYPE_DEVICE, nullptr, CU_MEMORYTYPE_HOST, bytes);
  c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  c.srcHost = nullptr;
  c.srcArray = src;
  c.srcXInBytes = offset;
  return copy3d_sync(c);
}

// One operand of a 3D batch copy as a side of a CUDA_MEMCPY3D: a pointer (unified: host or
// device, as prepare3d finds; rows of rowLength elements, layers of layerHeight rows, 0: packed)
// or an array (its offset in elements).
static CUresult batch_side(const CUmemcpy3DOperand& o, size_t element, const CUextent3D& e,
                           CUmemorytype* type, CUdeviceptr* device, CUarray* array, size_t* x,
                           size_t* y, size_t* z, size_t* pitch, size_t* rows) {
  if (o.type == CU_MEMCPY_OPERAND_TYPE_POINTER) {
    if (o.op.ptr.ptr == 0) return CUDA_ERROR_INVALID_VALUE;
    if ((o.op.ptr.rowLength != 0 && o.op.ptr.rowLength < e.width) ||
        (o.op.ptr.layerHeight != 0 && o.op.ptr.layerHeight < e.height)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    *type = CU_MEMORYTYPE_UNIFIED;
    *device = o.op.ptr.ptr;
    *pitch = (o.op.ptr.rowLength ? o.op.ptr.rowLength : e.width) * element;
    *rows = o.op.ptr.layerHeight ? o.op.ptr.layerHeight : e.height;
    return CUDA_SUCCESS;
  }
  if (o.type == CU_MEMCPY_OPERAND_TYPE_ARRAY) {
    *type = CU_MEMORYTYPE_ARRAY;
    *array = o.op.array.array;
    *x = o.op.array.offset.x * element;
    *y = o.op.array.offset.y;
    *z = o.op.array.offset.z;
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

static size_t array_element(const CUmemcpy3DOperand& o) {
  if (o.type != CU_MEMCPY_OPERAND_TYPE_ARRAY) return 0;
  std::lock_guard<std::mutex> lock(memory_mutex());
  auto it = ranges().find(reinterpret_cast<uintptr_t>(o.op.array.array));
  return it == ranges().end() || it->second.kind != Kind::kArray ? 0 : it->second.element;
}

// A batch of 3D copies (CUDA 13's revision). As the driver documents: at least one copy, flags
// 0, not the legacy NULL stream, every extent non-zero, every source order valid; the element is
// one byte between pointers, else the array's. All or nothing: every copy is resolved and its
// device spans checked before any is enqueued.
CUresult CUDAAPI cuMemcpy3DBatchAsync_v2(size_t count, CUDA_MEMCPY3D_BATCH_OP* ops,
                                         unsigned long long flags, CUstream hs) {
  SIM_ENTER();
  if (count == 0 || ops == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (hs == CU_STREAM_LEGACY || (hs == nullptr && !tls_null_is_per_thread)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::vector<CUDA_MEMCPY3D> copies(count);
  for (size_t i = 0; i < count; ++i) {
    const CUDA_MEMCPY3D_BATCH_OP& op = ops[i];
    if (op.extent.width == 0 || op.extent.height == 0 || op.extent.depth == 0 ||
        op.srcAccessOrder == CU_MEMCPY_SRC_ACCESS_ORDER_INVALID ||
        op.srcAccessOrder > CU_MEMCPY_SRC_ACCESS_ORDER_ANY) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const size_t src_element = array_element(op.src), dst_element = array_element(op.dst);
    if (src_element != 0 && dst_element != 0 && src_element != dst_element) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const size_t element = std::max<size_t>({src_element, dst_element, 1});
    CUDA_MEMCPY3D& c = copies[i];
    c = CUDA_MEMCPY3D{};
    SIM_TRY(batch_side(op.src, element, op.extent, &c.srcMemoryType, &c.srcDevice, &c.srcArray,
                       &c.srcXInBytes, &c.srcY, &c.srcZ, &c.srcPitch, &c.srcHeight));
    SIM_TRY(batch_side(op.dst, element, op.extent, &c.dstMemoryType, &c.dstDevice, &c.dstArray,
                       &c.dstXInBytes, &c.dstY, &c.dstZ, &c.dstPitch, &c.dstHeight));
    c.WidthInBytes = op.extent.width * element;
    c.Height = op.extent.height;
    c.Depth = op.extent.depth;
    SIM_TRY(prepare3d(&c, hs));
  }
  for (const CUDA_MEMCPY3D& c : copies) SIM_TRY(submit3d(c, hs));
  return CUDA_SUCCESS;
}

// CUDA 12.8's revision (asked for at 12080): the same, with a failure index before the flags:
// SIZE_MAX when the batch was made, 0 when it was refused (all or nothing here, so no copy of it
// was made). Reached only through cuGetProcAddress.
CUresult CUDAAPI cuMemcpy3DBatchAsync_sim_v1(size_t count, CUDA_MEMCPY3D_BATCH_OP* ops,
                                             size_t* failIdx, unsigned long long flags,
                                             CUstream hs) {
  if (failIdx != nullptr) *failIdx = SIZE_MAX;
  const CUresult rc = cuMemcpy3DBatchAsync_v2(count, ops, flags, hs);
  if (rc != CUDA_SUCCESS && failIdx != nullptr) *failIdx = 0;
  return rc;
}

// Memsets: `count` elements per row, `height` rows `pitch` bytes apart (0: one row).
static CUresult memset_async(CUdeviceptr dst, unsigned value, unsigned element, size_t count,
                             CUstream hs, size_t pitch = 0, size_t height = 1) {
  SIM_TRY(check_span(dst, (height - 1) * pitch + count * element, hs));
  auto node = std::make_unique<Node>();
  node->type = CU_GRAPH_NODE_TYPE_MEMSET;
  node->memset.dst = dst;
  node->memset.value = value;
  node->memset.elementSize = element;
  node->memset.width = count;
  node->memset.height = height;
  node->memset.pitch = pitch;
  return submit(hs, std::move(node));
}

static CUresult memset_sync(CUdeviceptr dst, unsigned value, unsigned element, size_t count,
                            size_t pitch = 0, size_t height = 1) {
  SIM_TRY(check_capture_safety());
  SIM_TRY(memset_async(dst, value, element, count, nullptr, pitch, height));
  return sync_or_query(nullptr, true);
}

CUresult CUDAAPI cuMemsetD16Async(CUdeviceptr dst, unsigned short v, size_t n, CUstream hs) {
  SIM_ENTER();
  return memset_async(dst, v, 2, n, hs);
}
CUresult CUDAAPI cuMemsetD16_v2(CUdeviceptr dst, unsigned short v, size_t n) {
  SIM_ENTER();
  return memset_sync(dst, v, 2, n);
}
CUresult CUDAAPI cuMemsetD2D8Async(CUdeviceptr dst, size_t pitch, unsigned char v, size_t w,
                                   size_t h, CUstream hs) {
  SIM_ENTER();
  return memset_async(dst, v, 1, w, hs, pitch, h);
}
CUresult CUDAAPI cuMemsetD2D16Async(CUdeviceptr dst, size_t pitch, unsigned short v, size_t w,
                                    size_t h, CUstream hs) {
  SIM_ENTER();
  return memset_async(dst, v, 2, w, hs, pitch, h);
}
CUresult CUDAAPI cuMemsetD2D32Async(CUdeviceptr dst, size_t pitch, unsigned int v, size_t w,
                                    size_t h, CUstream hs) {
  SIM_ENTER();
  return memset_async(dst, v, 4, w, hs, pitch, h);
}
CUresult CUDAAPI cuMemsetD2D8_v2(CUdeviceptr dst, size_t pitch, unsigned char v, size_t w,
                                 size_t h) {
  SIM_ENTER();
  return memset_sync(dst, v, 1, w, pitch, h);
}
CUresult CUDAAPI cuMemsetD2D16_v2(CUdeviceptr dst, size_t pitch, unsigned short v, size_t w,
                                  size_t h) {
  SIM_ENTER();
  return memset_sync(dst, v, 2, w, pitch, h);
}
CUresult CUDAAPI cuMemsetD2D32_v2(CUdeviceptr dst, size_t pitch, unsigned int v, size_t w,
                                  size_t h) {
  SIM_ENTER();
  return memset_sync(dst, v, 4, w, pitch, h);
}

CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream hs) {
  SIM_ENTER();
  return memset_async(dst, v, 1, n, hs);
}
CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream hs) {
  SIM_ENTER();
  return memset_async(dst, v, 4, n, hs);
}
CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
  SIM_ENTER();
  return memset_sync(dst, v, 1, n);
}
CUresult CUDAAPI cuMemsetD32_v2(CUdeviceptr dst, unsigned int v, size_t n) {
  SIM_ENTER();
  return memset_sync(dst, v, 4, n);
}

extern "C" void vaswapSimSetPinnedLimit(unsigned long long bytes) { pinned_limit().store(bytes); }

extern "C" unsigned long long vaswapSimPinnedBytes(void) {
  std::lock_guard<std::mutex> lock(memory_mutex());
  return g_pinned_bytes;
}
