/*
 * timing.c: the timed loop of ewkern.bench, in C so no Python runs between launches.
 *   time_plans(plans, *, launches=1, samples=10, warmup=2, flush=None, blocking=True, graph=None)
 * CUDA: events around each sample of `launches` back-to-back launches on the plans' stream,
 * cycling through the plans (distinct buffers rotate the working set). With blocking=True a
 * spin kernel holds the stream while the sample is queued, so the GPU's time is measured and
 * not the host's launch rate (nvbench's blocking kernel). With flush= a buffer larger than the
 * L2 is read before each sample, outside the timed region (read, not written: written lines
 * would be written back during the timed kernel). CPU plans use a monotonic host clock and
 * write the flush buffer.
 * graph (default: when launches > 1) captures a sample's launches into one CUDA graph and times
 * its replays. Returns seconds per launch, one value per sample.
 * Floor 5 (see state.h): calls ops (the Plans' launches), dlpack (the flush buffer's view),
 * dtype, device and state.
 */
#include "timing.h"

#include "device.h"
#include "dlpack.h"
#include "dtype.h"
#include "ops.h"
#include "state.h"

#include <string.h>
#include <time.h>

#include "cuda_api.h"

#define MAX_BLOCKING_LAUNCHES 1000

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static int run_cpu(PlanObject **plans, int np, long launches, long samples, long warmup, void *flush,
                   size_t flush_bytes, double *out)
{
    long idx = 0;
    for (long w = 0; w < warmup * launches; w++) {
        int err = ew_plan_launch(plans[idx++ % np]);
        if (err)
            return err;
    }
    for (long s = 0; s < samples; s++) {
        if (flush)
            memset(flush, (int)(s & 0x7f) + 1, flush_bytes);
        double t0 = now_s();
        for (long i = 0; i < launches; i++) {
            int err = ew_plan_launch(plans[idx++ % np]);
            if (err)
                return err;
        }
        out[s] = (now_s() - t0) / launches;
    }
    return 0;
}

#if EWKERN_WITH_CUDA
/* One sample: [flush] [spin] ev0 <launches> ev1 [release]. The launches are either queued one
 * by one on the plans' stream, or (graph) one replay of a CUDA graph that holds all of them,
 * on a private stream: graph replay has no per-launch host gap (about 1.3 us per launch on an
 * H100 when queued one by one), which is how the peers are timed too. */
static int run_cuda(PlanObject **plans, int np, long launches, long samples, long warmup, void *flush,
                    size_t flush_bytes, int blocking, int graph, double *out)
{
    void *stream = plans[0]->stream;
    void *exec = NULL;
    void **ev = PyMem_RawCalloc(2 * samples, sizeof(void *));
    volatile int *flag = NULL;
    int err = 0;
    long idx = 0;
    if (ev == NULL)
        return 2; /* cudaErrorMemoryAllocation */
    for (long i = 0; i < 2 * samples && !err; i++)
        err = ewcuda_event_create(&ev[i]);
    if (!err && blocking)
        err = ewcuda_host_flag_alloc(&flag);
    if (!err && graph) {
        /* everything queued so far (the inputs) completes before the private stream starts */
        err = ewcuda_device_synchronize();
        if (!err)
            err = ewcuda_stream_create(&stream);
        if (!err && !(err = ewcuda_capture_begin(stream))) {
            for (long i = 0; i < launches && !err; i++)
                err = ew_plan_launch_on(plans[i % np], stream);
            void *g = NULL;
            int err2 = ewcuda_capture_end(stream, &g);
            exec = g;
            if (!err)
                err = err2;
        }
    }
    for (long w = 0; w < warmup && !err; w++) {
        if (graph)
            err = ewcuda_graph_launch(exec, stream);
        for (long i = 0; !graph && i < launches && !err; i++)
            err = ew_plan_launch(plans[idx++ % np]);
    }
    if (!err)
        err = ewcuda_stream_synchronize(stream);
    for (long s = 0; s < samples && !err; s++) {
        if (flush)
            err = ewcuda_flush_read(flush, flush_bytes & ~(size_t)15, stream);
        if (!err && blocking) {
            *flag = 0;
            err = ewcuda_spin_launch(flag, 5.0, stream);
        }
        if (!err)
            err = ewcuda_event_record(ev[2 * s], stream);
        if (!err && graph)
            err = ewcuda_graph_launch(exec, stream);
        for (long i = 0; !graph && i < launches && !err; i++)
            err = ew_plan_launch(plans[idx++ % np]);
        if (!err)
            err = ewcuda_event_record(ev[2 * s + 1], stream);
        if (blocking)
            *flag = 1;
        if (!err)
            err = ewcuda_event_synchronize(ev[2 * s + 1]);
    }
    if (blocking && flag)
        *flag = 1;
    if (!err)
        err = ewcuda_stream_synchronize(stream);
    for (long s = 0; s < samples && !err; s++) {
        float ms = 0;
        err = ewcuda_event_elapsed_ms(ev[2 * s], ev[2 * s + 1], &ms);
        out[s] = 1e-3 * ms / launches;
    }
    for (long i = 0; i < 2 * samples; i++)
        if (ev[i])
            ewcuda_event_destroy(ev[i]);
    if (flag)
        ewcuda_host_flag_free(flag);
    if (exec)
        ewcuda_graph_destroy(exec);
    if (graph && stream && stream != plans[0]->stream)
        ewcuda_stream_destroy(stream);
    PyMem_RawFree(ev);
    return err;
}
#endif

