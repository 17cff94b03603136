"""vaswap's Python binding: fixed-address device slots as torch tensors.

    import torch, vaswap
    slot = vaswap.Slot((4096, 4096), torch.bfloat16)       # device memory at a fixed address
    host = vaswap.HostBuffer(slot.nbytes)                   # pinned, from vaswap's pool
    x = slot.tensor                                         # a torch tensor at slot.address
    vaswap.offload_after([slot], [host])                    # D2H on the current stream, then release
    with vaswap.remap_and_copy_after([slot], [host]) as r:  # same address, new pages, H2D
        r.wait()                                            # the current stream waits for the copy
        r.adopt()
    assert slot.tensor.data_ptr() == slot.address

Streams are torch.cuda.Stream objects, raw handles (int), or None for torch's current stream
(the legacy default stream when torch is absent). Every failure raises VaswapError with the
library's message. The C API (include/vaswap/vaswap.h) documents each call.

libvaswap.so is loaded at the first call: VASWAP_LIBRARY if set, else the one this process
preloads, else the one installed with this package (pip or cmake --install), else a checkout's
build. vaswap.version() is the library's version, vaswap.__version__ the package's.
"""

import ctypes
import weakref

from . import _dlpack, _layout, _lib

__all__ = [
    "VaswapError", "Slot", "HostBuffer", "Remap", "release_after", "offload_after",
    "remap_after", "remap_and_copy_after", "remap_deferred_after", "memory_info", "stats",
    "workers_init", "set_serial_driver_calls", "set_page_reuse", "trace_open", "trace_close",
    "version",
]

_c = _lib.Library()  # libvaswap.so, loaded at the first call
__version__ = _layout.version()

OK = 0
NOT_READY = 7


class VaswapError(RuntimeError):
    """A failed vaswap call: `status` is the vaswap_status name, the text the library's message."""

    def __init__(self, status, message):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def _check(status):
    if status != OK:
        name = _c.vaswap_status_name(status).decode()
        raise VaswapError(name, _c.vaswap_last_error().decode(errors="replace"))


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("vaswap: tensors need PyTorch (pip install torch)") from e
    return torch


def _stream(stream):
    """A raw CUstream handle from a torch stream, an int, or None (torch's current stream)."""
    if stream is None:
        try:
            import torch
        except ImportError:
            return None
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        return None
    if isinstance(stream, int):
        return ctypes.c_void_p(stream)
    handle = getattr(stream, "cuda_stream", None)
    if handle is None:
        raise TypeError(f"vaswap: expected a torch.cuda.Stream, an int or None, got {stream!r}")
    return ctypes.c_void_p(handle)


def _handles(objects, kind):
    array = (ctypes.c_void_p * max(len(objects), 1))()
    for i, obj in enumerate(objects):
        if not isinstance(obj, kind):
            raise TypeError(f"vaswap: item {i} is {type(obj).__name__}, expected {kind.__name__}")
        array[i] = obj._handle()
    return array


class _Owned:
    """An owned C handle (`_ptr`), released once by close() or when garbage-collected."""

    _kind = "handle"
    _release = None  # the name of the C call that frees the handle

    def _handle(self):
        if not self._ptr:
            raise VaswapError("VASWAP_ERROR_INVALID_ARGUMENT", f"the {self._kind} is closed")
        return self._ptr.value

    def close(self):
        if self._ptr:
            handle, self._ptr = self._ptr.value, ctypes.c_void_p()
            _check(getattr(_c, type(self)._release)(handle))

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass


