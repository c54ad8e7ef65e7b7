/*
 * rtc.c: floor 4 (see state.h), beside ops. The C side of run-time kernels (ewkern/rtc/, ewkern.ElementwiseKernel and
 * ewkern.ReductionKernel). Python generates and compiles the code; this file views the arrays,
 * allocates results and, in CUDA builds, loads and launches the compiled image:
 *
 *   _rtc_views(objs, names)           C-contiguous DLPack views (ptr, dtype, device, shape, readonly)
 *                                     and the stream to launch on, by the rule of ewkern's ops: the
 *                                     current work stream of the first array's framework (torch)
 *                                     when it has the DLPack exchange API, else ewkern's current
 *                                     stream, passed to every producer's __dlpack__.
 *   _rtc_result(like, dtype, shape)   a result in like's framework (ew_new_result).
 *   _rtc_sig(args, scalars)           a call's signature (bytes): the key of a recorded plan.
 *   _rtc_fast(plans, args, nin, extra, scalars)
 *                                     a warm call run by its recorded plan (ewkern/rtc/_kernel.py's
 *                                     _fast_call in C), or NotImplemented where it cannot decide.
 *   _rtc_load(image, name, device)    cudaLibraryLoadData + cudaLibraryGetKernel; the library stays
 *                                     loaded for the life of the process (the Python cache keeps
 *                                     one handle per (image, device)).
 *   _rtc_launch(kernel, grid, block, params, device, stream, pdl[, smem])
 *                                     cudaLaunchKernelExC with one by-value parameter (the bytes of
 *                                     the generated kernel's argument struct) and smem bytes of
 *                                     dynamic shared memory (default 0).
 *   _rtc_occupancy(kernel, block, device)
 *                                     resident blocks per SM of a loaded kernel.
 *   _rtc_cap(kernel, block, device, blocks)
 *                                     the dynamic shared memory that keeps a loaded kernel's
 *                                     launches to `blocks` blocks an SM (ewcuda_kernel_cap), 0
 *                                     where none applies.
 *   _rtc_attrs(kernel, device)        (registers a thread, local memory bytes a thread) of a loaded
 *                                     kernel (cudaFuncGetAttributes): local bytes are spills (the
 *                                     generated kernels keep no local arrays).
 *   _auto_plan(nvec, nedge, block, wave1, wave4, i32, pdl, fill, heavy16, heavy64, heavy16_from[, wide[,
 *              heavy_math]])
 *                                     the same rule with every input given (ewcuda_auto_plan_rule):
 *                                     what the tests check the built-in ops' launches against.
 *   _rtc_plan(device, nvec, nedge, block, wave1, wave4, i32, heavy, elems, pdl[, wide[, max_vpt]])
 *                                     (vectors per thread, grid, prefetch) by the default path's
 *                                     launch rule (ewcuda_auto_plan), for the vector kernels of
 *                                     ewkern/rtc/_codegen.py; wide as the rule's (a programmatic
 *                                     launch on a device of >= 30 GB/s an SM; the caller decides:
 *                                     the vector rule's; the prefetch rule takes none);
 *                                     max_vpt: the most vectors a thread of the forms that do
 *                                     not spill (1, 2 or 4, default 4).
 *   _rtc_store_wb(device, bytes[, out_bytes])
 *                                     whether a vector kernel's launch that moves `bytes` and
 *                                     writes `out_bytes` of them (default 0) stores write-back
 *                                     (True) or streaming (False), by the default path's store
 *                                     rule (ewcuda_store_wb).
 *   _rtc_fpe_guard(address)           the CPU backend's guard for integer division (below): the
 *                                     executable segment of the library holding address joins
 *                                     the guarded code; True where the guard works (Linux x86_64).
 */
#include "rtc.h"

#include "device.h"
#include "dlpack.h"
#include "dtype.h"
#include "state.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "cuda_api.h"

static int rtc_pick_stream(ew_state *st, const ew_view *first, void **stream)
{
    *stream = NULL;
    if (first->device.type != EW_CUDA)
        return 0;
    if (first->kind == EW_KIND_API)
        return first->api->current_work_stream(kDLCUDA, first->device.id, stream) == 0 ? 0 : -1;
    *stream = ew_current_stream(st, first->device.id, NULL);
    return 0;
}

static PyObject *view_tuple(const ew_view *v)
{
    PyObject *shape = PyTuple_New(v->ndim);
    if (shape == NULL)
        return NULL;
    for (int d = 0; d < v->ndim; d++) {
        PyObject *n = PyLong_FromLongLong(v->shape[d]);
        if (n == NULL) {
            Py_DECREF(shape);
            return NULL;
        }
        PyTuple_SET_ITEM(shape, d, n);
    }
    PyObject *dev = ew_device_str(v->device);
    if (dev == NULL) {
        Py_DECREF(shape);
        return NULL;
    }
    return Py_BuildValue("(KsNNO)", (unsigned long long)(uintptr_t)v->data, ew_dtype_name(v->dtype), dev, shape,
                         v->readonly ? Py_True : Py_False);
}

PyObject *ew_rtc_views(PyObject *module, PyObject *args)
{
    PyObject *objs, *names;
    if (!PyArg_ParseTuple(args, "O!O!:_rtc_views", &PyTuple_Type, &objs, &PyTuple_Type, &names))
        return NULL;
    const Py_ssize_t n = PyTuple_GET_SIZE(objs);
    if (PyTuple_GET_SIZE(names) != n) {
        PyErr_SetString(PyExc_ValueError, "_rtc_views: objs and names differ in length");
        return NULL;
    }
    ew_state *st = ew_get_state(module);
    PyObject *views = PyTuple_New(n), *res = NULL;
    if (views == NULL)
        return NULL;
    void *stream = NULL;
    int have_stream = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(names, i));
        if (name == NULL)
            goto done;
        ew_view v;
        if (ew_view_from_object(st, PyTuple_GET_ITEM(objs, i), &v, name, stream, have_stream) < 0)
            goto done;
        if (!have_stream) {
            if (rtc_pick_stream(st, &v, &stream) < 0) {
                ew_view_release(&v);
                goto done;
            }
            have_stream = 1;
        }
        PyObject *t = view_tuple(&v);
        ew_view_release(&v);   /* the producer object (alive in objs) still owns the memory */
        if (t == NULL)
            goto done;
        PyTuple_SET_ITEM(views, i, t);
    }
    res = Py_BuildValue("(OK)", views, (unsigned long long)(uintptr_t)stream);
