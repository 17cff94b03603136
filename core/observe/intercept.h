// What the preload does with the calls its hooks see. interpose/ decodes each hooked entry point
// (runtime or driver, legacy or per-thread stream) into these calls, with driver types only; the
// decisions are made here.
//
// Allocation: an allocation the policy selects becomes a slot (engine.h) at a fixed VA; every
// other one goes to the real function. All of them enter the region registry with the capture
// they were made in. Capture, instantiate, launch and destroy calls keep the capture and graph
// tables right and go to the trace.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "observe/graph_scan.h"
#include "observe/registry.h"
#include "plan/planner.h"
#include "policy.h"

namespace vaswap::intercept {

enum class Api : uint8_t { runtime, driver };

// Who made a call: the hooked symbol, its level, whether a null stream means the per-thread
// stream (the _ptsz/_ptds entry points), and the return address in the calling code.
struct Call {
  const char* symbol;
  Api api;
  bool per_thread;
  const void* caller;
};

// True when the preload acts on calls. Decided once, from the environment: false with mode off,
// in secure-execution mode (AT_SECURE), or when the policy is malformed and on_error is
// passthrough. While false, every hook forwards at once and lookups are not rerouted.
// What the environment asks for: the policy (VASWAP_POLICY, then VASWAP_CONF; config/policy.h).
// In secure-execution mode (`secure`: AT_SECURE, a setuid or capability-raising exec) nothing is
// read and the preload is off, as glibc ignores LD_* there. `notices` are said once, at the first
// hooked call (or at once, when the preload is off). A malformed policy with on_error: abort sets
// `abort_message`: the first hooked call prints it and ends the process.
struct Environment {
  bool on = false;
  Policy policy;
  std::vector<std::string> notices;
  std::string abort_message;
};
Environment read_environment(bool secure, const std::function<const char*(const char*)>& variable);

// Logs the environment's notices and opens the trace at the first call that returns true.
bool on();
// The same decision without side effects, for symbol lookups (which can run while other
// libraries are still being initialized, too early to log).
bool routing_on();

// ---------------------------------------------------------------------------------------------
// Allocation
// ---------------------------------------------------------------------------------------------

// Backs the allocation with a slot when the policy selects it. Returns true and sets `va` when
// it did; false means the caller makes the real allocation and reports it with `allocated`,
// passing on `skipped` (set when a guard, rather than the policy, kept it from being a slot).
// A slot made during a capture reserves its address only: it gets pages before its first use.
bool try_slot(const Call& call, size_t bytes, CUdeviceptr* va, const char** skipped);
// A real allocation, or a launch (the driver grows a kernel's local memory when it is launched),
// failed for want of memory: slots no launch in flight needs give at least `bytes` of pages back
// if they can (evicted to pinned host memory). True when some did, and the call may be retried.
// `what` names the call in the trace ("allocation of 32 MiB", "launch").
bool out_of_memory(const Call& call, size_t bytes, const std::string& what);
// Before an allocation of `bytes` (a slot's or the program's own; not a stream-ordered one, which
// a pool may serve from memory it holds) on the current device: where
// graphs rewritten under the auto budget may still map pages within their reserves
// (inside::unmapped_reserve), the allocation must leave those free. Slots no launch needs give
// pages back first; false (said in the log and the trace) when the allocation would still take
// them: the caller refuses it for want of memory, as the device would have without the
// graph's windows, rather than leave a launch waiting on the device for pages that never come.
bool room_beside_graphs(const Call& call, size_t bytes);
// A real allocation succeeded. `stream` is the stream of a stream-ordered allocation, or null.
void allocated(const Call& call, CUdeviceptr va, size_t bytes, CUstream stream,
               const char* skipped = nullptr);
// Frees `va` if it is a slot (waiting for work in flight on the device, as cudaFree does) and
// returns the result; returns nothing when `va` is not a slot and the real free must run.
std::optional<CUresult> free_slot(const Call& call, CUdeviceptr va);
// A real free succeeded.
void freed(const Call& call, CUdeviceptr va, CUstream stream);
// Held by the hooks around the real free of memory that is not a slot: a map refused meanwhile
// is not taken as the device keeping memory back (Engine::GivingBack). Nothing while the process
// has no slots.
class ProgramFree {
 public:
  ProgramFree();
  ProgramFree(const ProgramFree&) = delete;
  ProgramFree& operator=(const ProgramFree&) = delete;
  ~ProgramFree();

