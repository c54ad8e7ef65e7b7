/*
 * dtype.h: floor 1 (see state.h). ewkern's element types and their other spellings (names,
 * DLPack codes, NumPy descrs, what a Python dtype argument may be), the size rule of a shape,
 * and the NumPy C-API table the files that use NumPy share.
 */
#ifndef EWKERN_DTYPE_H
#define EWKERN_DTYPE_H

#include "state.h"

#include <dlpack/dlpack.h>

#include "ewkern_kernels.h"

const char *ew_dtype_name(ew_dtype dt);
int ew_dtype_size(ew_dtype dt);
int ew_dtype_from_py(ew_state *st, PyObject *obj, ew_dtype *out); /* str, numpy dtype, type, None->float32 */
int ew_dtype_from_dl(DLDataType dl, ew_dtype *out);
DLDataType ew_dtype_to_dl(ew_dtype dt);
/* numpy dtype object for dt (new reference); bfloat16 needs ml_dtypes */
PyObject *ew_numpy_descr(ew_state *st, ew_dtype dt);
/* dtype from a numpy descr (a PyArray_Descr *); -1 with TypeError if unsupported. */
struct _PyArray_Descr;
int ew_dtype_from_descr(ew_state *st, struct _PyArray_Descr *d, ew_dtype *out);
/* The highest address a user-space pointer can have here (2^56 on 64-bit platforms). */
extern const uint64_t ew_address_limit;
/* The number of elements of shape, or -1 with a ValueError naming `what` for a negative
 * dimension or more bytes of dt than fit below ew_address_limit (no int64 overflow). */
int ew_shape_size(const char *what, int ndim, const int64_t *shape, ew_dtype dt, int64_t *size);
/* Import NumPy's C API into the table the NumPy-using files share (once, at module exec). */
int ew_numpy_import(void);

#endif /* EWKERN_DTYPE_H */
