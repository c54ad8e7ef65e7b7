/*
 * ops.c: the Python entry of every op. Each elementwise op of ops.def and rmse is a builtin
 * created from one PyMethodDef (op_call / rmse_call) whose self is (module, op index). A call:
 *   parse arguments -> import views (dlpack.c) -> check dtypes, shapes, devices, out=
 *   -> registry lookup -> allocate the result like the first input -> launch -> check.
 * ewkern._C.prepare runs the same path but stores the launch in a Plan instead of running it.
 * Floor 4 (see state.h): calls dlpack, registry, dtype, device and state.
 */
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL ewkern_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include "ops.h"

#include <limits.h>
#include <string.h>

#include "device.h"
#include "dlpack.h"
#include "dtype.h"
#include "registry.h"
#include "state.h"

#include "cuda_api.h"

/* ---- argument parsing ------------------------------------------------------------------------ */

enum { P_VARIANT = 0, P_BLOCK = 1, P_GRID = 2, P_MASK = 3, N_KWONLY = 4 };
static const char *const kwonly_names[N_KWONLY] = {"variant", "block", "grid", "output_mask"};
#define MAX_PARAMS 8

typedef struct call_spec {
    const char *fname;
    const char *names[MAX_PARAMS];  /* positional-or-keyword parameters, in order */
    int npos;
    int nrequired;                  /* the first nrequired of them */
    char buf[64];                   /* the array names of a grads.def row, split */
} call_spec;

/* Parse FASTCALL arguments into vals[0..npos) (positional-or-keyword) and
 * vals[npos..npos+N_KWONLY) (keyword-only); missing ones are NULL. */
static int parse_args(const call_spec *cs, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                      PyObject **vals)
{
    int total = cs->npos + N_KWONLY;
    for (int i = 0; i < total; i++)
        vals[i] = NULL;
    if (nargs > cs->npos) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d positional arguments (%zd given)",
                     cs->fname, cs->npos, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        vals[i] = args[i];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t j = 0; j < nkw; j++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, j);
        int slot = -1;
        for (int i = 0; i < cs->npos && slot < 0; i++)
            if (PyUnicode_CompareWithASCIIString(key, cs->names[i]) == 0)
                slot = i;
        for (int i = 0; i < N_KWONLY && slot < 0; i++)
            if (PyUnicode_CompareWithASCIIString(key, kwonly_names[i]) == 0)
                slot = cs->npos + i;
        if (slot < 0) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument %R", cs->fname, key);
            return -1;
        }
        if (vals[slot]) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument %R", cs->fname, key);
            return -1;
        }
        vals[slot] = args[nargs + j];
    }
    for (int i = 0; i < cs->nrequired; i++)
        if (vals[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s' (pos %d)", cs->fname,
                         cs->names[i], i + 1);
            return -1;
        }
    return 0;
}

typedef struct launch_opts {
    const char *variant;
    int block, grid;
    int block_given, grid_given;
} launch_opts;

static int parse_opts(const char *fname, PyObject **kw, launch_opts *o)
{
    o->variant = "auto";
    o->block = o->grid = 0;
    o->block_given = o->grid_given = 0;
    if (kw[P_VARIANT] && kw[P_VARIANT] != Py_None) {
        if (!PyUnicode_Check(kw[P_VARIANT])) {
            PyErr_Format(PyExc_TypeError, "%s(): variant must be a str, got %.200s", fname,
                         Py_TYPE(kw[P_VARIANT])->tp_name);
            return -1;
        }
        o->variant = PyUnicode_AsUTF8(kw[P_VARIANT]);
        if (o->variant == NULL)
            return -1;
    }
    PyObject *bg[2] = {kw[P_BLOCK], kw[P_GRID]};
    int *dst[2] = {&o->block, &o->grid};
    int *given[2] = {&o->block_given, &o->grid_given};
    for (int i = 0; i < 2; i++) {
        if (bg[i] == NULL || bg[i] == Py_None)
            continue;
        if (!PyLong_Check(bg[i])) {
            PyErr_Format(PyExc_TypeError, "%s(): %s must be an int, got %.200s", fname, kwonly_names[1 + i],
                         Py_TYPE(bg[i])->tp_name);
            return -1;
        }
        long x = PyLong_AsLong(bg[i]);
        if (x == -1 && PyErr_Occurred())
            return -1;
        if (x <= 0 || x > (1L << 30)) {
            PyErr_Format(PyExc_ValueError, "%s(): %s must be a positive int, got %ld", fname,
                         kwonly_names[1 + i], x);
            return -1;
        }
        *dst[i] = (int)x;
        *given[i] = 1;
    }
    return 0;
}

/* Check block= and grid= against what the kernel honours and the device allows. */
static int check_launch_params(const char *fname, const ew_kernel *k, const launch_opts *o, ew_device dev)
{
    if (o->block_given) {
        if (!(k->flags & EW_USES_BLOCK)) {
            PyErr_Format(PyExc_ValueError, "%s(): variant '%s' chooses its own block size; do not pass block=",
                         fname, k->variant);
            return -1;
        }
        if (o->block % 32 != 0) {
            PyErr_Format(PyExc_ValueError, "%s(): block=%d is not a multiple of the warp size (32)", fname,
                         o->block);
            return -1;
        }
        int limit = 1024;
#if EWKERN_WITH_CUDA
        ew_func_attrs fa;
        if (dev.type == EW_CUDA && k->kernel && ewcuda_func_attrs(k->kernel, &fa) == 0)
            limit = fa.max_threads_per_block;
#endif
        if (o->block > limit) {
            PyErr_Format(PyExc_ValueError, "%s(): block=%d exceeds the limit of %d threads per block for "
                         "variant '%s' on this device", fname, o->block, limit, k->variant);
            return -1;
        }
    }
    if (o->grid_given && !(k->flags & EW_USES_GRID)) {
        PyErr_Format(PyExc_ValueError, "%s(): variant '%s' is not a grid-stride kernel and takes no grid=",
                     fname, k->variant);
        return -1;
    }
    (void)dev;
    return 0;
}

