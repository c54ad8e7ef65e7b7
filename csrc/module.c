/*
 * module.c: the ewkern._C module (multi-phase initialisation, module state), the Stream
 * type, array creation, device queries and the registry listings.
 */
#define PY_ARRAY_UNIQUE_SYMBOL ewkern_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include "ewkern.h"
#include "rtc.h"

#include <numpy/arrayobject.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cuda_api.h"

ew_state *ew_get_state(PyObject *module) { return (ew_state *)PyModule_GetState(module); }

ew_state *ew_state_from_type(PyTypeObject *tp)
{
    PyObject *m = PyType_GetModuleByDef(tp, &ew_moduledef);
    return m ? ew_get_state(m) : NULL;
}

/* ---- streams ---------------------------------------------------------------------------------- */

void *ew_current_stream(ew_state *st, int device, PyObject **stream_ref)
{
    if (stream_ref)
        *stream_ref = NULL;
    if (st->current_stream == Py_None)
        return NULL;
    StreamObject *s = (StreamObject *)st->current_stream;
    if (s->device != device)
        return NULL;
    if (stream_ref)
        *stream_ref = (PyObject *)s;
    return s->handle;
}

static PyObject *stream_new(PyTypeObject *tp, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"device", "handle", NULL};
    PyObject *devobj = Py_None, *handle = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OO:Stream", kwlist, &devobj, &handle))
        return NULL;
    ew_device dev;
    if (ew_device_from_py(devobj, &dev) < 0)
        return NULL;
    if (dev.type != EW_CUDA) {
        PyErr_SetString(PyExc_ValueError, "Stream: streams exist only on CUDA devices");
        return NULL;
    }
    if (ew_device_check(dev) < 0)
        return NULL;
    StreamObject *s = (StreamObject *)tp->tp_alloc(tp, 0);
    if (s == NULL)
        return NULL;
    s->device = dev.id;
    if (handle != Py_None) {
        s->handle = PyLong_AsVoidPtr(handle);
        if (PyErr_Occurred()) {
            Py_DECREF(s);
            return NULL;
        }
        s->owned = 0;
        return (PyObject *)s;
    }
#if EWKERN_WITH_CUDA
    /* a stream belongs to the device current when it is created */
    ew_device_guard g = EW_DEVICE_GUARD_INIT;
    if (ew_device_enter(&g, dev) < 0) {
        Py_DECREF(s);
        return NULL;
    }
    int err = ewcuda_stream_create(&s->handle);
    ew_device_exit(&g);
    if (err) {
        Py_DECREF(s);
        ew_raise_cuda(err, "creating a stream");
        return NULL;
    }
    s->owned = 1;
#endif
    return (PyObject *)s;
}

static void stream_dealloc(StreamObject *s)
{
    PyTypeObject *tp = Py_TYPE(s);
#if EWKERN_WITH_CUDA
    int prev;
    if (s->owned && s->handle && ewcuda_device_enter(s->device, &prev) == 0) {
        ewcuda_stream_destroy(s->handle);
        ewcuda_device_exit(prev);
    }
#endif
    tp->tp_free((PyObject *)s);
    Py_DECREF(tp);
}

static PyObject *stream_synchronize(StreamObject *s, PyObject *unused)
{
#if EWKERN_WITH_CUDA
    int err, prev;
    if ((err = ewcuda_device_enter(s->device, &prev)) == 0) {
        Py_BEGIN_ALLOW_THREADS
        err = ewcuda_stream_synchronize(s->handle);
        Py_END_ALLOW_THREADS
        ewcuda_device_exit(prev);
    }
    if (err) {
        ew_raise_cuda(err, "Stream.synchronize");
        return NULL;
    }
#endif
    Py_RETURN_NONE;
}

static PyObject *stream_handle(StreamObject *s, void *c) { return PyLong_FromVoidPtr(s->handle); }
static PyObject *stream_device(StreamObject *s, void *c)
{
    ew_device d = {EW_CUDA, s->device};
    return ew_device_str(d);
}
static PyObject *stream_cuda_stream(StreamObject *s, PyObject *unused)
{
    return Py_BuildValue("(iN)", 0, PyLong_FromVoidPtr(s->handle));
}
static PyObject *stream_repr(StreamObject *s)
{
    return PyUnicode_FromFormat("ewkern.Stream(device='cuda:%d', handle=0x%zx)", s->device, (size_t)s->handle);
}

