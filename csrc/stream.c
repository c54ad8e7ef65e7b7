/*
 * stream.c: floor 2 (see state.h). The ewkern.Stream type: a new non-blocking CUDA stream of a
 * device, or a wrapper of an existing handle; synchronize() and the __cuda_stream__ protocol.
 * Calls device (floor 1) and the CUDA runtime surface.
 */
#include "stream.h"

#include "cuda_api.h"

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
