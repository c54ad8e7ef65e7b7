/*
 * registry.h: floor 2 (see state.h). The op table (from ops.def) and the one kernel registry:
 * every lookup of (op, variant, dtype, device type) goes through here.
 */
#ifndef EWKERN_REGISTRY_H
#define EWKERN_REGISTRY_H

#include "device.h"
#include "dtype.h"
#include "ewkern_kernels.h"

typedef struct ew_op_info {
    const char *name;
    int inputs;
    int scalars;
    const char *definition;
    const char *accuracy; /* the bound the docstring states and the tests assert */
    int outputs;          /* 1, or 2 for the backward ops of two gradients */
    const char *args;     /* the array arguments' names, space-separated ("a b", "grad a b") */
    int backward;         /* a row of grads.def (family "backward") rather than ops.def */
} ew_op_info;

/* the reductions, past ops.def's and grads.def's rows (-2: no such op) */
enum { EW_OP_RMSE = -1, EW_OP_RMSE_BACKWARD = -3 };
/* ops.def's rows, then grads.def's */
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

#endif /* EWKERN_REGISTRY_H */
