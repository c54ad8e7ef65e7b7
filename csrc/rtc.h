/*
 * rtc.h: the C entries behind ewkern.ElementwiseKernel / ewkern.ReductionKernel (ewkern/rtc/).
 * The code generation, NVRTC and the C-compiler backend live in Python; these entries give it
 * what only the C side has: views of DLPack producers (with the stream handshake and the stream
 * rule of every ewkern op), results allocated in the first input's framework, and, in CUDA builds,
 * loading a compiled image (CUBIN or PTX) and launching one of its kernels on a stream.
 *
 * Floor 4 (see state.h), beside ops: calls dlpack, dtype, device and state. module.c's method table
 * takes them with one line: EW_RTC_METHODS.
 */
#ifndef EWKERN_RTC_H
#define EWKERN_RTC_H

#include "device.h"
#include "dlpack.h"
#include "state.h"

PyObject *ew_rtc_views(PyObject *module, PyObject *args);
PyObject *ew_rtc_result(PyObject *module, PyObject *args);
PyObject *ew_rtc_load(PyObject *module, PyObject *args);
PyObject *ew_rtc_launch(PyObject *module, PyObject *args);
PyObject *ew_rtc_occupancy(PyObject *module, PyObject *args);
PyObject *ew_rtc_attrs(PyObject *module, PyObject *args);
PyObject *ew_rtc_cap(PyObject *module, PyObject *args);
PyObject *ew_rtc_plan(PyObject *module, PyObject *args);
PyObject *ew_rtc_store_wb(PyObject *module, PyObject *args);
PyObject *ew_auto_plan(PyObject *module, PyObject *args);
PyObject *ew_rtc_fpe_guard(PyObject *module, PyObject *arg);
PyObject *ew_rtc_sig(PyObject *module, PyObject *args);
PyObject *ew_rtc_fast(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* A C plan's launches as data (ewkern/rtc/_kernel.py: a runner's .prog): nwords int64 words, a
 * record after another, each led by its tag:
 *   EW_PROG_LAUNCH  device, block, (grid, prefetch, kernel handle) for PDL off, the same for PDL
 *                   on (by ewkern's switch, pdl_enabled()), the prefetch field's offset in params
 *                   (-1: none), the store field's (-1: none) and its value: one launch with params
 *                   as its argument struct;
 *   EW_PROG_LAUNCH_CAP the same, then its dynamic shared memory bytes for PDL off and for PDL on
 *                   (a launch whose blocks an SM holds are capped: the rows engine's, _kernel.py);
 *   EW_PROG_COLSUM  kernel handle, device, block, grid, partial rows, columns, offset: a column sum
 *                   (a RowKernel's), whose (partials, output) addresses sit at offset in params;
 *   EW_PROG_CPU     function address, threads: `void entry(const params *, int threads)`.
 * The caller holds the device current (CUDA) and need not hold the GIL. 0; a CUDA error (the first
 * launch's that failed, msg says which); or -1 with msg set for a program that does not fit params
 * or this build. */
enum { EW_PROG_LAUNCH = 1, EW_PROG_COLSUM = 2, EW_PROG_CPU = 3, EW_PROG_LAUNCH_CAP = 4 };
enum { EW_PROG_LAUNCH_WORDS = 12, EW_PROG_COLSUM_WORDS = 8, EW_PROG_CPU_WORDS = 3, EW_PROG_LAUNCH_CAP_WORDS = 14 };
int ew_rtc_run(const int64_t *prog, int64_t nwords, char *params, int64_t plen, void *stream, char *msg,
               size_t msglen);

#define EW_RTC_METHODS \
    {"_rtc_views", (PyCFunction)ew_rtc_views, METH_VARARGS, \
     "_rtc_views(objs, names, /)\n--\n\nFor run-time kernels: ((ptr, dtype, device, shape), ...), stream, for " \
     "C-contiguous DLPack arrays, taken as ewkern's ops take them (the stream of the first array's framework)."}, \
    {"_rtc_sig", (PyCFunction)ew_rtc_sig, METH_VARARGS, \
     "_rtc_sig(args, scalars, /)\n--\n\nThe signature bytes of a run-time kernel call's arguments (scalars: the " \
     "types taken as scalars), or None where they cannot be viewed: the key of _rtc_fast's plans."}, \
    {"_rtc_fast", (PyCFunction)(void (*)(void))ew_rtc_fast, METH_FASTCALL, \
     "_rtc_fast(plans, args, nin, extra, scalars, /)\n--\n\nRun a run-time kernel call by the plan recorded " \
     "for its signature, or return NotImplemented (ewkern/rtc/_kernel.py's _fast_call, in C)."}, \
    {"_rtc_result", (PyCFunction)ew_rtc_result, METH_VARARGS, \
     "_rtc_result(like, dtype, shape, /)\n--\n\nAn uninitialised result in like's framework and device."}, \
    {"_rtc_load", (PyCFunction)ew_rtc_load, METH_VARARGS, \
     "_rtc_load(image, name, device, /)\n--\n\nLoad a CUBIN/PTX image (cudaLibraryLoadData) on device and return " \
     "the handle of its kernel `name` (cudaLibraryGetKernel)."}, \
    {"_rtc_launch", (PyCFunction)ew_rtc_launch, METH_VARARGS, \
     "_rtc_launch(kernel, grid, block, params, device, stream, pdl, smem=0, /)\n--\n\nLaunch a loaded kernel " \
     "whose one parameter is the bytes `params`, on stream (an int handle), as a programmatic dependent launch " \
     "when pdl, with smem bytes of dynamic shared memory."}, \
    {"_rtc_cap", (PyCFunction)ew_rtc_cap, METH_VARARGS, \
     "_rtc_cap(kernel, block, device, blocks, /)\n--\n\nThe dynamic shared memory bytes with which launches of " \
     "a loaded kernel at block threads keep at most `blocks` blocks on an SM (the kernel's attributes set for " \
     "it), or 0 where no cap applies."}, \
    {"_rtc_occupancy", (PyCFunction)ew_rtc_occupancy, METH_VARARGS, \
     "_rtc_occupancy(kernel, block, device, /)\n--\n\nResident blocks per SM of a loaded kernel at block threads."}, \
    {"_rtc_attrs", (PyCFunction)ew_rtc_attrs, METH_VARARGS, \
     "_rtc_attrs(kernel, device, /)\n--\n\n(registers a thread, local memory bytes a thread) of a loaded kernel."}, \
    {"_rtc_plan", (PyCFunction)ew_rtc_plan, METH_VARARGS, \
     "_rtc_plan(device, nvec, nedge, block, wave1, wave4, i32, heavy, elems, pdl, wide=False, max_vpt=4, /)\n--\n\n" \
     "(vectors per thread, grid, prefetch) of a run-time vector kernel by the default path's launch rule " \
     "(wide: its case for a programmatic launch on a GPU of >= 30 GB/s an SM; max_vpt: the most vectors " \
     "a thread of the kernel's forms that do not spill)."}, \
    {"_rtc_store_wb", (PyCFunction)ew_rtc_store_wb, METH_VARARGS, \
     "_rtc_store_wb(device, bytes, out_bytes=0, /)\n--\n\nWhether a run-time vector kernel's launch that " \
     "moves `bytes` (inputs read + outputs written) and writes `out_bytes` of them stores write-back " \
     "(True: outputs of at least 1/32 of the device's L2, or more bytes moved than it holds) or streaming " \
     "(False), by the default path's store rule (EWKERN_AUTO_STORES=cs|wb forces one)."}, \
    {"_rtc_fpe_guard", (PyCFunction)ew_rtc_fpe_guard, METH_O, \
     "_rtc_fpe_guard(address, /)\n--\n\nGuard the integer division of the CPU kernels in the library whose code " \
     "holds address: a div/idiv there that faults (a zero divisor, MIN / -1) gives NumPy's result (0; MIN) " \
     "instead of ending the process. True where the guard works (Linux x86_64), else False."}, \
    {"_auto_plan", (PyCFunction)ew_auto_plan, METH_VARARGS, \
     "_auto_plan(nvec, nedge, block, wave1, wave4, i32, pdl, fill, heavy16, heavy64, heavy16_from, wide=False, " \
     "heavy_math=False, /)" \
     "\n--\n\n(vectors per thread, grid, prefetch) by the default path's launch rule with every input given " \
     "(the built-in ops' launchers ask it with the device's waves; wide: a programmatic launch on a GPU " \
     "whose memory moves >= 30 GB/s an SM, for the vectors a thread; the prefetch rule is every " \
     "device's): for tests."},

#endif /* EWKERN_RTC_H */