done:
    Py_DECREF(views);
    return res;
}

PyObject *ew_rtc_result(PyObject *module, PyObject *args)
{
    PyObject *like, *dtobj, *shapeobj;
    if (!PyArg_ParseTuple(args, "OOO!:_rtc_result", &like, &dtobj, &PyTuple_Type, &shapeobj))
        return NULL;
    ew_state *st = ew_get_state(module);
    ew_dtype dt;
    if (ew_dtype_from_py(st, dtobj, &dt) < 0)
        return NULL;
    const Py_ssize_t ndim = PyTuple_GET_SIZE(shapeobj);
    if (ndim > EW_MAXDIM) {
        PyErr_Format(PyExc_ValueError, "_rtc_result: %zd dimensions (ewkern supports up to %d)", ndim, EW_MAXDIM);
        return NULL;
    }
    int64_t shape[EW_MAXDIM];
    for (Py_ssize_t d = 0; d < ndim; d++) {
        shape[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(shapeobj, d));
        if (shape[d] == -1 && PyErr_Occurred())
            return NULL;
    }
    int64_t size;
    if (ew_shape_size("result", (int)ndim, shape, dt, &size) < 0)
        return NULL;
    ew_view v, outv;
    if (ew_view_from_object(st, like, &v, "input", NULL, 0) < 0)
        return NULL;
    PyObject *res = NULL;
    void *stream = NULL;
    ew_device_guard g = EW_DEVICE_GUARD_INIT;
    if (rtc_pick_stream(st, &v, &stream) < 0)
        goto done;
    if (v.device.type == EW_CUDA && ew_device_enter(&g, v.device) < 0)
        goto done;
    res = ew_new_result(st, &v, dt, (int)ndim, shape, stream, &outv);
    if (res != NULL)
        ew_view_release(&outv);
done:
    ew_device_exit(&g);
    ew_view_release(&v);
    return res;
}

/* ---- warm calls by plan -----------------------------------------------------------------------
 * The C twin of ewkern/rtc/_kernel.py's _fast_call (which stays the reference and the fallback):
 * the arguments' signature, the plan's lookup, the checks of given outputs, the results'
 * allocation and the argument struct's bytes, with one Python call left: the plan's run(buf,
 * stream). Anything it cannot decide is a miss (NotImplemented, no exception): the caller takes
 * the Python path, which raises what is wrong. */

enum { RTC_FAST_MAX = 64 };

typedef struct rtc_fast_args {
    Py_ssize_t n;
    int first;                       /* index of the first array argument, or -1 */
    char is_arr[RTC_FAST_MAX];
    ew_view v[RTC_FAST_MAX];
    void *stream;
} rtc_fast_args;

static void rtc_fast_release(rtc_fast_args *a)
{
    for (Py_ssize_t i = 0; i < a->n; i++)
        if (a->is_arr[i])
            ew_view_release(&a->v[i]);
}

/* Whether o is a scalar: a Python float, int or bool, or an instance of `scalars` (the user
 * kernels' tuple of NumPy's number types, _kernel.py's _SCALARS), decided once a type. Asked of
 * every argument of a warm call: isinstance against that tuple of 21 types cost about 1 us a torch
 * tensor on the CPU host (each type's check falls back to asking the tensor's __class__), 3 us
 * of a warm ElementwiseKernel(out=) call on three torch tensors on the H100's host. 1, 0, or -1
 * with an exception. */
static int rtc_is_scalar(ew_state *st, PyObject *o, PyObject *scalars)
{
    if (PyFloat_CheckExact(o) || PyLong_CheckExact(o) || PyBool_Check(o))
        return 1;
    if (Py_IS_TYPE(o, st->Array_Type))
        return 0;
    if (st->scalar_types != scalars) {   /* a tuple other than the one the cache answers for */
        PyDict_Clear(st->scalar_cache);
        Py_INCREF(scalars);
        Py_XSETREF(st->scalar_types, scalars);
    }
    PyObject *tp = (PyObject *)Py_TYPE(o);
    PyObject *known = PyDict_GetItemWithError(st->scalar_cache, tp);   /* borrowed */
    if (known != NULL)
        return known == Py_True;
    if (PyErr_Occurred())
        return -1;
    const int sc = PyObject_IsSubclass(tp, scalars);
    if (sc < 0 || PyDict_SetItem(st->scalar_cache, tp, sc ? Py_True : Py_False) < 0)
        return -1;
    return sc;
}

/* View every argument that is not a scalar (rtc_is_scalar). 1: done; 0: a miss (no exception;
 * nothing left to release). */
static int rtc_fast_view(ew_state *st, PyObject *const *args, Py_ssize_t n, PyObject *scalars, rtc_fast_args *a)
{
    a->n = 0;
    a->first = -1;
    a->stream = NULL;
    if (n > RTC_FAST_MAX)
        return 0;
    int have_stream = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = args[i];
        const int sc = rtc_is_scalar(st, o, scalars);
        if (sc < 0)
            goto miss;
        a->is_arr[i] = (char)!sc;
        a->n = i;
        if (sc)
            continue;
        if (ew_view_from_object(st, o, &a->v[i], "argument", a->stream, have_stream) < 0)
            goto miss;
        a->n = i + 1;
        if (a->first < 0) {
            a->first = (int)i;
            if (rtc_pick_stream(st, &a->v[i], &a->stream) < 0)
                goto miss;
            have_stream = 1;
        }
    }
    a->n = n;
    return 1;
miss:
    PyErr_Clear();
    rtc_fast_release(a);
    a->n = 0;
    return 0;
}

/* The signature of viewed arguments, as bytes: per argument -1 for a scalar, or its dtype,
 * dimensions, shape, device and data pointer modulo 16 (which decides the vector head). */