static int to_double(const char *fname, const char *name, PyObject *obj, double *out)
{
    if (PyFloat_CheckExact(obj)) {
        *out = PyFloat_AS_DOUBLE(obj);
        return 0;
    }
    if (!PyNumber_Check(obj) || PyUnicode_Check(obj) || PyComplex_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s(): %s must be a real number, got %.200s", fname, name,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    *out = PyFloat_AsDouble(obj);
    return *out == -1.0 && PyErr_Occurred() ? -1 : 0;
}

/* ---- checks ------------------------------------------------------------------------------------- */

static PyObject *shape_str(const ew_view *v)
{
    PyObject *t = PyTuple_New(v->ndim);
    for (int i = 0; t && i < v->ndim; i++)
        PyTuple_SET_ITEM(t, i, PyLong_FromLongLong(v->shape[i]));
    return t;
}

static int same_shape(const ew_view *a, const ew_view *b)
{
    if (a->ndim != b->ndim)
        return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return 0;
    return 1;
}

static int check_pair(const char *fname, const ew_view *ref, const char *refname, const ew_view *v,
                      const char *vname, int check_dtype, int check_shape)
{
    if (ref->device.type != v->device.type || ref->device.id != v->device.id) {
        PyObject *d1 = ew_device_str(ref->device), *d2 = ew_device_str(v->device);
        PyErr_Format(PyExc_ValueError, "%s(): device mismatch: %s is on %U but %s is on %U", fname, refname,
                     d1, vname, d2);
        Py_XDECREF(d1);
        Py_XDECREF(d2);
        return -1;
    }
    if (check_dtype && ref->dtype != v->dtype) {
        PyErr_Format(PyExc_TypeError, "%s(): dtype mismatch: %s is %s but %s is %s", fname, refname,
                     ew_dtype_name(ref->dtype), vname, ew_dtype_name(v->dtype));
        return -1;
    }
    if (check_shape && !same_shape(ref, v)) {
        PyObject *s1 = shape_str(ref), *s2 = shape_str(v);
        PyErr_Format(PyExc_ValueError, "%s(): shape mismatch: %s has shape %R but %s has shape %R "
                     "(ewkern does not broadcast)", fname, refname, s1, vname, s2);
        Py_XDECREF(s1);
        Py_XDECREF(s2);
        return -1;
    }
    return 0;
}

/* out= must be writable and either apart from every input or, where exact_ok (an elementwise
 * op: each element read before its own result is written), exactly one of them: the same start
 * and the same bytes. An out= that only starts where an input starts is a partial overlap (an
 * rmse result over part of its input). */
static int check_out(const char *fname, const ew_view *out, const ew_view *ins, int nin, int exact_ok)
{
    if (out->readonly) {
        PyErr_Format(PyExc_ValueError, "%s(): out is read-only", fname);
        return -1;
    }
    for (int i = 0; i < nin; i++) {
        if (!ew_views_overlap(out, &ins[i]))
            continue;
        if (exact_ok && ins[i].data == out->data &&
            ins[i].size * ew_dtype_size(ins[i].dtype) == out->size * ew_dtype_size(out->dtype))
            continue;
        PyErr_Format(PyExc_ValueError, exact_ok ? "%s(): out partially overlaps an input; it may be the same "
                                                  "array as an input, or separate memory"
                                                : "%s(): out overlaps an input; give it separate memory", fname);
        return -1;
    }
    return 0;
}

/* ewkern records no autograd graph, so a torch tensor that requires grad while torch's grad
 * mode is on would lose its gradient here without a word: refuse it and point to ewkern.torch
 * (custom ops with autograd). Only arrays that came through the exchange API (torch) are asked,
 * one attribute read each; torch.is_grad_enabled() runs once, at the first tensor that requires
 * grad (ewkern.torch's kernels get such tensors, under the no_grad of autograd's forward). */
static int refuse_grad(ew_state *st, const char *fname, const ew_view *v, const char *const *names, int nv)
{
    for (int i = 0; i < nv; i++) {
        if (v[i].kind != EW_KIND_API)
            continue;
        PyObject *rg = NULL;
#if PY_VERSION_HEX >= 0x030D0000
        if (PyObject_GetOptionalAttr(v[i].obj, st->str_requires_grad, &rg) < 0)
            return -1;
#else
        if ((rg = PyObject_GetAttr(v[i].obj, st->str_requires_grad)) == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError))
                return -1;
            PyErr_Clear();
        }
#endif
        int requires = rg == Py_True;
        Py_XDECREF(rg);
        if (!requires)
            continue;
        PyObject *torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");   /* borrowed */
        if (torch == NULL)
            continue;   /* not a torch tensor: no grad mode to ask */
        PyObject *on = PyObject_CallMethod(torch, "is_grad_enabled", NULL);
        if (on == NULL)
            return -1;
        int enabled = PyObject_IsTrue(on);
        Py_DECREF(on);
        /* a backward op has no function in ewkern.torch: its forward op's autograd runs it */
        size_t len = strlen(fname), bw = len > 9 && strcmp(fname + len - 9, "_backward") == 0 ? 9 : 0;
        char forward[64];   /* PyErr_Format takes no %.*s */
        snprintf(forward, sizeof forward, "%.*s", (int)(len - bw), fname);
        if (enabled > 0 && bw)
            PyErr_Format(PyExc_RuntimeError,
                         "%s(): %s requires grad and torch's grad mode is on, but ewkern.%s records no "
                         "autograd graph, so the gradient would be lost. It is the backward of "
                         "ewkern.torch.%s, whose autograd runs it (and differentiates the gradient "
                         "again for double backward); or call ewkern.%s under torch.no_grad() or on "
                         "detached tensors", fname, names[i], fname, forward, fname);
        else if (enabled > 0)
            PyErr_Format(PyExc_RuntimeError,
                         "%s(): %s requires grad and torch's grad mode is on, but ewkern.%s records no "
                         "autograd graph, so the gradient would be lost. Use ewkern.torch.%s (import "
                         "ewkern.torch: torch custom ops with autograd; out= is not differentiable there "
                         "either, as in torch), or call ewkern.%s under torch.no_grad() or on detached "
                         "tensors", fname, names[i], fname, fname, fname);
        return enabled ? -1 : 0;   /* grad mode off: the other arrays need no look */
    }
    return 0;
}

/* The stream to launch on: the producer's current work stream when the first array came
 * through the exchange API, else ewkern's current stream. */
static int pick_stream(ew_state *st, const ew_view *first, void **stream)
{
    *stream = NULL;
    if (first->device.type != EW_CUDA)
        return 0;
    if (first->kind == EW_KIND_API)
        return first->api->current_work_stream(kDLCUDA, first->device.id, stream) == 0 ? 0 : -1;
    *stream = ew_current_stream(st, first->device.id, NULL);
    return 0;
}

static int report_launch_error(int err, const char *fname, const ew_kernel *k, ew_device dev)
{
    if (err == 0)
        return 0;
    char what[256];
    if (dev.type == EW_CPU) {
        PyErr_Format(PyExc_RuntimeError, "%s (variant '%s', %s, cpu) failed with error %d", fname, k->variant,
                     ew_dtype_name(k->dtype), err);
        return -1;
    }
    snprintf(what, sizeof what, "%s (variant '%s', %s, cuda:%d)", fname, k->variant, ew_dtype_name(k->dtype),
             dev.id);
    ew_raise_cuda(err, what);
    return -1;
}

/* Run a kernel, releasing the GIL when the work is large: a CPU loop runs for a while, and a
 * CUDA launch may block the host while the launch queue is full of large kernels. Tiny calls
 * keep it (the release and re-acquire would be most of their cost). */
