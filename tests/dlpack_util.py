"""Hand-made DLPack capsules: malformed ones for the error tests, and views at an element
offset (misaligned starts) of any ewkern array, on the CPU or a GPU, without torch."""
import ctypes
import math

ctypes.pythonapi.PyCapsule_GetName.restype = ctypes.c_char_p
ctypes.pythonapi.PyCapsule_GetName.argtypes = [ctypes.py_object]
ctypes.pythonapi.PyCapsule_New.restype = ctypes.py_object
ctypes.pythonapi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

DL_CODES = {"float32": (2, 32), "float16": (2, 16), "bfloat16": (4, 16), "float64": (2, 64)}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


_keep = []  # the ctypes structures must outlive the capsules (tests are short-lived)


def capsule_name(cap):
    return ctypes.pythonapi.PyCapsule_GetName(cap).decode()


def make_capsule(ptr, owner=None, code=2, bits=32, device_type=1, device_id=0, ndim=1, shape=(4,),
                 strides=None, name=b"dltensor"):
    """A legacy DLPack capsule over memory at ptr with every field chosen by the caller; owner is
    kept alive as long as the module runs."""
    shp = (ctypes.c_int64 * max(ndim, 1))(*shape)
    strd = (ctypes.c_int64 * max(ndim, 1))(*strides) if strides else None
    mt = DLManagedTensor()
    mt.dl_tensor.data = ptr
    mt.dl_tensor.device = DLDevice(device_type, device_id)
    mt.dl_tensor.ndim = ndim
    mt.dl_tensor.dtype = DLDataType(code, bits, 1)
    mt.dl_tensor.shape = shp
    mt.dl_tensor.strides = ctypes.cast(strd, ctypes.POINTER(ctypes.c_int64)) if strd else None
    _keep.append((owner, shp, strd, mt))
    return ctypes.pythonapi.PyCapsule_New(ctypes.addressof(mt), name, None)


def offset_view(arr, offset, n, shape=None):
    """An ewkern.Array of n elements starting `offset` elements into ewkern array arr (so its
    start is aligned to the element size only), 1-D or of C-contiguous `shape`."""
    import ewkern
    assert offset + n <= arr.size
    shape = (n,) if shape is None else tuple(shape)
    assert math.prod(shape) == n
    code, bits = DL_CODES[arr.dtype]
    dev_type, dev_id = arr.__dlpack_device__()
    cap = make_capsule(arr.data_ptr + offset * arr.itemsize, owner=arr, code=code, bits=bits,
                       device_type=dev_type, device_id=dev_id, ndim=len(shape), shape=shape)
    return ewkern.from_dlpack(cap)
