/*
 * device.h: floor 1 (see state.h). Devices: the device argument, the checks, the device guard
 * that every CUDA call goes through, CUDA errors as Python exceptions, and the device queries
 * of the module (device_info, synchronize, _current_device).
 */
#ifndef EWKERN_DEVICE_H
#define EWKERN_DEVICE_H

#include "state.h"

#include <dlpack/dlpack.h>

enum { EW_CPU = kDLCPU, EW_CUDA = kDLCUDA };

typedef struct ew_device {
    int type;   /* EW_CPU or EW_CUDA */
    int id;
} ew_device;

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

/* ---- the module's device queries -------------------------------------------------------- */
/* device_info(device): a dict describing the device (the cpu's name and cores, or the GPU's
 * properties and its theoretical peak memory bandwidth). */
PyObject *ew_describe_device(PyObject *dev_obj);
/* synchronize(device): wait for all work on a CUDA device (nothing for the cpu). */
PyObject *ew_synchronize_device(PyObject *dev_obj);
/* The calling thread's current CUDA device (cudaGetDevice), or None without CUDA. */
PyObject *ew_current_device(void);

#endif /* EWKERN_DEVICE_H */
