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

#endif /* EWKERN_REGISTRY_H */
