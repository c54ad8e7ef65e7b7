/*
 * dlpack.c: floor 3 (see state.h). DLPack in.
 *  - import: any producer -> ew_view (ewkern.Array and numpy.ndarray directly; types with
 *    the C exchange API through it, cached per type; everything else through __dlpack__),
 *  - Arrays from views and capsules (from_dlpack), asarray (a copy when the dtype or the
 *    device differs),
 *  - results that follow the inputs' framework (ew_new_result).
 * The export (Array.__dlpack__) is the Array's own, on floor 2 (array.c). Calls array, dtype,
 * device, state and the CUDA runtime surface.
 */
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL ewkern_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include "dlpack.h"

#include <numpy/arrayobject.h>
#include <string.h>

#include "cuda_api.h"

#if DLPACK_MAJOR_VERSION < 1 || (DLPACK_MAJOR_VERSION == 1 && DLPACK_MINOR_VERSION < 2)
#error "ewkern needs dlpack.h 1.2 or newer (DLPackExchangeAPI); set EWKERN_DLPACK_INCLUDE"
#endif

/* ---- import -------------------------------------------------------------------------------- */

const DLPackExchangeAPI *ew_exchange_api(ew_state *st, PyTypeObject *tp)
{
    PyObject *cached = PyDict_GetItemWithError(st->api_cache, (PyObject *)tp);
    if (cached == NULL) {
        if (PyErr_Occurred())
            return NULL;
        PyObject *cap = PyObject_GetAttr((PyObject *)tp, st->str_api);
        if (cap == NULL) {
            PyErr_Clear();
            cap = Py_None;
            Py_INCREF(cap);
        } else if (!PyCapsule_IsValid(cap, "dlpack_exchange_api")) {
            void *p = PyLong_Check(cap) ? PyLong_AsVoidPtr(cap) : NULL;
            PyErr_Clear();
            Py_DECREF(cap);
            cap = p ? PyCapsule_New(p, "dlpack_exchange_api", NULL) : (Py_INCREF(Py_None), Py_None);
            if (cap == NULL)
                return NULL;
        }
        if (cap != Py_None) {
            const DLPackExchangeAPI *api = PyCapsule_GetPointer(cap, "dlpack_exchange_api");
            if (api == NULL || api->header.version.major != DLPACK_MAJOR_VERSION ||
                api->managed_tensor_allocator == NULL || api->current_work_stream == NULL) {
                PyErr_Clear();
                Py_DECREF(cap);
                cap = Py_None;
                Py_INCREF(cap);
            }
        }
        int rc = PyDict_SetItem(st->api_cache, (PyObject *)tp, cap);
        Py_DECREF(cap);
        if (rc < 0)
            return NULL;
        cached = cap;
    }
    return cached == Py_None ? NULL : PyCapsule_GetPointer(cached, "dlpack_exchange_api");
}

/* Every field of a producer's DLTensor is checked before it is used: a malformed tensor gets
 * an exception that names the field, never a read through a bad pointer. */
