/* vaswap public C API. One include; every call is prefixed vaswap_.
 *
 * A slot is device memory at a virtual address that never changes: vaswap reserves the address
 * once and maps physical pages under it. Offloading a slot copies its bytes to pinned host memory
 * and gives the pages back to the driver; restoring maps new pages at the same address and copies
 * the bytes back. A CUDA graph captured against the address stays valid throughout.
 *
 * Every call returns a vaswap_status. On failure, vaswap_last_error() returns a message for the
 * calling thread that names what failed, with which value, and what to do. Streams are CUstream /
 * cudaStream_t handles passed as void*; NULL is the legacy default stream. docs/API.md describes
 * each call and maps it to the TransformerEngine vmm_activation call it replaces. */
#ifndef VASWAP_VASWAP_H
#define VASWAP_VASWAP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VASWAP_VERSION_MAJOR 0
#define VASWAP_VERSION_MINOR 2
#define VASWAP_VERSION_PATCH 0

typedef enum vaswap_status {
  VASWAP_OK = 0,
  VASWAP_ERROR_INVALID_ARGUMENT = 1, /* null, duplicate or unknown handle; zero or bad size */
  VASWAP_ERROR_INVALID_STATE = 2,    /* the slot or remap is not in a state that allows the call */
  VASWAP_ERROR_HOST_BUFFER = 3,      /* host buffer not pinned, not at offset 0, or too small */
  VASWAP_ERROR_DEVICE_MISMATCH = 4,  /* slots of several devices, or a stream of another device */
  VASWAP_ERROR_CAPTURING = 5,        /* the stream is being captured into a graph */
  VASWAP_ERROR_CUDA = 6,             /* a driver call failed: the message names call, code, slot */
  VASWAP_ERROR_NOT_READY = 7,        /* a try-call found the work not yet submitted */
  VASWAP_ERROR_UNAVAILABLE = 8,      /* the CUDA driver cannot be loaded or initialized */
  VASWAP_ERROR_NOT_FOUND = 9         /* no slot at that address */
} vaswap_status;

typedef struct vaswap_slot_s* vaswap_slot;   /* one fixed-address region */
typedef struct vaswap_remap_s* vaswap_remap; /* one restore of a batch of slots, in flight */
typedef void* vaswap_stream;                 /* a CUstream / cudaStream_t */

/* ---- Errors and version ------------------------------------------------------------------- */

/* The library's version, "MAJOR.MINOR.PATCH". */
const char* vaswap_version(void);
/* The message of the calling thread's last failed call ("" if none). Valid until its next call. */
const char* vaswap_last_error(void);
/* "VASWAP_ERROR_CUDA" for a status. */
const char* vaswap_status_name(vaswap_status status);

/* ---- Slots ---------------------------------------------------------------------------------- */

/* Reserves a virtual address range on `device` and maps `bytes` of new device memory under it
 * (rounded up to the allocation granularity, as one physical handle). The contents are
 * undefined, as after cudaMalloc. */
vaswap_status vaswap_slot_create(int device, size_t bytes, vaswap_slot* slot);

/* The same for a strided tensor: the extent is the largest element offset reached by `shape` and
 * `strides` (in elements; NULL strides mean contiguous) plus one, times `element_bytes`. */
vaswap_status vaswap_slot_create_strided(int device, int ndim, const int64_t* shape,
                                         const int64_t* strides, size_t element_bytes,
                                         vaswap_slot* slot);

/* Closes a slot: waits for its pending release or remap, synchronizes the device (as cudaFree
 * does), unmaps and releases its pages and frees the address. A remap that still references the
 * slot loses it (its other slots are unaffected). */
vaswap_status vaswap_slot_destroy(vaswap_slot slot);

/* The slot that backs `address` (its first byte or any byte inside) when the preload backed the
 * program's allocation with one (DESIGN.md section 4; docs/INTERPOSITION.md). Such a slot can be
 * released and remapped like any other; the program's cudaFree/cuMemFree destroys it, and
 * vaswap_slot_destroy refuses to. VASWAP_ERROR_NOT_FOUND when no slot contains the address. */
vaswap_status vaswap_slot_find(const void* address, vaswap_slot* slot);

typedef struct vaswap_slot_info {
  uint64_t id;         /* unique in the process, as in the trace */
  uint64_t va;         /* the fixed device address */
  size_t bytes;        /* the size asked for */
  size_t mapped_bytes; /* bytes of one physical handle (granularity-rounded) */
  int device;          /* device ordinal */
  int mapped;          /* 1 if pages are mapped under the address now */
  int release_pending; /* 1 between vaswap_*release*_after and the worker's unmap */
  int remap_pending;   /* 1 from a remap call until vaswap_remap_adopt / _destroy */
} vaswap_slot_info;

