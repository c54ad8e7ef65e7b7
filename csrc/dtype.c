/*
 * dtype.c: floor 1 (see state.h). The dtypes (names, sizes, DLPack and NumPy spellings, the
 * dtype argument of every function), the shape size rule, and the definition of the NumPy
 * C-API table (ewkern_ARRAY_API) that array.c and dlpack.c use too. Calls only state.
 */
#define PY_ARRAY_UNIQUE_SYMBOL ewkern_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include "dtype.h"

#include <numpy/arrayobject.h>
#include <string.h>

int ew_numpy_import(void) { return _import_array(); }

/* ---- dtypes ---------------------------------------------------------------------------- */
static const char *const dtype_names[EW_NDTYPES] = {"float32", "float16", "bfloat16", "float64"};
static const int dtype_sizes[EW_NDTYPES] = {4, 2, 2, 8};

const char *ew_dtype_name(ew_dtype dt) { return dtype_names[dt]; }
int ew_dtype_size(ew_dtype dt) { return dtype_sizes[dt]; }

int ew_dtype_from_dl(DLDataType dl, ew_dtype *out)
{
    if (dl.lanes == 1 && dl.code == kDLFloat && dl.bits == 32) *out = EW_FLOAT32;
    else if (dl.lanes == 1 && dl.code == kDLFloat && dl.bits == 16) *out = EW_FLOAT16;
    else if (dl.lanes == 1 && dl.code == kDLBfloat && dl.bits == 16) *out = EW_BFLOAT16;
    else if (dl.lanes == 1 && dl.code == kDLFloat && dl.bits == 64) *out = EW_FLOAT64;
    else {
        /* named as the frameworks name it (a torch int32 tensor arrives as DLPack code 0, 32 bits) */
        static const char *const kinds[] = {"int", "uint", "float", NULL, "bfloat", "complex", "bool"};
        const char *kind = dl.code < sizeof kinds / sizeof *kinds ? kinds[dl.code] : NULL;
        char lanes[32] = "";
        if (dl.lanes != 1)
            snprintf(lanes, sizeof lanes, " x %d lanes", (int)dl.lanes);
        if (kind != NULL && dl.code == kDLBool && dl.bits == 8)
            PyErr_Format(PyExc_TypeError, "unsupported dtype bool%s: ewkern supports float32, float16, bfloat16 and "
                         "float64", lanes);
        else if (kind != NULL)
            PyErr_Format(PyExc_TypeError, "unsupported dtype %s%d%s: ewkern supports float32, float16, bfloat16 and "
                         "float64", kind, (int)dl.bits, lanes);
        else
            PyErr_Format(PyExc_TypeError, "unsupported dtype (DLPack code %d, %d bits%s): ewkern supports float32, "
                         "float16, bfloat16 and float64", (int)dl.code, (int)dl.bits, lanes);
        return -1;
    }
    return 0;
}

DLDataType ew_dtype_to_dl(ew_dtype dt)
{
    DLDataType d;
    d.code = dt == EW_BFLOAT16 ? kDLBfloat : kDLFloat;
    d.bits = (uint8_t)(8 * dtype_sizes[dt]);
    d.lanes = 1;
    return d;
}

static int bf16_descr(ew_state *st)
{
    if (st->bf16_descr)
        return 0;
    PyObject *mod = PyImport_ImportModule("ml_dtypes");
    if (mod == NULL) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ImportError,
                        "bfloat16 arrays need the ml_dtypes package to convert to or from NumPy "
                        "(pip install ml_dtypes)");
        return -1;
    }
    PyObject *type = PyObject_GetAttrString(mod, "bfloat16");
    Py_DECREF(mod);
    if (type == NULL)
        return -1;
    PyArray_Descr *descr = NULL;
    int ok = PyArray_DescrConverter(type, &descr);
    Py_DECREF(type);
    if (!ok)
        return -1;
    st->bf16_descr = (PyObject *)descr;
    return 0;
}

PyObject *ew_numpy_descr(ew_state *st, ew_dtype dt)
{
    switch (dt) {
    case EW_FLOAT32: return (PyObject *)PyArray_DescrFromType(NPY_FLOAT32);
    case EW_FLOAT16: return (PyObject *)PyArray_DescrFromType(NPY_FLOAT16);
    case EW_FLOAT64: return (PyObject *)PyArray_DescrFromType(NPY_FLOAT64);
    default:
        if (bf16_descr(st) < 0)
            return NULL;
        Py_INCREF(st->bf16_descr);
        return st->bf16_descr;
    }
}