static int fill_from_dltensor(ew_view *v, const DLTensor *t, uint64_t flags, const char *what)
{
    if (t->ndim < 0 || t->ndim > EW_MAXDIM) {
        PyErr_Format(PyExc_ValueError, "%s: %d dimensions (ewkern supports up to %d)", what,
                     (int)t->ndim, EW_MAXDIM);
        return -1;
    }
    if (t->ndim > 0 && t->shape == NULL) {
        PyErr_Format(PyExc_BufferError, "%s: malformed DLPack tensor: ndim is %d but shape is NULL",
                     what, (int)t->ndim);
        return -1;
    }
    if (ew_dtype_from_dl(t->dtype, &v->dtype) < 0)
        return -1;
    switch (t->device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
        v->device.type = EW_CPU;
        v->device.id = 0;
        break;
    case kDLCUDA:
    case kDLCUDAManaged:
        if (t->device.device_id < 0) {
            PyErr_Format(PyExc_ValueError, "%s: DLPack device id %d is negative (expected cuda:N, N >= 0)",
                         what, (int)t->device.device_id);
            return -1;
        }
        v->device.type = EW_CUDA;
        v->device.id = t->device.device_id;
        break;
    default:
        PyErr_Format(PyExc_ValueError,
                     "%s: unsupported DLPack device type %d (ewkern takes cpu and cuda arrays)", what,
                     (int)t->device.device_type);
        return -1;
    }
    const int64_t item = ew_dtype_size(v->dtype);
    int64_t size;
    if (ew_shape_size(what, t->ndim, t->shape, v->dtype, &size) < 0)
        return -1;
    memcpy(v->shape, t->shape, sizeof(int64_t) * t->ndim);
    v->ndim = t->ndim;
    v->size = size;
    if (v->size > 0 && t->strides) {   /* NULL strides: row-major (DLPack before 1.2) */
        int64_t expect = 1;
        for (int i = t->ndim - 1; i >= 0; i--) {
            if (t->shape[i] != 1 && t->strides[i] != expect) {
                PyErr_Format(PyExc_ValueError,
                             "%s is not C-contiguous: ewkern takes contiguous arrays only (make a contiguous "
                             "copy first, e.g. numpy.ascontiguousarray(x) or x.contiguous())", what);
                return -1;
            }
            expect *= t->shape[i];
        }
    }
    if (t->data == NULL && v->size > 0) {
        PyErr_Format(PyExc_ValueError, "%s: DLPack tensor has a NULL data pointer", what);
        return -1;
    }
    const uint64_t base = (uint64_t)(uintptr_t)t->data, nbytes = (uint64_t)(v->size * item);
    if (base > ew_address_limit || t->byte_offset > ew_address_limit - base ||
        nbytes > ew_address_limit - base - t->byte_offset) {
        PyErr_Format(PyExc_BufferError, "%s: malformed DLPack tensor: data %p + byte_offset %llu + %llu "
                     "bytes ends beyond the address space", what, t->data,
                     (unsigned long long)t->byte_offset, (unsigned long long)nbytes);
        return -1;
    }
    if (v->size > 0 && (base + t->byte_offset) % (uint64_t)item != 0) {
        PyErr_Format(PyExc_ValueError, "%s: data pointer + byte_offset (%p) is not aligned to the "
                     "%d-byte %s element", what, (void *)(uintptr_t)(base + t->byte_offset), (int)item,
                     ew_dtype_name(v->dtype));
        return -1;
    }
    v->data = (char *)t->data + t->byte_offset;
    v->readonly = (flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0;
    return 0;
}

/* Take a DLPack capsule: validate it, then rename it "used_..." and own its tensor. */
static int view_from_capsule(ew_view *v, PyObject *cap, const char *what)
{
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        DLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
        if (m->version.major != DLPACK_MAJOR_VERSION) {
            /* the spec: with another major version only the deleter may be touched, and the
             * consumer must call it */
            if (PyCapsule_SetName(cap, "used_dltensor_versioned") < 0)
                return -1;
            PyErr_Format(PyExc_BufferError, "%s: DLPack major version %u is not supported (ewkern "
                         "reads version %d)", what, m->version.major, DLPACK_MAJOR_VERSION);
            ew_release_managed(NULL, m);
            return -1;
        }
        if (fill_from_dltensor(v, &m->dl_tensor, m->flags, what) < 0)
            return -1;
        if (PyCapsule_SetName(cap, "used_dltensor_versioned") < 0)
            return -1;
        v->mtv = m;
        return 0;
    }
    if (PyCapsule_IsValid(cap, "dltensor")) {
        DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
        if (fill_from_dltensor(v, &m->dl_tensor, 0, what) < 0)
            return -1;
        if (PyCapsule_SetName(cap, "used_dltensor") < 0)
            return -1;
        v->mt = m;
        return 0;
    }
    const char *name = PyCapsule_GetName(cap);
    PyErr_Clear();
    if (name && strncmp(name, "used_", 5) == 0)
        PyErr_Format(PyExc_BufferError, "%s: this DLPack capsule was already consumed", what);
    else
        PyErr_Format(PyExc_TypeError,
                     "%s: expected a DLPack capsule named 'dltensor' or 'dltensor_versioned', got "
                     "one named %s%s%s", what, name ? "'" : "", name ? name : "NULL", name ? "'" : "");
    return -1;
}

