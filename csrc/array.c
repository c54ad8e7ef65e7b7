/*
 * array.c: floor 2 (see state.h). ewkern.Array, an n-dimensional C-contiguous buffer on cpu or
 * cuda:N: new arrays of fresh memory (empty/zeros/full), the conversions to NumPy, and its
 * DLPack export (Array.__dlpack__: versioned and legacy capsules, the stream handshake). An
 * Array may own an imported producer's managed tensor, so the release of producer memory
 * (ew_release_managed) lives here too. Calls state, dtype, device and the CUDA runtime surface.
 * Managed tensors we export are one allocation (struct + shape + strides); their deleter
 * takes the GIL and does nothing after interpreter shutdown. A capsule's destructor does
 * nothing once a consumer renamed it "used_...".
 */
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL ewkern_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include "array.h"

#include <numpy/arrayobject.h>
#include <structmember.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_api.h"

/* ---- producer memory an Array may own ------------------------------------------------------- */

static int is_finalizing(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

void ew_error_save(ew_saved_error *e)
{
#if PY_VERSION_HEX >= 0x030C0000
    e->exc = PyErr_GetRaisedException();
#else
    PyErr_Fetch(&e->type, &e->value, &e->tb);
#endif
}

void ew_error_restore(ew_saved_error *e)
{
    if (PyErr_Occurred())   /* producer code that raised: report it, keep the caller's error */
        PyErr_WriteUnraisable(NULL);
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(e->exc);
#else
    PyErr_Restore(e->type, e->value, e->tb);
#endif
}

void ew_release_managed(DLManagedTensor *mt, DLManagedTensorVersioned *mtv)
{
    if ((mt == NULL || mt->deleter == NULL) && (mtv == NULL || mtv->deleter == NULL))
        return;
    ew_saved_error e;
    ew_error_save(&e);
    if (mt && mt->deleter)
        mt->deleter(mt);
    if (mtv && mtv->deleter)
        mtv->deleter(mtv);
    ew_error_restore(&e);
}

/* ---- the Array type ---------------------------------------------------------------------- */
int ew_array_check(ew_state *st, PyObject *obj) { return Py_IS_TYPE(obj, st->Array_Type); }

ArrayObject *ew_array_alloc(ew_state *st)
{
    ArrayObject *a = PyObject_New(ArrayObject, st->Array_Type);
    if (a == NULL)
        return NULL;
    a->data = NULL;
    a->ndim = 0;
    a->size = 1;
    a->dtype = EW_FLOAT32;
    a->device.type = EW_CPU;
    a->device.id = 0;
    a->readonly = 0;
    a->alloc = NULL;
    a->alloc_stream = NULL;
    a->stream_ref = NULL;
    a->mt = NULL;
    a->mtv = NULL;
    a->base = NULL;
    a->weakreflist = NULL;
    return a;
}

int ew_array_set_shape(ArrayObject *a, int ndim, const int64_t *shape)
{
    if (ndim > EW_MAXDIM) {
        PyErr_Format(PyExc_ValueError, "too many dimensions: %d (ewkern supports up to %d)", ndim,
                     EW_MAXDIM);
        return -1;
    }
    if (ew_shape_size("shape", ndim, shape, a->dtype, &a->size) < 0)
        return -1;
    a->ndim = ndim;
    memcpy(a->shape, shape, sizeof(int64_t) * ndim);
    return 0;
}

PyObject *ew_array_new(ew_state *st, ew_device dev, ew_dtype dt, int ndim, const int64_t *shape,
                       void *stream, PyObject *stream_ref)
{
    ArrayObject *a = ew_array_alloc(st);
    if (a == NULL)
        return NULL;
    a->dtype = dt;
    a->device = dev;
    if (ew_array_set_shape(a, ndim, shape) < 0) {
        Py_DECREF(a);
        return NULL;
    }
    size_t nbytes = (size_t)a->size * (size_t)ew_dtype_size(dt);
    if (dev.type == EW_CPU) {
        size_t rounded = (nbytes + 63) & ~(size_t)63;
        a->alloc = aligned_alloc(64, rounded ? rounded : 64);
        if (a->alloc == NULL) {
            Py_DECREF(a);
            return PyErr_Format(PyExc_MemoryError, "cannot allocate %zu bytes of host memory", nbytes);
        }
    } else {
#if EWKERN_WITH_CUDA
        ew_device_guard g = EW_DEVICE_GUARD_INIT;
        if (ew_device_enter(&g, dev) < 0) {
            Py_DECREF(a);
            return NULL;
        }
        int err = ewcuda_malloc_async(&a->alloc, nbytes, stream);
        ew_device_exit(&g);
        if (err) {
            Py_DECREF(a);
            PyErr_Format(PyExc_MemoryError, "cannot allocate %zu bytes on cuda:%d: %s", nbytes,
                         dev.id, ewcuda_error_string(err));
            return NULL;
        }
        a->alloc_stream = stream;
        a->stream_ref = stream_ref;
        Py_XINCREF(stream_ref);
#else
        (void)stream;
        (void)stream_ref;
        Py_DECREF(a);
        ew_device_check(dev);
        return NULL;
#endif
    }
    a->data = a->alloc;
    return (PyObject *)a;
}

static void array_dealloc(ArrayObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (self->weakreflist)
        PyObject_ClearWeakRefs((PyObject *)self);
    if (self->alloc) {
        if (self->device.type == EW_CPU)
            free(self->alloc);
#if EWKERN_WITH_CUDA
        else {
            /* stream-ordered: the memory returns to the pool after the work queued on it;
             * at interpreter exit the runtime may be gone already, which is harmless */
            int prev;
            if (ewcuda_device_enter(self->device.id, &prev) == 0) {
                ewcuda_free_async(self->alloc, self->alloc_stream);
                ewcuda_device_exit(prev);
            }
            (void)ewcuda_last_error();
        }
#endif
    }
    ew_release_managed(self->mt, self->mtv);
    Py_XDECREF(self->base);
    Py_XDECREF(self->stream_ref);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *shape_tuple(const int64_t *shape, int ndim)
{
    PyObject *t = PyTuple_New(ndim);
    if (t == NULL)
        return NULL;
    for (int i = 0; i < ndim; i++) {
        PyObject *x = PyLong_FromLongLong(shape[i]);
        if (x == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, x);
    }
    return t;
}

static PyObject *array_shape(ArrayObject *self, void *c) { return shape_tuple(self->shape, self->ndim); }
static PyObject *array_dtype(ArrayObject *self, void *c) { return PyUnicode_FromString(ew_dtype_name(self->dtype)); }
static PyObject *array_device(ArrayObject *self, void *c) { return ew_device_str(self->device); }
static PyObject *array_ndim(ArrayObject *self, void *c) { return PyLong_FromLong(self->ndim); }
static PyObject *array_size(ArrayObject *self, void *c) { return PyLong_FromLongLong(self->size); }
static PyObject *array_itemsize(ArrayObject *self, void *c) { return PyLong_FromLong(ew_dtype_size(self->dtype)); }
static PyObject *array_readonly(ArrayObject *self, void *c) { return PyBool_FromLong(self->readonly); }
static PyObject *array_data_ptr(ArrayObject *self, void *c) { return PyLong_FromVoidPtr(self->data); }

static PyObject *array_nbytes(ArrayObject *self, void *c)
{
    return PyLong_FromLongLong(self->size * ew_dtype_size(self->dtype));
}

static PyObject *array_strides(ArrayObject *self, void *c)
{
    int64_t strides[EW_MAXDIM];
    int64_t s = ew_dtype_size(self->dtype);
    for (int i = self->ndim - 1; i >= 0; i--) {
        strides[i] = s;
        s *= self->shape[i];
    }
    return shape_tuple(strides, self->ndim);
}

static const char *typestr(ew_dtype dt)
{
    switch (dt) {
    case EW_FLOAT32: return "<f4";
    case EW_FLOAT16: return "<f2";
    case EW_FLOAT64: return "<f8";
    default: return NULL;
    }
}

static PyObject *array_cai(ArrayObject *self, void *c)
{
    if (self->device.type != EW_CUDA) {
        PyErr_SetString(PyExc_AttributeError,
                        "__cuda_array_interface__ exists only for CUDA arrays; this one is on the cpu");
        return NULL;
    }
    const char *ts = typestr(self->dtype);
    if (ts == NULL) {
        PyErr_SetString(PyExc_AttributeError,
                        "bfloat16 has no __cuda_array_interface__ type code; use DLPack instead");
        return NULL;
    }
    ew_state *st = ew_state_from_type(Py_TYPE(self));
    if (st == NULL)
        return NULL;
    void *stream = ew_current_stream(st, self->device.id, NULL);
    PyObject *shape = shape_tuple(self->shape, self->ndim);
    if (shape == NULL)
        return NULL;
    /* v3: "stream" is where the data is ready; 1 means the legacy default stream */
    return Py_BuildValue("{s:N,s:s,s:(NO),s:i,s:O,s:N}", "shape", shape, "typestr", ts, "data",
                         PyLong_FromVoidPtr(self->data), self->readonly ? Py_True : Py_False,
                         "version", 3, "strides", Py_None, "stream",
                         stream ? PyLong_FromVoidPtr(stream) : PyLong_FromLong(1));
}

static PyObject *array_repr(ArrayObject *self)
{
    PyObject *shape = shape_tuple(self->shape, self->ndim);
    if (shape == NULL)
        return NULL;
    PyObject *dev = ew_device_str(self->device);
    PyObject *r = PyUnicode_FromFormat("ewkern.Array(shape=%R, dtype=%s, device='%U'%s)", shape,
                                       ew_dtype_name(self->dtype), dev,
                                       self->readonly ? ", readonly=True" : "");
    Py_DECREF(shape);
    Py_XDECREF(dev);
    return r;
}

static Py_ssize_t array_len(ArrayObject *self)
{
    if (self->ndim == 0) {
        PyErr_SetString(PyExc_TypeError, "len() of a 0-d array");
        return -1;
    }
    return (Py_ssize_t)self->shape[0];
}

/* A NumPy array holding this Array's values: a view for cpu arrays (copy=0), a host copy
 * otherwise. */
static PyObject *to_numpy(ArrayObject *self, int copy)
{
    ew_state *st = ew_state_from_type(Py_TYPE(self));
    if (st == NULL)
        return NULL;
    PyArray_Descr *descr = (PyArray_Descr *)ew_numpy_descr(st, self->dtype);
    if (descr == NULL)
        return NULL;
    npy_intp dims[EW_MAXDIM];
    for (int i = 0; i < self->ndim; i++)
        dims[i] = (npy_intp)self->shape[i];
    size_t nbytes = (size_t)self->size * ew_dtype_size(self->dtype);
    if (self->device.type == EW_CPU && !copy) {
        PyObject *arr = PyArray_NewFromDescr(&PyArray_Type, descr, self->ndim, dims, NULL, self->data,
                                             self->readonly ? 0 : NPY_ARRAY_WRITEABLE, NULL);
        if (arr == NULL)
            return NULL;
        Py_INCREF(self);
        if (PyArray_SetBaseObject((PyArrayObject *)arr, (PyObject *)self) < 0) {
            Py_DECREF(arr);
            return NULL;
        }
        return arr;
    }
    PyObject *arr = PyArray_NewFromDescr(&PyArray_Type, descr, self->ndim, dims, NULL, NULL, 0, NULL);
    if (arr == NULL)
        return NULL;
    void *dst = PyArray_DATA((PyArrayObject *)arr);
    if (self->device.type == EW_CPU) {
        if (self->size > EW_GIL_FREE_WORK) {
            Py_BEGIN_ALLOW_THREADS
            memcpy(dst, self->data, nbytes);
            Py_END_ALLOW_THREADS
        } else {
            memcpy(dst, self->data, nbytes);
        }
        return arr;
    }
#if EWKERN_WITH_CUDA
    ew_device_guard g = EW_DEVICE_GUARD_INIT;
    if (ew_device_enter(&g, self->device) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    void *stream = ew_current_stream(st, self->device.id, NULL);
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = ewcuda_memcpy_sync(dst, self->data, nbytes, EWCUDA_D2H, stream);
    Py_END_ALLOW_THREADS
    ew_device_exit(&g);
    if (err) {
        Py_DECREF(arr);
        ew_raise_cuda(err, "copying an array to the host");
        return NULL;
    }
#endif
    return arr;
}

static PyObject *array_numpy(ArrayObject *self, PyObject *unused) { return to_numpy(self, 0); }

static PyObject *array_array(ArrayObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"dtype", "copy", NULL};
    PyObject *dtype = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OO:__array__", kwlist, &dtype, &copy))
        return NULL;
    if (copy == Py_False && self->device.type != EW_CPU) {
        PyErr_SetString(PyExc_ValueError,
                        "a CUDA array cannot be viewed from NumPy without a copy (copy=False given)");
        return NULL;
    }
    PyObject *arr = to_numpy(self, copy == Py_True);
    if (arr == NULL || dtype == Py_None)
        return arr;
    PyArray_Descr *want = NULL;
    if (!PyArray_DescrConverter(dtype, &want)) {
        Py_DECREF(arr);
        return NULL;
    }
    int same = PyArray_EquivTypes(PyArray_DESCR((PyArrayObject *)arr), want);
    Py_DECREF(want);
    if (same)
        return arr;
    if (copy == Py_False) {
        /* NumPy 2's protocol: copy=False promises a view, which another dtype cannot be */
        PyErr_Format(PyExc_ValueError, "__array__: dtype %R needs a copy of this %S array (copy=False given)", dtype,
                     PyArray_DESCR((PyArrayObject *)arr));
        Py_DECREF(arr);
        return NULL;
    }
    PyObject *res = PyObject_CallMethod(arr, "astype", "O", dtype);
    Py_DECREF(arr);
    return res;
}

static PyObject *array_dlpack_device(ArrayObject *self, PyObject *unused)
{
    return Py_BuildValue("(ii)", self->device.type, self->device.id);
}

/* ---- export --------------------------------------------------------------------------------- */

typedef struct {
    DLManagedTensorVersioned m;
    int64_t dims[2 * EW_MAXDIM];
} exported_versioned;

typedef struct {
    DLManagedTensor m;
    int64_t dims[2 * EW_MAXDIM];
} exported_legacy;

static void release_owner(void *owner)
{
    if (owner == NULL || !Py_IsInitialized() || is_finalizing())
        return;   /* at interpreter exit: leak rather than touch a dying interpreter */
    PyGILState_STATE g = PyGILState_Ensure();
    Py_DECREF((PyObject *)owner);
    PyGILState_Release(g);
}

static void deleter_versioned(DLManagedTensorVersioned *m)
{
    release_owner(m->manager_ctx);
    free(m);
}

static void deleter_legacy(DLManagedTensor *m)
{
    release_owner(m->manager_ctx);
    free(m);
}

static void capsule_destructor_versioned(PyObject *cap)
{
    if (PyCapsule_IsValid(cap, "used_dltensor_versioned"))
        return;
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    DLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
    if (m && m->deleter)
        m->deleter(m);
    else
        PyErr_WriteUnraisable(cap);
    PyErr_Restore(t, v, tb);
}

static void capsule_destructor_legacy(PyObject *cap)
{
    if (PyCapsule_IsValid(cap, "used_dltensor"))
        return;
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
    if (m && m->deleter)
        m->deleter(m);
    else
        PyErr_WriteUnraisable(cap);
    PyErr_Restore(t, v, tb);
}

static void fill_dltensor(DLTensor *t, ArrayObject *a, int64_t *dims)
{
    t->data = a->data;
    t->byte_offset = 0;
    t->device.device_type = a->device.type == EW_CPU ? kDLCPU : kDLCUDA;
    t->device.device_id = a->device.id;
    t->ndim = a->ndim;
    t->dtype = ew_dtype_to_dl(a->dtype);
    int64_t *shape = dims, *strides = dims + EW_MAXDIM;
    int64_t s = 1;
    for (int i = a->ndim - 1; i >= 0; i--) {
        shape[i] = a->shape[i];
        strides[i] = s;
        s *= a->shape[i];
    }
    t->shape = shape;
    t->strides = strides;
}

/* The consumer's stream argument as a handle; -1 in *skip means "no synchronisation". */
static int parse_consumer_stream(PyObject *stream, void **handle, int *skip)
{
    *skip = 0;
    *handle = NULL;
    if (stream == NULL || stream == Py_None)
        return 0;   /* legacy default stream */
    if (!PyLong_Check(stream)) {
        PyErr_Format(PyExc_TypeError, "__dlpack__: stream must be an int or None, got %.200s",
                     Py_TYPE(stream)->tp_name);
        return -1;
    }
    long long s = PyLong_AsLongLong(stream);
    if (s == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        *handle = PyLong_AsVoidPtr(stream);
        return PyErr_Occurred() ? -1 : 0;
    }
    if (s == -1) {
        *skip = 1;
        return 0;
    }
    if (s == 0) {
        PyErr_SetString(PyExc_ValueError,
                        "__dlpack__: stream=0 is ambiguous for CUDA; use 1 (legacy default stream), "
                        "2 (per-thread default stream) or a stream handle");
        return -1;
    }
    *handle = s == 1 ? NULL : (void *)(intptr_t)s;
    return 0;
}

static PyObject *array_dlpack(ArrayObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$OOOO:__dlpack__", kwlist, &stream, &max_version,
                                     &dl_device, &copy))
        return NULL;
    ew_state *st = ew_state_from_type(Py_TYPE(self));
    if (st == NULL)
        return NULL;
    int versioned = 0;
    if (max_version != Py_None) {
        long major = -1;
        if (!PyTuple_Check(max_version) || PyTuple_GET_SIZE(max_version) != 2 ||
            ((major = PyLong_AsLong(PyTuple_GET_ITEM(max_version, 0))) == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "__dlpack__: max_version must be a (major, minor) tuple");
            return NULL;
        }
        versioned = major >= 1;
    }
    if (copy != Py_None && copy != Py_True && copy != Py_False) {
        PyErr_SetString(PyExc_TypeError, "__dlpack__: copy must be True, False or None");
        return NULL;
    }
    ew_device target = self->device;
    if (dl_device != Py_None) {
        int t, id;
        if (!PyTuple_Check(dl_device)) {
            PyErr_Format(PyExc_TypeError, "__dlpack__: dl_device must be a (device_type, device_id) tuple, got "
                         "%.200s", Py_TYPE(dl_device)->tp_name);
            return NULL;
        }
        if (!PyArg_ParseTuple(dl_device, "ii;__dlpack__: dl_device must be a (device_type, device_id) "
                              "tuple", &t, &id))
            return NULL;
        if (t == kDLCPU) {
            target.type = EW_CPU;
            target.id = 0;
        } else if (t == kDLCUDA) {
            target.type = EW_CUDA;
            target.id = id;
        } else {
            PyErr_Format(PyExc_BufferError, "__dlpack__: cannot export to DLPack device type %d", t);
            return NULL;
        }
    }
    int need_copy = copy == Py_True || target.type != self->device.type || target.id != self->device.id;
    if (self->readonly && !versioned && !need_copy) {
        /* the legacy capsule has no read-only flag: its consumer would take the memory as
         * writable (NumPy refuses the same way) */
        PyErr_SetString(PyExc_BufferError, "__dlpack__: a read-only array is exported only as a versioned "
                        "capsule (max_version >= (1, 0)), or as a copy (copy=True)");
        return NULL;
    }
    if (need_copy && copy == Py_False) {
        PyErr_SetString(PyExc_BufferError, "__dlpack__: the requested device needs a copy, but copy=False");
        return NULL;
    }
    if (need_copy && target.type == EW_CUDA && self->device.type == EW_CUDA &&
        target.id != self->device.id) {
        PyErr_SetString(PyExc_BufferError, "__dlpack__: copies between CUDA devices are not supported");
        return NULL;
    }
    if (self->device.type == EW_CPU && stream != Py_None && target.type == EW_CPU) {
        PyErr_SetString(PyExc_BufferError, "__dlpack__: stream must be None for a cpu array");
        return NULL;
    }
    /* stream handshake: make the consumer's stream wait for our queued work */
    if (self->device.type == EW_CUDA && target.type == EW_CUDA) {
        void *consumer;
        int skip;
        if (parse_consumer_stream(stream, &consumer, &skip) < 0)
            return NULL;
#if EWKERN_WITH_CUDA
        void *ours = ew_current_stream(st, self->device.id, NULL);
        if (!skip && ours != consumer) {
            /* the event and the legacy default stream (handle NULL) are the current device's */
            ew_device_guard g = EW_DEVICE_GUARD_INIT;
            if (ew_device_enter(&g, self->device) < 0)
                return NULL;
            int err = ewcuda_stream_order(ours, consumer);
            ew_device_exit(&g);
            if (err) {
                ew_raise_cuda(err, "__dlpack__ stream handshake");
                return NULL;
            }
        }
#endif
    }
    PyObject *owner = (PyObject *)self;
    Py_INCREF(owner);
    if (need_copy) {
        PyObject *host_or_dev;
        if (target.type == EW_CPU) {
            host_or_dev = PyObject_CallMethod((PyObject *)self, "numpy", NULL);
            if (host_or_dev && self->device.type == EW_CPU) {
                PyObject *c = PyObject_CallMethod(host_or_dev, "copy", NULL);
                Py_SETREF(host_or_dev, c);
            }
        } else {
            host_or_dev = NULL;
            PyObject *mod = PyType_GetModule(Py_TYPE(self));
            PyObject *dev = ew_device_str(target);
            if (mod && dev)
                host_or_dev = PyObject_CallMethod(mod, "asarray", "OsO", (PyObject *)self, NULL, dev);
            Py_XDECREF(dev);
            if (host_or_dev && host_or_dev == (PyObject *)self) {
                /* same device, copy=True: a fresh Array of the same values */
                Py_DECREF(host_or_dev);
                host_or_dev = mod ? PyObject_CallMethod(mod, "copy", "O", (PyObject *)self) : NULL;
            }
        }
        Py_DECREF(owner);
        if (host_or_dev == NULL)
            return NULL;
        /* the copy (a NumPy array or an ewkern.Array) as an Array: through the module's
         * from_dlpack, which lives on a floor above this one (dlpack.c) */
        PyObject *mod = PyType_GetModule(Py_TYPE(self));
        owner = mod ? PyObject_CallMethod(mod, "from_dlpack", "O", host_or_dev) : NULL;
        Py_DECREF(host_or_dev);
        if (owner == NULL)
            return NULL;
        if (!Py_IS_TYPE(owner, Py_TYPE(self))) {
            PyErr_Format(PyExc_SystemError, "__dlpack__: ewkern._C.from_dlpack returned %.200s, not an "
                         "ewkern.Array", Py_TYPE(owner)->tp_name);
            Py_DECREF(owner);
            return NULL;
        }
    }
    ArrayObject *a = (ArrayObject *)owner;
    PyObject *cap;
    if (versioned) {
        exported_versioned *e = calloc(1, sizeof *e);
        if (e == NULL) {
            Py_DECREF(owner);
            return PyErr_NoMemory();
        }
        e->m.version.major = DLPACK_MAJOR_VERSION;
        e->m.version.minor = DLPACK_MINOR_VERSION;
        e->m.manager_ctx = owner;
        e->m.deleter = deleter_versioned;
        e->m.flags = (a->readonly ? DLPACK_FLAG_BITMASK_READ_ONLY : 0) |
                     (need_copy ? DLPACK_FLAG_BITMASK_IS_COPIED : 0);
        fill_dltensor(&e->m.dl_tensor, a, e->dims);
        cap = PyCapsule_New(&e->m, "dltensor_versioned", capsule_destructor_versioned);
        if (cap == NULL)
            deleter_versioned(&e->m);
    } else {
        exported_legacy *e = calloc(1, sizeof *e);
        if (e == NULL) {
            Py_DECREF(owner);
            return PyErr_NoMemory();
        }
        e->m.manager_ctx = owner;
        e->m.deleter = deleter_legacy;
        fill_dltensor(&e->m.dl_tensor, a, e->dims);
        cap = PyCapsule_New(&e->m, "dltensor", capsule_destructor_legacy);
        if (cap == NULL)
            deleter_legacy(&e->m);
    }
    return cap;
}

