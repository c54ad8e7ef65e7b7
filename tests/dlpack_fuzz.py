"""Malformed DLPack capsules, made with ctypes, for test_dlpack_fuzz.py.

cases() lists every case (the same list in the test and in its worker processes): one field of
an otherwise valid legacy or versioned tensor broken in one way, reaching ewkern in one position
(from_dlpack, first input, second input after a valid hand-made capsule, out=, rmse's second
input), with the exception it must raise and how often the producer's deleter must run. A few
valid controls prove that the harness sees success and counts deleters.

`python dlpack_fuzz.py START STOP` runs cases[START:STOP] in this process and prints one JSON
line per case as soon as it finishes, so a crash shows as the first missing line.
"""
import ctypes
import json
import sys

from dlpack_util import DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned

POSITIONS = ("from_dlpack", "a", "b", "out", "rmse_b")
SHAPE = (2, 4)
DELETED_BY_PRODUCER = 1    # every capsule's deleter runs once: by ewkern or by the capsule destructor

LIMIT = 1 << 56


def _mutations():
    """(name, field overrides, exception, message regex, kinds) for every malformed tensor."""
    m = []
    for nd in (-1, -7, -(1 << 31), 17, 64, (1 << 31) - 1):
        m.append(("ndim=%d" % nd, dict(ndim=nd, shape=None), "ValueError", "dimensions", "lv"))
    for nd in range(1, 17):
        m.append(("NULL shape, ndim=%d" % nd, dict(ndim=nd, shape=None), "BufferError", "shape is NULL", "lv"))
    for shp in ((-1,), (2, -4), (-(1 << 63), 1), (4, -1, 2), (0, -1), (1,) * 15 + (-3,)):
        m.append(("shape=%s" % (shp,), dict(ndim=len(shp), shape=shp), "ValueError", "negative dimension", "lv"))
    for shp in ((1 << 20,) * 4, (1 << 32, 1 << 32), (1 << 62, 4), ((1 << 63) - 1, 2), (1 << 31,) * 3,
                (3, 1 << 62), (1 << 40, 1 << 20), (1 << 55,), (0, 1 << 40, 1 << 40), (1 << 40, 1 << 40, 0),
                (16,) * 15 + (1 << 8,)):
        m.append(("shape=%s" % (shp,), dict(ndim=len(shp), shape=shp), "ValueError", "more than 2\\^56 bytes", "lv"))
    for off in ((1 << 64) - 1, 1 << 63, 1 << 62, 1 << 57, LIMIT, "wrap"):
        m.append(("byte_offset=%s" % off, dict(byte_offset=off), "BufferError", "beyond the address space", "lv"))
    for data in ((1 << 63), (1 << 64) - 64, LIMIT - 16, LIMIT):
        m.append(("data=%#x" % data, dict(data=data), "BufferError", "beyond the address space", "lv"))
    m.append(("NULL data", dict(data=0), "ValueError", "NULL data pointer", "lv"))
    for mis in (1, 2, 3):
        m.append(("data+%d" % mis, dict(data_off=mis), "ValueError", "not aligned", "lv"))
        m.append(("byte_offset=%d" % mis, dict(byte_offset=mis), "ValueError", "not aligned", "lv"))
    m.append(("float64 at +4", dict(code=2, bits=64, byte_offset=4), "ValueError", "not aligned", "lv"))
    for code in (0, 1, 3, 5, 6, 7, 8, 9, 17, 100, 255):
        for bits in (16, 32):
            m.append(("code=%d bits=%d" % (code, bits), dict(code=code, bits=bits), "TypeError",
                      "unsupported dtype", "lv"))
    for bits in (0, 1, 8, 24, 128, 255):
        m.append(("float bits=%d" % bits, dict(bits=bits), "TypeError", "unsupported dtype", "lv"))
    for bits in (8, 32, 64):
        m.append(("bfloat bits=%d" % bits, dict(code=4, bits=bits), "TypeError", "unsupported dtype", "lv"))
    for lanes in (0, 2, 4, 65535):
        m.append(("lanes=%d" % lanes, dict(lanes=lanes), "TypeError", "unsupported dtype", "lv"))
    for dt in (0, 4, 7, 8, 9, 10, 11, 12, 14, 15, 16, 17, 18, 99, -1, (1 << 31) - 1):
        m.append(("device_type=%d" % dt, dict(device=(dt, 0)), "ValueError", "device type", "lv"))
    for did in (-1, -(1 << 31)):
        for dt in (2, 13):
            m.append(("device=(%d, %d)" % (dt, did), dict(device=(dt, did)), "ValueError", "is negative", "lv"))
    for strides in ((1, 2), (0, 0), (-4, -1), (8, 1), (4, 2), (1 << 62, 1), (-(1 << 63), 1), (4, 0)):
        m.append(("strides=%s" % (strides,), dict(strides=strides), "ValueError", "not C-contiguous", "lv"))
    for major in (0, 2, 3, 255, (1 << 32) - 1):
        m.append(("version major=%d" % major, dict(version=(major, 0)), "BufferError", "major version", "v"))
    for name in (b"foo", b"", b"DLTENSOR", b"dltensor_versione", b"dltensor "):
        m.append(("name=%r" % name, dict(name=name), "TypeError", "named", "lv"))
    for name in (b"used_dltensor", b"used_dltensor_versioned"):
        m.append(("name=%r" % name, dict(name=name), "BufferError", "already consumed", "lv"))
    return m


