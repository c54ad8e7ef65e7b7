/*
 * dlpack.h: floor 3 (see state.h). DLPack import: any producer -> ew_view (the borrowed
 * description of an array that the ops work on), Arrays made from views and capsules,
 * asarray, and results that follow the inputs' framework.
 */
#ifndef EWKERN_DLPACK_H
#define EWKERN_DLPACK_H

#include "array.h"
#include "device.h"
#include "dtype.h"
#include "state.h"

typedef struct DLPackExchangeAPI DLPackExchangeAPI;

enum { EW_KIND_ARRAY = 0, EW_KIND_NUMPY = 1, EW_KIND_API = 2, EW_KIND_DLPACK = 3 };

typedef struct ew_view {
    void *data;
    int ndim;
    int64_t shape[EW_MAXDIM];
    int64_t size;
    ew_dtype dtype;
    ew_device device;
    int readonly;
    int kind;                        /* EW_KIND_*: where it came from */
    PyObject *obj;                   /* borrowed: the Python object it views */
    const DLPackExchangeAPI *api;    /* for EW_KIND_API */
    /* to release */
    DLManagedTensor *mt;
    DLManagedTensorVersioned *mtv;
} ew_view;

/* Fill a view of obj, any DLPack producer. stream: the stream the consumer will use (passed
 * to __dlpack__). what: the argument name for messages. Returns -1 with an exception set. */
int ew_view_from_object(ew_state *st, PyObject *obj, ew_view *v, const char *what, void *stream,
                        int have_stream);
void ew_view_release(ew_view *v);
/* Whether the bytes of a and b overlap (an empty view overlaps nothing). */
int ew_views_overlap(const ew_view *a, const ew_view *b);
/* Turn a view into an owning Array (steals the view's managed tensor). */
PyObject *ew_array_from_view(ew_state *st, ew_view *v, PyObject *base);
/* Exchange API of obj's type, or NULL (no exception) when it has none. */
const DLPackExchangeAPI *ew_exchange_api(ew_state *st, PyTypeObject *tp);
/* Array from a capsule or DLPack producer (zero-copy). */
PyObject *ew_from_dlpack(ew_state *st, PyObject *obj);
/* Allocate a result like `like` (same framework): numpy, exchange-API producer, or Array. */
PyObject *ew_new_result(ew_state *st, const ew_view *like, ew_dtype dt, int ndim, const int64_t *shape,
                        void *stream, ew_view *outv);
/* asarray(obj, dtype=None, device=None): the module function, with its arguments. */
PyObject *ew_asarray(PyObject *module, PyObject *args, PyObject *kwds);

#endif /* EWKERN_DLPACK_H */