static int view_from_array(ew_view *v, ArrayObject *a)
{
    v->data = a->data;
    v->ndim = a->ndim;
    memcpy(v->shape, a->shape, sizeof(int64_t) * a->ndim);
    v->size = a->size;
    v->dtype = a->dtype;
    v->device = a->device;
    v->readonly = a->readonly;
    v->kind = EW_KIND_ARRAY;
    return 0;
}

static int view_from_numpy(ew_state *st, ew_view *v, PyArrayObject *arr, const char *what)
{
    if (ew_dtype_from_descr(st, PyArray_DESCR(arr), &v->dtype) < 0)
        return -1;
    int nd = PyArray_NDIM(arr);
    if (nd > EW_MAXDIM) {
        PyErr_Format(PyExc_ValueError, "%s: %d dimensions (ewkern supports up to %d)", what, nd,
                     EW_MAXDIM);
        return -1;
    }
    if (!PyArray_IS_C_CONTIGUOUS(arr) || !PyArray_ISALIGNED(arr) || PyArray_ISBYTESWAPPED(arr)) {
        PyErr_Format(PyExc_ValueError,
                     "%s is not a C-contiguous, aligned, native-byte-order array: ewkern takes "
                     "contiguous arrays only (make one with numpy.ascontiguousarray(x))", what);
        return -1;
    }
    v->ndim = nd;
    v->size = 1;
    for (int i = 0; i < nd; i++) {
        v->shape[i] = PyArray_DIM(arr, i);
        v->size *= v->shape[i];
    }
    v->data = PyArray_DATA(arr);
    v->device.type = EW_CPU;
    v->device.id = 0;
    v->readonly = !PyArray_ISWRITEABLE(arr);
    v->kind = EW_KIND_NUMPY;
    return 0;
}

/* Call obj.__dlpack__(stream=..., max_version=(1, 3)); producers that predate max_version get
 * a second call without it. */
static PyObject *call_dlpack(ew_state *st, PyObject *obj, PyObject *stream_arg)
{
    PyObject *meth = PyObject_GetAttr(obj, st->str_dlpack);
    if (meth == NULL)
        return NULL;
    PyObject *maxv = Py_BuildValue("(ii)", DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION);
    if (maxv == NULL) {
        Py_DECREF(meth);
        return NULL;
    }
    PyObject *argv[2] = {stream_arg, maxv};
    PyObject *cap = PyObject_Vectorcall(meth, argv, 0, st->dlpack_kwnames);
    if (cap == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        PyObject *kw = PyTuple_GetSlice(st->dlpack_kwnames, 0, 1);
        if (kw) {
            cap = PyObject_Vectorcall(meth, argv, 0, kw);
            Py_DECREF(kw);
        }
    }
    Py_DECREF(maxv);
    Py_DECREF(meth);
    return cap;
}

/* torch's DLPack export (its exchange API and __dlpack__ alike) hands over a tensor with the
 * negative bit (torch._neg_view, the imaginary part of a real tensor's conj(): -x held as x)
 * without the bit, so its memory would be read, or written, with the wrong sign: refused, naming
 * the fix. Asked only of types that have is_neg (looked up once a type: a dict lookup a call). */
static int refuse_neg_bit(ew_state *st, PyObject *obj, const char *what)
{
    PyObject *tp = (PyObject *)Py_TYPE(obj);
    PyObject *has = PyDict_GetItemWithError(st->neg_cache, tp);   /* borrowed */
    if (has == NULL) {
        if (PyErr_Occurred())
            return -1;
        has = PyObject_HasAttr(tp, st->str_is_neg) ? Py_True : Py_False;
        if (PyDict_SetItem(st->neg_cache, tp, has) < 0)
            return -1;
    }
    if (has != Py_True)
        return 0;
    PyObject *r = PyObject_CallMethodNoArgs(obj, st->str_is_neg);
    if (r == NULL)
        return -1;
    int neg = r == Py_True;
    Py_DECREF(r);
    if (neg) {
        PyErr_Format(PyExc_ValueError, "%s: a torch tensor with the negative bit (torch._neg_view, the imaginary part "
                     "of a real tensor's conj()) holds -x in memory and torch's DLPack export drops the bit; pass "
                     "t.resolve_neg() (ewkern.torch's functions resolve it themselves)", what);
        return -1;
    }
    return 0;
}