static PyMethodDef array_methods[] = {
    {"numpy", (PyCFunction)array_numpy, METH_NOARGS,
     "numpy($self)\n--\n\nThe values as a numpy.ndarray: a view for cpu arrays, a host copy for CUDA "
     "arrays. bfloat16 arrays come back with ml_dtypes.bfloat16 elements."},
    {"__array__", (PyCFunction)(void (*)(void))array_array, METH_VARARGS | METH_KEYWORDS,
     "__array__($self, /, dtype=None, copy=None)\n--\n\nNumPy conversion (numpy.asarray(arr))."},
    {"__dlpack__", (PyCFunction)(void (*)(void))array_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__($self, /, *, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\n"
     "Export as a DLPack capsule (versioned when max_version >= (1, 0))."},
    {"__dlpack_device__", (PyCFunction)array_dlpack_device, METH_NOARGS,
     "__dlpack_device__($self)\n--\n\n(device type, device id) as DLPack numbers them."},
    {NULL}
};

static PyGetSetDef array_getset[] = {
    {"shape", (getter)array_shape, NULL, "Tuple of dimensions.", NULL},
    {"dtype", (getter)array_dtype, NULL, "Element type name: float32, float16, bfloat16 or float64.", NULL},
    {"device", (getter)array_device, NULL, "'cpu' or 'cuda:N'.", NULL},
    {"ndim", (getter)array_ndim, NULL, "Number of dimensions.", NULL},
    {"size", (getter)array_size, NULL, "Number of elements.", NULL},
    {"itemsize", (getter)array_itemsize, NULL, "Bytes per element.", NULL},
    {"nbytes", (getter)array_nbytes, NULL, "Bytes of the elements.", NULL},
    {"strides", (getter)array_strides, NULL, "Bytes between neighbours along each axis (C order).", NULL},
    {"readonly", (getter)array_readonly, NULL, "True when the memory must not be written.", NULL},
    {"data_ptr", (getter)array_data_ptr, NULL, "Address of element 0.", NULL},
    {"__cuda_array_interface__", (getter)array_cai, NULL, "CUDA Array Interface, version 3.", NULL},
    {NULL}
};

static PyMemberDef array_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(ArrayObject, weakreflist), READONLY},
    {NULL}
};