 private:
  bool held_ = false;
};

// ---------------------------------------------------------------------------------------------
// Capture and graphs
// ---------------------------------------------------------------------------------------------

// Before the real stream destroy: the slots' uses enqueued on `stream` are closed now.
void stream_destroying(const Call& call, CUstream stream);
// Before the real begin-capture call: what slots' uses were enqueued on `stream` is closed now.
void capture_beginning(const Call& call, CUstream stream);
// The driver refused to begin the capture capture_beginning() announced.
void capture_refused();
void capture_began(const Call& call, CUstream stream, CUstreamCaptureMode mode, CUgraph target);
void capture_ended(const Call& call, CUstream stream, CUgraph graph, CUresult result);
void capture_mode_exchanged(const Call& call, CUstreamCaptureMode before, CUstreamCaptureMode now);
// One instantiation's scan of the program's graph, made by the first of the calls below that
// needs it and reused by the others, so that a graph is scanned once per instantiation (a
// rewritten copy is scanned apart). The hook makes one per instantiation, naming the graph.
struct Scanned {
  explicit Scanned(CUgraph of) : graph(of) {}
  CUgraph graph;
  bool with_nodes = false;  // the scan has each top-level node's references (GraphScan::order)
  std::optional<GraphScan> scan;
};
// Before the real instantiation of `graph`: the graph to instantiate instead (a rewritten copy
// with windows inside it, core/plan/inside.h), or `graph` itself.
CUgraph graph_to_instantiate(const Call& call, CUgraph graph, Scanned* scanned);
// Runs `instantiate` (the real instantiation of `graph`) while the slots its copy and memset
// nodes name have pages: the driver refuses a graph whose copy names an address without them
// (bench/results/launch_unmapped_h100.txt), and residency may have evicted one since the capture.
// Pages that cannot be had are logged, the driver then says what it says, and the result says
// why they could not be had: the failed driver call's code (CUDA_ERROR_OUT_OF_MEMORY for a device
// without room), CUDA_ERROR_UNKNOWN where no driver call failed, CUDA_SUCCESS when they were.
// A hook whose real call then fails returns an out-of-memory as the program's error: the driver's
// own (an invalid address) would name the wrong cause.
CUresult with_pages_to_instantiate(const Call& call, CUgraph graph, Scanned* scanned,
                                   const std::function<void()>& instantiate);
// Runs `fn` (a real cudaGraphExec*NodeSetParams) while the slots that `words` (its arguments'
// bytes, as 8-byte words) name have pages: the driver checks a copy's or memset's new addresses
// at the call. Returns as with_pages_to_instantiate.
CUresult with_pages_named(const Call& call, const std::vector<uintptr_t>& words,
                          const std::function<void()>& fn);
// An executable graph was made (`exec`; nullptr when the instantiation failed) from `graph`, or
// from `instead` (what graph_to_instantiate gave): the graph is scanned for the slots it uses
// (graph_scan.h).
void instantiated(const Call& call, CUgraphExec exec, CUgraph graph, CUgraph instead,
                  Scanned* scanned);
// An executable graph was changed: updated from `graph` (rescanned), or, with no graph, one of
// its nodes was given new parameters (from then on it counts as using every slot).
void exec_changed(const Call& call, CUgraphExec exec, std::optional<CUgraph> graph);
// Before the real cudaGraphExecUpdate of `exec` from `graph`: the graph to update from instead
// (an executable made from a rewritten copy: `graph` with its windows added, inside::
// update_source), or `graph`. The hook makes one Scanned per update, naming `graph`.
CUgraph update_source(const Call& call, CUgraphExec exec, CUgraph graph, Scanned* scanned);
// After it (`made`: the driver updated it from `instead`, what update_source gave): the
// executable's facts are `graph`'s. CUDA_SUCCESS, or the error the call returns instead of
// success (logged and traced): the windows' copies were off and could not be turned off again.
CUresult exec_updated(const Call& call, CUgraphExec exec, CUgraph graph, CUgraph instead, bool made,
                      Scanned* scanned);
// Before the real cudaGraphExec*NodeSetParams: the node to name (the program names a node of
// the captured graph; an executable made from a rewritten copy has its counterpart there). A
// rewritten executable's slots come back to the device first and are unmapped no more
// (inside::node_changing): the driver checks a copy or memset node's new addresses at the call,
// and refuses one without pages (bench/results/launch_unmapped_h200.txt). Its windows' copies
// are disabled first; where that fails, `refused` holds the error the call must return without
// making the change (logged, and traced as an `error`).
CUgraphNode exec_node_changing(const Call& call, CUgraphExec exec, CUgraphNode node,
                               CUresult* refused);
// The node of `exec` to name for a call that changes nothing `exec` reads or writes in device
// memory (enabling a node, an event or host node's new parameters): its counterpart where `exec`
// was made from a rewritten copy, else `node`.
CUgraphNode exec_node_in(CUgraphExec exec, CUgraphNode node);
// What a launch holds from before the real call to after it. Not ok: the launch must not happen
// (its slots cannot fit the residency budget); the hook returns the API's out-of-memory error.
using Ticket = planner::Ticket;
// Before the real launch: the planner makes the graph's slots resident and acts on its plan.
Ticket launched(const Call& call, CUgraphExec exec, CUstream stream);
// After the real launch returned; `enqueued` when it succeeded.
void launch_returned(const Call& call, CUgraphExec exec, CUstream stream, const Ticket& ticket,
                     bool enqueued);
void exec_destroyed(const Call& call, CUgraphExec exec);
void graph_destroyed(const Call& call, CUgraph graph);

// ---------------------------------------------------------------------------------------------
// Eager work: kernels, copies and memsets outside graphs
// ---------------------------------------------------------------------------------------------

// True when eager work must be scanned (planner.h: unless a schedule is in force and the guard
// is off), and while any capture is open (copies and memsets recorded into slots need them
// mapped). The hooks forward at once otherwise. Two relaxed loads.
bool eager_wanted();
// True once the preload has made a slot: copies and memsets are always looked up (they name
// their addresses, and the driver checks those when they are enqueued: an evicted slot must be
// mapped again first, whatever the plan). One relaxed load.
bool access_wanted();
// What asking for one kernel parameter's place gave: the place, the end of the list (a kernel
// has that many parameters), or nothing (the kernel gives no layout).
enum class Param { found, end, unknown };
// A kernel and how to ask for its parameter layout: a runtime host stub with
// cudaFuncGetParamInfo, or a CUfunction with cuFuncGetParamInfo. Layouts are cached by `key`.
struct Kernel {
  const void* key;
  Param (*param_info)(const void* key, size_t index, size_t* offset, size_t* bytes);
};
// cuFuncGetParamInfo (else cuKernelGetParamInfo) through the driver vaswap loaded.
Param driver_param_info(const void* function, size_t index, size_t* offset, size_t* bytes);
// Before a kernel launch: its parameters (laid out as the kernel says) or its packed `extra`
// buffer are scanned for slot addresses, and those slots made resident.
Ticket eager_kernel(const Call& call, CUstream stream, const Kernel& kernel, void** params,
                    void** extra);
// A kernel node of `exec` was given new arguments (cudaGraphExecKernelNodeSetParams and its
// driver twins): the slots they name join the executable's; a layout that cannot be read makes
// it use every slot.
void exec_kernel_changed(const Call& call, CUgraphExec exec, const Kernel& kernel, void** params,
                         void** extra);
// A copy or memset node of `exec` was given new parameters (cudaGraphExecMemcpyNodeSetParams*,
// cudaGraphExecMemsetNodeSetParams and their driver twins), whose bytes as 8-byte words are
// `words`: the slots they name join the executable's.
void exec_copy_changed(const Call& call, CUgraphExec exec, const std::vector<uintptr_t>& words);
// Before a copy or memset: the addresses it reads or writes (host addresses find nothing). The
// slots it names are made resident, and this thread waits until their pages are mapped: the
// driver refuses a copy into a reserved, unmapped address when it is enqueued (the stream still
// waits for their data on the device). Into a capture: the slots get their pages now, as a
// captured copy needs its addresses mapped too.
// `shape`: the copy or memset itself, between device addresses, which the device handshake may
// make as a graph (residency::EagerShape): the ticket's acquired.substitute, when set, is launched
// on acquired.stream instead of the program's call.
Ticket eager_access(const Call& call, CUstream stream, const uintptr_t* addresses, size_t count,
                    const residency::EagerShape* shape = nullptr);
// After the real eager call returned.
void eager_done(const Ticket& ticket);

// ---------------------------------------------------------------------------------------------
// First-time work and the device handshake
// ---------------------------------------------------------------------------------------------

// True when `function` (a runtime host stub or a CUfunction) has no launch made yet in the
// current context (launch_made) while the device handshake is in use (residency::parks_streams):
// the launch loads it under lazy loading, and settles. Every thread launching it meanwhile settles
// too: another thread's first launch may still be waiting to settle, its kernel not yet loaded.
// One relaxed load when the handshake is not in use.
bool first_launch(const void* function);
// After a launch of `function` returned successfully (its kernel is loaded in the context).
void launch_made(const void* function);
// True while the device handshake is in use: an instantiation or a module load settles first.
// Starts nothing (a module load asks it from inside cudart's initialization).
bool settles();
using Quiet = residency::Quiet;
// True while no lookup of `name` (may be null) in `handle` (a module, library, kernel or
// function) returned yet in the current context (lookup_made) and the device handshake is in
// use: a kernel's first lookup, which loads it under lazy loading, settles.
bool first_lookup(const void* handle, const char* name);
// After a lookup returned successfully.
void lookup_made(const void* handle, const char* name);
// First-time work waits on the host until no stream is parked on a restore
// (residency::settle); CUDA_SUCCESS, or the error to return with the reason on the log. With
// `quiet`, no stream is parked again until it is released (after the work).
CUresult settle(const Call& call, const char* work, residency::Quiet* quiet = nullptr);
// True when some address is host memory the driver does not know (pageable: malloc, the stack):
// a copy to or from it is staged, and the call waits for its stream's earlier work.
bool pageable(const uintptr_t* addresses, size_t count);

// ---------------------------------------------------------------------------------------------
// Device state
// ---------------------------------------------------------------------------------------------

// cudaMemGetInfo / cuMemGetInfo answered: the driver's own numbers, recorded as a sample.
void memory_queried(const Call& call, size_t free_bytes, size_t total_bytes);
// The current device (runtime) or `device` (driver) is about to be reset: its slots are freed
// first, since the reset destroys the context that owns their pages.
void device_resetting(const Call& call, std::optional<CUdevice> device);
// The current device may now reach `peer`'s memory (cudaDeviceEnablePeerAccess: its ordinal;
// cuCtxEnablePeerAccess: its context): every slot of the peer's is mapped for it too, now and at
// every later map (Engine::grant_device_access).
// cuPointerGetAttribute refused `ptr`: if it lies in a slot, `attribute` is answered as for the
// cudaMalloc'd memory the slot stands for (device memory of the slot's device and context, the
// slot as its range) and true is returned; false for other addresses and attributes.
bool slot_pointer_attribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr);
// cuPointerGetAttributes answered: if `ptr` lies in a slot the driver does not see as device
// memory now (no pages), every attribute slot_pointer_attribute() can answer is answered so.
void slot_pointer_attributes(unsigned int count, const CUpointer_attribute* attributes, void** data,
                             CUdeviceptr ptr);
void peer_access_enabled(const Call& call, int peer);
void peer_access_enabled(const Call& call, CUcontext peer);

// ---------------------------------------------------------------------------------------------
// Queries, for the C API and tests
// ---------------------------------------------------------------------------------------------

// The region that contains `address`, if the preload has seen its allocation.
std::optional<Region> find_region(uintptr_t address);

// Counts of what the hooks handled; each user call is counted once, at the level it entered.
struct Counters {
  uint64_t allocations = 0, frees = 0, slots = 0, captures = 0, instantiations = 0, launches = 0;
};
Counters counters();

}  // namespace vaswap::intercept