class Slot(_Owned):
    """Device memory at a virtual address that never changes (vaswap_slot).

    Slot(shape, dtype, device=None, strides=None) or Slot(nbytes=N, device=None). `device`
    defaults to torch's current device (0 without torch). close() destroys the slot (drains its
    work, frees pages and address); tensors over it must not be used afterwards."""

    _kind = "slot"
    _release = "vaswap_slot_destroy"

    def __init__(self, shape=None, dtype=None, device=None, strides=None, nbytes=None):
        if device is None:
            try:
                import torch

                device = torch.cuda.current_device() if torch.cuda.is_available() else 0
            except ImportError:
                device = 0
        elif not isinstance(device, int):
            device = device.index if device.index is not None else 0
        self._ptr = ctypes.c_void_p()
        self._tensor_ref = None  # weak: the tensor keeps the slot alive, not the other way
        self.shape, self.dtype, self.strides = None, dtype, None
        if nbytes is not None:
            if shape is not None:
                raise ValueError("vaswap.Slot: give either shape and dtype, or nbytes")
            _check(_c.vaswap_slot_create(device, nbytes, ctypes.byref(self._ptr)))
        else:
            if shape is None or dtype is None:
                raise ValueError("vaswap.Slot: give shape and dtype, or nbytes")
            torch = _torch()
            self.shape = tuple(int(s) for s in shape)
            if strides is None:
                strides, step = [], 1
                for size in reversed(self.shape):
                    strides.insert(0, step)
                    step *= size
            self.strides = tuple(int(s) for s in strides)
            element = torch.empty((), dtype=dtype).element_size()
            n = len(self.shape)
            _check(_c.vaswap_slot_create_strided(
                device, n, (ctypes.c_int64 * max(n, 1))(*self.shape),
                (ctypes.c_int64 * max(n, 1))(*self.strides), element, ctypes.byref(self._ptr)))
            self.tensor  # builds the view and checks its address

    @classmethod
    def find(cls, address):
        """The slot that contains `address` (an int, or a tensor: its data_ptr()), such as a
        graph-pool segment the preload backed with a slot. The object does not own the slot:
        close() forgets the handle and never destroys the slot. VaswapError with
        VASWAP_ERROR_NOT_FOUND when no slot contains the address."""
        if hasattr(address, "data_ptr"):
            address = address.data_ptr()
        found = cls.__new__(cls)
        found._ptr = ctypes.c_void_p()
        found._tensor_ref = None
        found.shape = found.dtype = found.strides = None
        found._borrowed = True
        _check(_c.vaswap_slot_find(ctypes.c_void_p(int(address)), ctypes.byref(found._ptr)))
        return found

    def close(self):
        if getattr(self, "_borrowed", False):
            self._ptr = ctypes.c_void_p()  # found, not owned: the slot stays
            return
        super().close()

    def info(self):
        info = _lib.SlotInfo()
        _check(_c.vaswap_slot_get_info(self._handle(), ctypes.byref(info)))
        return info

    @property
    def address(self):
        return self.info().va

    @property
    def nbytes(self):
        return self.info().bytes

    @property
    def device(self):
        return self.info().device

    @property
    def mapped(self):
        return bool(self.info().mapped)

    @property
    def tensor(self):
        """The torch tensor at the slot's address. The same object while it lives; it keeps the
        slot alive. Its data is valid while the slot's pages are mapped."""
        if self.shape is None:
            raise ValueError("vaswap.Slot: a slot made with nbytes has no tensor view")
        t = self._tensor_ref() if self._tensor_ref is not None else None
        if t is None:
            info = self.info()
            t = _dlpack.tensor_at(_torch(), info.va, self.shape, self.strides, self.dtype,
                                  info.device, self)
            self._tensor_ref = weakref.ref(t)
        self._check_address(t)
        return t

    def _check_address(self, t):
        if t.data_ptr() != self.address:
            raise AssertionError(
                f"vaswap: tensor.data_ptr() {t.data_ptr():#x} != slot address {self.address:#x}")

    def _check_live_tensor(self):
        t = self._tensor_ref() if self._tensor_ref is not None else None
        if t is not None:
            self._check_address(t)

    def unmap_and_release(self):
        _check(_c.vaswap_slot_unmap_and_release(self._handle()))

    def create_and_remap(self):
        _check(_c.vaswap_slot_create_and_remap(self._handle()))
        self._check_live_tensor()

    def __repr__(self):
        if not self._ptr:
            return "<vaswap.Slot closed>"
        i = self.info()
        return (f"<vaswap.Slot {i.id} va={i.va:#x} bytes={i.bytes} device={i.device} "
                f"mapped={bool(i.mapped)}>")