static PyMethodDef stream_methods[] = {
    {"synchronize", (PyCFunction)stream_synchronize, METH_NOARGS, "Wait for the work queued on this stream."},
    {"__cuda_stream__", (PyCFunction)stream_cuda_stream, METH_NOARGS, "(0, handle): the CUDA stream protocol."},
    {NULL}
};
static PyGetSetDef stream_getset[] = {
    {"handle", (getter)stream_handle, NULL, "The cudaStream_t as an int.", NULL},
    {"device", (getter)stream_device, NULL, "'cuda:N'.", NULL},
    {NULL}
};
static PyType_Slot stream_slots[] = {
    {Py_tp_new, stream_new},
    {Py_tp_dealloc, stream_dealloc},
    {Py_tp_methods, stream_methods},
    {Py_tp_getset, stream_getset},
    {Py_tp_repr, stream_repr},
    {Py_tp_doc, "Stream(device=None, handle=None)\n\nA CUDA stream: a new non-blocking one, or a wrapper "
                "of an existing handle (for example torch.cuda.current_stream().cuda_stream)."},
    {0, NULL}
};
PyType_Spec ew_stream_spec = {
    .name = "ewkern.Stream",
    .basicsize = sizeof(StreamObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = stream_slots,
};

static PyObject *set_stream(PyObject *module, PyObject *s)
{
    ew_state *st = ew_get_state(module);
    if (s != Py_None && !Py_IS_TYPE(s, st->Stream_Type)) {
        PyErr_Format(PyExc_TypeError, "expected an ewkern.Stream or None, got %.200s", Py_TYPE(s)->tp_name);
        return NULL;
    }
    PyObject *prev = st->current_stream;
    Py_INCREF(s);
    st->current_stream = s;
    return prev;   /* the reference the state held */
}

static PyObject *get_stream(PyObject *module, PyObject *unused)
{
    ew_state *st = ew_get_state(module);
    Py_INCREF(st->current_stream);
    return st->current_stream;
}

/* set_pdl(on) -> previous: the programmatic-dependent-launch switch of the default CUDA kernels */
static PyObject *m_set_pdl(PyObject *module, PyObject *arg)
{
    const int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
#if EWKERN_WITH_CUDA
    return PyBool_FromLong(ewcuda_pdl_set(on));
#else
    (void)on;
    Py_RETURN_FALSE;
#endif
}

static PyObject *m_get_pdl(PyObject *module, PyObject *unused)
{
#if EWKERN_WITH_CUDA
    return PyBool_FromLong(ewcuda_pdl_get());
#else
    Py_RETURN_FALSE;
#endif
}

/* ---- creation ------------------------------------------------------------------------------------ */

static int parse_shape(PyObject *obj, int *ndim, int64_t *shape)
{
    PyObject *seq = PyLong_Check(obj) ? PyTuple_Pack(1, obj)
                                      : PySequence_Tuple(obj);
    if (seq == NULL) {
        PyErr_Format(PyExc_TypeError, "shape must be an int or a sequence of ints, got %.200s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    if (n > EW_MAXDIM) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "too many dimensions: %zd (ewkern supports up to %d)", n, EW_MAXDIM);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyTuple_GET_ITEM(seq, i);
        long long v = PyLong_Check(x) ? PyLong_AsLongLong(x) : -2;
        if (v == -2 && !PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "shape entries must be ints, got %.200s", Py_TYPE(x)->tp_name);
        else if (v < 0 && !PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "negative dimension %lld in shape", v);
        if (PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        shape[i] = v;
    }
    *ndim = (int)n;
    Py_DECREF(seq);
    return 0;
}

static PyObject *create(PyObject *module, PyObject *args, PyObject *kwds, int mode)
{
    static char *kw_empty[] = {"shape", "dtype", "device", NULL};
    static char *kw_full[] = {"shape", "fill_value", "dtype", "device", NULL};
    PyObject *shape_obj, *dtype_obj = Py_None, *dev_obj = Py_None, *value = NULL;
    ew_state *st = ew_get_state(module);
    int ok = mode == 2 ? PyArg_ParseTupleAndKeywords(args, kwds, "OO|OO:full", kw_full, &shape_obj, &value,
                                                     &dtype_obj, &dev_obj)
                       : PyArg_ParseTupleAndKeywords(args, kwds, mode ? "O|OO:zeros" : "O|OO:empty", kw_empty,
                                                     &shape_obj, &dtype_obj, &dev_obj);
    if (!ok)
        return NULL;
    int ndim;
    int64_t shape[EW_MAXDIM];
    ew_dtype dt;
    ew_device dev;
    ew_device_guard g = EW_DEVICE_GUARD_INIT;
    if (parse_shape(shape_obj, &ndim, shape) < 0 || ew_dtype_from_py(st, dtype_obj, &dt) < 0 ||
        ew_device_from_py(dev_obj, &dev) < 0 || ew_device_enter(&g, dev) < 0)
        return NULL;
    PyObject *ref = NULL;
    void *stream = dev.type == EW_CUDA ? ew_current_stream(st, dev.id, &ref) : NULL;
    PyObject *arr = ew_array_new(st, dev, dt, ndim, shape, stream, ref);
    if (arr == NULL || mode == 0)
        goto done;
    ArrayObject *a = (ArrayObject *)arr;
    size_t nbytes = (size_t)a->size * ew_dtype_size(dt);
    if (mode == 1) {
        if (dev.type == EW_CPU && a->size > EW_GIL_FREE_WORK) {
            Py_BEGIN_ALLOW_THREADS
            memset(a->data, 0, nbytes);
            Py_END_ALLOW_THREADS
        } else if (dev.type == EW_CPU)
            memset(a->data, 0, nbytes);
#if EWKERN_WITH_CUDA
        else {
            int err = ewcuda_memset_async(a->data, 0, nbytes, stream);
            if (err) {
                Py_CLEAR(arr);
                ew_raise_cuda(err, "zeros");
            }
        }
#endif
        goto done;
    }
    PyObject *fill = PyObject_GetAttrString(module, "fill");
    PyObject *res = fill ? PyObject_CallFunctionObjArgs(fill, arr, value, NULL) : NULL;
    Py_XDECREF(fill);
    Py_SETREF(arr, res);
done:
    ew_device_exit(&g);
    return arr;
}

static PyObject *m_empty(PyObject *m, PyObject *a, PyObject *k) { return create(m, a, k, 0); }
static PyObject *m_zeros(PyObject *m, PyObject *a, PyObject *k) { return create(m, a, k, 1); }
static PyObject *m_full(PyObject *m, PyObject *a, PyObject *k) { return create(m, a, k, 2); }

static PyObject *m_from_dlpack(PyObject *module, PyObject *obj) { return ew_from_dlpack(ew_get_state(module), obj); }

/* asarray(obj, dtype=None, device=None): zero-copy when dtype and device already match. */
static PyObject *m_asarray(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"obj", "dtype", "device", NULL};
    PyObject *obj, *dtype_obj = Py_None, *dev_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|OO:asarray", kwlist, &obj, &dtype_obj, &dev_obj))
        return NULL;
    ew_state *st = ew_get_state(module);
    ew_dtype want_dt = EW_FLOAT32;
    ew_device want_dev = {EW_CPU, 0};
    if (dtype_obj != Py_None && ew_dtype_from_py(st, dtype_obj, &want_dt) < 0)
        return NULL;
    if (dev_obj != Py_None && ew_device_from_py(dev_obj, &want_dev) < 0)
        return NULL;
    PyObject *src = obj;
    Py_INCREF(src);
    int is_array_like = Py_IS_TYPE(obj, st->Array_Type) || PyArray_Check(obj) ||
                        PyObject_HasAttr(obj, st->str_dlpack);
    if (!is_array_like) {
        /* Python sequences and scalars: through NumPy; ints and bools become float64 */
        PyObject *np = PyArray_FromAny(obj, NULL, 0, 0, NPY_ARRAY_DEFAULT, NULL);
        Py_DECREF(src);
        if (np == NULL)
            return NULL;
        if (dtype_obj == Py_None && !PyArray_ISFLOAT((PyArrayObject *)np)) {
            PyObject *f = PyArray_Cast((PyArrayObject *)np, NPY_FLOAT64);
            Py_SETREF(np, f);
            if (np == NULL)
                return NULL;
        }
        src = np;
    }
    ew_view v;
    memset(&v, 0, sizeof v);
    PyObject *res = NULL;
    ew_device_guard g = EW_DEVICE_GUARD_INIT;
    if (ew_view_from_object(st, src, &v, "asarray", NULL, 0) < 0)
        goto done;
    ew_dtype dt = dtype_obj == Py_None ? v.dtype : want_dt;
    ew_device dev = dev_obj == Py_None ? v.device : want_dev;
    if (dt == v.dtype && dev.type == v.device.type && dev.id == v.device.id) {
        if (Py_IS_TYPE(src, st->Array_Type)) {
            res = src;
            Py_INCREF(res);
        } else {
            res = ew_array_from_view(st, &v, v.kind == EW_KIND_DLPACK ? NULL : src);
        }
        goto done;
    }
    if (ew_device_enter(&g, dev) < 0)
        goto done;
    if (dt != v.dtype) {
        /* dtype conversion happens on the host through NumPy */
        PyObject *host = NULL;
        if (v.device.type == EW_CPU && v.kind != EW_KIND_API && v.kind != EW_KIND_DLPACK)
            host = PyArray_CheckExact(src) ? (Py_INCREF(src), src) : PyObject_CallMethod(src, "numpy", NULL);
        else {
            PyObject *tmp = ew_array_from_view(st, &v, v.kind == EW_KIND_DLPACK ? NULL : src);
            host = tmp ? PyObject_CallMethod(tmp, "numpy", NULL) : NULL;
            Py_XDECREF(tmp);
        }
        PyObject *descr = host ? ew_numpy_descr(st, dt) : NULL;
        PyObject *conv = descr ? PyObject_CallMethod(host, "astype", "O", descr) : NULL;
        Py_XDECREF(descr);
        Py_XDECREF(host);
        if (conv == NULL)
            goto done;
        PyObject *devstr = ew_device_str(dev);
        res = devstr ? PyObject_CallMethod(module, "asarray", "ONO", conv, Py_None, devstr) : NULL;
        Py_DECREF(conv);
        goto done;
    }
    /* same dtype, another device: one copy */
    {
        PyObject *ref = NULL;
        void *stream = dev.type == EW_CUDA ? ew_current_stream(st, dev.id, &ref) : NULL;
        if (dev.type == EW_CPU && v.device.type == EW_CUDA)
            stream = ew_current_stream(st, v.device.id, &ref);
        res = ew_array_new(st, dev, dt, v.ndim, v.shape, stream, ref);
        if (res == NULL)
            goto done;
        size_t nbytes = (size_t)v.size * ew_dtype_size(dt);
#if EWKERN_WITH_CUDA
        const int kind = dev.type == EW_CPU ? EWCUDA_D2H : v.device.type == EW_CPU ? EWCUDA_H2D : EWCUDA_D2D;
        const int peer = kind == EWCUDA_D2D && v.device.id != dev.id;
        int err = 0;
        void *dst = ((ArrayObject *)res)->data;
        void *host = NULL;
        if (peer) {
            /* between devices: through host memory, from the source's current stream on its device
             * (which orders the copy after the work that may still be writing the source), then
             * to the destination's. A direct copy needs peer access to the source's stream-ordered
             * pool, which ewkern does not grant. */
            void *src_stream = ew_current_stream(st, v.device.id, NULL);
            host = nbytes ? PyMem_RawMalloc(nbytes) : NULL;
            if (nbytes && host == NULL) {
                Py_CLEAR(res);
                PyErr_NoMemory();
                goto done;
            }
            if (ew_device_enter(&g, v.device) < 0) {
                PyMem_RawFree(host);
                Py_CLEAR(res);
                goto done;
            }
            Py_BEGIN_ALLOW_THREADS
            err = ewcuda_memcpy_sync(host, v.data, nbytes, EWCUDA_D2H, src_stream);
            Py_END_ALLOW_THREADS
        }
        /* the copy runs on the stream chosen above, from its device: the source's for a copy to
         * the host, else the destination's */
        if (ew_device_enter(&g, kind == EWCUDA_D2H ? v.device : dev) < 0) {
            PyMem_RawFree(host);
            Py_CLEAR(res);
            goto done;
        }
        if (!err) {
            Py_BEGIN_ALLOW_THREADS
            err = ewcuda_memcpy_sync(dst, peer ? host : v.data, nbytes, peer ? EWCUDA_H2D : kind, stream);
            Py_END_ALLOW_THREADS
        }
        PyMem_RawFree(host);
        if (err) {
            Py_CLEAR(res);
            ew_raise_cuda(err, "asarray copy");
        }
#else
        (void)nbytes;
        Py_CLEAR(res);
        if (ew_device_check(dev) == 0)   /* one of the two is CUDA: say so */
            ew_device_check(v.device);
#endif
    }
done:
    ew_device_exit(&g);
    ew_view_release(&v);
    Py_DECREF(src);
    return res;
}

/* ---- queries ---------------------------------------------------------------------------------------- */

static PyObject *m_cuda_available(PyObject *m, PyObject *u) { return PyBool_FromLong(ew_cuda_device_count() > 0); }
static PyObject *m_device_count(PyObject *m, PyObject *u) { return PyLong_FromLong(ew_cuda_device_count()); }

/* The calling thread's current CUDA device (cudaGetDevice), which every ewkern call leaves as it
 * found it; None without CUDA. For the tests, and for callers without torch or CuPy to ask. */
static PyObject *m_current_device(PyObject *m, PyObject *u)
{
#if EWKERN_WITH_CUDA
    int dev;
    if (ew_cuda_device_count() > 0 && ewcuda_get_device(&dev) == 0)
        return PyLong_FromLong(dev);
#endif
    Py_RETURN_NONE;
}

static PyObject *m_synchronize(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    ew_device dev;
    if (ew_device_from_py(nargs ? args[0] : Py_None, &dev) < 0)
        return NULL;
    if (dev.type == EW_CPU)
        Py_RETURN_NONE;
    ew_device_guard g = EW_DEVICE_GUARD_INIT;
    if (ew_device_enter(&g, dev) < 0)
        return NULL;
#if EWKERN_WITH_CUDA
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = ewcuda_device_synchronize();
    Py_END_ALLOW_THREADS
    ew_device_exit(&g);
    if (err) {
        ew_raise_cuda(err, "synchronize");
        return NULL;
    }
#endif
    Py_RETURN_NONE;
}

#if EWKERN_WITH_CUDA
/* Memory type and transfers per memory-clock cycle, from the device's name (the
 * elementwise study's table: GDDR6X 16, GDDR6/GDDR5X 8, DDR and HBM 2). */
static void memory_type(const char *name, int bus_bits, const char **type, int *tpc)
{
    static const struct { const char *pat; const char *type; int tpc; } known[] = {
        {"H200", "HBM3e", 2}, {"H100 PCIe", "HBM2e", 2}, {"H100", "HBM3", 2}, {"H800", "HBM3", 2},
        {"GH200", "HBM3", 2}, {"B200", "HBM3e", 2}, {"A100", "HBM2e", 2}, {"A800", "HBM2e", 2},
        {"V100", "HBM2", 2}, {"MI300", "HBM3", 2}, {"L40", "GDDR6", 8}, {"L4", "GDDR6", 8},
        {"A10", "GDDR6", 8}, {"A40", "GDDR6", 8}, {"T4", "GDDR6", 8}, {"RTX 4090", "GDDR6X", 16},
        {"RTX 4080", "GDDR6X", 16}, {"RTX 3090", "GDDR6X", 16}, {"RTX 3080", "GDDR6X", 16},
        {"RTX 4070", "GDDR6X", 16}, {"RTX 4060", "GDDR6", 8}, {"RTX A6000", "GDDR6", 8},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strstr(name, known[i].pat)) {
            *type = known[i].type;
            *tpc = known[i].tpc;
            return;
        }
    /* HBM stacks are 1024 bits wide each; GDDR buses are at most 512 bits */
    *type = bus_bits >= 2048 ? "HBM" : NULL;
    *tpc = bus_bits >= 2048 ? 2 : 0;
}

#endif

static PyObject *cpu_info(void)
{
    char name[256] = "cpu";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f))
            if (strncmp(line, "model name", 10) == 0) {
                char *c = strchr(line, ':');
                if (c) {
                    snprintf(name, sizeof name, "%s", c + 2);
                    name[strcspn(name, "\n")] = 0;
                }
                break;
            }
        fclose(f);
    }
    return Py_BuildValue("{s:s,s:s,s:l,s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:O}", "name", name, "device", "cpu",
                         "cores", sysconf(_SC_NPROCESSORS_ONLN), "compute_capability", Py_None, "sm_count", Py_None,
                         "l2_bytes", Py_None, "max_threads_per_sm", Py_None, "memory_bus_width_bits", Py_None,
                         "memory_clock_khz", Py_None, "memory_type", Py_None, "transfers_per_cycle", Py_None,
                         "peak_bandwidth_gbs", Py_None, "total_memory_bytes", Py_None);
}