static PyObject *rtc_fast_sig(const rtc_fast_args *a)
{
    int64_t buf[RTC_FAST_MAX * (EW_MAXDIM + 5)];
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < a->n; i++) {
        if (!a->is_arr[i]) {
            buf[k++] = -1;
            continue;
        }
        const ew_view *v = &a->v[i];
        buf[k++] = (int64_t)v->dtype;
        buf[k++] = v->ndim;
        for (int d = 0; d < v->ndim; d++)
            buf[k++] = v->shape[d];
        buf[k++] = v->device.type;
        buf[k++] = v->device.id;
        buf[k++] = (int64_t)((uintptr_t)v->data & 15);
    }
    return PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)(k * sizeof(int64_t)));
}

/* _rtc_sig(args, scalars): the signature bytes of a call's arguments, or None where they cannot
 * be viewed (the key _rtc_fast looks up, with the kernel's keyword arguments beside it). */
PyObject *ew_rtc_sig(PyObject *module, PyObject *args)
{
    PyObject *call_args, *scalars;
    if (!PyArg_ParseTuple(args, "O!O:_rtc_sig", &PyTuple_Type, &call_args, &scalars))
        return NULL;
    ew_state *st = ew_get_state(module);
    rtc_fast_args *a = PyMem_Malloc(sizeof *a);
    if (a == NULL)
        return PyErr_NoMemory();
    PyObject *res;
    if (rtc_fast_view(st, &PyTuple_GET_ITEM(call_args, 0), PyTuple_GET_SIZE(call_args), scalars, a)) {
        res = rtc_fast_sig(a);
        rtc_fast_release(a);
    } else {
        res = Py_NewRef(Py_None);
    }
    PyMem_Free(a);
    return res;
}

/* Whether given output o (any index >= nin) overlaps an input other than as the very same view
 * (strict: at all, the same view included; a kernel with raw parameters, which index anywhere). */
static int rtc_fast_overlap(const rtc_fast_args *a, Py_ssize_t nin, Py_ssize_t o, int strict)
{
    const ew_view *w = &a->v[o];
    for (Py_ssize_t i = 0; i < nin && i < a->n; i++) {
        if (!a->is_arr[i])
            continue;
        const ew_view *v = &a->v[i];
        if (ew_views_overlap(v, w)) {
            int same = v->data == w->data && v->dtype == w->dtype && v->ndim == w->ndim;
            for (int d = 0; same && d < v->ndim; d++)
                same = v->shape[d] == w->shape[d];
            if (!same || strict)
                return 1;
        }
    }
    return 0;
}

/* _rtc_fast(plans, args, nin, extra, scalars): run a call by the plan recorded for its signature
 * (plans: {(signature bytes, extra): plan}), or NotImplemented for a miss. A plan is the tuple
 * (template bytes, pointer slots, scalar slots, outputs, run, ret): slots as bytes of int64
 * triples, (offset, argument, bytes added) and (offset, 0 float32 | 1 float64, argument), with
 * the new outputs numbered after the arguments; outputs ((dtype name, shape), ...) allocated like
 * the first array; run: the launches as bytes (ew_rtc_run's program, run here without the GIL),
 * or a Python run(buf, stream); ret 0: None, 1: the first result, 2: every result. An optional
 * seventh item, hidden: how many of the last outputs are the kernel's own scratch (a
 * RowKernel's partial rows for its column sums), allocated and held through run but not returned. */