class HostBuffer(_Owned):
    """A pinned host buffer from vaswap's pool (vaswap_host_alloc); close() returns it."""

    _kind = "host buffer"
    _release = "vaswap_host_free"

    def __init__(self, nbytes):
        self.nbytes = int(nbytes)
        self._ptr = ctypes.c_void_p()
        _check(_c.vaswap_host_alloc(self.nbytes, ctypes.byref(self._ptr)))

    @property
    def address(self):
        return self._handle()

    def tensor(self, dtype=None, shape=None):
        """A CPU tensor over the buffer (bytes as uint8 unless dtype/shape are given)."""
        torch = _torch()
        dtype = dtype or torch.uint8
        element = torch.empty((), dtype=dtype).element_size()
        shape = tuple(shape) if shape is not None else (self.nbytes // element,)
        strides, step = [], 1
        for size in reversed(shape):
            strides.insert(0, step)
            step *= size
        return _dlpack.tensor_at(torch, self.address, shape, strides, dtype, 0, self, host=True)



class Remap(_Owned):
    """A restore in flight (vaswap_remap). Use as a context manager, or call close(): it drains
    the remap and unmaps pages that no slot adopted."""

    _kind = "remap"
    _release = "vaswap_remap_destroy"

    def __init__(self, handle, slots):
        self._ptr = handle
        self.slots = list(slots)

    def launch_h2d(self, index, stream=None):
        _check(_c.vaswap_remap_launch_h2d(self._handle(), index, _stream(stream)))

    def wait_submitted(self, index):
        _check(_c.vaswap_remap_wait_slot_submitted(self._handle(), index))

    def wait_slot(self, index, stream=None):
        _check(_c.vaswap_remap_wait_slot_on_stream(self._handle(), index, _stream(stream)))

    def wait(self, stream=None):
        _check(_c.vaswap_remap_wait_on_stream(self._handle(), _stream(stream)))

    def try_wait(self, stream=None):
        """True once the stream waits for every copy; False (nothing changed) if not yet."""
        status = _c.vaswap_remap_try_wait_on_stream(self._handle(), _stream(stream))
        if status == NOT_READY:
            return False
        _check(status)
        return True

    def adopt(self):
        _check(_c.vaswap_remap_adopt(self._handle()))
        for slot in self.slots:
            slot._check_live_tensor()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def release_after(slots, stream=None):
    _check(_c.vaswap_release_after(_handles(slots, Slot), len(slots), _stream(stream)))


def offload_after(slots, hosts, stream=None):
    _check(_c.vaswap_offload_after(_handles(slots, Slot), _handles(hosts, HostBuffer),
                                   len(slots), _stream(stream)))


def _remap(fn, slots, hosts, stream):
    out = ctypes.c_void_p()
    if hosts is None:
        _check(fn(_handles(slots, Slot), len(slots), _stream(stream), ctypes.byref(out)))
    else:
        if len(hosts) != len(slots):
            raise ValueError(f"vaswap: {len(slots)} slots but {len(hosts)} host buffers")
        _check(fn(_handles(slots, Slot), _handles(hosts, HostBuffer), len(slots),
                  _stream(stream), ctypes.byref(out)))
    return Remap(out, slots)


def remap_after(slots, stream=None):
    return _remap(_c.vaswap_remap_after, slots, None, stream)


def remap_and_copy_after(slots, hosts, stream=None):
    return _remap(_c.vaswap_remap_and_copy_after, slots, hosts, stream)


def remap_deferred_after(slots, hosts, stream=None):
    return _remap(_c.vaswap_remap_deferred_after, slots, hosts, stream)


def memory_info(device=0):
    """(free, total) bytes from the driver (cuMemGetInfo): VMM pages included."""
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    _check(_c.vaswap_driver_memory_info(device, ctypes.byref(free), ctypes.byref(total)))
    return free.value, total.value


def stats():
    s = _lib.Stats()
    _check(_c.vaswap_get_stats(ctypes.byref(s)))
    return {name: getattr(s, name) for name, _ in _lib.Stats._fields_}


def workers_init(device=0):
    _check(_c.vaswap_workers_init(device))


def set_serial_driver_calls(serial):
    _check(_c.vaswap_set_serial_driver_calls(1 if serial else 0))


def set_page_reuse(bytes_per_device):
    """Keep up to this many bytes of unmapped pages per device for later remaps of the same size
    (0: none, and the kept ones go back to the driver now). See vaswap_set_page_reuse."""
    _check(_c.vaswap_set_page_reuse(int(bytes_per_device)))


def trace_open(path):
    _check(_c.vaswap_trace_open(str(path).encode()))


def trace_close():
    _check(_c.vaswap_trace_close())


def version():
    return _c.vaswap_version().decode()