static int view_from_protocol(ew_state *st, PyObject *obj, ew_view *v, const char *what, void *stream,
                              int have_stream)
{
    PyObject *devmeth = PyObject_GetAttr(obj, st->str_dlpack_device);
    if (devmeth != NULL && refuse_neg_bit(st, obj, what) < 0) {
        Py_DECREF(devmeth);
        return -1;
    }
    if (devmeth == NULL) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "%s: expected an array that supports DLPack (ewkern.Array, numpy.ndarray, "
                     "torch.Tensor, cupy.ndarray, jax.Array, ...), got %.200s", what,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    PyObject *dev = PyObject_CallNoArgs(devmeth);
    Py_DECREF(devmeth);
    if (dev == NULL)
        return -1;
    int dtype_code = 0, dev_id = 0;
    if (!PyTuple_Check(dev)) {   /* PyArg_ParseTuple takes only a tuple (a SystemError otherwise) */
        PyErr_Format(PyExc_TypeError, "%s: __dlpack_device__() must return a (device_type, device_id) tuple, "
                     "got %.200s", what, Py_TYPE(dev)->tp_name);
        Py_DECREF(dev);
        return -1;
    }
    if (!PyArg_ParseTuple(dev, "ii;__dlpack_device__() must return (device_type, device_id)",
                          &dtype_code, &dev_id)) {
        Py_DECREF(dev);
        return -1;
    }
    Py_DECREF(dev);
    PyObject *stream_arg;
    if (dtype_code == kDLCUDA || dtype_code == kDLCUDAManaged) {
        void *s = have_stream ? stream : ew_current_stream(st, dev_id, NULL);
        /* DLPack's numbering: 1 is the legacy default stream, other values are handles */
        stream_arg = s ? PyLong_FromVoidPtr(s) : PyLong_FromLong(1);
        if (stream_arg == NULL)
            return -1;
    } else {
        stream_arg = Py_None;
        Py_INCREF(stream_arg);
    }
    /* a CUDA producer exports with its device current (torch refuses otherwise: "Can't export
     * tensors on a different CUDA device index"); the caller's device is back right after. A
     * device that cannot be selected is left to the capsule's checks to name. */
    ew_device_guard g = EW_DEVICE_GUARD_INIT;
    ew_device d = {EW_CUDA, dev_id};
    if (stream_arg != Py_None && ew_device_enter(&g, d) < 0)
        PyErr_Clear();
    PyObject *cap = call_dlpack(st, obj, stream_arg);
    ew_device_exit(&g);
    Py_DECREF(stream_arg);
    if (cap == NULL)
        return -1;
    if (!PyCapsule_CheckExact(cap)) {
        PyErr_Format(PyExc_TypeError, "%s: __dlpack__() returned %.200s, not a DLPack capsule", what,
                     Py_TYPE(cap)->tp_name);
        Py_DECREF(cap);
        return -1;
    }
    int rc = view_from_capsule(v, cap, what);
    ew_saved_error e;
    ew_error_save(&e);
    Py_DECREF(cap);   /* an unconsumed capsule's destructor is producer code */
    ew_error_restore(&e);
    v->kind = EW_KIND_DLPACK;
    return rc;
}