static int launch(const ew_kernel *k, const void *args, int64_t work)
{
    int err;
    if (work > EW_GIL_FREE_WORK) {
        Py_BEGIN_ALLOW_THREADS
        err = k->launch(args);
        Py_END_ALLOW_THREADS
    } else {
        err = k->launch(args);
    }
    return err;
}

/* ---- plans ---------------------------------------------------------------------------------------- */

static PlanObject *plan_new(ew_state *st)
{
    PlanObject *p = PyObject_New(PlanObject, st->Plan_Type);
    if (p == NULL)
        return NULL;
    memset((char *)p + sizeof(PyObject), 0, sizeof(PlanObject) - sizeof(PyObject));
    return p;
}

static void plan_dealloc(PlanObject *p)
{
    PyTypeObject *tp = Py_TYPE(p);
    for (int i = 0; i < p->nviews; i++)
        ew_view_release(&p->views[i]);
    Py_XDECREF(p->keep);
    Py_XDECREF(p->out);
    tp->tp_free((PyObject *)p);
    Py_DECREF(tp);
}

int ew_plan_launch(PlanObject *p)
{
    return p->k->launch(p->is_rmse ? (const void *)&p->rm : (const void *)&p->ew);
}

int ew_plan_launch_on(PlanObject *p, void *stream)
{
    if (p->is_rmse) {
        ew_rmse_args a = p->rm;
        a.stream = stream;
        return p->k->launch(&a);
    }
    ew_args a = p->ew;
    a.stream = stream;
    return p->k->launch(&a);
}

/* Move the call's views and objects into the plan. */
static int plan_fill(PlanObject *p, const ew_kernel *k, int is_rmse, const void *args, ew_device dev,
                     void *stream, ew_view *views, int nviews, PyObject *out, int64_t rd, int64_t wr)
{
    p->k = k;
    p->is_rmse = is_rmse;
    if (is_rmse)
        p->rm = *(const ew_rmse_args *)args;
    else
        p->ew = *(const ew_args *)args;
    p->device = dev;
    p->stream = stream;
    p->bytes_read = rd;
    p->bytes_written = wr;
    p->keep = PyTuple_New(nviews);
    if (p->keep == NULL)
        return -1;
    for (int i = 0; i < nviews; i++) {
        p->views[i] = views[i];
        views[i].mt = NULL;
        views[i].mtv = NULL;
        Py_INCREF(views[i].obj);
        PyTuple_SET_ITEM(p->keep, i, views[i].obj);
    }
    p->nviews = nviews;
    Py_INCREF(out);
    p->out = out;
    return 0;
}

static PyObject *plan_get(PlanObject *p, void *which)
{
    switch ((intptr_t)which) {
    case 0: return PyUnicode_FromString(p->k->op);
    case 1: return PyUnicode_FromString(p->k->variant);
    case 2: return PyUnicode_FromString(ew_dtype_name(p->k->dtype));
    case 3: return ew_device_str(p->device);
    case 4: return PyLong_FromLongLong(p->bytes_read);
    case 5: return PyLong_FromLongLong(p->bytes_written);
    case 6: Py_INCREF(p->out); return p->out;
    default: return PyLong_FromLongLong(p->is_rmse ? p->rm.outer * p->rm.n * p->rm.inner : p->ew.n);
    }
}

static PyObject *plan_call(PlanObject *p, PyObject *args, PyObject *kwds)
{
    ew_device_guard g = EW_DEVICE_GUARD_INIT;
    if (ew_device_enter(&g, p->device) < 0)
        return NULL;
    const int64_t work = p->is_rmse ? p->rm.outer * p->rm.n * p->rm.inner : p->ew.n;
    const void *kargs = p->is_rmse ? (const void *)&p->rm : (const void *)&p->ew;
    int rc = report_launch_error(launch(p->k, kargs, work), p->k->op, p->k, p->device);
    ew_device_exit(&g);
    if (rc < 0)
        return NULL;
    Py_INCREF(p->out);
    return p->out;
}

static PyObject *plan_repr(PlanObject *p)
{
    PyObject *dev = ew_device_str(p->device);
    PyObject *r = PyUnicode_FromFormat("<ewkern Plan %s variant=%s dtype=%s device=%U bytes=%lld>",
                                       p->k->op, p->k->variant, ew_dtype_name(p->k->dtype), dev,
                                       (long long)(p->bytes_read + p->bytes_written));
    Py_XDECREF(dev);
    return r;
}

static PyGetSetDef plan_getset[] = {
    {"op", (getter)plan_get, NULL, "Op name.", (void *)0},
    {"variant", (getter)plan_get, NULL, "Kernel variant.", (void *)1},
    {"dtype", (getter)plan_get, NULL, "Input dtype.", (void *)2},
    {"device", (getter)plan_get, NULL, "Device.", (void *)3},
    {"nbytes_read", (getter)plan_get, NULL, "Bytes one launch reads (the declared convention).", (void *)4},
    {"nbytes_written", (getter)plan_get, NULL, "Bytes one launch writes.", (void *)5},
    {"out", (getter)plan_get, NULL, "The output the plan writes.", (void *)6},
    {"size", (getter)plan_get, NULL, "Elements per input.", (void *)7},
    {NULL}
};

static PyType_Slot plan_slots[] = {
    {Py_tp_dealloc, plan_dealloc},
    {Py_tp_getset, plan_getset},
    {Py_tp_call, plan_call},
    {Py_tp_repr, plan_repr},
    {Py_tp_doc, "A resolved op call (ewkern._C.prepare): calling it launches again; "
                "ewkern._C.time_plans times it."},
    {0, NULL}
};

