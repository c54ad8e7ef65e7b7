/*
 * native_api.h: floor 5 (see state.h). ewkern._C._native_api, the capsule of ewkern_native.h.
 */
#ifndef EWKERN_NATIVE_API_H
#define EWKERN_NATIVE_API_H

#include "state.h"

/* Add the capsule to the module: 0, or -1 with an exception. */
int ew_add_native_api(PyObject *module);

#endif /* EWKERN_NATIVE_API_H */