static PyObject *m_device_info(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"device", NULL};
    PyObject *dev_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:device_info", kwlist, &dev_obj))
        return NULL;
    ew_device dev;
    if (ew_device_from_py(dev_obj, &dev) < 0)
        return NULL;
    if (dev.type == EW_CPU)
        return cpu_info();
    if (ew_device_check(dev) < 0)   /* the queries name the device: no switch */
        return NULL;
#if EWKERN_WITH_CUDA
    ew_device_info di;
    int err = ewcuda_device_info(dev.id, &di);
    if (err) {
        ew_raise_cuda(err, "device_info");
        return NULL;
    }
    const char *mtype;
    int tpc;
    memory_type(di.name, di.memory_bus_width_bits, &mtype, &tpc);
    double peak = tpc ? di.memory_bus_width_bits / 8.0 * tpc * di.memory_clock_khz * 1e-6 : 0;
    PyObject *peak_obj = tpc ? PyFloat_FromDouble(peak) : (Py_INCREF(Py_None), Py_None);
    PyObject *mtype_obj = mtype ? PyUnicode_FromString(mtype) : (Py_INCREF(Py_None), Py_None);
    PyObject *tpc_obj = tpc ? PyLong_FromLong(tpc) : (Py_INCREF(Py_None), Py_None);
    return Py_BuildValue("{s:s,s:N,s:(ii),s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:N,s:N,s:N,s:n,s:i,s:i,s:i}",
                         "name", di.name, "device", ew_device_str(dev), "compute_capability", di.major, di.minor,
                         "sm_count", di.sm_count, "l2_bytes", di.l2_bytes, "max_threads_per_sm",
                         di.max_threads_per_sm, "max_threads_per_block", di.max_threads_per_block,
                         "memory_bus_width_bits", di.memory_bus_width_bits, "memory_clock_khz",
                         di.memory_clock_khz, "clock_khz", di.clock_khz, "memory_type", mtype_obj,
                         "transfers_per_cycle", tpc_obj, "peak_bandwidth_gbs", peak_obj, "total_memory_bytes",
                         (Py_ssize_t)di.total_memory_bytes, "driver_version", di.driver_version,
                         "runtime_version", di.runtime_version, "pci_bus_id", di.pci_bus_id);
