"""Loads libvaswap.so and declares the C API (include/vaswap/vaswap.h) for ctypes."""

import ctypes
import os

from . import _layout


class SlotInfo(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_uint64),
        ("va", ctypes.c_uint64),
        ("bytes", ctypes.c_size_t),
        ("mapped_bytes", ctypes.c_size_t),
        ("device", ctypes.c_int),
        ("mapped", ctypes.c_int),
        ("release_pending", ctypes.c_int),
        ("remap_pending", ctypes.c_int),
    ]


class Stats(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "slots_live",
            "bytes_mapped",
            "releases",
            "remaps",
            "bytes_offloaded",
            "bytes_restored",
            "errors",
            "host_bytes_pinned",
            "host_bytes_in_use",
            "allocations_seen",
            "frees_seen",
            "slots_selected",
            "captures_seen",
            "instantiations_seen",
            "graph_launches_seen",
            "plans",
            "regions_offloaded",
            "planned_offloads",
            "planned_restores",
            "on_demand_restores",
            "guard_hits",
            "deviations",
            "restore_waits",
            "restore_wait_ns",
        )
    ]


_P = ctypes.c_void_p
_SIZE = ctypes.c_size_t
_INT = ctypes.c_int
_SLOTS = ctypes.POINTER(_P)
_OUT = ctypes.POINTER(_P)

# name -> argument types; every call returns a vaswap_status (int), except where noted.
_SIGNATURES = {
    "vaswap_slot_create": [_INT, _SIZE, _OUT],
    "vaswap_slot_find": [_P, _OUT],
    "vaswap_slot_create_strided": [
        _INT, _INT, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64), _SIZE, _OUT,
    ],
    "vaswap_slot_destroy": [_P],
    "vaswap_slot_get_info": [_P, ctypes.POINTER(SlotInfo)],
    "vaswap_release_after": [_SLOTS, _SIZE, _P],
    "vaswap_offload_after": [_SLOTS, _SLOTS, _SIZE, _P],
    "vaswap_remap_after": [_SLOTS, _SIZE, _P, _OUT],
    "vaswap_remap_and_copy_after": [_SLOTS, _SLOTS, _SIZE, _P, _OUT],
    "vaswap_remap_deferred_after": [_SLOTS, _SLOTS, _SIZE, _P, _OUT],
    "vaswap_remap_launch_h2d": [_P, _SIZE, _P],
    "vaswap_remap_wait_slot_submitted": [_P, _SIZE],
    "vaswap_remap_wait_slot_on_stream": [_P, _SIZE, _P],
    "vaswap_remap_wait_on_stream": [_P, _P],
    "vaswap_remap_try_wait_on_stream": [_P, _P],
    "vaswap_remap_adopt": [_P],
    "vaswap_remap_destroy": [_P],
    "vaswap_slot_unmap_and_release": [_P],
    "vaswap_slot_create_and_remap": [_P],
    "vaswap_host_alloc": [_SIZE, _OUT],
    "vaswap_host_free": [_P],
    "vaswap_driver_memory_info": [_INT, ctypes.POINTER(_SIZE), ctypes.POINTER(_SIZE)],
    "vaswap_workers_init": [_INT],
    "vaswap_set_serial_driver_calls": [_INT],
    "vaswap_set_page_reuse": [ctypes.c_uint64],
    "vaswap_trace_open": [ctypes.c_char_p],
    "vaswap_trace_close": [],
    "vaswap_get_stats": [ctypes.POINTER(Stats)],
}


def _already_loaded():
    """The libvaswap.so this process has mapped (LD_PRELOAD), if any."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if path.endswith("/libvaswap.so"):
                    return path
    except OSError:
        pass
    return None


def _candidates():
    explicit = os.environ.get("VASWAP_LIBRARY")
    if explicit:
        return [explicit]
    found = [_already_loaded(), str(_layout.library())]
    if not _layout.installed():  # a checkout built in another build directory
        found += [str(p) for p in sorted(_layout.CHECKOUT.glob("build/*/lib/libvaswap.so"))]
    found.append("libvaswap.so")  # LD_LIBRARY_PATH
    return list(dict.fromkeys(p for p in found if p))


_loaded = None


def load():
    """libvaswap.so with the C API declared; loaded once, at the first call that needs it."""
    global _loaded
    if _loaded is not None:
        return _loaded
    errors = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
            continue
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
        lib.vaswap_last_error.restype = ctypes.c_char_p
        lib.vaswap_last_error.argtypes = []
        lib.vaswap_status_name.restype = ctypes.c_char_p
        lib.vaswap_status_name.argtypes = [ctypes.c_int]
        lib.vaswap_version.restype = ctypes.c_char_p
        lib.vaswap_version.argtypes = []
        _loaded = lib
        return lib
    raise ImportError(
        "vaswap: cannot load libvaswap.so; build it (scripts/test.sh or cmake), install vaswap "
        "(pip install), or set VASWAP_LIBRARY=/path/to/libvaswap.so. Tried: " + "; ".join(errors)
    )


class Library:
    """libvaswap.so, loaded at its first use rather than at import: the command line
    (vaswap._cli) imports this package only to name the library to LD_PRELOAD, and must not
    map it (a sanitizer build cannot even be loaded into an uninstrumented python)."""

    def __getattr__(self, name):
        return getattr(load(), name)
