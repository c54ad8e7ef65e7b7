/*
 * array.c: ewkern.Array (an n-dimensional C-contiguous buffer on cpu or cuda:N), the dtype
 * and device helpers, and the conversions to NumPy.
 */
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL ewkern_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include "ewkern.h"

#include <numpy/arrayobject.h>
#include <structmember.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_api.h"

/* ---- dtypes ---------------------------------------------------------------------------- */
static const char *const dtype_names[EW_NDTYPES] = {"float32", "float16", "bfloat16", "float64"};
static const int dtype_sizes[EW_NDTYPES] = {4, 2, 2, 8};

const char *ew_dtype_name(ew_dtype dt) { return dtype_names[dt]; }
int ew_dtype_size(ew_dtype dt) { return dtype_sizes[dt]; }

int ew_dtype_from_dl(DLDataType dl, ew_dtype *out)
{
    if (dl.lanes == 1 && dl.code == kDLFloat && dl.bits == 32) *out = EW_FLOAT32;
    else if (dl.lanes == 1 && dl.code == kDLFloat && dl.bits == 16) *out = EW_FLOAT16;
    else if (dl.lanes == 1 && dl.code == kDLBfloat && dl.bits == 16) *out = EW_BFLOAT16;
    else if (dl.lanes == 1 && dl.code == kDLFloat && dl.bits == 64) *out = EW_FLOAT64;
    else {
        PyErr_Format(PyExc_TypeError,
                     "unsupported dtype (DLPack code %d, %d bits, %d lanes): ewkern supports "
                     "float32, float16, bfloat16 and float64",
                     (int)dl.code, (int)dl.bits, (int)dl.lanes);
        return -1;
    }
    return 0;
}

DLDataType ew_dtype_to_dl(ew_dtype dt)
{
    DLDataType d;
    d.code = dt == EW_BFLOAT16 ? kDLBfloat : kDLFloat;
    d.bits = (uint8_t)(8 * dtype_sizes[dt]);
    d.lanes = 1;
    return d;
}

static int bf16_descr(ew_state *st)
{
    if (st->bf16_descr)
        return 0;
    PyObject *mod = PyImport_ImportModule("ml_dtypes");
    if (mod == NULL) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ImportError,
                        "bfloat16 arrays need the ml_dtypes package to convert to or from NumPy "
                        "(pip install ml_dtypes)");
        return -1;
    }
    PyObject *type = PyObject_GetAttrString(mod, "bfloat16");
    Py_DECREF(mod);
    if (type == NULL)
        return -1;
    PyArray_Descr *descr = NULL;
    int ok = PyArray_DescrConverter(type, &descr);
    Py_DECREF(type);
    if (!ok)
        return -1;
    st->bf16_descr = (PyObject *)descr;
    return 0;
}

PyObject *ew_numpy_descr(ew_state *st, ew_dtype dt)
{
    switch (dt) {
    case EW_FLOAT32: return (PyObject *)PyArray_DescrFromType(NPY_FLOAT32);
    case EW_FLOAT16: return (PyObject *)PyArray_DescrFromType(NPY_FLOAT16);
    case EW_FLOAT64: return (PyObject *)PyArray_DescrFromType(NPY_FLOAT64);
    default:
        if (bf16_descr(st) < 0)
            return NULL;
        Py_INCREF(st->bf16_descr);
        return st->bf16_descr;
    }
}

/* dtype from a numpy descr; -1 with TypeError if unsupported. */
int ew_dtype_from_descr(ew_state *st, PyArray_Descr *d, ew_dtype *out)
{
    switch (d->type_num) {
    case NPY_FLOAT32: *out = EW_FLOAT32; return 0;
    case NPY_FLOAT16: *out = EW_FLOAT16; return 0;
    case NPY_FLOAT64: *out = EW_FLOAT64; return 0;
    default: break;
    }
    if (PyDataType_ELSIZE(d) == 2 && d->type_num >= NPY_USERDEF) {
        /* a user dtype of 2 bytes: bfloat16 from ml_dtypes? */
        if (st->bf16_descr == NULL && !st->bf16_lookup_failed && bf16_descr(st) < 0) {
            PyErr_Clear();
            st->bf16_lookup_failed = 1;
        }
        if (st->bf16_descr && ((PyArray_Descr *)st->bf16_descr)->type_num == d->type_num) {
            *out = EW_BFLOAT16;
            return 0;
        }
    }
    PyObject *repr = PyObject_Str((PyObject *)d);
    PyErr_Format(PyExc_TypeError,
                 "unsupported dtype %U: ewkern supports float32, float16, bfloat16 and float64",
                 repr ? repr : Py_None);
    Py_XDECREF(repr);
    return -1;
}