#else
    return NULL;
#endif
}

static int device_type_arg(PyObject *obj, int *type)
{
    ew_device d;
    if (obj == NULL || obj == Py_None) {
        *type = EW_CUDA;
        return 0;
    }
    if (ew_device_from_py(obj, &d) < 0)
        return -1;
    *type = d.type;
    return 0;
}

static PyObject *m_variants(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"op", "dtype", "device", NULL};
    const char *op;
    PyObject *dtype_obj = Py_None, *dev_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "s|OO:variants", kwlist, &op, &dtype_obj, &dev_obj))
        return NULL;
    int type;
    ew_dtype dt = EW_FLOAT32;
    if (device_type_arg(dev_obj, &type) < 0 ||
        (dtype_obj != Py_None && ew_dtype_from_py(ew_get_state(module), dtype_obj, &dt) < 0))
        return NULL;
    if (ew_op_index(op) == -2) {
        PyObject *names = PyList_New(0);
        for (int i = 0; names && i < ew_nops; i++) {
            PyObject *s = PyUnicode_FromString(ew_ops[i].name);
            if (s == NULL || PyList_Append(names, s) < 0)
                Py_CLEAR(names);
            Py_XDECREF(s);
        }
        if (names) {
            PyErr_Format(PyExc_ValueError, "variants(): unknown op '%s'; valid ops: %R and 'rmse'", op, names);
            Py_DECREF(names);
        }
        return NULL;
    }
    return ew_variant_list(op, dtype_obj == Py_None ? -1 : (int)dt, type);
}

