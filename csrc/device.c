/*
 * device.c: floor 1 (see state.h). The device argument ("cpu", "cuda", "cuda:N"), the checks,
 * the device guard (switch for a call's own work, put the caller's device back), CUDA errors
 * as Python exceptions, and the device queries behind device_info(), synchronize() and
 * _current_device(). Calls only the CUDA runtime surface (cuda_api.h).
 */
#include "device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_api.h"

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

/* ---- queries ---------------------------------------------------------------------------------------- */

/* The calling thread's current CUDA device (cudaGetDevice), which every ewkern call leaves as it
 * found it; None without CUDA. For the tests, and for callers without torch or CuPy to ask. */
PyObject *ew_current_device(void)
{
#if EWKERN_WITH_CUDA
    int dev;
    if (ew_cuda_device_count() > 0 && ewcuda_get_device(&dev) == 0)
        return PyLong_FromLong(dev);
#endif
    Py_RETURN_NONE;
}

PyObject *ew_synchronize_device(PyObject *dev_obj)
{
    ew_device dev;
    if (ew_device_from_py(dev_obj, &dev) < 0)
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

PyObject *ew_describe_device(PyObject *dev_obj)
{
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