int ew_dtype_from_py(ew_state *st, PyObject *obj, ew_dtype *out)
{
    if (obj == NULL || obj == Py_None) {
        *out = EW_FLOAT32;
        return 0;
    }
    if (PyUnicode_Check(obj)) {
        for (int i = 0; i < EW_NDTYPES; i++)
            if (PyUnicode_CompareWithASCIIString(obj, dtype_names[i]) == 0) {
                *out = (ew_dtype)i;
                return 0;
            }
        if (PyUnicode_CompareWithASCIIString(obj, "half") == 0) { *out = EW_FLOAT16; return 0; }
        if (PyUnicode_CompareWithASCIIString(obj, "float") == 0) { *out = EW_FLOAT32; return 0; }
        if (PyUnicode_CompareWithASCIIString(obj, "double") == 0) { *out = EW_FLOAT64; return 0; }
        PyErr_Format(PyExc_TypeError,
                     "unknown dtype %R: expected one of 'float32', 'float16', 'bfloat16', 'float64'",
                     obj);
        return -1;
    }
    /* numpy dtypes, numpy scalar types, ml_dtypes.bfloat16, torch dtypes by name */
    PyObject *name = PyObject_GetAttrString(obj, "name");
    if (name == NULL) {
        PyErr_Clear();
        name = PyObject_GetAttrString(obj, "__name__");
    }
    if (name == NULL || !PyUnicode_Check(name)) {
        PyErr_Clear();
        Py_XDECREF(name);
        /* torch.float32 prints as "torch.float32" */
        name = PyObject_Str(obj);
        if (name == NULL)
            return -1;
    }
    const char *s = PyUnicode_AsUTF8(name);
    if (s == NULL) {
        Py_DECREF(name);
        return -1;
    }
    if (strncmp(s, "torch.", 6) == 0)
        s += 6;
    for (int i = 0; i < EW_NDTYPES; i++)
        if (strcmp(s, dtype_names[i]) == 0) {
            Py_DECREF(name);
            *out = (ew_dtype)i;
            return 0;
        }
    PyErr_Format(PyExc_TypeError,
                 "unsupported dtype %R: expected one of 'float32', 'float16', 'bfloat16', 'float64'",
                 obj);
    Py_DECREF(name);
    return -1;
}

/* ---- devices ----------------------------------------------------------------------------- */
int ew_cuda_device_count(void)
{
#if EWKERN_WITH_CUDA
    static int cached = -1;
    if (cached < 0) {
        int n = 0;
        ewcuda_device_count(&n);
        cached = n;
    }
    return cached;
#else
    return 0;
#endif
}

int ew_device_from_py(PyObject *obj, ew_device *out)
{
    if (obj == NULL || obj == Py_None) {
        out->type = ew_cuda_device_count() > 0 ? EW_CUDA : EW_CPU;
        out->id = 0;
        return 0;
    }
    PyObject *s = NULL;
    if (PyUnicode_Check(obj)) {
        s = obj;
        Py_INCREF(s);
    } else {
        /* torch.device, cupy Device etc.: use their string form */
        s = PyObject_Str(obj);
        if (s == NULL)
            return -1;
    }
    const char *c = PyUnicode_AsUTF8(s);
    if (c == NULL) {
        Py_DECREF(s);
        return -1;
    }
    int ok = 0;
    if (strcmp(c, "cpu") == 0) {
        out->type = EW_CPU;
        out->id = 0;
        ok = 1;
    } else if (strncmp(c, "cuda", 4) == 0) {
        out->type = EW_CUDA;
        out->id = 0;
        if (c[4] == '\0')
            ok = 1;
        else if (c[4] == ':' && c[5] >= '0' && c[5] <= '9') {
            char *end;
            long id = strtol(c + 5, &end, 10);
            if (*end == '\0' && id < 1 << 20) {
                out->id = (int)id;
                ok = 1;
            }
        }
    } else if (strncmp(c, "<CUDA Device ", 13) == 0) {  /* cupy.cuda.Device */
        out->type = EW_CUDA;
        out->id = atoi(c + 13);
        ok = 1;
    }
    if (!ok)
        PyErr_Format(PyExc_ValueError, "unknown device %R: expected 'cpu', 'cuda' or 'cuda:N'", obj);
    Py_DECREF(s);
    return ok ? 0 : -1;
}

PyObject *ew_device_str(ew_device dev)
{
    if (dev.type == EW_CPU)
        return PyUnicode_FromString("cpu");
    return PyUnicode_FromFormat("cuda:%d", dev.id);
}

void ew_raise_cuda(int err, const char *what)
{
#if EWKERN_WITH_CUDA
    PyObject *exc = err == 2 /* cudaErrorMemoryAllocation */ ? PyExc_MemoryError : PyExc_RuntimeError;
    PyErr_Format(exc, "%s: CUDA error %s (%d): %s", what, ewcuda_error_name(err), err,
                 ewcuda_error_string(err));
#else
    PyErr_Format(PyExc_RuntimeError, "%s: CUDA error %d", what, err);
#endif
}

