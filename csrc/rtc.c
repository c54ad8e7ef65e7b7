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
 *   _rtc_load(image, name, device)    cudaLibraryLoadData + cudaLibraryGetKernel; the library stays
 *                                     loaded for the life of the process (the Python cache keeps
 *                                     one handle per (image, device)).
 *   _rtc_launch(kernel, grid, block, params, device, stream, pdl)
 *                                     cudaLaunchKernelExC with one by-value parameter (the bytes of
 *                                     the generated kernel's argument struct).
 *   _rtc_occupancy(kernel, block, device)
 *                                     resident blocks per SM of a loaded kernel.
 *   _rtc_plan(device, nvec, nedge, block, wave1, wave4, i32, heavy, elems, pdl)
 *                                     (vectors per thread, grid, prefetch) by the default path's
 *                                     launch rule (ewcuda_auto_plan), for the vector kernels of
 *                                     ewkern/rtc/_codegen.py.
 */
#include "rtc.h"

#include "device.h"
#include "dlpack.h"
#include "dtype.h"
#include "state.h"

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
    long long grid;
    int block, device, pdl;
    Py_buffer params;
    if (!PyArg_ParseTuple(args, "KLiy*iKp:_rtc_launch", &kernel, &grid, &block, &params, &device, &stream, &pdl))
        return NULL;
    PyObject *res = NULL;
    ew_device_guard g = EW_DEVICE_GUARD_INIT;
    const ew_device dev = {EW_CUDA, device};
    if (grid < 1 || grid > 0x7fffffffLL || block < 1 || block > 1024) {
        PyErr_Format(PyExc_ValueError, "_rtc_launch: grid %lld and block %d (expected 1..2^31-1 and 1..1024)",
                     grid, block);
        goto done;
    }
    if (ew_device_enter(&g, dev) < 0)
        goto done;
    void *param_ptr = params.buf;
    int err = ewcuda_launch_kernel((void *)(uintptr_t)kernel, (unsigned)grid, (unsigned)block, &param_ptr,
                                   (void *)(uintptr_t)stream, pdl && ewcuda_pdl_active(device));
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

PyObject *ew_rtc_plan(PyObject *module, PyObject *args)
{
    long long nvec, nedge, wave1, wave4;
    int device, block, i32, heavy, elems, pdl;
    if (!PyArg_ParseTuple(args, "iLLiLLppip:_rtc_plan", &device, &nvec, &nedge, &block, &wave1, &wave4, &i32,
                          &heavy, &elems, &pdl))
        return NULL;
    if (nvec < 0 || nedge < 0 || block < 1 || block > 1024 || nedge >= block || wave1 < 1 || wave4 < 1) {
        PyErr_Format(PyExc_ValueError, "_rtc_plan: nvec %lld, nedge %lld, block %d, waves %lld/%lld out of range",
                     nvec, nedge, block, wave1, wave4);
        return NULL;
    }
    int vpt, prefetch;
    long long grid;
    ewcuda_auto_plan(nvec, nedge, block, wave1, wave4, i32, pdl && ewcuda_pdl_active(device), heavy, elems, &vpt,
                     &grid, &prefetch);
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
PyObject *ew_rtc_plan(PyObject *module, PyObject *args)
{
    return ew_rtc_load(module, args);
}
#endif
