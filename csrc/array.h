/*
 * array.h: floor 2 (see state.h). The ewkern.Array type: its layout, new arrays of fresh
 * memory, the empty/zeros/full entries, its DLPack export (Array.__dlpack__), and the release
 * of producer memory an Array may own.
 */
#ifndef EWKERN_ARRAY_H
#define EWKERN_ARRAY_H

#include "device.h"
#include "dtype.h"
#include "state.h"

#include <dlpack/dlpack.h>

typedef struct ArrayObject {
    PyObject_HEAD
    void *data;                  /* element 0 */
    int ndim;
    int64_t shape[EW_MAXDIM];
    int64_t size;
    ew_dtype dtype;
    ew_device device;
    int readonly;
    /* who owns the memory: exactly one of these */
    void *alloc;                 /* our allocation (free/cudaFreeAsync) */
    void *alloc_stream;          /* stream the allocation is ordered on */
    PyObject *stream_ref;        /* the Stream object kept alive while alloc is */
    DLManagedTensor *mt;         /* imported legacy managed tensor */
    DLManagedTensorVersioned *mtv; /* imported versioned managed tensor */
    PyObject *base;              /* other owner object kept alive */
    PyObject *weakreflist;
} ArrayObject;

extern PyType_Spec ew_array_spec;

/* A new Array of fresh memory (uninitialised). stream: CUDA stream to order on. */
PyObject *ew_array_new(ew_state *st, ew_device dev, ew_dtype dt, int ndim, const int64_t *shape,
                       void *stream, PyObject *stream_ref);
int ew_array_check(ew_state *st, PyObject *obj);
/* An Array that owns nothing yet (a 0-d float32 on the cpu, data NULL): the caller fills it. */
ArrayObject *ew_array_alloc(ew_state *st);
/* Set ndim, shape and size (from a->dtype); ValueError for too many dimensions or a bad shape. */
int ew_array_set_shape(ArrayObject *a, int ndim, const int64_t *shape);
/* empty (mode 0), zeros (1), full (2): the module functions, with their arguments. */
PyObject *ew_create(PyObject *module, PyObject *args, PyObject *kwds, int mode);

/* ---- producer memory ----------------------------------------------------------------------- */
/* Call the producer deleters of mt and mtv (either may be NULL) with the error state saved. */
void ew_release_managed(DLManagedTensor *mt, DLManagedTensorVersioned *mtv);
/* The error indicator set aside while producer code runs: a deleter or a capsule destructor
 * may run Python code (a ctypes callback, a framework's release) that must neither see nor
 * swallow an exception on its way to the caller. */
typedef struct ew_saved_error {
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *exc;
#else
    PyObject *type, *value, *tb;
#endif
} ew_saved_error;
void ew_error_save(ew_saved_error *e);
/* Put the saved error back; an exception the producer code raised meanwhile is reported as
 * unraisable. */
void ew_error_restore(ew_saved_error *e);

#endif /* EWKERN_ARRAY_H */