static PyObject *array_new(PyTypeObject *tp, PyObject *args, PyObject *kwds)
{
    PyErr_SetString(PyExc_TypeError,
                    "ewkern.Array cannot be created directly: use ewkern.empty, zeros, full, asarray "
                    "or from_dlpack");
    return NULL;
}

static PyType_Slot array_slots[] = {
    {Py_tp_dealloc, array_dealloc},
    {Py_tp_repr, array_repr},
    {Py_tp_methods, array_methods},
    {Py_tp_getset, array_getset},
    {Py_tp_members, array_members},
    {Py_tp_new, array_new},
    {Py_mp_length, array_len},
    {Py_tp_doc, "Array\n\nAn n-dimensional C-contiguous buffer of float32, float16, bfloat16 or "
                "float64 on 'cpu' or 'cuda:N'. Create with ewkern.empty/zeros/full/asarray/"
                "from_dlpack; exchange through DLPack."},
    {0, NULL}
};

PyType_Spec ew_array_spec = {
    .name = "ewkern.Array",
    .basicsize = sizeof(ArrayObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = array_slots,
};

/* ---- creation ------------------------------------------------------------------------------------ */

static int parse_shape(PyObject *obj, int *ndim, int64_t *shape)
{
    /* an int, or any integer with __index__ (numpy.int64 included), or a sequence of them */
    PyObject *seq = PyLong_Check(obj) || (PyIndex_Check(obj) && !PySequence_Check(obj)) ? PyTuple_Pack(1, obj)
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
        PyObject *x = PyTuple_GET_ITEM(seq, i), *ix = NULL;
        int overflow = 0;
        long long v = -1;
        if (!PyIndex_Check(x) || (ix = PyNumber_Index(x)) == NULL) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "shape entries must be ints, got %.200s", Py_TYPE(x)->tp_name);
        } else if ((v = PyLong_AsLongLongAndOverflow(ix, &overflow)) == -1 && PyErr_Occurred()) {
            /* raised as it is */
        } else if (overflow > 0) {
            PyErr_Format(PyExc_ValueError, "dimension %R in shape is too large", ix);
        } else if (overflow < 0 || v < 0) {
            PyErr_Format(PyExc_ValueError, "negative dimension %R in shape", ix);
        }
        Py_XDECREF(ix);
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

PyObject *ew_create(PyObject *module, PyObject *args, PyObject *kwds, int mode)
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