PyObject *ew_rtc_fast(PyObject *module, PyObject *const *fargs, Py_ssize_t nfargs)
{
    if (nfargs != 5 || !PyDict_Check(fargs[0]) || !PyTuple_Check(fargs[1])) {
        PyErr_SetString(PyExc_TypeError, "_rtc_fast(plans, args, nin, extra, scalars)");
        return NULL;
    }
    PyObject *plans = fargs[0], *call_args = fargs[1], *extra = fargs[3], *scalars = fargs[4];
    const Py_ssize_t nin = PyLong_AsSsize_t(fargs[2]);
    if (nin == -1 && PyErr_Occurred())
        return NULL;
    ew_state *st = ew_get_state(module);
    const Py_ssize_t n = PyTuple_GET_SIZE(call_args);
    rtc_fast_args a;
    if (!rtc_fast_view(st, &PyTuple_GET_ITEM(call_args, 0), n, scalars, &a) || a.first < 0) {
        if (a.first >= 0)
            rtc_fast_release(&a);
        Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject *res = NULL, *key = NULL, *plan = NULL, *news = NULL, *buf = NULL, *stream_obj = NULL;
    int miss = 1;
    ew_device_guard g = EW_DEVICE_GUARD_INIT;
    PyObject *sig = rtc_fast_sig(&a);
    if (sig == NULL)
        goto done;
    key = PyTuple_Pack(2, sig, extra);
    Py_DECREF(sig);
    if (key == NULL)
        goto done;
    /* held for the whole call: run() may let another thread clear the kernel's plans */
    plan = Py_XNewRef(PyDict_GetItemWithError(plans, key));
    if (plan == NULL || !PyTuple_Check(plan) || PyTuple_GET_SIZE(plan) < 6 || PyTuple_GET_SIZE(plan) > 8) {
        PyErr_Clear();
        goto done;
    }
    PyObject *tmpl = PyTuple_GET_ITEM(plan, 0), *pslots = PyTuple_GET_ITEM(plan, 1),
             *sslots = PyTuple_GET_ITEM(plan, 2), *outs = PyTuple_GET_ITEM(plan, 3), *run = PyTuple_GET_ITEM(plan, 4);
    const long ret = PyLong_AsLong(PyTuple_GET_ITEM(plan, 5));
    if (!PyBytes_Check(tmpl) || !PyBytes_Check(pslots) || !PyBytes_Check(sslots) || !PyTuple_Check(outs)) {
        PyErr_Clear();
        goto done;
    }
    /* given outputs: none read-only, none overlapping an input other than as itself (a plan's
     * eighth item true, a kernel with raw parameters: none overlapping at all; Python's path
     * reads such an input from a copy) */
    const int strict = PyTuple_GET_SIZE(plan) == 8 && PyTuple_GET_ITEM(plan, 7) == Py_True;
    for (Py_ssize_t o = nin; o < n; o++)
        if (a.is_arr[o] && (a.v[o].readonly || rtc_fast_overlap(&a, nin, o, strict)))
            goto done;
    const Py_ssize_t nout = PyTuple_GET_SIZE(outs);
    const Py_ssize_t hidden = PyTuple_GET_SIZE(plan) >= 7 ? PyLong_AsSsize_t(PyTuple_GET_ITEM(plan, 6)) : 0;
    if (n + nout > RTC_FAST_MAX || hidden < 0 || hidden > nout) {
        PyErr_Clear();
        goto done;
    }
    uint64_t ptrs[RTC_FAST_MAX];
    for (Py_ssize_t i = 0; i < n; i++)
        ptrs[i] = a.is_arr[i] ? (uint64_t)(uintptr_t)a.v[i].data : 0;
    /* scalars first: a value this path does not convert (NumPy's scalars, other types) is a miss
     * before anything is allocated */
    const Py_ssize_t nss = PyBytes_GET_SIZE(sslots) / (3 * (Py_ssize_t)sizeof(int64_t));
    const int64_t *ss = (const int64_t *)PyBytes_AS_STRING(sslots);
    const Py_ssize_t tlen = PyBytes_GET_SIZE(tmpl);
    double svals[RTC_FAST_MAX];
    if (nss > RTC_FAST_MAX)
        goto done;
    for (Py_ssize_t j = 0; j < nss; j++) {
        const int64_t off = ss[3 * j], kind = ss[3 * j + 1], k = ss[3 * j + 2];
        if (k < 0 || k >= n || a.is_arr[k] || off < 0 || off + (kind ? 8 : 4) > tlen)
            goto done;
        PyObject *x = PyTuple_GET_ITEM(call_args, k);
        if (PyFloat_CheckExact(x)) {
            svals[j] = PyFloat_AS_DOUBLE(x);
        } else if (PyLong_CheckExact(x) || PyBool_Check(x)) {
            /* exact in a double only up to 2^53; past it NumPy rounds the integer once, from int64 */
            int over;
            const long long v = PyLong_AsLongLongAndOverflow(x, &over);
            if (over || (v == -1 && PyErr_Occurred()) || v > (1LL << 53) || v < -(1LL << 53)) {
                PyErr_Clear();
                goto done;
            }
            svals[j] = (double)v;
        } else {
            goto done;   /* NumPy's scalars and the rest: Python's _scalar_value */
        }
    }
    if (nout > 0) {
        news = PyTuple_New(nout);
        if (news == NULL)
            goto done;
        const ew_view *like = &a.v[a.first];
        if (like->device.type == EW_CUDA && ew_device_enter(&g, like->device) < 0) {
            PyErr_Clear();
            goto done;
        }
        for (Py_ssize_t j = 0; j < nout; j++) {
            PyObject *spec = PyTuple_GET_ITEM(outs, j);
            ew_dtype dt;
            int64_t shape[EW_MAXDIM];
            PyObject *shp = PyTuple_Check(spec) && PyTuple_GET_SIZE(spec) == 2 ? PyTuple_GET_ITEM(spec, 1) : NULL;
            if (shp == NULL || !PyTuple_Check(shp) || PyTuple_GET_SIZE(shp) > EW_MAXDIM ||
                ew_dtype_from_py(st, PyTuple_GET_ITEM(spec, 0), &dt) < 0) {
                PyErr_Clear();
                goto done;
            }
            const int nd = (int)PyTuple_GET_SIZE(shp);
            for (int d = 0; d < nd; d++)
                shape[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(shp, d));
            ew_view outv;
            PyObject *r = ew_new_result(st, like, dt, nd, shape, a.stream, &outv);
            if (r == NULL)
                goto fail;   /* out of memory: the same error the Python path would meet */
            ptrs[n + j] = (uint64_t)(uintptr_t)outv.data;
            ew_view_release(&outv);
            PyTuple_SET_ITEM(news, j, r);
        }
    }
    buf = PyByteArray_FromStringAndSize(PyBytes_AS_STRING(tmpl), tlen);
    if (buf == NULL)
        goto fail;
    char *b = PyByteArray_AS_STRING(buf);
    const Py_ssize_t nps = PyBytes_GET_SIZE(pslots) / (3 * (Py_ssize_t)sizeof(int64_t));
    const int64_t *ps = (const int64_t *)PyBytes_AS_STRING(pslots);
    for (Py_ssize_t j = 0; j < nps; j++) {
        const int64_t off = ps[3 * j], k = ps[3 * j + 1], add = ps[3 * j + 2];
        if (k < 0 || k >= n + nout || off < 0 || off + 8 > tlen)
            goto done;
        const uint64_t p = ptrs[k] + (uint64_t)add;
        memcpy(b + off, &p, 8);
    }
    for (Py_ssize_t j = 0; j < nss; j++) {
        const int64_t off = ss[3 * j];
        if (ss[3 * j + 1]) {
            memcpy(b + off, &svals[j], 8);
        } else {
            const float f = (float)svals[j];
            memcpy(b + off, &f, 4);
        }
    }
    const ew_device like_dev = a.v[a.first].device;
    rtc_fast_release(&a);
    a.n = 0;
    miss = 0;
    if (PyBytes_Check(run)) {
        /* the launches as data (ew_rtc_run), with the device current and without the GIL */
        if (like_dev.type == EW_CUDA && nout == 0 && ew_device_enter(&g, like_dev) < 0)
            goto fail;   /* (with results to allocate it is current already) */
        char msg[160];
        int err;
        const int64_t *prog = (const int64_t *)PyBytes_AS_STRING(run);
        const int64_t nw = PyBytes_GET_SIZE(run) / (Py_ssize_t)sizeof(int64_t);
        char *params = PyByteArray_AS_STRING(buf);
        void *stream = a.stream;
        Py_BEGIN_ALLOW_THREADS
        err = ew_rtc_run(prog, nw, params, tlen, stream, msg, sizeof msg);
        Py_END_ALLOW_THREADS
        if (err != 0) {
            if (err < 0)
                PyErr_SetString(PyExc_RuntimeError, msg);
            else
                ew_raise_cuda(err, "a run-time kernel's launch");
            goto fail;
        }
    } else {
        stream_obj = PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)a.stream);
        if (stream_obj == NULL)
            goto fail;
        ew_device_exit(&g);
        PyObject *r = PyObject_CallFunctionObjArgs(run, buf, stream_obj, NULL);
        if (r == NULL)
            goto fail;
        Py_DECREF(r);
    }
    if (ret == 0) {
        res = Py_NewRef(Py_None);
    } else {
        const Py_ssize_t ngiven = n > nin ? n - nin : 0;
        const Py_ssize_t nshown = nout - hidden;
        if (ret == 1) {
            res = Py_NewRef(ngiven ? PyTuple_GET_ITEM(call_args, nin) : nshown ? PyTuple_GET_ITEM(news, 0) : Py_None);
        } else {
            res = PyTuple_New(ngiven + nshown);
            if (res == NULL)
                goto fail;
            for (Py_ssize_t j = 0; j < ngiven; j++)
                PyTuple_SET_ITEM(res, j, Py_NewRef(PyTuple_GET_ITEM(call_args, nin + j)));
            for (Py_ssize_t j = 0; j < nshown; j++)
                PyTuple_SET_ITEM(res, ngiven + j, Py_NewRef(PyTuple_GET_ITEM(news, j)));
        }
    }
    goto out;
