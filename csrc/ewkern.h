/*
 * ewkern.h: host-side internals shared by the C files of the extension.
 * One way through: Python object -> ew_view (dlpack.c) -> registry lookup (registry.c)
 * -> launcher (csrc/cpu, csrc/cuda) -> result object (ops.c, array.c).
 */
#ifndef EWKERN_H
#define EWKERN_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#include "ewkern_kernels.h"

#ifndef EWKERN_WITH_CUDA
#define EWKERN_WITH_CUDA 0
#endif

#define EW_MAXDIM 16
/* Elements of work above which a launch, a copy or a timing loop releases the GIL. */
#define EW_GIL_FREE_WORK (1 << 16)

enum { EW_CPU = kDLCPU, EW_CUDA = kDLCUDA };

typedef struct ew_device {
    int type;   /* EW_CPU or EW_CUDA */
    int id;
} ew_device;

/* ---- module state ---------------------------------------------------------------- */
typedef struct ew_state {
    PyTypeObject *Array_Type;
    PyTypeObject *Stream_Type;
    PyTypeObject *Plan_Type;
    PyObject *api_cache;        /* dict: type -> capsule with a DLPackExchangeAPI, or None */
    PyObject *bf16_descr;       /* numpy dtype of ml_dtypes.bfloat16, or NULL (not looked up yet) */
    PyObject *current_stream;   /* ewkern.Stream set by `with ewkern.stream(s)`, or None */
    PyObject *str_dlpack, *str_dlpack_device, *str_api; /* interned attribute names */
    PyObject *str_requires_grad;
    PyObject *dlpack_kwnames;   /* ("stream", "max_version") */
    int bf16_lookup_failed;
} ew_state;

extern PyModuleDef ew_moduledef;
ew_state *ew_get_state(PyObject *module);
ew_state *ew_state_from_type(PyTypeObject *tp);

/* ---- the Array type (array.c) ------------------------------------------------------ */
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
extern PyType_Spec ew_stream_spec;
extern PyType_Spec ew_plan_spec;

/* A new Array of fresh memory (uninitialised). stream: CUDA stream to order on. */
PyObject *ew_array_new(ew_state *st, ew_device dev, ew_dtype dt, int ndim, const int64_t *shape,
                       void *stream, PyObject *stream_ref);
int ew_array_check(ew_state *st, PyObject *obj);

/* ---- streams (module.c) --------------------------------------------------------------- */
typedef struct StreamObject {
    PyObject_HEAD
    void *handle;       /* cudaStream_t; NULL = the legacy default stream */
    int device;
    int owned;
} StreamObject;
/* The stream ewkern launches on for its own arrays: the handle of the current Stream. */
void *ew_current_stream(ew_state *st, int device, PyObject **stream_ref);

/* ---- dtypes ---------------------------------------------------------------------------- */
const char *ew_dtype_name(ew_dtype dt);
int ew_dtype_size(ew_dtype dt);
int ew_dtype_from_py(ew_state *st, PyObject *obj, ew_dtype *out); /* str, numpy dtype, type, None->float32 */
int ew_dtype_from_dl(DLDataType dl, ew_dtype *out);
/* The highest address a user-space pointer can have here (2^56 on 64-bit platforms). */
extern const uint64_t ew_address_limit;
/* The number of elements of shape, or -1 with a ValueError naming `what` for a negative
 * dimension or more bytes of dt than fit below ew_address_limit (no int64 overflow). */
int ew_shape_size(const char *what, int ndim, const int64_t *shape, ew_dtype dt, int64_t *size);
DLDataType ew_dtype_to_dl(ew_dtype dt);
/* numpy dtype object for dt (new reference); bfloat16 needs ml_dtypes */
PyObject *ew_numpy_descr(ew_state *st, ew_dtype dt);