static PyObject *m_kernel_info(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"op", "variant", "dtype", "device", NULL};
    const char *op, *variant = "auto";
    PyObject *dtype_obj = Py_None, *dev_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "s|sOO:kernel_info", kwlist, &op, &variant, &dtype_obj, &dev_obj))
        return NULL;
    int type;
    ew_dtype dt;
    if (device_type_arg(dev_obj, &type) < 0 || ew_dtype_from_py(ew_get_state(module), dtype_obj, &dt) < 0)
        return NULL;
    const ew_kernel *k = ew_find_kernel(op, variant, dt, type);
    if (k == NULL)
        return NULL;
    PyObject *d = Py_BuildValue("{s:s,s:s,s:s,s:s,s:s,s:O,s:O}", "op", k->op, "variant", k->variant, "dtype",
                                ew_dtype_name(k->dtype), "about", k->about ? k->about : "", "device",
                                type == EW_CPU ? "cpu" : "cuda", "takes_block",
                                (k->flags & EW_USES_BLOCK) ? Py_True : Py_False, "takes_grid",
                                (k->flags & EW_USES_GRID) ? Py_True : Py_False);
    if (d == NULL || type == EW_CPU || k->kernel == NULL)
        return d;
#if EWKERN_WITH_CUDA
    ew_device dev = {EW_CUDA, 0};
    ew_device_guard g = EW_DEVICE_GUARD_INIT;
    if (ew_device_enter(&g, dev) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    ew_func_attrs fa;
    int err = ewcuda_func_attrs(k->kernel, &fa);
    ew_device_exit(&g);
    if (err) {
        Py_DECREF(d);
        ew_raise_cuda(err, "kernel_info");
        return NULL;
    }
    PyObject *more = Py_BuildValue("{s:i,s:n,s:n,s:n,s:i,s:i,s:i}", "num_regs", fa.num_regs, "local_size_bytes",
                                   (Py_ssize_t)fa.local_size_bytes, "shared_size_bytes",
                                   (Py_ssize_t)fa.shared_size_bytes, "const_size_bytes",
                                   (Py_ssize_t)fa.const_size_bytes, "max_threads_per_block",
                                   fa.max_threads_per_block, "ptx_version", fa.ptx_version, "binary_version",
                                   fa.binary_version);
    if (more == NULL || PyDict_Update(d, more) < 0)
        Py_CLEAR(d);
    Py_XDECREF(more);
#endif
    return d;
}

