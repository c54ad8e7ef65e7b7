/*
 * module.c: floor 6, the top (see state.h). The ewkern._C module: its method table, multi-phase
 * initialisation (the types, the op builtins, the state's names and caches), traverse/clear,
 * and thin wrappers that hand each call to the floor that does the work. Calls every floor.
 */
#include "array.h"
#include "device.h"
#include "dlpack.h"
#include "dtype.h"
#include "listing.h"
#include "native_api.h"
#include "ops.h"
#include "registry.h"
#include "state.h"
#include "stream.h"
#include "timing.h"
#include "rtc.h"

#include "cuda_api.h"
#include "cpu/cpu_math.h"

/* ---- streams and PDL ---------------------------------------------------------------------------- */

static PyObject *set_stream(PyObject *module, PyObject *s) { return ew_set_current_stream(ew_get_state(module), s); }
static PyObject *get_stream(PyObject *module, PyObject *unused) { return ew_get_current_stream(ew_get_state(module)); }

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

/* ---- creation and import ----------------------------------------------------------------------- */

static PyObject *m_empty(PyObject *m, PyObject *a, PyObject *k) { return ew_create(m, a, k, 0); }
static PyObject *m_zeros(PyObject *m, PyObject *a, PyObject *k) { return ew_create(m, a, k, 1); }
static PyObject *m_full(PyObject *m, PyObject *a, PyObject *k) { return ew_create(m, a, k, 2); }

static PyObject *m_from_dlpack(PyObject *module, PyObject *obj) { return ew_from_dlpack(ew_get_state(module), obj); }

/* ---- queries ---------------------------------------------------------------------------------------- */

static PyObject *m_cuda_available(PyObject *m, PyObject *u) { return PyBool_FromLong(ew_cuda_device_count() > 0); }
static PyObject *m_device_count(PyObject *m, PyObject *u) { return PyLong_FromLong(ew_cuda_device_count()); }
static PyObject *m_current_device(PyObject *m, PyObject *u) { return ew_current_device(); }

static PyObject *m_synchronize(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return ew_synchronize_device(nargs ? args[0] : Py_None);
}

static PyObject *m_device_info(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"device", NULL};
    PyObject *dev_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:device_info", kwlist, &dev_obj))
        return NULL;
    return ew_describe_device(dev_obj);
}

static PyObject *m_build_info(PyObject *module, PyObject *unused)
{
#ifndef EWKERN_CUDA_ARCHS
#define EWKERN_CUDA_ARCHS ""
#endif
    return Py_BuildValue("{s:O,s:s,s:(ii),s:s}", "cuda", EWKERN_WITH_CUDA ? Py_True : Py_False, "cuda_archs",
                         EWKERN_CUDA_ARCHS, "dlpack_version", DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION, "cpu_math", ew_cpu_math_library());
}

static PyMethodDef module_methods[] = {
    {"empty", (PyCFunction)(void (*)(void))m_empty, METH_VARARGS | METH_KEYWORDS,
     "empty(shape, dtype='float32', device=None)\n--\n\nA new uninitialised Array. device None means "
     "'cuda:0' when a GPU is present, else 'cpu'."},
    {"zeros", (PyCFunction)(void (*)(void))m_zeros, METH_VARARGS | METH_KEYWORDS,
     "zeros(shape, dtype='float32', device=None)\n--\n\nA new Array of zeros."},
    {"full", (PyCFunction)(void (*)(void))m_full, METH_VARARGS | METH_KEYWORDS,
     "full(shape, fill_value, dtype='float32', device=None)\n--\n\nA new Array filled with fill_value."},
    {"asarray", (PyCFunction)(void (*)(void))ew_asarray, METH_VARARGS | METH_KEYWORDS,
     "asarray(obj, dtype=None, device=None)\n--\n\nAn Array from a NumPy array, a Python sequence or any "
     "DLPack producer: zero-copy when dtype and device already match, else a copy (dtype conversion goes "
     "through NumPy on the host). A sequence of ints or bools becomes float64 unless dtype is given; an "
     "integer or bool array (NumPy's, a framework's) is a TypeError without dtype, converted with it (through "
     "NumPy on the host, onto the array's own device unless device is given)."},
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
    {"variants", (PyCFunction)(void (*)(void))ew_variants, METH_VARARGS | METH_KEYWORDS,
     "variants(op, dtype=None, device='cuda')\n--\n\nNames of the kernel variants of op."},
    {"kernel_info", (PyCFunction)(void (*)(void))ew_kernel_info, METH_VARARGS | METH_KEYWORDS,
     "kernel_info(op, variant='auto', dtype='float32', device='cuda')\n--\n\nThe compiled kernel's "
     "attributes from the CUDA runtime (registers per thread, local bytes, ...)."},
    {"ops", (PyCFunction)ew_list_ops, METH_NOARGS, "ops()\n--\n\nThe op table: name, inputs, scalars, definition."},
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
     "it waits for that\nkernel's results before touching memory. While a stream is captured into a CUDA graph, "
     "a launch asks for it\nonly behind a kernel ewkern launched (other kernels never trigger the early launch). "
     "Builds without\nCUDA always report False."},
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
    if (ew_numpy_import() < 0)
        return -1;
    if (ew_registry_init() < 0)
        return -1;
    st->current_stream = Py_None;
    Py_INCREF(Py_None);
    if ((st->api_cache = PyDict_New()) == NULL || (st->neg_cache = PyDict_New()) == NULL ||
        (st->scalar_cache = PyDict_New()) == NULL)
        return -1;
    if ((st->str_dlpack = PyUnicode_InternFromString("__dlpack__")) == NULL ||
        (st->str_dlpack_device = PyUnicode_InternFromString("__dlpack_device__")) == NULL ||
        (st->str_api = PyUnicode_InternFromString("__dlpack_c_exchange_api__")) == NULL ||
        (st->str_is_neg = PyUnicode_InternFromString("is_neg")) == NULL ||
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
    if (ew_add_native_api(m) < 0)
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
    Py_VISIT(st->neg_cache);
    Py_VISIT(st->scalar_cache);
    Py_VISIT(st->scalar_types);
    Py_VISIT(st->bf16_descr);
    Py_VISIT(st->current_stream);
    Py_VISIT(st->str_dlpack);
    Py_VISIT(st->str_dlpack_device);
    Py_VISIT(st->str_api);
    Py_VISIT(st->str_is_neg);
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
    Py_CLEAR(st->neg_cache);
    Py_CLEAR(st->scalar_cache);
    Py_CLEAR(st->scalar_types);
    Py_CLEAR(st->bf16_descr);
    Py_CLEAR(st->current_stream);
    Py_CLEAR(st->str_dlpack);
    Py_CLEAR(st->str_dlpack_device);
    Py_CLEAR(st->str_api);
    Py_CLEAR(st->str_is_neg);
    Py_CLEAR(st->str_requires_grad);
    Py_CLEAR(st->dlpack_kwnames);
    return 0;
}

static void module_free(void *m) { module_clear((PyObject *)m); }

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL}
};

static PyModuleDef ew_moduledef = {
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