/* ---- devices --------------------------------------------------------------------------- */
int ew_device_from_py(PyObject *obj, ew_device *out);   /* "cpu", "cuda", "cuda:1", None -> default */
PyObject *ew_device_str(ew_device dev);
int ew_cuda_device_count(void);
/* RuntimeError when dev is CUDA and CUDA is missing, ValueError when its id is bad; 0 for the cpu. */
int ew_device_check(ew_device dev);
/* The CUDA runtime's current device is the calling thread's, shared with every other library in
 * the process (torch.cuda.current_device() reads it): a call that needs another one switches for
 * its own work and puts the caller's back before it returns, on every path. The guard holds the
 * caller's device, or -1 while nothing was switched:
 *     ew_device_guard g = EW_DEVICE_GUARD_INIT;
 *     if (ew_device_enter(&g, dev) < 0) goto done;   ...   done: ew_device_exit(&g);
 * enter checks dev (ew_device_check) and switches only when dev is not current already (one
 * cudaGetDevice, the common case's whole cost); it may be called again with another device, and
 * exit still restores the device the caller had. exit does nothing after a failed or no-op enter,
 * never sets an exception and keeps a pending one. */
typedef struct ew_device_guard {
    int prev;
} ew_device_guard;
#define EW_DEVICE_GUARD_INIT {-1}
int ew_device_enter(ew_device_guard *g, ew_device dev);
void ew_device_exit(ew_device_guard *g);
/* Raise the Python exception for a CUDA error (MemoryError for out-of-memory). */
void ew_raise_cuda(int err, const char *what);

/* ---- tensor views (dlpack.c) ------------------------------------------------------------ */
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
/* Call the producer deleters of mt and mtv (either may be NULL) with the error state saved. */
void ew_release_managed(DLManagedTensor *mt, DLManagedTensorVersioned *mtv);
/* Turn a view into an owning Array (steals the view's managed tensor). */
PyObject *ew_array_from_view(ew_state *st, ew_view *v, PyObject *base);
/* Exchange API of obj's type, or NULL (no exception) when it has none. */
const DLPackExchangeAPI *ew_exchange_api(ew_state *st, PyTypeObject *tp);
/* Export an Array as a DLPack capsule. */
PyObject *ew_array_dlpack(ArrayObject *self, PyObject *args, PyObject *kwds);
/* Array from a capsule or DLPack producer (zero-copy). */
PyObject *ew_from_dlpack(ew_state *st, PyObject *obj);
/* Allocate a result like `like` (same framework): numpy, exchange-API producer, or Array. */
PyObject *ew_new_result(ew_state *st, const ew_view *like, ew_dtype dt, int ndim, const int64_t *shape,
                        void *stream, ew_view *outv);

/* ---- registry (registry.c) ----------------------------------------------------------------- */
typedef struct ew_op_info {
    const char *name;
    int inputs;
    int scalars;
    const char *definition;
    const char *accuracy; /* the bound the docstring states and the tests assert */
} ew_op_info;

enum { EW_OP_RMSE = -1 };
extern const ew_op_info ew_ops[];
extern const int ew_nops;
int ew_op_index(const char *name);
/* Find the kernel for (op, variant, dtype, device type). NULL with an exception that lists
 * the valid names when there is none. */
const ew_kernel *ew_find_kernel(const char *op, const char *variant, ew_dtype dt, int device_type);
/* Python list of variant names of op (optionally one dtype; -1 = all) on a device type. */
PyObject *ew_variant_list(const char *op, int dtype, int device_type);
int ew_registry_init(void);
/* The "auto" kernel of op (index into ew_ops, or EW_OP_RMSE): one array lookup. */
const ew_kernel *ew_auto_kernel(int op, ew_dtype dt, int device_type);

/* ---- ops (ops.c) ------------------------------------------------------------------------------ */
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
    ew_view views[3];
    int nviews;
} PlanObject;

int ew_plan_launch(PlanObject *p);
/* The same launch on another stream (graph capture in the timing core). */
int ew_plan_launch_on(PlanObject *p, void *stream);
PyObject *ew_make_op_functions(PyObject *module);
PyObject *ew_prepare(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *ew_time_plans(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

#endif /* EWKERN_H */