def _controls():
    """Valid tensors: they must work, and their deleters still run once."""
    return [
        ("valid", dict()),
        ("valid, explicit strides", dict(strides=(4, 1))),
        ("valid, byte_offset=8", dict(byte_offset=8)),
        ("valid, NULL deleter", dict(deleter=False)),
        ("valid, minor version 99 and unknown flag bits", dict(version=(1, 99), flags=1 << 40)),
        ("valid, kDLCUDAHost memory", dict(device=(3, 0))),
    ]


def cases():
    out = []
    for name, fields, exc, match, kinds in _mutations():
        for kind in ("legacy", "versioned"):
            if kind[0] not in kinds:
                continue
            f = dict(fields)
            deleted = 0 if f.get("name", b"").startswith(b"used_") else DELETED_BY_PRODUCER
            for pos in POSITIONS:
                out.append(dict(kind=kind, what=name, fields=f, pos=pos, exc=exc, match=match, deleted=deleted))
    for name, fields in _controls():
        for kind in ("legacy", "versioned"):
            for pos in POSITIONS:
                out.append(dict(kind=kind, what=name, fields=fields, pos=pos, exc=None, match=None,
                                deleted=0 if fields.get("deleter") is False else 1))
    return out


# ---- the worker ---------------------------------------------------------------------------------

DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)(("PyCapsule_GetName", ctypes.pythonapi))
_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))

deleted = {}     # struct address -> deleter calls
_structs = {}    # struct address -> (struct, shape, strides, name): alive for the whole process


@DELETER
def _deleter(addr):
    deleted[addr] = deleted.get(addr, 0) + 1


@DESTRUCTOR
def _destructor(cap):
    """A producer's capsule destructor: free the tensor unless a consumer took it."""
    name = _get_name(cap)
    if name is None or name.startswith(b"used_"):
        return
    addr = _get_pointer(cap, name)
    m = _structs[addr][0]
    if m.deleter:
        DELETER(m.deleter)(addr)


def make(kind, buf_addr, fields):
    """A capsule over buf_addr with the default float32 (2, 4) tensor changed by fields; returns
    (capsule, struct address)."""
    ndim = fields.get("ndim", 2)
    shape = fields.get("shape", SHAPE)
    m = DLManagedTensorVersioned() if kind == "versioned" else DLManagedTensor()
    t = m.dl_tensor
    shp = (ctypes.c_int64 * len(shape))(*shape) if shape is not None else None
    t.shape = ctypes.cast(shp, ctypes.POINTER(ctypes.c_int64)) if shp is not None else None
    strides = fields.get("strides")
    strd = (ctypes.c_int64 * len(strides))(*strides) if strides else None
    t.strides = ctypes.cast(strd, ctypes.POINTER(ctypes.c_int64)) if strd is not None else None
    t.ndim = ndim
    t.dtype = DLDataType(fields.get("code", 2), fields.get("bits", 32), fields.get("lanes", 1))
    t.device = DLDevice(*fields.get("device", (1, 0)))
    data = fields.get("data", buf_addr + fields.get("data_off", 0))
    t.data = data or None
    off = fields.get("byte_offset", 0)
    t.byte_offset = (1 << 64) - data + 64 if off == "wrap" else off   # wraps to address 64
    if kind == "versioned":
        m.version.major, m.version.minor = fields.get("version", (1, 3))
        m.flags = fields.get("flags", 0)
    m.deleter = ctypes.cast(_deleter, ctypes.c_void_p) if fields.get("deleter", True) else None
    name = fields.get("name", b"dltensor_versioned" if kind == "versioned" else b"dltensor")
    addr = ctypes.addressof(m)
    _structs[addr] = (m, shp, strd, name)
    return _capsule_new(addr, name, ctypes.cast(_destructor, ctypes.c_void_p)), addr