done:   /* a miss */
    if (miss) {
        PyErr_Clear();
        res = Py_NewRef(Py_NotImplemented);
    }
    goto out;
fail:   /* an error the caller must see */
    res = NULL;
out:
    ew_device_exit(&g);
    rtc_fast_release(&a);
    Py_XDECREF(key);
    Py_XDECREF(plan);
    Py_XDECREF(news);
    Py_XDECREF(buf);
    Py_XDECREF(stream_obj);
    return res;
}

#if EWKERN_WITH_CUDA
static int rtc_run_error(int err, char *msg, size_t msglen)
{
    snprintf(msg, msglen, "a run-time kernel's launch: CUDA error %s (%d): %s", ewcuda_error_name(err), err,
             ewcuda_error_string(err));
    return err;
}
#endif

/* ew_rtc_run (rtc.h): a C plan's launches, run without Python. */
int ew_rtc_run(const int64_t *w, int64_t nwords, char *params, int64_t plen, void *stream, char *msg, size_t msglen)
{
#if EWKERN_WITH_CUDA
    const int pdl_on = ewcuda_pdl_get();
#endif
    int64_t i = 0;
    while (i < nwords) {
        const int64_t tag = w[i];
        const int64_t len = tag == EW_PROG_LAUNCH ? EW_PROG_LAUNCH_WORDS
                          : tag == EW_PROG_LAUNCH_CAP ? EW_PROG_LAUNCH_CAP_WORDS
                          : tag == EW_PROG_COLSUM ? EW_PROG_COLSUM_WORDS
                          : tag == EW_PROG_CPU    ? EW_PROG_CPU_WORDS : 0;
        if (len == 0 || i + len > nwords) {
            snprintf(msg, msglen, "a run-time kernel's plan: a malformed launch record at word %lld", (long long)i);
            return -1;
        }
        const int64_t *r = w + i;
        i += len;
        if (tag == EW_PROG_CPU) {
            if (r[1] == 0 || r[2] < 1 || r[2] > INT_MAX) {
                snprintf(msg, msglen, "a run-time kernel's plan: a CPU launch without a kernel address");
                return -1;
            }
            void (*entry)(const void *, int) = (void (*)(const void *, int))(uintptr_t)r[1];
            entry(params, (int)r[2]);
            continue;
        }
#if EWKERN_WITH_CUDA
        if (tag == EW_PROG_LAUNCH || tag == EW_PROG_LAUNCH_CAP) {
            const int64_t *set = r + (pdl_on ? 6 : 3);   /* grid, prefetch, handle */
            const int64_t poff = r[9], wboff = r[10];
            const int64_t smem = tag == EW_PROG_LAUNCH_CAP ? r[pdl_on ? 13 : 12] : 0;
            if (set[0] < 1 || set[0] > 0x7fffffffLL || r[2] < 1 || r[2] > 1024 || (poff >= 0 && poff + 8 > plen) ||
                (wboff >= 0 && wboff + 8 > plen) || smem < 0 || smem > INT_MAX) {
                snprintf(msg, msglen, "a run-time kernel's plan: grid %lld, block %lld, smem %lld", (long long)set[0],
                         (long long)r[2], (long long)smem);
                return -1;
            }
            if (poff >= 0)
                memcpy(params + poff, &set[1], 8);
            if (wboff >= 0)
                memcpy(params + wboff, &r[11], 8);
            void *p = params;
            const int err = ewcuda_launch_kernel((void *)(uintptr_t)set[2], (unsigned)set[0], (unsigned)r[2], &p,
                                                 stream, pdl_on && ewcuda_pdl_active((int)r[1]), smem);
            if (err != 0)
                return rtc_run_error(err, msg, msglen);
            continue;
        }
        /* EW_PROG_COLSUM: {partials, out, partial rows, columns} */
        int64_t cs[4];
        if (r[7] < 0 || r[7] + 16 > plen || r[4] < 1 || r[4] > 0x7fffffffLL || r[3] < 1 || r[3] > 1024) {
            snprintf(msg, msglen, "a run-time kernel's plan: a column sum's record out of bounds");
            return -1;
        }
        memcpy(cs, params + r[7], 16);
        cs[2] = r[5];
        cs[3] = r[6];
        void *p = cs;
        const int err = ewcuda_launch_kernel((void *)(uintptr_t)r[1], (unsigned)r[4], (unsigned)r[3], &p, stream,
                                             pdl_on && ewcuda_pdl_active((int)r[2]), 0);
        if (err != 0)
            return rtc_run_error(err, msg, msglen);
#else
        snprintf(msg, msglen, "a run-time kernel's plan launches on CUDA in a build without it");
        return -1;
#endif
    }
    return 0;
}

#if EWKERN_WITH_CUDA
PyObject *ew_rtc_load(PyObject *module, PyObject *args)
{
    Py_buffer image;
    const char *name;
    int device;
    if (!PyArg_ParseTuple(args, "y*si:_rtc_load", &image, &name, &device))
        return NULL;
    PyObject *res = NULL;
    ew_device_guard g = EW_DEVICE_GUARD_INIT;
    const ew_device dev = {EW_CUDA, device};
    void *lib = NULL, *kernel = NULL;
    if (ew_device_enter(&g, dev) < 0)
        goto done;
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = ewcuda_library_load(image.buf, name, &lib, &kernel);
    Py_END_ALLOW_THREADS
    if (err != 0) {
        char what[320];
        snprintf(what, sizeof what, "loading the compiled kernel %s", name);
        ew_raise_cuda(err, what);
        goto done;
    }
    res = PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)kernel);