int ew_view_from_object(ew_state *st, PyObject *obj, ew_view *v, const char *what, void *stream,
                        int have_stream)
{
    v->mt = NULL;
    v->mtv = NULL;
    v->api = NULL;
    v->obj = obj;
    if (Py_IS_TYPE(obj, st->Array_Type))
        return view_from_array(v, (ArrayObject *)obj);
    if (PyArray_Check(obj))
        return view_from_numpy(st, v, (PyArrayObject *)obj, what);
    const DLPackExchangeAPI *api = ew_exchange_api(st, Py_TYPE(obj));
    if (api) {
        if (refuse_neg_bit(st, obj, what) < 0)
            return -1;
        v->kind = EW_KIND_API;
        v->api = api;
        if (api->dltensor_from_py_object_no_sync) {
            DLTensor t;
            if (api->dltensor_from_py_object_no_sync(obj, &t) != 0)
                return -1;
            /* the producer gives no flags here; read-only tensors are rare in frameworks */
            return fill_from_dltensor(v, &t, 0, what);
        }
        DLManagedTensorVersioned *m = NULL;
        if (api->managed_tensor_from_py_object_no_sync(obj, &m) != 0)
            return -1;
        if (fill_from_dltensor(v, &m->dl_tensor, m->flags, what) < 0) {
            ew_release_managed(NULL, m);
            return -1;
        }
        v->mtv = m;
        return 0;
    }
    if (PyErr_Occurred())
        return -1;
    return view_from_protocol(st, obj, v, what, stream, have_stream);
}

void ew_view_release(ew_view *v)
{
    if (v->mt == NULL && v->mtv == NULL)
        return;   /* ewkern arrays and NumPy: nothing to release (the per-call fast path) */
    DLManagedTensor *mt = v->mt;
    DLManagedTensorVersioned *mtv = v->mtv;
    v->mt = NULL;
    v->mtv = NULL;
    ew_release_managed(mt, mtv);
}

int ew_views_overlap(const ew_view *a, const ew_view *b)
{
    const uintptr_t a0 = (uintptr_t)a->data, a1 = a0 + (uintptr_t)a->size * (uintptr_t)ew_dtype_size(a->dtype);
    const uintptr_t b0 = (uintptr_t)b->data, b1 = b0 + (uintptr_t)b->size * (uintptr_t)ew_dtype_size(b->dtype);
    return a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1;
}

PyObject *ew_from_dlpack(ew_state *st, PyObject *obj)
{
    ew_view v;
    memset(&v, 0, sizeof v);
    if (PyCapsule_CheckExact(obj)) {
        if (view_from_capsule(&v, obj, "from_dlpack") < 0)
            return NULL;
        PyObject *res = ew_array_from_view(st, &v, NULL);
        ew_view_release(&v);   /* only on failure is anything left to release */
        return res;
    }
    if (Py_IS_TYPE(obj, st->Array_Type)) {
        Py_INCREF(obj);
        return obj;
    }
    if (PyArray_Check(obj)) {
        if (view_from_numpy(st, &v, (PyArrayObject *)obj, "from_dlpack") < 0)
            return NULL;
        return ew_array_from_view(st, &v, obj);
    }
    if (view_from_protocol(st, obj, &v, "from_dlpack", NULL, 0) < 0)
        return NULL;
    PyObject *res = ew_array_from_view(st, &v, NULL);
    ew_view_release(&v);   /* only on failure is anything left to release */
    return res;
}

