/*
 * listing.h: floor 3 (see state.h). The registry as Python sees it: variants(), kernel_info()
 * and ops(), the module functions with their arguments.
 */
#ifndef EWKERN_LISTING_H
#define EWKERN_LISTING_H

#include "state.h"

PyObject *ew_variants(PyObject *module, PyObject *args, PyObject *kwds);
PyObject *ew_kernel_info(PyObject *module, PyObject *args, PyObject *kwds);
PyObject *ew_list_ops(PyObject *module, PyObject *unused);

#endif /* EWKERN_LISTING_H */