PyType_Spec ew_plan_spec = {
    .name = "ewkern.Plan",
    .basicsize = sizeof(PlanObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = plan_slots,
};

/* The last step of every op call: launch (or store the launch in plan), release the views, and
 * return the result; on failure release everything and return NULL. */
static PyObject *finish_call(const char *fname, const ew_kernel *k, int is_rmse, const void *args, ew_device dev,
                             void *stream, ew_view *v, int nv, PyObject *result, int64_t rd, int64_t wr,
                             int64_t work, PlanObject *plan)
{
    int rc = plan ? plan_fill(plan, k, is_rmse, args, dev, stream, v, nv, result, rd, wr)
                  : report_launch_error(launch(k, args, work), fname, k, dev);
    for (int i = 0; i < nv; i++)
        ew_view_release(&v[i]);
    if (rc < 0)
        Py_CLEAR(result);
    return result;
}

/* ---- elementwise ops ------------------------------------------------------------------------------
 * ops.def's rows (inputs a, b; one result) and grads.def's (inputs grad and the saved arrays; one
 * or two gradients, output_mask choosing which of two are computed). */

#define MAX_IN 3
#define MAX_OUT 2

static void elementwise_spec(int opi, call_spec *cs)
{
    const ew_op_info *op = &ew_ops[opi];
    cs->fname = op->name;
    cs->npos = 0;
    if (op->inputs == 0) {            /* fill(out, value) */
        cs->names[cs->npos++] = "out";
        cs->names[cs->npos++] = "value";
        cs->nrequired = 2;
        return;
    }
    snprintf(cs->buf, sizeof cs->buf, "%s", op->args);
    for (char *p = cs->buf; *p && cs->npos < MAX_IN;) {
        cs->names[cs->npos++] = p;
        while (*p && *p != ' ')
            p++;
        if (*p)
            *p++ = '\0';
    }
    if (op->scalars == 1)
        cs->names[cs->npos++] = "c";
    else if (op->scalars == 2) {
        cs->names[cs->npos++] = "alpha";
        cs->names[cs->npos++] = "beta";
    }
    cs->nrequired = cs->npos;
    cs->names[cs->npos++] = "out";
}

/* output_mask= of a two-gradient op: which gradients to compute (default both). */
static int parse_mask(const char *fname, int nout, PyObject *obj, int *mask)
{
    mask[0] = mask[1] = 1;
    if (obj == NULL || obj == Py_None)
        return 0;
    if (nout < 2) {
        PyErr_Format(PyExc_TypeError, "%s() computes one gradient and takes no output_mask", fname);
        return -1;
    }
    PyObject *seq = PyTuple_Check(obj) || PyList_Check(obj) ? PySequence_Tuple(obj) : NULL;
    if (seq == NULL || PyTuple_GET_SIZE(seq) != 2) {
        Py_XDECREF(seq);
        PyErr_Format(PyExc_TypeError, "%s(): output_mask must be a pair of bools (grad of a, grad of b), got %.200s",
                     fname, Py_TYPE(obj)->tp_name);
        return -1;
    }
    for (int k = 0; k < 2; k++) {
        int t = PyObject_IsTrue(PyTuple_GET_ITEM(seq, k));
        if (t < 0) {
            Py_DECREF(seq);
            return -1;
        }
        mask[k] = t;
    }
    Py_DECREF(seq);
    if (!mask[0] && !mask[1]) {
        PyErr_Format(PyExc_ValueError, "%s(): output_mask=(False, False) asks for no gradient", fname);
        return -1;
    }
    return 0;
}

/* out= of an op with nout results: None, an array (nout == 1), or a pair whose entries are arrays
 * or None (nout == 2). outs[k] NULL where none was given. */
static int split_out(const char *fname, int nout, PyObject *obj, PyObject **outs)
{
    outs[0] = outs[1] = NULL;
    if (obj == NULL || obj == Py_None)
        return 0;
    if (nout == 1) {
        outs[0] = obj;
        return 0;
    }
    if (!(PyTuple_Check(obj) || PyList_Check(obj)) || PySequence_Size(obj) != 2) {
        PyErr_Format(PyExc_TypeError, "%s(): out must be None or a pair (out for the gradient of a, of b), each "
                     "an array or None; got %.200s", fname, Py_TYPE(obj)->tp_name);
        return -1;
    }
    for (int k = 0; k < 2; k++) {
        PyObject *o = PySequence_Fast_GET_ITEM(obj, k);   /* tuple or list: no new reference */
        outs[k] = o == Py_None ? NULL : o;
    }
    return 0;
}

/* The result of an op call: the one result, or the pair with None where a gradient was not asked
 * for. Steals the references in res. */
static PyObject *pack_results(int nout, PyObject **res, const int *mask)
{
    if (nout == 1)
        return res[0];
    PyObject *t = PyTuple_New(2);
    for (int k = 0; k < 2; k++) {
        PyObject *x = mask[k] ? res[k] : Py_NewRef(Py_None);
        if (t)
            PyTuple_SET_ITEM(t, k, x);
        else
            Py_XDECREF(x);
    }
    return t;
}

/* The results of a call with nout outputs: each asked-for output is the given out= array or a new
 * array like `like` (its view appended to v[*nv], its index in out_view). NULL on failure (the new
 * views taken stay in v for the caller to release). */
static PyObject *make_results(ew_state *st, const ew_view *like, void *stream, int nout, const int *mask,
                              PyObject *const *out_objs, ew_view *v, int *nv, int *out_view)
{
    PyObject *res[MAX_OUT] = {NULL, NULL};
    for (int o = 0; o < nout; o++) {
        if (!mask[o])
            continue;
        if (out_objs[o]) {
            res[o] = Py_NewRef(out_objs[o]);
            continue;
        }
        res[o] = ew_new_result(st, like, like->dtype, like->ndim, like->shape, stream, &v[*nv]);
        if (res[o] == NULL) {
            Py_XDECREF(res[0]);
            return NULL;
        }
        out_view[o] = (*nv)++;
    }
    return pack_results(nout, res, mask);
}

static PyObject *run_elementwise(ew_state *st, int opi, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames, PlanObject *plan)
{
    const ew_op_info *op = &ew_ops[opi];
    call_spec cs;
    elementwise_spec(opi, &cs);
    PyObject *vals[MAX_PARAMS + N_KWONLY];
    if (parse_args(&cs, args, nargs, kwnames, vals) < 0)
        return NULL;
    launch_opts lo;
    if (parse_opts(cs.fname, vals + cs.npos, &lo) < 0)
        return NULL;
    const int nin = op->inputs, nout = op->outputs;
    int mask[MAX_OUT];
    if (parse_mask(cs.fname, nout, vals[cs.npos + P_MASK], mask) < 0)
        return NULL;

    int fill = nin == 0;
    PyObject *in_objs[MAX_IN] = {NULL, NULL, NULL};
    PyObject *scal_objs[2] = {NULL, NULL};
    PyObject *out_objs[MAX_OUT] = {NULL, NULL};
    if (fill) {
        out_objs[0] = vals[0];
        scal_objs[0] = vals[1];
    } else {
        for (int i = 0; i < nin; i++)
            in_objs[i] = vals[i];
        for (int i = 0; i < op->scalars; i++)
            scal_objs[i] = vals[nin + i];
        if (split_out(cs.fname, nout, vals[cs.npos - 1], out_objs) < 0)
            return NULL;
        for (int k = 0; k < nout; k++)
            if (!mask[k])
                out_objs[k] = NULL;     /* a gradient not asked for: its out= is left alone */
    }
    ew_args ea;
    memset(&ea, 0, sizeof ea);
    for (int i = 0; i < op->scalars; i++)
        if (to_double(cs.fname, cs.names[fill ? 1 : nin + i], scal_objs[i], &ea.scalar[i]) < 0)
            return NULL;

    ew_view v[MAX_IN + MAX_OUT];     /* inputs, then the outputs in order */
    int out_view[MAX_OUT] = {-1, -1};
    const char *view_names[MAX_IN + MAX_OUT];
    static const char *const out_names[MAX_OUT] = {"out", "out[1]"};
    int nv = 0;
    PyObject *result = NULL;
    void *stream = NULL;
    const ew_kernel *k = NULL;
    int have_stream = 0;
    ew_device_guard g = EW_DEVICE_GUARD_INIT;
    for (int i = 0; i < nin; i++) {
        if (ew_view_from_object(st, in_objs[i], &v[nv], cs.names[i], stream, have_stream) < 0)
            goto fail;
        view_names[nv++] = cs.names[i];
        if (i == 0) {
            if (pick_stream(st, &v[0], &stream) < 0)
                goto fail;
            have_stream = 1;
        } else if (check_pair(cs.fname, &v[0], cs.names[0], &v[i], cs.names[i], 1, 1) < 0)
            goto fail;
    }
    for (int o = 0; o < nout; o++) {
        if (!out_objs[o])
            continue;
        const char *oname = nout == 1 ? "out" : out_names[o];
        if (ew_view_from_object(st, out_objs[o], &v[nv], oname, stream, have_stream) < 0)
            goto fail;
        out_view[o] = nv;
        view_names[nv++] = oname;
        if (fill) {
            if (pick_stream(st, &v[0], &stream) < 0)
                goto fail;
        } else if (check_pair(cs.fname, &v[0], cs.names[0], &v[nv - 1], oname, 1, 1) < 0)
            goto fail;
        if (check_out(cs.fname, &v[nv - 1], v, nin, 1) < 0)
            goto fail;
        if (o == 1 && out_view[0] >= 0 && ew_views_overlap(&v[out_view[0]], &v[nv - 1])) {
            PyErr_Format(PyExc_ValueError, "%s(): the two gradients' out= arrays overlap; give each its own memory",
                         cs.fname);
            goto fail;
        }
    }
    if (refuse_grad(st, cs.fname, v, view_names, nv) < 0)
        goto fail;
    const ew_view *ref = &v[0];
    k = strcmp(lo.variant, "auto") == 0 ? ew_auto_kernel(opi, ref->dtype, ref->device.type)
                                        : ew_find_kernel(op->name, lo.variant, ref->dtype, ref->device.type);
    if (k == NULL || check_launch_params(cs.fname, k, &lo, ref->device) < 0 || ew_device_enter(&g, ref->device) < 0)
        goto fail;
    if ((result = make_results(st, ref, stream, nout, mask, out_objs, v, &nv, out_view)) == NULL)
        goto fail;
    for (int i = 0; i < nin; i++)
        ea.in[i] = v[i].data;
    ea.out = out_view[0] >= 0 ? v[out_view[0]].data : NULL;
    ea.out2 = out_view[1] >= 0 ? v[out_view[1]].data : NULL;
    ea.n = ref->size;
    ea.block = lo.block;
    ea.grid = lo.grid;
    ea.stream = stream;
    ea.device = ref->device.id;
    int64_t item = ew_dtype_size(ref->dtype);
    int64_t written = fill ? 1 : (out_view[0] >= 0) + (out_view[1] >= 0);
    result = finish_call(cs.fname, k, 0, &ea, ref->device, stream, v, nv, result, nin * ea.n * item,
                         written * ea.n * item, ea.n, plan);
    ew_device_exit(&g);
    return result;
fail:
    for (int i = 0; i < nv; i++)
        ew_view_release(&v[i]);
    Py_XDECREF(result);
    ew_device_exit(&g);
    return NULL;
}

static ew_state *self_state(PyObject *self, int *opi)
{
    *opi = (int)PyLong_AsLong(PyTuple_GET_ITEM(self, 1));
    return ew_get_state(PyTuple_GET_ITEM(self, 0));
}

/* ewkern.fuse traces a function by calling it on stand-ins (ewkern/_fuse.py). An op given one
 * fails to view it as an array with a TypeError; then, and only then, the call goes to the
 * stand-in type's __ewkern_fuse__(name, args, kwargs), which adds the op to the traced expression.
 * An ordinary call pays nothing; a TypeError with no stand-in among the arguments stays as it was. */
static PyObject *fuse_handoff(const char *name, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (!PyErr_ExceptionMatches(PyExc_TypeError))
        return NULL;
    const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    ew_saved_error e;
    ew_error_save(&e);
    PyObject *hook = NULL;
    for (Py_ssize_t i = 0; i < nargs + nkw && hook == NULL; i++) {
        hook = PyObject_GetAttrString((PyObject *)Py_TYPE(args[i]), "__ewkern_fuse__");
        if (hook == NULL)
            PyErr_Clear();
    }
    ew_error_restore(&e);
    if (hook == NULL)
        return NULL;
    PyErr_Clear();
    PyObject *pos = PyTuple_New(nargs), *kw = PyDict_New(), *r = NULL;
    if (pos != NULL && kw != NULL) {
        for (Py_ssize_t i = 0; i < nargs; i++)
            PyTuple_SET_ITEM(pos, i, Py_NewRef(args[i]));
        int ok = 0;
        for (Py_ssize_t i = 0; i < nkw && ok == 0; i++)
            ok = PyDict_SetItem(kw, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]);
        if (ok == 0)
            r = PyObject_CallFunction(hook, "sOO", name, pos, kw);
    }
    Py_XDECREF(pos);
    Py_XDECREF(kw);
    Py_DECREF(hook);
    return r;
}