done:
    ew_device_exit(&g);
    PyBuffer_Release(&image);
    return res;
}

PyObject *ew_rtc_launch(PyObject *module, PyObject *args)
{
    unsigned long long kernel, stream;
    long long grid, smem = 0;
    int block, device, pdl;
    Py_buffer params;
    if (!PyArg_ParseTuple(args, "KLiy*iKp|L:_rtc_launch", &kernel, &grid, &block, &params, &device, &stream, &pdl,
                          &smem))
        return NULL;
    PyObject *res = NULL;
    ew_device_guard g = EW_DEVICE_GUARD_INIT;
    const ew_device dev = {EW_CUDA, device};
    if (grid < 1 || grid > 0x7fffffffLL || block < 1 || block > 1024 || smem < 0 || smem > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "_rtc_launch: grid %lld, block %d and smem %lld (expected 1..2^31-1, "
                     "1..1024 and 0..2^31-1)", grid, block, smem);
        goto done;
    }
    if (ew_device_enter(&g, dev) < 0)
        goto done;
    void *param_ptr = params.buf;
    int err = ewcuda_launch_kernel((void *)(uintptr_t)kernel, (unsigned)grid, (unsigned)block, &param_ptr,
                                   (void *)(uintptr_t)stream, pdl && ewcuda_pdl_active(device), smem);
    if (err != 0) {
        ew_raise_cuda(err, "a run-time kernel's launch");
        goto done;
    }
    res = Py_NewRef(Py_None);
done:
    ew_device_exit(&g);
    PyBuffer_Release(&params);
    return res;
}
PyObject *ew_rtc_occupancy(PyObject *module, PyObject *args)
{
    unsigned long long kernel;
    int block, device;
    if (!PyArg_ParseTuple(args, "Kii:_rtc_occupancy", &kernel, &block, &device))
        return NULL;
    if (block < 1 || block > 1024) {
        PyErr_Format(PyExc_ValueError, "_rtc_occupancy: block %d (expected 1..1024)", block);
        return NULL;
    }
    ew_device_guard g = EW_DEVICE_GUARD_INIT;
    const ew_device dev = {EW_CUDA, device};
    if (ew_device_enter(&g, dev) < 0)
        return NULL;
    const int nb = ewcuda_kernel_occupancy((void *)(uintptr_t)kernel, block);
    ew_device_exit(&g);
    return PyLong_FromLong(nb);
}

PyObject *ew_rtc_cap(PyObject *module, PyObject *args)
{
    unsigned long long kernel;
    int block, device, blocks;
    if (!PyArg_ParseTuple(args, "Kiii:_rtc_cap", &kernel, &block, &device, &blocks))
        return NULL;
    if (block < 1 || block > 1024 || blocks < 1) {
        PyErr_Format(PyExc_ValueError, "_rtc_cap: block %d and blocks %d (expected 1..1024 and >= 1)", block, blocks);
        return NULL;
    }
    ew_device_guard g = EW_DEVICE_GUARD_INIT;
    const ew_device dev = {EW_CUDA, device};
    if (ew_device_enter(&g, dev) < 0)
        return NULL;
    long long smem = 0;
    const int err = ewcuda_kernel_cap((void *)(uintptr_t)kernel, block, blocks, &smem);
    ew_device_exit(&g);
    if (err != 0) {
        ew_raise_cuda(err, "a run-time kernel's residency cap");
        return NULL;
    }
    return PyLong_FromLongLong(smem);
}

PyObject *ew_rtc_attrs(PyObject *module, PyObject *args)
{
    unsigned long long kernel;
    int device;
    if (!PyArg_ParseTuple(args, "Ki:_rtc_attrs", &kernel, &device))
        return NULL;
    ew_device_guard g = EW_DEVICE_GUARD_INIT;
    const ew_device dev = {EW_CUDA, device};
    if (ew_device_enter(&g, dev) < 0)
        return NULL;
    ew_func_attrs fa;
    const int err = ewcuda_func_attrs((const void *)(uintptr_t)kernel, &fa);
    ew_device_exit(&g);
    if (err != 0) {
        ew_raise_cuda(err, "a run-time kernel's attributes");
        return NULL;
    }
    return Py_BuildValue("(in)", fa.num_regs, (Py_ssize_t)fa.local_size_bytes);
}

PyObject *ew_rtc_plan(PyObject *module, PyObject *args)
{
    long long nvec, nedge, wave1, wave4;
    int device, block, i32, heavy, elems, pdl, wide = 0, max_vpt = 4;
    if (!PyArg_ParseTuple(args, "iLLiLLppip|pi:_rtc_plan", &device, &nvec, &nedge, &block, &wave1, &wave4, &i32,
                          &heavy, &elems, &pdl, &wide, &max_vpt))
        return NULL;
    if (nvec < 0 || nedge < 0 || block < 1 || block > 1024 || nedge >= block || wave1 < 1 || wave4 < 1 ||
        (max_vpt != 1 && max_vpt != 2 && max_vpt != 4)) {
        PyErr_Format(PyExc_ValueError,
                     "_rtc_plan: nvec %lld, nedge %lld, block %d, waves %lld/%lld, max_vpt %d (1, 2 or 4) out of range",
                     nvec, nedge, block, wave1, wave4, max_vpt);
        return NULL;
    }
    int vpt, prefetch;
    long long grid;
    ewcuda_auto_plan(device, nvec, nedge, block, wave1, wave4, i32, pdl && ewcuda_pdl_active(device), heavy, elems,
                     wide, max_vpt, &vpt, &grid, &prefetch);
    return Py_BuildValue("(iLi)", vpt, grid, prefetch);
}

