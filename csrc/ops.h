/*
 * ops.h: floor 4 (see state.h). The op entry points (one builtin per op of ops.def, and rmse),
 * prepare(), and the Plan type: a resolved call, ready to launch.
 */
#ifndef EWKERN_OPS_H
#define EWKERN_OPS_H

#include "device.h"
#include "dlpack.h"
#include "ewkern_kernels.h"
#include "state.h"

/* A resolved call, ready to launch: what ewkern._C.prepare returns and time_plans replays. */
typedef struct PlanObject {
    PyObject_HEAD
    const ew_kernel *k;
    int is_rmse;
    ew_args ew;
    ew_rmse_args rm;
    ew_device device;
    void *stream;
    int64_t bytes_read, bytes_written;
    PyObject *keep;     /* tuple of the objects whose memory the plan uses */
    PyObject *out;
    ew_view views[5];
    int nviews;
} PlanObject;

int ew_plan_launch(PlanObject *p);
/* The same launch on another stream (graph capture in the timing core). */
int ew_plan_launch_on(PlanObject *p, void *stream);
PyObject *ew_make_op_functions(PyObject *module);
PyObject *ew_prepare(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
extern PyType_Spec ew_plan_spec;

#endif /* EWKERN_OPS_H */