static PyObject *op_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    int opi;
    ew_state *st = self_state(self, &opi);
    PyObject *r = run_elementwise(st, opi, args, nargs, kwnames, NULL);
    return r != NULL ? r : fuse_handoff(ew_ops[opi].name, args, nargs, kwnames);
}

/* ---- rmse ------------------------------------------------------------------------------------------- */

static const call_spec rmse_spec = {"rmse", {"a", "b", "axis", "out"}, 4, 2};

/* Turn axis= into the [outer][n][inner] split of shape; the result keeps the other axes. */
static int rmse_split(const ew_view *v, PyObject *axis, int64_t *outer, int64_t *n, int64_t *inner,
                      int *out_ndim, int64_t *out_shape)
{
    int nd = v->ndim;
    int reduce[EW_MAXDIM] = {0};
    if (axis == NULL || axis == Py_None) {
        for (int i = nd == 1 ? 0 : 1; i < nd; i++)
            reduce[i] = 1;
    } else {
        /* an int or any integer with __index__ (numpy.int64 included), or a sequence of them */
        PyObject *seq = PyIndex_Check(axis) ? PyTuple_Pack(1, axis) : PySequence_Tuple(axis);
        if (seq == NULL) {
            PyErr_Format(PyExc_TypeError, "rmse(): axis must be None, an int or a tuple of ints, got %.200s",
                         Py_TYPE(axis)->tp_name);
            return -1;
        }
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(seq); j++) {
            PyObject *item = PyTuple_GET_ITEM(seq, j);
            if (!PyIndex_Check(item)) {
                PyErr_Format(PyExc_TypeError, "rmse(): axis entries must be ints, got %.200s", Py_TYPE(item)->tp_name);
                Py_DECREF(seq);
                return -1;
            }
            PyObject *idx = PyNumber_Index(item);
            /* out of a long's range is out of bounds as any other (a ValueError, as NumPy's AxisError) */
            long ax = idx ? PyLong_AsLong(idx) : -1L;
            Py_XDECREF(idx);
            if (ax == -1 && PyErr_Occurred()) {
                if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
                    Py_DECREF(seq);
                    return -1;
                }
                PyErr_Clear();
                ax = LONG_MAX;
            }
            if (ax < -nd || ax >= nd) {
                PyErr_Format(PyExc_ValueError, "rmse(): axis %R is out of bounds for an array of %d dimensions",
                             item, nd);
                Py_DECREF(seq);
                return -1;
            }
            if (ax < 0)
                ax += nd;
            if (reduce[ax]) {
                Py_DECREF(seq);
                PyErr_Format(PyExc_ValueError, "rmse(): axis %ld repeated", ax);
                return -1;
            }
            reduce[ax] = 1;
        }
        Py_DECREF(seq);
    }
    int lo = -1, hi = -1;
    for (int i = 0; i < nd; i++)
        if (reduce[i]) {
            if (lo < 0)
                lo = i;
            else if (hi != i - 1) {
                PyErr_SetString(PyExc_ValueError,
                                "rmse(): the reduced axes must be one contiguous run (for example the trailing "
                                "axes, each batch contiguous, or the leading axes, batch as the fastest axis)");
                return -1;
            }
            hi = i;
        }
    *outer = 1;
    *n = 1;
    *inner = 1;
    *out_ndim = 0;
    if (lo < 0) {           /* nothing reduced: every element is its own batch */
        lo = nd;
        hi = nd - 1;
    }
    for (int i = 0; i < nd; i++) {
        if (i < lo)
            *outer *= v->shape[i];
        else if (i > hi)
            *inner *= v->shape[i];
        else
            *n *= v->shape[i];
        if (i < lo || i > hi)
            out_shape[(*out_ndim)++] = v->shape[i];
    }
    return 0;
}

