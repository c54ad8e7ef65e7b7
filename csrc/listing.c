/*
 * listing.c: floor 3 (see state.h). The registry's Python listings: variants(op, dtype, device),
 * kernel_info(op, variant, dtype, device) (the compiled kernel's attributes from the CUDA
 * runtime) and ops() (the op table). Calls registry, dtype, device, state and the CUDA
 * runtime surface.
 */
#include "listing.h"

#include "device.h"
#include "dtype.h"
#include "registry.h"

#include "cuda_api.h"

static int device_type_arg(PyObject *obj, int *type)
{
    ew_device d;
    if (obj == NULL || obj == Py_None) {
        *type = EW_CUDA;
        return 0;
    }
    if (ew_device_from_py(obj, &d) < 0)
        return -1;
    *type = d.type;
    return 0;
}

PyObject *ew_variants(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"op", "dtype", "device", NULL};
    const char *op;
    PyObject *dtype_obj = Py_None, *dev_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "s|OO:variants", kwlist, &op, &dtype_obj, &dev_obj))
        return NULL;
    int type;
    ew_dtype dt = EW_FLOAT32;
    if (device_type_arg(dev_obj, &type) < 0 ||
        (dtype_obj != Py_None && ew_dtype_from_py(ew_get_state(module), dtype_obj, &dt) < 0))
        return NULL;
    if (ew_op_index(op) == -2) {
        PyObject *names = PyList_New(0);
        for (int i = 0; names && i < ew_nops; i++) {
            PyObject *s = PyUnicode_FromString(ew_ops[i].name);
            if (s == NULL || PyList_Append(names, s) < 0)
                Py_CLEAR(names);
            Py_XDECREF(s);
        }
        if (names) {
            PyErr_Format(PyExc_ValueError, "variants(): unknown op '%s'; valid ops: %R and 'rmse'", op, names);
            Py_DECREF(names);
        }
        return NULL;
    }
    return ew_variant_list(op, dtype_obj == Py_None ? -1 : (int)dt, type);
}

PyObject *ew_kernel_info(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"op", "variant", "dtype", "device", NULL};
    const char *op, *variant = "auto";
    PyObject *dtype_obj = Py_None, *dev_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "s|sOO:kernel_info", kwlist, &op, &variant, &dtype_obj, &dev_obj))
        return NULL;
    int type;
    ew_dtype dt;
    if (device_type_arg(dev_obj, &type) < 0 || ew_dtype_from_py(ew_get_state(module), dtype_obj, &dt) < 0)
        return NULL;
    const ew_kernel *k = ew_find_kernel(op, variant, dt, type);
    if (k == NULL)
        return NULL;
    PyObject *d = Py_BuildValue("{s:s,s:s,s:s,s:s,s:s,s:O,s:O}", "op", k->op, "variant", k->variant, "dtype",
                                ew_dtype_name(k->dtype), "about", k->about ? k->about : "", "device",
                                type == EW_CPU ? "cpu" : "cuda", "takes_block",
                                (k->flags & EW_USES_BLOCK) ? Py_True : Py_False, "takes_grid",
                                (k->flags & EW_USES_GRID) ? Py_True : Py_False);
    if (d == NULL || type == EW_CPU || k->kernel == NULL)
        return d;
#if EWKERN_WITH_CUDA
    ew_device dev = {EW_CUDA, 0};
    ew_device_guard g = EW_DEVICE_GUARD_INIT;
    if (ew_device_enter(&g, dev) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    ew_func_attrs fa;
    int err = ewcuda_func_attrs(k->kernel, &fa);
    ew_device_exit(&g);
    if (err) {
        Py_DECREF(d);
        ew_raise_cuda(err, "kernel_info");
        return NULL;
    }
    PyObject *more = Py_BuildValue("{s:i,s:n,s:n,s:n,s:i,s:i,s:i}", "num_regs", fa.num_regs, "local_size_bytes",
                                   (Py_ssize_t)fa.local_size_bytes, "shared_size_bytes",
                                   (Py_ssize_t)fa.shared_size_bytes, "const_size_bytes",
                                   (Py_ssize_t)fa.const_size_bytes, "max_threads_per_block",
                                   fa.max_threads_per_block, "ptx_version", fa.ptx_version, "binary_version",
                                   fa.binary_version);
    if (more == NULL || PyDict_Update(d, more) < 0)
        Py_CLEAR(d);
    Py_XDECREF(more);
#endif
    return d;
}

PyObject *ew_list_ops(PyObject *module, PyObject *unused)
{
    PyObject *list = PyList_New(0);
    for (int i = 0; list && i <= ew_nops + 1; i++) {
        PyObject *d;
        if (i < ew_nops) {
            const ew_op_info *op = &ew_ops[i];
            PyObject *args = PyUnicode_FromString(op->args);
            PyObject *names = args ? PyUnicode_Split(args, NULL, -1) : NULL;
            Py_XDECREF(args);
            d = names ? Py_BuildValue("{s:s,s:i,s:i,s:i,s:N,s:s,s:s,s:s}", "name", op->name, "inputs", op->inputs,
                                      "scalars", op->scalars, "outputs", op->outputs, "args", names, "definition",
                                      op->definition, "accuracy", op->accuracy, "family",
                                      op->backward ? "backward" : "elementwise")
                      : NULL;
        } else if (i == ew_nops) {
            d = Py_BuildValue("{s:s,s:i,s:i,s:i,s:[ss],s:s,s:s}", "name", "rmse", "inputs", 2, "scalars", 0,
                              "outputs", 1, "args", "a", "b", "definition", "out[batch] = sqrt(mean((a - b)^2))",
                              "family", "reduction");
        } else {
            d = Py_BuildValue("{s:s,s:i,s:i,s:i,s:[ssss],s:s,s:s}", "name", "rmse_backward", "inputs", 4, "scalars",
                              0, "outputs", 2, "args", "grad", "a", "b", "r", "definition",
                              "grad_a = (a - b) grad / (n r) per batch, grad_b = -grad_a", "family",
                              "reduction backward");
        }
        if (d == NULL || PyList_Append(list, d) < 0)
            Py_CLEAR(list);
        Py_XDECREF(d);
    }
    return list;
}