PyObject *ew_rtc_store_wb(PyObject *module, PyObject *args)
{
    int device;
    long long bytes, out_bytes = 0;
    if (!PyArg_ParseTuple(args, "iL|L:_rtc_store_wb", &device, &bytes, &out_bytes))
        return NULL;
    if (bytes < 0 || out_bytes < 0 || out_bytes > bytes) {
        PyErr_Format(PyExc_ValueError,
                     "_rtc_store_wb: expected 0 <= out_bytes <= bytes, got bytes %lld, out_bytes %lld", bytes,
                     out_bytes);
        return NULL;
    }
    return PyBool_FromLong(ewcuda_store_wb(device, bytes, out_bytes));
}

PyObject *ew_auto_plan(PyObject *module, PyObject *args)
{
    long long nvec, nedge, wave1, wave4, heavy16_from;
    int block, i32, pdl, fill, heavy16, heavy64, wide = 0, heavy_math = 0;
    if (!PyArg_ParseTuple(args, "LLiLLpppiiL|pp:_auto_plan", &nvec, &nedge, &block, &wave1, &wave4, &i32, &pdl,
                          &fill, &heavy16, &heavy64, &heavy16_from, &wide, &heavy_math))
        return NULL;
    if (nvec < 0 || nedge < 0 || block < 1 || block > 1024 || nedge >= block || wave1 < 1 || wave4 < 1 ||
        heavy16 < 0 || heavy16 > 2 || heavy64 < 0 || heavy64 > 4 || heavy16_from < 1) {
        PyErr_Format(PyExc_ValueError,
                     "_auto_plan: nvec %lld, nedge %lld, block %d, waves %lld/%lld, heavy16 %d, heavy64 %d, "
                     "heavy16_from %lld out of range",
                     nvec, nedge, block, wave1, wave4, heavy16, heavy64, heavy16_from);
        return NULL;
    }
    int vpt, prefetch;
    long long grid;
    ewcuda_auto_plan_rule(nvec, nedge, block, wave1, wave4, i32, pdl, fill, heavy16, heavy64, heavy16_from, wide, 4,
                          heavy_math, &vpt, &grid, &prefetch);
    return Py_BuildValue("(iLi)", vpt, grid, prefetch);
}
#else
PyObject *ew_rtc_load(PyObject *module, PyObject *args)
{
    PyErr_SetString(PyExc_RuntimeError, "run-time CUDA kernels need ewkern built with CUDA (this build is CPU-only)");
    return NULL;
}

PyObject *ew_rtc_launch(PyObject *module, PyObject *args)
{
    return ew_rtc_load(module, args);
}
PyObject *ew_rtc_occupancy(PyObject *module, PyObject *args)
{
    return ew_rtc_load(module, args);
}
PyObject *ew_rtc_attrs(PyObject *module, PyObject *args)
{
    return ew_rtc_load(module, args);
}
PyObject *ew_rtc_cap(PyObject *module, PyObject *args)
{
    return ew_rtc_load(module, args);
}
PyObject *ew_rtc_plan(PyObject *module, PyObject *args)
{
    return ew_rtc_load(module, args);
}
PyObject *ew_rtc_store_wb(PyObject *module, PyObject *args)
{
    return ew_rtc_load(module, args);
}
PyObject *ew_auto_plan(PyObject *module, PyObject *args)
{
    return ew_rtc_load(module, args);
}
#endif

/* ---- the CPU backend's integer division guard ---------------------------------------------------
 * A run-time kernel compiled for the CPU divides integers with the x86 div/idiv instructions, which
 * raise #DE (SIGFPE) on a zero divisor and on MIN / -1: the signal would end the interpreter. Where a
 * library of such kernels is loaded (_build.build_cpu calls _rtc_fpe_guard with an address in it),
 * its executable segment joins a list, and a SIGFPE handler (installed once, chaining to the
 * handler before it) finishes a faulting div/idiv inside a listed segment as NumPy's integer
 * division does: x / 0 and x % 0 give 0, MIN / -1 gives MIN (wrapping) and MIN % -1 gives 0; the
 * thread goes on after the instruction. A fault anywhere else goes to the previous handler (or the
 * default action, as before). CUDA kernels are unaffected: the GPU gives its own results. */
#if defined(__linux__) && defined(__x86_64__)
#include <link.h>
#include <signal.h>
#include <stdatomic.h>
#include <ucontext.h>

enum { FPE_RANGES = 4096 };
static uintptr_t fpe_lo[FPE_RANGES], fpe_hi[FPE_RANGES];
static atomic_int fpe_n;                /* published after a range's bounds are written */
static struct sigaction fpe_old;
static int fpe_installed;

/* the x86-64 register number (ModRM/SIB with REX) -> its index in the signal's saved registers */
static const int FPE_GREG[16] = {REG_RAX, REG_RCX, REG_RDX, REG_RBX, REG_RSP, REG_RBP, REG_RSI, REG_RDI,
                                 REG_R8,  REG_R9,  REG_R10, REG_R11, REG_R12, REG_R13, REG_R14, REG_R15};

static int fpe_guarded(uintptr_t pc)
{
    const int n = atomic_load_explicit(&fpe_n, memory_order_acquire);
    for (int k = 0; k < n; k++)
        if (pc >= fpe_lo[k] && pc < fpe_hi[k])
            return 1;
    return 0;
}

/* Decode the div/idiv at the saved RIP (legacy prefixes, REX, opcode F6/F7 with ModRM reg 6 or 7,
 * SIB, displacement, RIP-relative), read its divisor, write the quotient and remainder NumPy gives
 * and step past it. 0 where the instruction is not one. */