PyObject *ew_time_plans(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const kw[] = {"launches", "samples", "warmup", "flush", "blocking", "graph"};
    PyObject *vals[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    ew_state *st = ew_get_state(module);
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "time_plans(plans, *, launches=1, samples=10, warmup=2, flush=None, "
                                         "blocking=True, graph=None) takes one positional argument");
        return NULL;
    }
    for (Py_ssize_t j = 0; kwnames && j < PyTuple_GET_SIZE(kwnames); j++) {
        int slot = -1;
        for (int i = 0; i < 6; i++)
            if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, j), kw[i]) == 0)
                slot = i;
        if (slot < 0) {
            PyErr_Format(PyExc_TypeError, "time_plans() got an unexpected keyword argument %R",
                         PyTuple_GET_ITEM(kwnames, j));
            return NULL;
        }
        vals[slot] = args[1 + j];
    }
    long num[3] = {1, 10, 2};
    for (int i = 0; i < 3; i++)
        if (vals[i]) {
            num[i] = PyLong_AsLong(vals[i]);
            if (num[i] == -1 && PyErr_Occurred())
                return NULL;
            if (num[i] < (i == 2 ? 0 : 1)) {
                PyErr_Format(PyExc_ValueError, "time_plans(): %s must be >= %d, got %ld", kw[i], i == 2 ? 0 : 1,
                             num[i]);
                return NULL;
            }
        }
    int blocking = vals[4] ? PyObject_IsTrue(vals[4]) : 1;
    int graph = vals[5] && vals[5] != Py_None ? PyObject_IsTrue(vals[5]) : num[0] > 1;
    if (blocking < 0 || graph < 0)
        return NULL;
    /* a tuple of its own (a list's items would be borrowed across the GIL's release below: a
     * thread that empties the list frees the Plans, their inputs and outputs mid-run) */
    if (!PySequence_Check(args[0])) {
        PyErr_Format(PyExc_TypeError, "time_plans(): plans must be a sequence of Plan objects, got %.200s",
                     Py_TYPE(args[0])->tp_name);
        return NULL;
    }
    PyObject *seq = PySequence_Tuple(args[0]);
    if (seq == NULL)
        return NULL;
    Py_ssize_t np = PyTuple_GET_SIZE(seq);
    PyObject *result = NULL;
    double *times = NULL;
    ew_view fv;
    int have_flush = 0;
    ew_device_guard g = EW_DEVICE_GUARD_INIT;
    if (np == 0 || np > 1 << 20) {
        PyErr_SetString(PyExc_ValueError, "time_plans(): plans must hold at least one Plan");
        goto done;
    }
    PlanObject **plans = (PlanObject **)&PyTuple_GET_ITEM(seq, 0);
    for (Py_ssize_t i = 0; i < np; i++) {
        if (!Py_IS_TYPE((PyObject *)plans[i], st->Plan_Type)) {
            PyErr_Format(PyExc_TypeError, "time_plans(): plans[%zd] is a %.200s, not a Plan from ewkern._C.prepare",
                         i, Py_TYPE(plans[i])->tp_name);
            goto done;
        }
        if (plans[i]->device.type != plans[0]->device.type || plans[i]->device.id != plans[0]->device.id ||
            plans[i]->stream != plans[0]->stream) {
            PyErr_SetString(PyExc_ValueError, "time_plans(): all plans must run on one device and stream");
            goto done;
        }
    }
    ew_device dev = plans[0]->device;
    if (blocking && !graph && dev.type == EW_CUDA && num[0] > MAX_BLOCKING_LAUNCHES) {
        PyErr_Format(PyExc_ValueError, "time_plans(): blocking=True queues at most %d launches per sample "
                     "(got launches=%ld); use graph=True, fewer launches or blocking=False", MAX_BLOCKING_LAUNCHES,
                     num[0]);
        goto done;
    }
    if (vals[3] && vals[3] != Py_None) {
        if (ew_view_from_object(st, vals[3], &fv, "flush", plans[0]->stream, 1) < 0)
            goto done;
        have_flush = 1;
        if (fv.device.type != dev.type || fv.device.id != dev.id || fv.readonly || ((uintptr_t)fv.data & 15)) {
            PyErr_SetString(PyExc_ValueError, "time_plans(): flush must be a writable, 16-byte aligned array on "
                                              "the plans' device");
            goto done;
        }
    }
    times = PyMem_RawCalloc(num[1], sizeof(double));
    if (times == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (ew_device_enter(&g, dev) < 0)
        goto done;
    void *fptr = have_flush ? fv.data : NULL;
    size_t fbytes = have_flush ? (size_t)fv.size * ew_dtype_size(fv.dtype) : 0;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    if (dev.type == EW_CPU)
        err = run_cpu(plans, (int)np, num[0], num[1], num[2], fptr, fbytes, times);
#if EWKERN_WITH_CUDA
    else
        err = run_cuda(plans, (int)np, num[0], num[1], num[2], fptr, fbytes, blocking, graph, times);
#endif
    Py_END_ALLOW_THREADS
    if (err) {
        if (dev.type == EW_CUDA)
            ew_raise_cuda(err, "time_plans");
        else
            PyErr_Format(PyExc_RuntimeError, "time_plans: a CPU kernel failed with error %d", err);
        goto done;
    }
    result = PyList_New(num[1]);
    for (long s = 0; result && s < num[1]; s++) {
        PyObject *f = PyFloat_FromDouble(times[s]);
        if (f == NULL)
            Py_CLEAR(result);
        else
            PyList_SET_ITEM(result, s, f);
    }
done:
    ew_device_exit(&g);
    if (have_flush)
        ew_view_release(&fv);
    PyMem_RawFree(times);
    Py_DECREF(seq);
    return result;
}