/* dtype from a numpy descr; -1 with TypeError if unsupported. */
int ew_dtype_from_descr(ew_state *st, PyArray_Descr *d, ew_dtype *out)
{
    switch (d->type_num) {
    case NPY_FLOAT32: *out = EW_FLOAT32; return 0;
    case NPY_FLOAT16: *out = EW_FLOAT16; return 0;
    case NPY_FLOAT64: *out = EW_FLOAT64; return 0;
    default: break;
    }
    if (PyDataType_ELSIZE(d) == 2 && d->type_num >= NPY_USERDEF) {
        /* a user dtype of 2 bytes: bfloat16 from ml_dtypes? */
        if (st->bf16_descr == NULL && !st->bf16_lookup_failed && bf16_descr(st) < 0) {
            PyErr_Clear();
            st->bf16_lookup_failed = 1;
        }
        if (st->bf16_descr && ((PyArray_Descr *)st->bf16_descr)->type_num == d->type_num) {
            *out = EW_BFLOAT16;
            return 0;
        }
    }
    PyObject *repr = PyObject_Str((PyObject *)d);
    PyErr_Format(PyExc_TypeError,
                 "unsupported dtype %U: ewkern supports float32, float16, bfloat16 and float64",
                 repr ? repr : Py_None);
    Py_XDECREF(repr);
    return -1;
}

int ew_dtype_from_py(ew_state *st, PyObject *obj, ew_dtype *out)
{
    if (obj == NULL || obj == Py_None) {
        *out = EW_FLOAT32;
        return 0;
    }
    if (PyUnicode_Check(obj)) {
        for (int i = 0; i < EW_NDTYPES; i++)
            if (PyUnicode_CompareWithASCIIString(obj, dtype_names[i]) == 0) {
                *out = (ew_dtype)i;
                return 0;
            }
        if (PyUnicode_CompareWithASCIIString(obj, "half") == 0) { *out = EW_FLOAT16; return 0; }
        if (PyUnicode_CompareWithASCIIString(obj, "float") == 0) { *out = EW_FLOAT32; return 0; }
        if (PyUnicode_CompareWithASCIIString(obj, "double") == 0) { *out = EW_FLOAT64; return 0; }
        PyErr_Format(PyExc_TypeError,
                     "unknown dtype %R: expected one of 'float32', 'float16', 'bfloat16', 'float64'",
                     obj);
        return -1;
    }
    /* numpy dtypes, numpy scalar types, ml_dtypes.bfloat16, torch dtypes by name */
    PyObject *name = PyObject_GetAttrString(obj, "name");
    if (name == NULL) {
        PyErr_Clear();
        name = PyObject_GetAttrString(obj, "__name__");
    }
    if (name == NULL || !PyUnicode_Check(name)) {
        PyErr_Clear();
        Py_XDECREF(name);
        /* torch.float32 prints as "torch.float32" */
        name = PyObject_Str(obj);
        if (name == NULL)
            return -1;
    }
    const char *s = PyUnicode_AsUTF8(name);
    if (s == NULL) {
        Py_DECREF(name);
        return -1;
    }
    if (strncmp(s, "torch.", 6) == 0)
        s += 6;
    for (int i = 0; i < EW_NDTYPES; i++)
        if (strcmp(s, dtype_names[i]) == 0) {
            Py_DECREF(name);
            *out = (ew_dtype)i;
            return 0;
        }
    PyErr_Format(PyExc_TypeError,
                 "unsupported dtype %R: expected one of 'float32', 'float16', 'bfloat16', 'float64'",
                 obj);
    Py_DECREF(name);
    return -1;
}

/* ---- shapes ------------------------------------------------------------------------------ */

/* No 64-bit platform ewkern builds for maps user memory above 2^56 bytes (x86-64 with 5-level
 * paging; arm64 stops at 2^52): a shape or a pointer beyond it is corrupt, not large. */
const uint64_t ew_address_limit = UINTPTR_MAX > 0xffffffffu ? (uint64_t)1 << 56 : (uint64_t)UINTPTR_MAX;

int ew_shape_size(const char *what, int ndim, const int64_t *shape, ew_dtype dt, int64_t *size)
{
    const int64_t limit = (int64_t)(ew_address_limit / (uint64_t)ew_dtype_size(dt));
    int64_t n = 1, nonzero = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            PyErr_Format(PyExc_ValueError, "%s: negative dimension %lld at axis %d", what,
                         (long long)shape[i], i);
            return -1;
        }
        if (shape[i] == 0) {
            n = 0;
            continue;
        }
        if (nonzero > limit / shape[i]) {   /* also every product that would overflow int64 */
            PyErr_Format(PyExc_ValueError, "%s: the shape describes more than 2^56 bytes of %s (an "
                         "overflowing or corrupt shape)", what, ew_dtype_name(dt));
            return -1;
        }
        nonzero *= shape[i];
        n *= shape[i];
    }
    *size = n;
    return 0;
}