static int fpe_finish(ucontext_t *uc)
{
    greg_t *g = uc->uc_mcontext.gregs;
    const uint8_t *p = (const uint8_t *)(uintptr_t)g[REG_RIP];
    int i = 0, size = 4, rex = 0;
    for (;; i++) {
        const uint8_t b = p[i];
        if (b == 0x66)
            size = 2;
        else if (!(b == 0x67 || b == 0x2e || b == 0x3e || b == 0x26 || b == 0x36 || b == 0xf2 || b == 0xf3))
            break;
        if (i > 14)
            return 0;
    }
    if ((p[i] & 0xf0) == 0x40)
        rex = p[i++];
    const uint8_t op = p[i++];
    if (op != 0xf6 && op != 0xf7)
        return 0;
    size = op == 0xf6 ? 1 : (rex & 8) ? 8 : size;
    const uint8_t modrm = p[i++];
    const int mod = modrm >> 6, reg = (modrm >> 3) & 7, rm = modrm & 7;
    if (reg != 6 && reg != 7)
        return 0;
    const int is_signed = reg == 7;
    uint64_t raw = 0;
    if (mod == 3) {
        const int r = rm | ((rex & 1) << 3);
        raw = (size == 1 && !rex && r >= 4) ? ((uint64_t)g[FPE_GREG[r - 4]] >> 8) : (uint64_t)g[FPE_GREG[r]];
    } else {
        uintptr_t addr = 0;
        if (rm == 4) {
            const uint8_t sib = p[i++];
            const int idx = ((sib >> 3) & 7) | ((rex & 2) << 2), base = (sib & 7) | ((rex & 1) << 3);
            if (idx != 4)
                addr += (uintptr_t)g[FPE_GREG[idx]] << (sib >> 6);
            if ((sib & 7) == 5 && mod == 0) {
                int32_t d;
                memcpy(&d, p + i, 4);
                i += 4;
                addr += (uintptr_t)(intptr_t)d;
            } else {
                addr += (uintptr_t)g[FPE_GREG[base]];
            }
        } else if (rm == 5 && mod == 0) {   /* RIP-relative: from the next instruction (no immediate follows) */
            int32_t d;
            memcpy(&d, p + i, 4);
            i += 4;
            addr = (uintptr_t)(p + i) + (uintptr_t)(intptr_t)d;
        } else {
            addr = (uintptr_t)g[FPE_GREG[rm | ((rex & 1) << 3)]];
        }
        if (mod == 1) {
            addr += (uintptr_t)(intptr_t)(int8_t)p[i];
            i += 1;
        } else if (mod == 2) {
            int32_t d;
            memcpy(&d, p + i, 4);
            i += 4;
            addr += (uintptr_t)(intptr_t)d;
        }
        memcpy(&raw, (const void *)addr, (size_t)size);   /* the operand the instruction had read */
    }
    const int bits = 8 * size;
    const uint64_t mask = size == 8 ? ~0ULL : (1ULL << bits) - 1;
    raw &= mask;
    /* x / 0 (either kind): quotient and remainder 0; signed MIN / -1: quotient MIN, remainder 0 */
    const int overflow = is_signed && raw == mask;
    const uint64_t rax = (uint64_t)g[REG_RAX];
    const uint64_t q = overflow ? rax & mask : 0;   /* the dividend's low half (AL, AX, EAX, RAX): MIN */
    if (size == 1) {
        g[REG_RAX] = (greg_t)((rax & ~0xffffULL) | (q & 0xff));            /* AL = q, AH = 0 */
    } else if (size == 2) {
        g[REG_RAX] = (greg_t)((rax & ~0xffffULL) | q);
        g[REG_RDX] = (greg_t)((uint64_t)g[REG_RDX] & ~0xffffULL);
    } else {
        g[REG_RAX] = (greg_t)q;     /* a 32-bit result clears the upper half, as the instruction would */
        g[REG_RDX] = 0;
    }
    g[REG_RIP] += i;
    return 1;
}

static void fpe_handler(int sig, siginfo_t *si, void *ctx)
{
    ucontext_t *uc = (ucontext_t *)ctx;
    if ((si->si_code == FPE_INTDIV || si->si_code == FPE_INTOVF) &&
        fpe_guarded((uintptr_t)uc->uc_mcontext.gregs[REG_RIP]) && fpe_finish(uc))
        return;
    if (fpe_old.sa_flags & SA_SIGINFO) {
        if (fpe_old.sa_sigaction) {
            fpe_old.sa_sigaction(sig, si, ctx);
            return;
        }
    } else if (fpe_old.sa_handler != SIG_DFL && fpe_old.sa_handler != SIG_IGN) {
        fpe_old.sa_handler(sig);
        return;
    }
    /* the default action, as before: a fault's instruction faults again on return, and a signal
     * sent by kill() is raised again (blocked until the handler returns) */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGFPE, &dfl, NULL);
    if (si->si_code <= 0)
        raise(sig);
}

struct fpe_find { uintptr_t addr, lo, hi; };

static int fpe_segment(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct fpe_find *f = data;
    for (int k = 0; k < info->dlpi_phnum; k++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[k];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
            continue;
        const uintptr_t lo = (uintptr_t)info->dlpi_addr + (uintptr_t)ph->p_vaddr, hi = lo + (uintptr_t)ph->p_memsz;
        if (f->addr >= lo && f->addr < hi) {
            f->lo = lo;
            f->hi = hi;
            return 1;
        }
    }
    return 0;
}

PyObject *ew_rtc_fpe_guard(PyObject *module, PyObject *arg)
{
    (void)module;
    const unsigned long long a = PyLong_AsUnsignedLongLong(arg);
    if (a == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    struct fpe_find f = {(uintptr_t)a, 0, 0};
    if (!dl_iterate_phdr(fpe_segment, &f)) {
        PyErr_Format(PyExc_ValueError, "_rtc_fpe_guard: 0x%llx is in no loaded library's code", a);
        return NULL;
    }
    if (fpe_guarded(f.addr))
        Py_RETURN_TRUE;
    /* the GIL orders the callers: a range is written, then published */
    const int n = atomic_load_explicit(&fpe_n, memory_order_relaxed);
    if (n >= FPE_RANGES)
        Py_RETURN_FALSE;
    fpe_lo[n] = f.lo;
    fpe_hi[n] = f.hi;
    atomic_store_explicit(&fpe_n, n + 1, memory_order_release);
    if (!fpe_installed) {
        struct sigaction act;
        memset(&act, 0, sizeof act);
        act.sa_sigaction = fpe_handler;
        act.sa_flags = SA_SIGINFO;
        sigemptyset(&act.sa_mask);
        if (sigaction(SIGFPE, &act, &fpe_old) != 0)
            return PyErr_SetFromErrno(PyExc_OSError);
        fpe_installed = 1;
    }
    Py_RETURN_TRUE;
}
#else
PyObject *ew_rtc_fpe_guard(PyObject *module, PyObject *arg)
{
    (void)module;
    (void)arg;
    Py_RETURN_FALSE;
}
#endif