static PyObject *run_rmse(ew_state *st, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                          PlanObject *plan)
{
    PyObject *vals[MAX_PARAMS + N_KWONLY];
    if (parse_args(&rmse_spec, args, nargs, kwnames, vals) < 0)
        return NULL;
    launch_opts lo;
    if (parse_opts("rmse", vals + rmse_spec.npos, &lo) < 0)
        return NULL;
    if (vals[rmse_spec.npos + P_MASK]) {
        PyErr_SetString(PyExc_TypeError, "rmse() got an unexpected keyword argument 'output_mask'");
        return NULL;
    }
    PyObject *out_obj = vals[3] == Py_None ? NULL : vals[3];
    ew_view v[3];
    int nv = 0;
    PyObject *result = NULL;
    void *stream = NULL;
    const ew_kernel *k;
    ew_device_guard g = EW_DEVICE_GUARD_INIT;
    if (ew_view_from_object(st, vals[0], &v[0], "a", NULL, 0) < 0)
        return NULL;
    nv = 1;
    if (pick_stream(st, &v[0], &stream) < 0)
        goto fail;
    if (ew_view_from_object(st, vals[1], &v[1], "b", stream, 1) < 0)
        goto fail;
    nv = 2;
    if (check_pair("rmse", &v[0], "a", &v[1], "b", 1, 1) < 0 || refuse_grad(st, "rmse", v, rmse_spec.names, 2) < 0)
        goto fail;
    ew_rmse_args ra;
    memset(&ra, 0, sizeof ra);
    int out_ndim;
    int64_t out_shape[EW_MAXDIM];
    if (rmse_split(&v[0], vals[2], &ra.outer, &ra.n, &ra.inner, &out_ndim, out_shape) < 0)
        goto fail;
    ew_dtype out_dt = v[0].dtype == EW_FLOAT64 ? EW_FLOAT64 : EW_FLOAT32;
    k = strcmp(lo.variant, "auto") == 0 ? ew_auto_kernel(EW_OP_RMSE, v[0].dtype, v[0].device.type)
                                        : ew_find_kernel("rmse", lo.variant, v[0].dtype, v[0].device.type);
    if (k == NULL || check_launch_params("rmse", k, &lo, v[0].device) < 0)
        goto fail;
    if ((k->flags & EW_CONTIGUOUS_BATCHES_ONLY) && ra.inner > 1 && ra.outer * ra.n > 0) {
        PyErr_Format(PyExc_ValueError, "rmse(): variant '%s' supports only contiguous batches (reducing "
                     "trailing axes); use variant='auto' for this layout", k->variant);
        goto fail;
    }
    if (ew_device_enter(&g, v[0].device) < 0)
        goto fail;
    if (out_obj) {
        if (ew_view_from_object(st, out_obj, &v[2], "out", stream, 1) < 0)
            goto fail;
        nv = 3;
        ew_view want = v[2];
        want.ndim = out_ndim;
        memcpy(want.shape, out_shape, sizeof(int64_t) * out_ndim);
        want.dtype = out_dt;
        want.device = v[0].device;
        if (check_pair("rmse", &want, "the result", &v[2], "out", 1, 1) < 0 || check_out("rmse", &v[2], v, 2, 0) < 0 ||
            refuse_grad(st, "rmse", &v[2], rmse_spec.names + 3, 1) < 0)
            goto fail;
        result = out_obj;
        Py_INCREF(result);
    } else {
        result = ew_new_result(st, &v[0], out_dt, out_ndim, out_shape, stream, &v[2]);
        if (result == NULL)
            goto fail;
        nv = 3;
    }
    ra.a = v[0].data;
    ra.b = v[1].data;
    ra.out = v[2].data;
    ra.block = lo.block;
    ra.grid = lo.grid;
    ra.stream = stream;
    ra.device = v[0].device.id;
    int64_t rd = 2 * v[0].size * ew_dtype_size(v[0].dtype);
    int64_t wr = ra.outer * ra.inner * ew_dtype_size(out_dt);
    result = finish_call("rmse", k, 1, &ra, v[0].device, stream, v, nv, result, rd, wr, v[0].size, plan);
    ew_device_exit(&g);
    return result;
fail:
    for (int i = 0; i < nv; i++)
        ew_view_release(&v[i]);
    Py_XDECREF(result);
    ew_device_exit(&g);
    return NULL;
}

static PyObject *rmse_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    int opi;
    ew_state *st = self_state(self, &opi);
    return run_rmse(st, args, nargs, kwnames, NULL);
}

/* rmse_backward(grad, a, b, r, axis=None): the gradients of rmse(a, b, axis) given the incoming
 * gradient grad and the forward's result r (both of the result's shape and dtype): grad_a =
 * (a - b) grad / (n r) per batch, grad_b = -grad_a, in one pass over a and b. */