PyObject *ew_array_from_view(ew_state *st, ew_view *v, PyObject *base)
{
    ArrayObject *a = ew_array_alloc(st);
    if (a == NULL)
        return NULL;
    a->dtype = v->dtype;
    if (ew_array_set_shape(a, v->ndim, v->shape) < 0) {
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

/* ---- results that follow the inputs ------------------------------------------------------- */

static void set_error_cb(void *ctx, const char *kind, const char *message)
{
    PyObject *exc = PyExc_RuntimeError;
    if (kind && strcmp(kind, "MemoryError") == 0) exc = PyExc_MemoryError;
    else if (kind && strcmp(kind, "ValueError") == 0) exc = PyExc_ValueError;
    else if (kind && strcmp(kind, "TypeError") == 0) exc = PyExc_TypeError;
    PyErr_SetString(exc, message ? message : "allocation failed in the array's framework");
}

PyObject *ew_new_result(ew_state *st, const ew_view *like, ew_dtype dt, int ndim, const int64_t *shape,
                        void *stream, ew_view *outv)
{
    PyObject *res = NULL;
    memset(outv, 0, sizeof *outv);
    if (like->kind == EW_KIND_NUMPY) {
        PyArray_Descr *descr = (PyArray_Descr *)ew_numpy_descr(st, dt);
        if (descr == NULL)
            return NULL;
        npy_intp dims[EW_MAXDIM];
        for (int i = 0; i < ndim; i++)
            dims[i] = (npy_intp)shape[i];
        res = PyArray_Empty(ndim, dims, descr, 0);
        if (res == NULL)
            return NULL;
        if (view_from_numpy(st, outv, (PyArrayObject *)res, "out") < 0) {
            Py_DECREF(res);
            return NULL;
        }
        outv->obj = res;
        return res;
    }
    if (like->kind == EW_KIND_API) {
        DLTensor proto;
        memset(&proto, 0, sizeof proto);
        proto.device.device_type = like->device.type == EW_CPU ? kDLCPU : kDLCUDA;
        proto.device.device_id = like->device.id;
        proto.ndim = ndim;
        proto.dtype = ew_dtype_to_dl(dt);
        proto.shape = (int64_t *)shape;
        DLManagedTensorVersioned *m = NULL;
        if (like->api->managed_tensor_allocator(&proto, &m, NULL, set_error_cb) != 0 || m == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_MemoryError, "the array framework could not allocate the result");
            return NULL;
        }
        if (fill_from_dltensor(outv, &m->dl_tensor, m->flags, "result") < 0) {
            ew_release_managed(NULL, m);
            return NULL;
        }
        void *py = NULL;
        if (like->api->managed_tensor_to_py_object_no_sync(m, &py) != 0)
            return NULL;
        outv->kind = EW_KIND_API;
        outv->api = like->api;
        outv->obj = (PyObject *)py;
        return (PyObject *)py;
    }
    PyObject *stream_ref = NULL;
    if (like->device.type == EW_CUDA)
        (void)ew_current_stream(st, like->device.id, &stream_ref);
    res = ew_array_new(st, like->device, dt, ndim, shape, stream, stream_ref);
    if (res == NULL)
        return NULL;
    view_from_array(outv, (ArrayObject *)res);
    outv->obj = res;
    return res;
}

/* ---- asarray ------------------------------------------------------------------------------------- */

/* asarray(x, dtype=...) of a DLPack producer's integer or bool array (a torch or CuPy tensor), which
 * ewkern's arrays cannot hold: NumPy imports it on the host (from a CUDA device as a copy, asked with
 * dl_device CPU and copy=True, which torch and CuPy honour) and asarray converts that as it converts
 * NumPy's own integer arrays, onto the producer's device unless device= names another. Called with
 * the view import's error set; where obj is not such an array (NumPy cannot import it, or it holds
 * another dtype) that error is restored and NULL returned. */
static PyObject *asarray_foreign_ints(PyObject *module, PyObject *obj, PyObject *dtype_obj, PyObject *dev_obj)
{
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *np = NULL, *arr = NULL, *res = NULL, *devstr = NULL;
    long type = -1, id = 0;
    PyObject *d = PyObject_CallMethod(obj, "__dlpack_device__", NULL);
    if (d != NULL && PyTuple_Check(d) && PyTuple_GET_SIZE(d) == 2) {
        type = PyLong_AsLong(PyTuple_GET_ITEM(d, 0));
        id = PyLong_AsLong(PyTuple_GET_ITEM(d, 1));
    }
    Py_XDECREF(d);
    const int cuda = type == kDLCUDA || type == kDLCUDAManaged;
    if (PyErr_Occurred() || !(cuda || type == kDLCPU || type == kDLCUDAHost))
        goto restore;
    /* (a torch tensor with the negative bit never comes here: the view import refused it first) */
    np = PyImport_ImportModule("numpy");
    if (np == NULL)
        goto restore;
    {
        PyObject *fn = PyObject_GetAttrString(np, "from_dlpack");
        PyObject *a = fn ? PyTuple_Pack(1, obj) : NULL;
        PyObject *kw = a ? Py_BuildValue("{s:s,s:O}", "device", "cpu", "copy", cuda ? Py_True : Py_None) : NULL;
        arr = kw ? PyObject_Call(fn, a, kw) : NULL;
        Py_XDECREF(kw);
        Py_XDECREF(a);
        Py_XDECREF(fn);
    }
    if (arr == NULL || !PyArray_Check(arr) ||
        !(PyArray_ISBOOL((PyArrayObject *)arr) || PyArray_ISINTEGER((PyArrayObject *)arr)))
        goto restore;
    Py_XDECREF(et);
    Py_XDECREF(ev);
    Py_XDECREF(tb);
    devstr = dev_obj != Py_None ? (Py_INCREF(dev_obj), dev_obj)
             : cuda ? PyUnicode_FromFormat("cuda:%ld", id) : PyUnicode_FromString("cpu");
    res = devstr ? PyObject_CallMethod(module, "asarray", "OOO", arr, dtype_obj, devstr) : NULL;
    Py_XDECREF(devstr);
    Py_DECREF(arr);
    Py_DECREF(np);
    return res;
restore:
    Py_XDECREF(arr);
    Py_XDECREF(np);
    PyErr_Clear();
    PyErr_Restore(et, ev, tb);
    return NULL;
}

/* asarray(obj, dtype=None, device=None): zero-copy when dtype and device already match. */
PyObject *ew_asarray(PyObject *module, PyObject *args, PyObject *kwds)
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
    /* a NumPy array of integers or bools with dtype= given: cast on the host (the copy dtype= asks
     * for anyway; ewkern's arrays hold floating types only, so its view import refuses it without) */
    if (dtype_obj != Py_None && PyArray_Check(obj) &&
        (PyArray_ISBOOL((PyArrayObject *)obj) || PyArray_ISINTEGER((PyArrayObject *)obj))) {
        Py_SETREF(src, (PyObject *)PyArray_Cast((PyArrayObject *)obj, NPY_FLOAT64));
        if (src == NULL)
            return NULL;
    }
    int is_array_like = Py_IS_TYPE(obj, st->Array_Type) || PyArray_Check(obj) ||
                        PyObject_HasAttr(obj, st->str_dlpack);
    if (!is_array_like) {
        /* Python sequences and scalars: through NumPy; ints and bools become float64 */
        PyObject *np = PyArray_FromAny(obj, NULL, 0, 0, NPY_ARRAY_DEFAULT, NULL);
        Py_DECREF(src);
        if (np == NULL)
            return NULL;
        /* numbers only: None, objects and strings would become object or string arrays, complex
         * values would lose their imaginary part in the cast */
        if (!PyArray_ISBOOL((PyArrayObject *)np) && !PyArray_ISINTEGER((PyArrayObject *)np) &&
            !PyArray_ISFLOAT((PyArrayObject *)np)) {
            PyErr_Format(PyExc_TypeError, "asarray: expected an array, a real number or a sequence of real numbers, "
                         "got %.200s (as NumPy dtype %S)", Py_TYPE(obj)->tp_name, PyArray_DESCR((PyArrayObject *)np));
            Py_DECREF(np);
            return NULL;
        }
        if (!PyArray_ISFLOAT((PyArrayObject *)np)) {
            /* float64 holds every int of |x| <= 2^53 exactly: a dtype= given rounds from there once */
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
    if (ew_view_from_object(st, src, &v, "asarray", NULL, 0) < 0) {
        /* is_array_like and neither NumPy's nor ewkern's: a DLPack producer, taken as it is */
        if (dtype_obj != Py_None && is_array_like && src == obj && !PyArray_Check(obj) &&
            !Py_IS_TYPE(obj, st->Array_Type) && PyErr_ExceptionMatches(PyExc_TypeError))
            res = asarray_foreign_ints(module, obj, dtype_obj, dev_obj);
        goto done;
    }
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
            /* a subclass (np.ma, np.memmap, a user's) as its base ndarray: astype keeps the subclass */
            host = PyArray_CheckExact(src) ? (Py_INCREF(src), src)
                   : PyArray_Check(src) ? PyArray_View((PyArrayObject *)src, NULL, &PyArray_Type)
                   : PyObject_CallMethod(src, "numpy", NULL);
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
        res = devstr ? PyObject_CallMethod(module, "asarray", "OOO", conv, Py_None, devstr) : NULL;
        Py_XDECREF(devstr);
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
