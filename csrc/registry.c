/*
 * registry.c: the op table (from ops.def) and the one kernel registry, built from the tables
 * that each kernel file exports. Every lookup of (op, variant, dtype, device) goes through
 * ew_find_kernel; an unknown name is an error that lists the valid ones, never a fallback.
 * Floor 2 (see state.h): calls dtype (floor 1) and the kernel tables of csrc/cpu, csrc/cuda.
 */
#include "registry.h"

#include <string.h>

const ew_op_info ew_ops[] = {
#define EW_OP(name, inputs, scalars, def, acc) {#name, inputs, scalars, def, acc, 1, inputs == 2 ? "a b" : "a", 0},
#include "ops.def"
#undef EW_OP
#define EW_GRAD(name, args, inputs, outputs, scalars, def, acc) {#name, inputs, scalars, def, acc, outputs, args, 1},
#include "grads.def"
#undef EW_GRAD
};
const int ew_nops = (int)(sizeof ew_ops / sizeof ew_ops[0]);

typedef const ew_kernel *(*ew_table_fn)(int *count);

typedef struct {
    const ew_kernel *rows;
    int count;
    int device_type;
} table;

static table tables[10]; /* 3 CPU + 7 CUDA kernel files */
static int ntables;

/* "auto" rows by (op, dtype, device), filled once: the per-call lookup is an array index */
static const ew_kernel *auto_rows[64][EW_NDTYPES][2];

/* auto_rows index of an op index: the reductions after the elementwise rows */
static int slot_of(int i)
{
    return i == EW_OP_RMSE ? ew_nops : i == EW_OP_RMSE_BACKWARD ? ew_nops + 1 : i;
}

static int op_slot(const char *op)
{
    int i = ew_op_index(op);
    return i == -2 ? -1 : slot_of(i);
}

static void add_table(const ew_kernel *rows, int count, int device_type)
{
    tables[ntables].rows = rows;
    tables[ntables].count = count;
    tables[ntables].device_type = device_type;
    ntables++;
}

int ew_registry_init(void)
{
    int n;
    if (ntables)
        return 0;
    const ew_kernel *t = ew_cpu_elementwise_table(&n);
    add_table(t, n, EW_CPU);
    t = ew_cpu_rmse_table(&n);
    add_table(t, n, EW_CPU);
    t = ew_cpu_backward_table(&n);
    add_table(t, n, EW_CPU);
#if EWKERN_WITH_CUDA
    /* one table per kernel file: the reference studies, then the default paths ("auto" rows) */
    static const ew_table_fn cuda_tables[] = {
        ew_cuda_add_kernel_experiments_table,
        ew_cuda_cuda_vectorization_f16x8_table,
        ew_cuda_elementwise_ops_on_gpus_table,
        ew_cuda_batched_rmse_kernel_analysis_table,
        ew_cuda_elementwise_auto_table,
        ew_cuda_rmse_auto_table,
        ew_cuda_elementwise_backward_table,
    };
    for (size_t k = 0; k < sizeof cuda_tables / sizeof cuda_tables[0]; k++) {
        t = cuda_tables[k](&n);
        add_table(t, n, EW_CUDA);
    }
#endif
    for (int k = 0; k < ntables; k++)
        for (int i = 0; i < tables[k].count; i++) {
            const ew_kernel *row = &tables[k].rows[i];
            int slot = op_slot(row->op);
            if (slot < 0) {
                PyErr_Format(PyExc_SystemError, "kernel table row for unknown op '%s'", row->op);
                return -1;
            }
            if (strcmp(row->variant, "auto") == 0)
                auto_rows[slot][row->dtype][tables[k].device_type == EW_CUDA] = row;
        }
    return 0;
}

const ew_kernel *ew_auto_kernel(int op, ew_dtype dt, int device_type)
{
    const ew_kernel *k = auto_rows[slot_of(op)][dt][device_type == EW_CUDA];
    const char *name = op == EW_OP_RMSE ? "rmse" : op == EW_OP_RMSE_BACKWARD ? "rmse_backward" : ew_ops[op].name;
    return k ? k : ew_find_kernel(name, "auto", dt, device_type);
}

int ew_op_index(const char *name)
{
    for (int i = 0; i < ew_nops; i++)
        if (strcmp(ew_ops[i].name, name) == 0)
            return i;
    if (strcmp(name, "rmse") == 0)
        return EW_OP_RMSE;
    return strcmp(name, "rmse_backward") == 0 ? EW_OP_RMSE_BACKWARD : -2;
}

PyObject *ew_variant_list(const char *op, int dtype, int device_type)
{
    PyObject *list = PyList_New(0);
    if (list == NULL)
        return NULL;
    for (int t = 0; t < ntables; t++) {
        if (tables[t].device_type != device_type)
            continue;
        for (int i = 0; i < tables[t].count; i++) {
            const ew_kernel *k = &tables[t].rows[i];
            if (strcmp(k->op, op) != 0 || (dtype >= 0 && (int)k->dtype != dtype))
                continue;
            PyObject *name = PyUnicode_FromString(k->variant);
            if (name == NULL) {
                Py_DECREF(list);
                return NULL;
            }
            int has = PySequence_Contains(list, name);
            if (has == 0 && PyList_Append(list, name) < 0)
                has = -1;
            Py_DECREF(name);
            if (has < 0) {
                Py_DECREF(list);
                return NULL;
            }
        }
    }
    return list;
}

static const char *device_type_name(int device_type) { return device_type == EW_CPU ? "cpu" : "cuda"; }

const ew_kernel *ew_find_kernel(const char *op, const char *variant, ew_dtype dt, int device_type)
{
    int variant_exists = 0;
    for (int t = 0; t < ntables; t++) {
        if (tables[t].device_type != device_type)
            continue;
        for (int i = 0; i < tables[t].count; i++) {
            const ew_kernel *k = &tables[t].rows[i];
            if (strcmp(k->op, op) != 0 || strcmp(k->variant, variant) != 0)
                continue;
            if (k->dtype == dt)
                return k;
            variant_exists = 1;
        }
    }
    if (variant_exists) {
        PyObject *dts = PyList_New(0);
        for (int t = 0; dts && t < ntables; t++)
            for (int i = 0; tables[t].device_type == device_type && i < tables[t].count; i++) {
                const ew_kernel *k = &tables[t].rows[i];
                if (strcmp(k->op, op) == 0 && strcmp(k->variant, variant) == 0) {
                    PyObject *s = PyUnicode_FromString(ew_dtype_name(k->dtype));
                    if (s == NULL || PyList_Append(dts, s) < 0)
                        Py_CLEAR(dts);
                    Py_XDECREF(s);
                }
            }
        if (dts) {
            PyErr_Format(PyExc_TypeError,
                         "ewkern.%s: variant '%s' does not support dtype %s on %s; it supports %R", op,
                         variant, ew_dtype_name(dt), device_type_name(device_type), dts);
            Py_DECREF(dts);
        }
        return NULL;
    }
    PyObject *valid = ew_variant_list(op, -1, device_type);
    if (valid == NULL)
        return NULL;
    if (PyList_GET_SIZE(valid) == 0)
        PyErr_Format(PyExc_ValueError, "ewkern.%s has no kernels on %s%s", op,
                     device_type_name(device_type),
                     device_type == EW_CUDA && !EWKERN_WITH_CUDA ? " (built without CUDA)" : "");
    else
        PyErr_Format(PyExc_ValueError, "ewkern.%s: unknown variant '%s' on %s; valid variants: %R", op,
                     variant, device_type_name(device_type), valid);
    Py_DECREF(valid);
    return NULL;
}