class Producer:
    """Hands out one capsule through __dlpack__, as a framework would."""

    def __init__(self, cap, device=(1, 0)):
        self.cap = cap
        self.device = device

    def __dlpack__(self, stream=None, max_version=None, **kw):
        cap, self.cap = self.cap, None
        return cap

    def __dlpack_device__(self):
        return self.device


def run_case(c, np, ewkern):
    """Run one case; returns what happened, checked by the test."""
    mem = np.arange(100, 164, dtype=np.float32)        # the memory behind the capsule
    a = np.arange(1, 9, dtype=np.float32).reshape(SHAPE)
    b = np.full(SHAPE, 2.0, np.float32)
    good_mem = np.arange(10, 18, dtype=np.float32).reshape(SHAPE)
    out = np.full(SHAPE, -1.0, np.float32)
    before = (mem.copy(), a.copy(), b.copy(), good_mem.copy(), out.copy())
    cap, addr = make(c["kind"], mem.ctypes.data, c["fields"])
    good_cap, good_addr = make(c["kind"], good_mem.ctypes.data, {})
    dev = c["fields"].get("device", (1, 0))
    dev = dev if dev[0] in (1, 2, 3, 13) else (1, 0)
    res = exc = None
    pos = c["pos"]
    try:
        if pos == "from_dlpack":
            res = ewkern.from_dlpack(cap)
        elif pos == "a":
            res = ewkern.add(Producer(cap, dev), b)
        elif pos == "b":
            res = ewkern.add(Producer(good_cap), Producer(cap, dev))
        elif pos == "out":
            res = ewkern.add(a, b, out=Producer(cap, dev))
        else:
            res = ewkern.rmse(a, Producer(cap, dev))
    except Exception as e:  # noqa: BLE001 (the test checks the kind)
        exc = e
    got = ref = None
    err = (type(exc).__name__, str(exc)) if exc else (None, None)
    start = 0
    if err[0] is None:
        start = (c["fields"].get("byte_offset", 0) + c["fields"].get("data_off", 0)) // 4
        got = res.numpy() if isinstance(res, ewkern.Array) else mem[start:start + 8] if pos == "out" else res
        got = np.asarray(got, np.float64).ravel().tolist()
    del res, cap, good_cap, exc    # nothing here makes cycles: the capsules die now
    if err[0] is None:
        view = before[0][start:start + 8].astype(np.float64).reshape(SHAPE)
        ref = {"from_dlpack": view, "a": view + 2, "b": good_mem + view, "out": a + b,
               "rmse_b": np.sqrt(np.mean((a - view) ** 2, axis=1))}[pos].ravel().tolist()
    written_mem = mem.copy()
    if pos == "out" and err[0] is None:       # a valid out= is written; the rest of it must not be
        written_mem[start:start + 8] = before[0][start:start + 8]
    intact = (np.array_equal(written_mem, before[0]) and np.array_equal(a, before[1])
              and np.array_equal(b, before[2]) and np.array_equal(good_mem, before[3])
              and np.array_equal(out, before[4]))
    return dict(exc=err[0], msg=err[1],
                deleted=deleted.get(addr, 0),
                good_deleted=deleted.get(good_addr, 0) if pos == "b" else 1,
                got=got, ref=ref, intact=bool(intact))


def main(start, stop):
    import numpy as np

    import ewkern
    for i, c in enumerate(cases()[start:stop], start):
        r = run_case(c, np, ewkern)
        r["i"] = i
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