static PyObject *m_ops(PyObject *module, PyObject *unused)
{
    PyObject *list = PyList_New(0);
    for (int i = 0; list && i <= ew_nops; i++) {
        PyObject *d = i < ew_nops
            ? Py_BuildValue("{s:s,s:i,s:i,s:s,s:s,s:s}", "name", ew_ops[i].name, "inputs", ew_ops[i].inputs,
                            "scalars", ew_ops[i].scalars, "definition", ew_ops[i].definition, "accuracy",
                            ew_ops[i].accuracy, "family", "elementwise")
            : Py_BuildValue("{s:s,s:i,s:i,s:s,s:s}", "name", "rmse", "inputs", 2, "scalars", 0, "definition",
                            "out[batch] = sqrt(mean((a - b)^2))", "family", "reduction");
        if (d == NULL || PyList_Append(list, d) < 0)
            Py_CLEAR(list);
        Py_XDECREF(d);
    }
    return list;
}

static PyObject *m_build_info(PyObject *module, PyObject *unused)
{
#ifndef EWKERN_CUDA_ARCHS
#define EWKERN_CUDA_ARCHS ""
#endif
    return Py_BuildValue("{s:O,s:s,s:(ii)}", "cuda", EWKERN_WITH_CUDA ? Py_True : Py_False, "cuda_archs",
                         EWKERN_CUDA_ARCHS, "dlpack_version", DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION);
}