static const call_spec rmse_grad_spec = {"rmse_backward", {"grad", "a", "b", "r", "axis", "out"}, 6, 4};

static PyObject *run_rmse_backward(ew_state *st, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *vals[MAX_PARAMS + N_KWONLY];
    if (parse_args(&rmse_grad_spec, args, nargs, kwnames, vals) < 0)
        return NULL;
    launch_opts lo;
    int mask[MAX_OUT];
    PyObject *out_objs[MAX_OUT];
    if (parse_opts("rmse_backward", vals + rmse_grad_spec.npos, &lo) < 0 ||
        parse_mask("rmse_backward", 2, vals[rmse_grad_spec.npos + P_MASK], mask) < 0 ||
        split_out("rmse_backward", 2, vals[5], out_objs) < 0)
        return NULL;
    for (int k = 0; k < 2; k++)
        if (!mask[k])
            out_objs[k] = NULL;
    static const char *const names[6] = {"a", "b", "grad", "r", "out[0]", "out[1]"};
    const char *view_names[6] = {"a", "b", "grad", "r", NULL, NULL};   /* out[1] alone sits in slot 4 */
    ew_view v[6];
    int nv = 0, out_view[2] = {-1, -1};
    PyObject *result = NULL;
    void *stream = NULL;
    const ew_kernel *k;
    ew_device_guard g = EW_DEVICE_GUARD_INIT;
    if (ew_view_from_object(st, vals[1], &v[0], "a", NULL, 0) < 0)
        return NULL;
    nv = 1;
    if (pick_stream(st, &v[0], &stream) < 0)
        goto fail;
    PyObject *objs[3] = {vals[2], vals[0], vals[3]};
    for (int i = 0; i < 3; i++) {
        if (ew_view_from_object(st, objs[i], &v[nv], names[nv], stream, 1) < 0)
            goto fail;
        nv++;
    }
    if (check_pair("rmse_backward", &v[0], "a", &v[1], "b", 1, 1) < 0)
        goto fail;
    ew_rmse_grad_args ra;
    memset(&ra, 0, sizeof ra);
    int red_ndim;
    int64_t red_shape[EW_MAXDIM];
    if (rmse_split(&v[0], vals[4] == Py_None ? NULL : vals[4], &ra.outer, &ra.n, &ra.inner, &red_ndim, red_shape) < 0)
        goto fail;
    ew_view want = v[0];
    want.ndim = red_ndim;
    memcpy(want.shape, red_shape, sizeof(int64_t) * red_ndim);
    want.dtype = v[0].dtype == EW_FLOAT64 ? EW_FLOAT64 : EW_FLOAT32;
    if (check_pair("rmse_backward", &want, "rmse's result", &v[2], "grad", 1, 1) < 0 ||
        check_pair("rmse_backward", &want, "rmse's result", &v[3], "r", 1, 1) < 0)
        goto fail;
    for (int o = 0; o < 2; o++) {
        if (!out_objs[o])
            continue;
        if (ew_view_from_object(st, out_objs[o], &v[nv], names[4 + o], stream, 1) < 0)
            goto fail;
        view_names[nv] = names[4 + o];
        out_view[o] = nv++;
        if (check_pair("rmse_backward", &v[0], "a", &v[nv - 1], names[4 + o], 1, 1) < 0 ||
            check_out("rmse_backward", &v[nv - 1], v, 4, 1) < 0)
            goto fail;
    }
    if (out_view[0] >= 0 && out_view[1] >= 0 && ew_views_overlap(&v[out_view[0]], &v[out_view[1]])) {
        PyErr_SetString(PyExc_ValueError, "rmse_backward(): the two gradients' out= arrays overlap; give each its own memory");
        goto fail;
    }
    if (refuse_grad(st, "rmse_backward", v, view_names, nv) < 0)
        goto fail;
    k = strcmp(lo.variant, "auto") == 0 ? ew_auto_kernel(EW_OP_RMSE_BACKWARD, v[0].dtype, v[0].device.type)
                                        : ew_find_kernel("rmse_backward", lo.variant, v[0].dtype, v[0].device.type);
    if (k == NULL || check_launch_params("rmse_backward", k, &lo, v[0].device) < 0 ||
        ew_device_enter(&g, v[0].device) < 0)
        goto fail;
    if ((result = make_results(st, &v[0], stream, 2, mask, out_objs, v, &nv, out_view)) == NULL)
        goto fail;
    ra.a = v[0].data;
    ra.b = v[1].data;
    ra.grad = v[2].data;
    ra.r = v[3].data;
    ra.out = out_view[0] >= 0 ? v[out_view[0]].data : NULL;
    ra.out2 = out_view[1] >= 0 ? v[out_view[1]].data : NULL;
    ra.block = lo.block;
    ra.stream = stream;
    ra.device = v[0].device.id;
    result = finish_call("rmse_backward", k, 2, &ra, v[0].device, stream, v, nv, result, 0, 0, v[0].size, NULL);
    ew_device_exit(&g);
    return result;
fail:
    for (int i = 0; i < nv; i++)
        ew_view_release(&v[i]);
    Py_XDECREF(result);
    ew_device_exit(&g);
    return NULL;
}

static PyObject *rmse_backward_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    int opi;
    ew_state *st = self_state(self, &opi);
    return run_rmse_backward(st, args, nargs, kwnames);
}

/* ---- the builtins ----------------------------------------------------------------------------------- */

static const char rmse_doc[] =
    "rmse(a, b, axis=None, *, out=None, variant='auto', block=None, grid=None)\n--\n\n"
    "Batched root-mean-square error: sqrt(mean((a - b)**2)) over the reduced axes.\n\n"
    "axis: the axes reduced, an int or tuple (negative allowed), one contiguous run of axes;\n"
    "None reduces all axes but the first (a 1-D input is one batch). The result has the other\n"
    "axes and dtype float32 (float64 for float64 inputs). A batch of zero elements gives NaN.\n"
    "variant: 'auto' (deterministic, the fast default) or one of the study's versions\n"
    "(ewkern.variants('rmse')).";

static PyMethodDef rmse_def = {"rmse", (PyCFunction)(void (*)(void))rmse_call, METH_FASTCALL | METH_KEYWORDS,
                               rmse_doc};

static const char rmse_backward_doc[] =
    "rmse_backward(grad, a, b, r, axis=None, out=None, *, output_mask=None, variant='auto', block=None, grid=None)\n"
    "--\n\n"
    "The gradients of r = rmse(a, b, axis) given the incoming gradient grad of r: per batch\n"
    "grad_a = (a - b) * grad / (n * r), n the elements of a batch, and grad_b = -grad_a, computed in\n"
    "one pass over a and b (one kernel; float16/bfloat16 in float32, rounded once).\n\n"
    "Accuracy: within 2 ulp of |grad_a|, where 1 ulp is eps(dtype) x |exact result| (plus the\n"
    "dtype's smallest normal near zero).\n\n"
    "grad and r: rmse's result shape and dtype (float32, float64 for float64 inputs). Returns the\n"
    "pair (grad_a, grad_b), each like a; output_mask=(True, False) computes grad_a only (None in\n"
    "grad_b's place; default both), and out=(oa, ob) writes into given arrays (None entries allocate).";

