/*
 * native_api.c: floor 5 (see state.h). The capsule ewkern._C._native_api (ewkern_native.h): the
 * registry's auto kernels and their launchers, and run-time kernels' recorded launches (rtc.c's
 * ew_rtc_run), for native code that runs without the GIL.
 */
#include "native_api.h"

#include <stdio.h>
#include <string.h>

#include "cuda_api.h"
#include "dtype.h"
#include "registry.h"
#include "rtc.h"
#include "ewkern_native.h"

static const void *auto_kernel(const char *op, int dtype, int cuda)
{
    int i = ew_op_index(op);
    if (i == -2 || dtype < 0 || dtype >= EW_NDTYPES)
        return NULL;
    const ew_kernel *k = ew_auto_kernel(i, (ew_dtype)dtype, cuda ? EW_CUDA : EW_CPU);
    if (k == NULL)
        PyErr_Clear();      /* ew_find_kernel's "no such kernel": here only a NULL */
    return k;
}

static int launch(const void *kernel, const ew_native_launch *a)
{
    ew_args ea;
    memset(&ea, 0, sizeof ea);
    for (int i = 0; i < 3; i++)
        ea.in[i] = a->in[i];
    ea.out = a->out;
    ea.out2 = a->out2;
    ea.n = a->n;
    ea.scalar[0] = a->scalar[0];
    ea.scalar[1] = a->scalar[1];
    ea.stream = a->stream;
    ea.device = a->device;
    return ((const ew_kernel *)kernel)->launch(&ea);
}

/* the fields ew_rmse_args and ew_rmse_grad_args share, from an ew_native_rmse */
#define EW_RMSE_COMMON(d, s)                                                                    \
    ((d).a = (s)->a, (d).b = (s)->b, (d).out = (s)->out, (d).outer = (s)->outer, (d).n = (s)->n, \
     (d).inner = (s)->inner, (d).stream = (s)->stream, (d).device = (s)->device)

static int launch_rmse(const void *kernel, const ew_native_rmse *a)
{
    const ew_kernel *k = kernel;
    if (strcmp(k->op, "rmse_backward") == 0) {
        ew_rmse_grad_args g;
        memset(&g, 0, sizeof g);
        EW_RMSE_COMMON(g, a);
        g.grad = a->grad;
        g.r = a->r;
        g.out2 = a->out2;
        return k->launch(&g);
    }
    ew_rmse_args r;
    memset(&r, 0, sizeof r);
    EW_RMSE_COMMON(r, a);
    return k->launch(&r);
}

static void describe_error(const void *kernel, int err, char *buf, size_t len)
{
    const ew_kernel *k = kernel;
#if EWKERN_WITH_CUDA
    if (k->kernel != NULL) {    /* a CUDA kernel */
        snprintf(buf, len, "%s (variant '%s', %s): CUDA error %s (%d): %s", k->op, k->variant,
                 ew_dtype_name(k->dtype), ewcuda_error_name(err), err, ewcuda_error_string(err));
        return;
    }
#endif
    snprintf(buf, len, "%s (variant '%s', %s): error %d", k->op, k->variant, ew_dtype_name(k->dtype), err);
}

static const ew_native_api api = {EW_NATIVE_API_VERSION, auto_kernel, launch, launch_rmse, describe_error, ew_rtc_run};

int ew_add_native_api(PyObject *module)
{
    PyObject *cap = PyCapsule_New((void *)&api, "ewkern._C._native_api", NULL);
    if (cap == NULL)
        return -1;
    int rc = PyModule_AddObjectRef(module, "_native_api", cap);
    Py_DECREF(cap);
    return rc;
}