static PyMethodDef module_methods[] = {
    {"empty", (PyCFunction)(void (*)(void))m_empty, METH_VARARGS | METH_KEYWORDS,
     "empty(shape, dtype='float32', device=None)\n--\n\nA new uninitialised Array. device None means "
     "'cuda:0' when a GPU is present, else 'cpu'."},
    {"zeros", (PyCFunction)(void (*)(void))m_zeros, METH_VARARGS | METH_KEYWORDS,
     "zeros(shape, dtype='float32', device=None)\n--\n\nA new Array of zeros."},
    {"full", (PyCFunction)(void (*)(void))m_full, METH_VARARGS | METH_KEYWORDS,
     "full(shape, fill_value, dtype='float32', device=None)\n--\n\nA new Array filled with fill_value."},
    {"asarray", (PyCFunction)(void (*)(void))m_asarray, METH_VARARGS | METH_KEYWORDS,
     "asarray(obj, dtype=None, device=None)\n--\n\nAn Array from a NumPy array, a Python sequence or any "
     "DLPack producer: zero-copy when dtype and device already match, else a copy (dtype conversion goes "
     "through NumPy on the host). Integer and bool data become float64 unless dtype is given."},
    {"from_dlpack", (PyCFunction)m_from_dlpack, METH_O,
     "from_dlpack(obj)\n--\n\nA zero-copy Array viewing any DLPack producer (or a DLPack capsule)."},
    {"cuda_available", (PyCFunction)m_cuda_available, METH_NOARGS,
     "cuda_available()\n--\n\nTrue when ewkern was built with CUDA and a CUDA device is present."},
    {"device_count", (PyCFunction)m_device_count, METH_NOARGS, "device_count()\n--\n\nNumber of CUDA devices."},
    {"synchronize", (PyCFunction)(void (*)(void))m_synchronize, METH_FASTCALL,
     "synchronize(device=None)\n--\n\nWait for all work on a CUDA device."},
    {"device_info", (PyCFunction)(void (*)(void))m_device_info, METH_VARARGS | METH_KEYWORDS,
     "device_info(device=None)\n--\n\nA dict describing the device, with the theoretical peak memory "
     "bandwidth by the formula bus width (bytes) x transfers per cycle x memory clock."},
    {"variants", (PyCFunction)(void (*)(void))m_variants, METH_VARARGS | METH_KEYWORDS,
     "variants(op, dtype=None, device='cuda')\n--\n\nNames of the kernel variants of op."},
    {"kernel_info", (PyCFunction)(void (*)(void))m_kernel_info, METH_VARARGS | METH_KEYWORDS,
     "kernel_info(op, variant='auto', dtype='float32', device='cuda')\n--\n\nThe compiled kernel's "
     "attributes from the CUDA runtime (registers per thread, local bytes, ...)."},
    {"ops", (PyCFunction)m_ops, METH_NOARGS, "ops()\n--\n\nThe op table: name, inputs, scalars, definition."},
    {"build_info", (PyCFunction)m_build_info, METH_NOARGS, "build_info()\n--\n\nHow this extension was built."},
    {"_set_stream", (PyCFunction)set_stream, METH_O, "Set the current Stream (or None); returns the previous."},
    {"_get_stream", (PyCFunction)get_stream, METH_NOARGS, "The current Stream or None."},
    {"_current_device", (PyCFunction)m_current_device, METH_NOARGS,
     "_current_device()\n--\n\nThe CUDA runtime's current device of this thread (cudaGetDevice), or None "
     "without CUDA. ewkern calls switch devices for their own work and put this one back before they return."},
    {"set_pdl", (PyCFunction)m_set_pdl, METH_O,
     "set_pdl(enabled)\n--\n\nTurn programmatic dependent launch of the default CUDA kernels on or off; returns "
     "the previous setting.\nWith it on (the default unless the environment has EWKERN_PDL=0), on compute "
     "capability 9.0+ each\nauto kernel may be scheduled while the previous kernel in its stream finishes; "
     "it waits for that\nkernel's results before touching memory. Builds without CUDA always report False."},
    {"pdl_enabled", (PyCFunction)m_get_pdl, METH_NOARGS,
     "pdl_enabled()\n--\n\nWhether programmatic dependent launch is switched on (see set_pdl)."},
    {"prepare", (PyCFunction)(void (*)(void))ew_prepare, METH_FASTCALL | METH_KEYWORDS,
     "prepare(fn, *args, **kwargs)\n--\n\nResolve one call of an ewkern op into a Plan for time_plans."},
    {"time_plans", (PyCFunction)(void (*)(void))ew_time_plans, METH_FASTCALL | METH_KEYWORDS,
     "time_plans(plans, *, launches=1, samples=10, warmup=2, flush=None, blocking=True, graph=None)\n--\n\n"
     "Seconds per launch for each sample of back-to-back launches of the plans (cycled), timed with CUDA\n"
     "events (a host clock on the CPU). graph (default: launches > 1) replays the sample's launches as\n"
     "one CUDA graph; flush= reads a buffer larger than the L2 before each sample."},
    EW_RTC_METHODS
    {NULL}
};