int ew_device_check(ew_device dev)
{
    if (dev.type == EW_CPU)
        return 0;
    int count = ew_cuda_device_count();
    if (count == 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        EWKERN_WITH_CUDA ? "CUDA is not available: no CUDA device or driver was found"
                                         : "CUDA is not available: ewkern was built without CUDA "
                                           "(nvcc was not found at build time)");
        return -1;
    }
    if (dev.id < 0 || dev.id >= count) {
        PyErr_Format(PyExc_ValueError, "device cuda:%d does not exist: %d CUDA device%s present",
                     dev.id, count, count == 1 ? " is" : "s are");
        return -1;
    }
    return 0;
}

int ew_device_enter(ew_device_guard *g, ew_device dev)
{
    if (dev.type == EW_CPU)
        return 0;
    if (ew_device_check(dev) < 0)
        return -1;
#if EWKERN_WITH_CUDA
    int prev;
    int err = ewcuda_device_enter(dev.id, &prev);
    if (err) {
        ew_raise_cuda(err, "selecting the CUDA device");
        return -1;
    }
    if (g->prev < 0)   /* the first switch of the call: prev is the caller's device */
        g->prev = prev;
#endif
    return 0;
}

void ew_device_exit(ew_device_guard *g)
{
#if EWKERN_WITH_CUDA
    /* a failure to switch back to a device that was current a moment ago has no remedy here
     * (and runtime.cu clears it): the call's own result or exception stands */
    if (g->prev >= 0)
        (void)ewcuda_device_exit(g->prev);
#endif
    g->prev = -1;
}

/* ---- the Array type ---------------------------------------------------------------------- */
int ew_array_check(ew_state *st, PyObject *obj) { return Py_IS_TYPE(obj, st->Array_Type); }

static ArrayObject *array_alloc(ew_state *st)
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

/* No 64-bit platform ewkern builds for maps user memory above 2^56 bytes (x86-64 with 5-level
 * paging; arm64 stops at 2^52): a shape or a pointer beyond it is corrupt, not large. */
const uint64_t ew_address_limit = UINTPTR_MAX > 0xffffffffu ? (uint64_t)1 << 56 : (uint64_t)UINTPTR_MAX;

int ew_shape_size(const char *what, int ndim, const int64_t *shape, ew_dtype dt, int64_t *size)
{
    const int64_t limit = (int64_t)(ew_address_limit / (uint64_t)ew_dtype_size(dt));
    int64_t n = 1, nonzero = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            PyErr_Format(PyExc_ValueError, "%s: negative dimension %lld at axis %d", what,
                         (long long)shape[i], i);
            return -1;
        }
        if (shape[i] == 0) {
            n = 0;
            continue;
        }
        if (nonzero > limit / shape[i]) {   /* also every product that would overflow int64 */
            PyErr_Format(PyExc_ValueError, "%s: the shape describes more than 2^56 bytes of %s (an "
                         "overflowing or corrupt shape)", what, ew_dtype_name(dt));
            return -1;
        }
        nonzero *= shape[i];
        n *= shape[i];
    }
    *size = n;
    return 0;
}

static int set_shape(ArrayObject *a, int ndim, const int64_t *shape)
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
    ArrayObject *a = array_alloc(st);
    if (a == NULL)
        return NULL;
    a->dtype = dt;
    a->device = dev;
    if (set_shape(a, ndim, shape) < 0) {
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

PyObject *ew_array_from_view(ew_state *st, ew_view *v, PyObject *base)
{
    ArrayObject *a = array_alloc(st);
    if (a == NULL)
        return NULL;
    a->dtype = v->dtype;
    if (set_shape(a, v->ndim, v->shape) < 0) {
        Py_DECREF(a);
        return NULL;
    }
    a->data = v->data;
    a->device = v->device;
    a->readonly = v->readonly;
    a->mt = v->mt;
    a->mtv = v->mtv;
    v->mt = NULL;
    v->mtv = NULL;
    a->base = base;
    Py_XINCREF(base);
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
    PyObject *res = PyObject_CallMethod(arr, "astype", "O", dtype);
    Py_DECREF(arr);
    return res;
}

static PyObject *array_dlpack_device(ArrayObject *self, PyObject *unused)
{
    return Py_BuildValue("(ii)", self->device.type, self->device.id);
}

static PyObject *array_dlpack_method(ArrayObject *self, PyObject *args, PyObject *kwds)
{
    return ew_array_dlpack(self, args, kwds);
}

static PyMethodDef array_methods[] = {
    {"numpy", (PyCFunction)array_numpy, METH_NOARGS,
     "numpy($self)\n--\n\nThe values as a numpy.ndarray: a view for cpu arrays, a host copy for CUDA "
     "arrays. bfloat16 arrays come back with ml_dtypes.bfloat16 elements."},
    {"__array__", (PyCFunction)(void (*)(void))array_array, METH_VARARGS | METH_KEYWORDS,
     "__array__($self, /, dtype=None, copy=None)\n--\n\nNumPy conversion (numpy.asarray(arr))."},
    {"__dlpack__", (PyCFunction)(void (*)(void))array_dlpack_method, METH_VARARGS | METH_KEYWORDS,
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