static PyMethodDef rmse_backward_def = {"rmse_backward", (PyCFunction)(void (*)(void))rmse_backward_call,
                                        METH_FASTCALL | METH_KEYWORDS, rmse_backward_doc};

/* Docstrings are built once from ops.def and live as long as the process. */
static PyMethodDef op_defs[64];
static char *op_docs[64];

static char *make_doc(int opi)
{
    const ew_op_info *op = &ew_ops[opi];
    call_spec cs;
    elementwise_spec(opi, &cs);
    char sig[256] = "";
    for (int i = 0; i < cs.npos; i++) {
        strcat(sig, i ? ", " : "");
        strcat(sig, cs.names[i]);
        if (i >= cs.nrequired)
            strcat(sig, "=None");
    }
    const char *fmt = "%s(%s, *, variant='auto', block=None, grid=None)\n--\n\n"
                      "Elementwise %s: %s.\n\n"
                      "Accuracy: %s, where 1 ulp is eps(dtype) x |exact result| (plus the dtype's\n"
                      "smallest normal near zero).\n\n"
                      "Inputs: any C-contiguous DLPack arrays (ewkern.Array, numpy, torch, CuPy, JAX) of\n"
                      "equal shape, dtype (float32, float16, bfloat16, float64) and device; no broadcasting.\n"
                      "The result follows the first input's framework (numpy in, numpy out; torch in, torch\n"
                      "out; otherwise an ewkern.Array). out= may alias an input exactly.\n"
                      "variant: 'auto' or a name from ewkern.variants('%s'); block/grid: launch parameters\n"
                      "for the variants that take them.";
    const char *bfmt = op->outputs == 2
        ? "%s(%s, *, output_mask=None, variant='auto', block=None, grid=None)\n--\n\n"
          "Backward of %.*s: %s.\n\n"
          "Accuracy: %s, where 1 ulp is eps(dtype) x |exact result| (plus the dtype's\n"
          "smallest normal near zero).\n\n"
          "One kernel: it reads each argument once and writes each gradient once (float16/\n"
          "bfloat16 computed in float32, rounded once). grad and the saved arrays (the forward's\n"
          "inputs a, b): C-contiguous DLPack arrays of equal shape, dtype and device. Returns the\n"
          "pair (grad_a, grad_b); output_mask=(True, False) computes only grad_a (None in grad_b's\n"
          "place; default both), and out=(oa, ob) writes into given arrays (None entries allocate).\n"
          "A gradient may be written over grad (out=(grad, None))."
        : "%s(%s, *, variant='auto', block=None, grid=None)\n--\n\n"
          "Backward of %.*s: %s.\n\n"
          "Accuracy: %s, where 1 ulp is eps(dtype) x |exact result| (plus the dtype's\n"
          "smallest normal near zero).\n\n"
          "One kernel: it reads each argument once and writes the gradient once (float16/bfloat16\n"
          "computed in float32, rounded once). grad and the saved array (the forward's input a or\n"
          "its result y): C-contiguous DLPack arrays of equal shape, dtype and device. The result\n"
          "follows grad's framework; out= may be grad itself (the gradient written over it).";
    if (op->backward) {
        fmt = bfmt;
        sig[0] = '\0';
        for (int i = 0; i < cs.npos; i++) {
            strcat(sig, i ? ", " : "");
            strcat(sig, cs.names[i]);
            if (i >= cs.nrequired)
                strcat(sig, "=None");
        }
    }
    size_t len = strlen(fmt) + 3 * strlen(op->name) + strlen(sig) + strlen(op->definition) + strlen(op->accuracy) + 16;
    char *doc = PyMem_RawMalloc(len);
    if (doc && op->backward)
        snprintf(doc, len, fmt, op->name, sig, (int)(strlen(op->name) - strlen("_backward")), op->name,
                 op->definition, op->accuracy);
    else if (doc)
        snprintf(doc, len, fmt, op->name, sig, op->name, op->definition, op->accuracy, op->name);
    return doc;
}

PyObject *ew_make_op_functions(PyObject *module)
{
    PyObject *dict = PyDict_New();
    if (dict == NULL)
        return NULL;
    for (int i = 0; i <= ew_nops + 1; i++) {
        PyMethodDef *def;
        if (i == ew_nops)
            def = &rmse_def;
        else if (i == ew_nops + 1)
            def = &rmse_backward_def;
        else {
            def = &op_defs[i];
            if (op_docs[i] == NULL && (op_docs[i] = make_doc(i)) == NULL) {
                Py_DECREF(dict);
                return PyErr_NoMemory();
            }
            def->ml_name = ew_ops[i].name;
            def->ml_meth = (PyCFunction)(void (*)(void))op_call;
            def->ml_flags = METH_FASTCALL | METH_KEYWORDS;
            def->ml_doc = op_docs[i];
        }
        PyObject *self = Py_BuildValue("(Oi)", module, i == ew_nops ? EW_OP_RMSE : i > ew_nops ? EW_OP_RMSE_BACKWARD : i);
        PyObject *modname = PyUnicode_FromString("ewkern");
        PyObject *fn = self && modname ? PyCFunction_NewEx(def, self, modname) : NULL;
        Py_XDECREF(self);
        Py_XDECREF(modname);
        if (fn == NULL || PyDict_SetItemString(dict, def->ml_name, fn) < 0) {
            Py_XDECREF(fn);
            Py_DECREF(dict);
            return NULL;
        }
        Py_DECREF(fn);
    }
    return dict;
}

/* prepare(fn, *args, **kwargs): resolve one call of an ewkern op into a Plan. */
PyObject *ew_prepare(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 1 || !PyCFunction_Check(args[0]) ||
        (PyCFunction_GET_FUNCTION(args[0]) != (PyCFunction)(void (*)(void))op_call &&
         PyCFunction_GET_FUNCTION(args[0]) != (PyCFunction)(void (*)(void))rmse_call)) {
        PyErr_SetString(PyExc_TypeError, "prepare(fn, *args, **kwargs): fn must be an ewkern op such as ewkern.add");
        return NULL;
    }
    int opi;
    ew_state *st = self_state(PyCFunction_GET_SELF(args[0]), &opi);
    PlanObject *p = plan_new(st);
    if (p == NULL)
        return NULL;
    PyObject *out = opi == EW_OP_RMSE ? run_rmse(st, args + 1, nargs - 1, kwnames, p)
                                      : run_elementwise(st, opi, args + 1, nargs - 1, kwnames, p);
    if (out == NULL) {
        Py_DECREF(p);
        return NULL;
    }
    Py_DECREF(out);
    return (PyObject *)p;
}