/* ---- module lifecycle ------------------------------------------------------------------------------- */

static int module_exec(PyObject *m)
{
    ew_state *st = ew_get_state(m);
    if (_import_array() < 0)
        return -1;
    if (ew_registry_init() < 0)
        return -1;
    st->current_stream = Py_None;
    Py_INCREF(Py_None);
    if ((st->api_cache = PyDict_New()) == NULL)
        return -1;
    if ((st->str_dlpack = PyUnicode_InternFromString("__dlpack__")) == NULL ||
        (st->str_dlpack_device = PyUnicode_InternFromString("__dlpack_device__")) == NULL ||
        (st->str_api = PyUnicode_InternFromString("__dlpack_c_exchange_api__")) == NULL ||
        (st->str_requires_grad = PyUnicode_InternFromString("requires_grad")) == NULL ||
        (st->dlpack_kwnames = Py_BuildValue("(ss)", "stream", "max_version")) == NULL)
        return -1;
    st->Array_Type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &ew_array_spec, NULL);
    st->Stream_Type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &ew_stream_spec, NULL);
    st->Plan_Type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &ew_plan_spec, NULL);
    if (!st->Array_Type || !st->Stream_Type || !st->Plan_Type)
        return -1;
    if (PyModule_AddType(m, st->Array_Type) < 0 || PyModule_AddType(m, st->Stream_Type) < 0 ||
        PyModule_AddType(m, st->Plan_Type) < 0)
        return -1;
    PyObject *fns = ew_make_op_functions(m);
    if (fns == NULL)
        return -1;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(fns, &pos, &key, &value))
        if (PyModule_AddObjectRef(m, PyUnicode_AsUTF8(key), value) < 0) {
            Py_DECREF(fns);
            return -1;
        }
    Py_DECREF(fns);
    return 0;
}

static int module_traverse(PyObject *m, visitproc visit, void *arg)
{
    ew_state *st = ew_get_state(m);
    if (st == NULL)
        return 0;
    Py_VISIT(st->Array_Type);
    Py_VISIT(st->Stream_Type);
    Py_VISIT(st->Plan_Type);
    Py_VISIT(st->api_cache);
    Py_VISIT(st->bf16_descr);
    Py_VISIT(st->current_stream);
    Py_VISIT(st->str_dlpack);
    Py_VISIT(st->str_dlpack_device);
    Py_VISIT(st->str_api);
    Py_VISIT(st->str_requires_grad);
    Py_VISIT(st->dlpack_kwnames);
    return 0;
}

static int module_clear(PyObject *m)
{
    ew_state *st = ew_get_state(m);
    if (st == NULL)
        return 0;
    Py_CLEAR(st->Array_Type);
    Py_CLEAR(st->Stream_Type);
    Py_CLEAR(st->Plan_Type);
    Py_CLEAR(st->api_cache);
    Py_CLEAR(st->bf16_descr);
    Py_CLEAR(st->current_stream);
    Py_CLEAR(st->str_dlpack);
    Py_CLEAR(st->str_dlpack_device);
    Py_CLEAR(st->str_api);
    Py_CLEAR(st->str_requires_grad);
    Py_CLEAR(st->dlpack_kwnames);
    return 0;
}

static void module_free(void *m) { module_clear((PyObject *)m); }

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL}
};

PyModuleDef ew_moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "ewkern._C",
    .m_doc = "ewkern's C extension: arrays, DLPack exchange, the kernel registry and the timing core.",
    .m_size = sizeof(ew_state),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__C(void) { return PyModuleDef_Init(&ew_moduledef); }