vaswap_status vaswap_slot_get_info(vaswap_slot slot, vaswap_slot_info* info);

/* ---- Offload ----------------------------------------------------------------------------------
 */

/* Enqueues one host callback on `stream` after the work already on it (typically the caller's
 * D2H burst). The callback only signals vaswap's release worker, which then unmaps and releases
 * the pages of every slot in the batch. The addresses stay reserved. */
vaswap_status vaswap_release_after(const vaswap_slot* slots, size_t count, vaswap_stream stream);

/* Copies each slot to its pinned host buffer on `stream` (D2H), then releases the batch as
 * vaswap_release_after does. host_buffers[i] must hold slot i's bytes (see vaswap_host_alloc). */
vaswap_status vaswap_offload_after(const vaswap_slot* slots, void* const* host_buffers,
                                   size_t count, vaswap_stream stream);

/* ---- Restore --------------------------------------------------------------------------------
 * Each call checks the batch and returns a remap handle: the slots are unique, none already has a
 * remap in flight, each is released or has a release pending, they share one device (the
 * stream's), the stream is not capturing, and every host buffer is pinned, starts its pinned
 * allocation, and holds the slot's bytes. Work is then signalled by a host callback on `stream`
 * and done by vaswap's remap worker. Until vaswap_remap_adopt, the new pages belong to the remap:
 * vaswap_remap_destroy unmaps the pages of slots that were not adopted. */

/* Remap only: new pages at the same addresses, no copy. */
vaswap_status vaswap_remap_after(const vaswap_slot* slots, size_t count, vaswap_stream stream,
                                 vaswap_remap* remap);

/* Remap, then copy each host buffer back (H2D) on vaswap's copy stream for the device. */
vaswap_status vaswap_remap_and_copy_after(const vaswap_slot* slots, void* const* host_buffers,
                                          size_t count, vaswap_stream stream, vaswap_remap* remap);

/* Remap now, copy later: the worker maps the pages and submits no copy; each slot's H2D is
 * submitted by vaswap_remap_launch_h2d on a stream of the caller's choosing. */
vaswap_status vaswap_remap_deferred_after(const vaswap_slot* slots, void* const* host_buffers,
                                          size_t count, vaswap_stream stream, vaswap_remap* remap);

/* Deferred remaps: waits (on the host) until slot `index` is mapped, then submits its H2D on
 * `stream` and records its copy event there. */
vaswap_status vaswap_remap_launch_h2d(vaswap_remap remap, size_t index, vaswap_stream stream);

/* Waits on the host until slot `index`'s copy event is recorded (its H2D submitted). */
vaswap_status vaswap_remap_wait_slot_submitted(vaswap_remap remap, size_t index);

/* Makes `stream` wait for slot `index`'s H2D (after waiting until it is submitted). */
vaswap_status vaswap_remap_wait_slot_on_stream(vaswap_remap remap, size_t index,
                                               vaswap_stream stream);

/* Makes `stream` wait for every slot of the remap (after waiting until all are submitted). */
vaswap_status vaswap_remap_wait_on_stream(vaswap_remap remap, vaswap_stream stream);

/* The same without blocking the host: VASWAP_ERROR_NOT_READY if some H2D is not yet submitted,
 * and then `stream` is left unchanged. */
vaswap_status vaswap_remap_try_wait_on_stream(vaswap_remap remap, vaswap_stream stream);

/* Waits until every slot is mapped, then hands each slot its new pages: from here on the slot
 * owns them, and vaswap_remap_destroy leaves them mapped. */
vaswap_status vaswap_remap_adopt(vaswap_remap remap);

/* Drains the remap (its worker steps and copies), unmaps the pages of slots it mapped that were
 * not adopted, and frees the handle. */
vaswap_status vaswap_remap_destroy(vaswap_remap remap);

/* ---- Synchronous fallbacks (tests, error recovery) --------------------------------------------
 * The caller guarantees that no queued work touches the slot. */

vaswap_status vaswap_slot_unmap_and_release(vaswap_slot slot);
vaswap_status vaswap_slot_create_and_remap(vaswap_slot slot);

/* ---- Pinned host buffers ----------------------------------------------------------------------
 */

/* A pinned host buffer of at least `bytes`, from vaswap's pool (pinning is slow: buffers are
 * kept and reused). Portable across devices. */
vaswap_status vaswap_host_alloc(size_t bytes, void** host_buffer);
/* Returns a buffer from vaswap_host_alloc to the pool. */
vaswap_status vaswap_host_free(void* host_buffer);

/* ---- Diagnostics and worker policy --------------------------------------------------------------
 */

/* cuMemGetInfo for `device`: the driver's free and total bytes. The caching allocators' counters
 * do not see VMM pages; this does. */
