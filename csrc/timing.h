/*
 * timing.h: floor 5 (see state.h). The timed loop of ewkern.bench over Plans.
 */
#ifndef EWKERN_TIMING_H
#define EWKERN_TIMING_H

#include "state.h"

PyObject *ew_time_plans(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

#endif /* EWKERN_TIMING_H */
