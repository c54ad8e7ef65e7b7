/*
 * state.h: floor 0, the bottom of the C core. What every other file shares and nothing here
 * calls upward: the build switch (EWKERN_WITH_CUDA), the limits, the module state with its
 * getters (the interned names and the caches live in it), the Stream object's layout and the
 * current-stream rule (which stream ewkern launches on for its own arrays).
 *
 * The floors of csrc/ (each file includes and calls only files on lower floors; the table is
 * checked by tests/test_layering.py):
 *   0  state          module state, current stream      (cuda_api.h, ewkern_kernels.h, ops.def,
 *                                                          erfc_fit.h: contracts with the kernels,
 *                                                          no calls)
 *   1  dtype, device  dtypes, NumPy descrs, shapes; devices, the device guard, CUDA errors
 *   2  registry, stream, array   op table and kernel lookup; the Stream type; the Array type
 *                                 (with its DLPack export)
 *   3  dlpack, listing  DLPack import, views, asarray; the registry's Python listings
 *   4  ops, rtc       op entry points and the Plan type; run-time kernels' views and launches
 *   5  timing         the timed loop over Plans
 *      native_api     the capsule of auto kernels and run-time kernels' launches for native code
 *                     (ewkern/_torch_native)
 *   6  module         method table, module init/traverse/clear, thin wrappers
 */
#ifndef EWKERN_STATE_H
#define EWKERN_STATE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#ifndef EWKERN_WITH_CUDA
#define EWKERN_WITH_CUDA 0
#endif

#define EW_MAXDIM 16
/* Elements of work above which a launch, a copy or a timing loop releases the GIL. */
#define EW_GIL_FREE_WORK (1 << 16)

/* ---- module state ---------------------------------------------------------------- */
typedef struct ew_state {
    PyTypeObject *Array_Type;
    PyTypeObject *Stream_Type;
    PyTypeObject *Plan_Type;
    PyObject *api_cache;        /* dict: type -> capsule with a DLPackExchangeAPI, or None */
    PyObject *neg_cache;        /* dict: type -> whether it has is_neg (torch's negative bit) */
    PyObject *scalar_cache;     /* dict: type -> whether it is a subclass of scalar_types (rtc.c) */
    PyObject *scalar_types;     /* the tuple scalar_cache answers for, or NULL */
    PyObject *bf16_descr;       /* numpy dtype of ml_dtypes.bfloat16, or NULL (not looked up yet) */
    PyObject *current_stream;   /* ewkern.Stream set by `with ewkern.stream(s)`, or None */
    PyObject *str_dlpack, *str_dlpack_device, *str_api, *str_is_neg; /* interned attribute names */
    PyObject *str_requires_grad;
    PyObject *dlpack_kwnames;   /* ("stream", "max_version") */
    int bf16_lookup_failed;
} ew_state;

ew_state *ew_get_state(PyObject *module);
/* The state of the module that created tp (ewkern's types come from PyType_FromModuleAndSpec
 * and cannot be subclassed); NULL with an exception for any other type. */
ew_state *ew_state_from_type(PyTypeObject *tp);

/* ---- streams: the object's layout and the current-stream rule ------------------------ */
typedef struct StreamObject {
    PyObject_HEAD
    void *handle;       /* cudaStream_t; NULL = the legacy default stream */
    int device;
    int owned;
} StreamObject;
/* The stream ewkern launches on for its own arrays: the handle of the current Stream. */
void *ew_current_stream(ew_state *st, int device, PyObject **stream_ref);
/* Set the current Stream (an ewkern.Stream or None): returns the previous one (the state's
 * reference), TypeError for anything else. */
PyObject *ew_set_current_stream(ew_state *st, PyObject *s);
/* The current Stream or None (new reference). */
PyObject *ew_get_current_stream(ew_state *st);

#endif /* EWKERN_STATE_H */