vaswap_status vaswap_driver_memory_info(int device, size_t* free_bytes, size_t* total_bytes);

/* Starts the release and remap workers and the copy stream of `device` now rather than at first
 * use (keeps their start-up out of a timed region). */
vaswap_status vaswap_workers_init(int device);

/* 1 (the default): workers make their VMM driver calls one at a time, process-wide; concurrent
 * cuMemSetAccess calls have been reported to take ~40 ms tails. 0: each worker calls freely. */
vaswap_status vaswap_set_serial_driver_calls(int serial);

/* Page reuse. 0 (the default): an offload or unmap gives the slot's pages back to the driver, and
 * a remap creates new ones. Above 0: up to `bytes_per_device` of unmapped physical handles are
 * kept on each device, and a remap of a slot whose mapped size equals a kept handle's maps that
 * handle instead of creating one. An H2D copy into a new handle runs about 8% below the link's
 * speed on the H200, into a kept one at full speed (docs/PERFORMANCE.md). Kept pages stay
 * allocated (cuMemGetInfo counts them) until a remap takes them, a new handle finds the device
 * full (they are released and the creation retried), or this call lowers the limit (they are
 * released down to it now; 0 releases them all). A destroyed slot's pages are never kept. */
vaswap_status vaswap_set_page_reuse(uint64_t bytes_per_device);

/* Starts writing the trace (docs/TRACE.md) to `path`; "%p" becomes the process id. Replaces a
 * trace already open. VASWAP_TRACE=path does the same at first use (not in a setuid program).
 * VASWAP_ERROR_INVALID_ARGUMENT, with the reason, when `path` is a symbolic link or a file that
 * exists and is not empty (vaswap never replaces a trace file: remove it first, or put %p in the
 * path), or cannot be created. */
vaswap_status vaswap_trace_open(const char* path);
/* Writes what is queued and closes the trace. */
vaswap_status vaswap_trace_close(void);

typedef struct vaswap_stats {
  uint64_t slots_live;
  uint64_t bytes_mapped;      /* physical bytes under live slots now */
  uint64_t releases;          /* slot releases done by workers and fallbacks */
  uint64_t remaps;            /* slot remaps done */
  uint64_t bytes_offloaded;   /* D2H bytes through vaswap_offload_after */
  uint64_t bytes_restored;    /* H2D bytes through the remap calls */
  uint64_t errors;            /* driver calls that failed */
  uint64_t host_bytes_pinned; /* pinned bytes held by the pool (in use and cached) */
  uint64_t host_bytes_in_use;
  /* What the preload's hooks handled, each user call once (all zero without LD_PRELOAD). */
  uint64_t allocations_seen; /* cudaMalloc, cuMemAlloc and the stream-ordered families */
  uint64_t frees_seen;
  uint64_t slots_selected; /* allocations backed by a slot */
  uint64_t captures_seen;  /* stream captures begun */
  uint64_t instantiations_seen;
  uint64_t graph_launches_seen;
  /* The planner (docs/PLANNER.md). */
  uint64_t plans;              /* plans put in force */
  uint64_t regions_offloaded;  /* distinct slots offloaded at least once */
  uint64_t planned_offloads;   /* slot offloads the plan or a rule issued */
  uint64_t planned_restores;   /* slot restores the plan started ahead of their use */
  uint64_t on_demand_restores; /* slots restored because a launch needed them unexpectedly */
  uint64_t guard_hits;         /* eager work that needed an offloaded slot (guard on) */
  uint64_t deviations;         /* graph launches out of the learned order */
  uint64_t restore_waits;      /* times the host waited for a restore to be submitted */
  uint64_t restore_wait_ns;    /* host time spent in those waits */
} vaswap_stats;

vaswap_status vaswap_get_stats(vaswap_stats* stats);

/* ---- Policy ------------------------------------------------------------------------------------
 * The policy file and VASWAP_CONF are described in docs/POLICY.md. */

/* Reads the policy `file` (NULL or "" for none) with the overrides `conf` (VASWAP_CONF syntax;
 * NULL for none), as the preload would. Writes the effective policy, one "key: value  # source"
 * line per key, or every error, one per line, into `text` (truncated to `text_bytes`, always
 * NUL-terminated), and the number of errors into `errors`. Returns VASWAP_OK even when the policy
 * has errors; a bad argument gives VASWAP_ERROR_INVALID_ARGUMENT. */
vaswap_status vaswap_policy_check(const char* file, const char* conf, char* text, size_t text_bytes,
                                  int* errors);

/* The policy's keys as the Markdown table docs/POLICY.md holds, in `text`. */
vaswap_status vaswap_policy_schema(char* text, size_t text_bytes);

#ifdef __cplusplus
}
#endif

#endif /* VASWAP_VASWAP_H */
