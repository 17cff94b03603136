"""A torch tensor over memory vaswap owns, through DLPack (no copy, same address)."""

import ctypes

_KDL_CUDA = 2
_KDL_CPU = 1


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [
    ("dl_tensor", _DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DELETER),
]

_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

# Everything a live tensor needs (its owner, shape and strides arrays, the struct itself), keyed
# by the address of its DLManagedTensor; the deleter drops the entry when torch frees the tensor.
_alive = {}


@_DELETER
def _deleter(managed):
    _alive.pop(ctypes.addressof(managed.contents), None)


def dtype_code(torch, dtype):
    """DLPack (code, bits) of a torch dtype."""
    table = {
        torch.float16: (2, 16), torch.bfloat16: (4, 16), torch.float32: (2, 32),
        torch.float64: (2, 64), torch.int8: (0, 8), torch.uint8: (1, 8), torch.int16: (0, 16),
        torch.int32: (0, 32), torch.int64: (0, 64), torch.bool: (6, 8),
    }
    if dtype not in table:
        raise TypeError(f"vaswap: dtype {dtype} has no DLPack code here; use one of {list(table)}")
    return table[dtype]


def tensor_at(torch, address, shape, strides, dtype, device, owner, host=False):
    """A torch tensor of `shape`/`strides` (elements) at `address`, keeping `owner` alive."""
    ndim = len(shape)
    shape_array = (ctypes.c_int64 * max(ndim, 1))(*shape)
    strides_array = (ctypes.c_int64 * max(ndim, 1))(*strides)
    code, bits = dtype_code(torch, dtype)
    managed = _DLManagedTensor()
    managed.dl_tensor.data = address
    managed.dl_tensor.device = _DLDevice(_KDL_CPU if host else _KDL_CUDA, device)
    managed.dl_tensor.ndim = ndim
    managed.dl_tensor.dtype = _DLDataType(code, bits, 1)
    managed.dl_tensor.shape = shape_array
    managed.dl_tensor.strides = strides_array
    managed.dl_tensor.byte_offset = 0
    managed.manager_ctx = None
    managed.deleter = _deleter
    _alive[ctypes.addressof(managed)] = (managed, shape_array, strides_array, owner)
    capsule = _PyCapsule_New(ctypes.addressof(managed), b"dltensor", None)
    return torch.utils.dlpack.from_dlpack(capsule)
