/*
 * state.c: floor 0 (see state.h for the floors). The module state's getters and the
 * current-stream rule: which Stream `with ewkern.stream(s)` set, and the handle ewkern launches
 * on for an array of a given device. Calls nothing of ewkern's.
 */
#include "state.h"

ew_state *ew_get_state(PyObject *module) { return (ew_state *)PyModule_GetState(module); }

ew_state *ew_state_from_type(PyTypeObject *tp) { return (ew_state *)PyType_GetModuleState(tp); }

/* ---- streams ---------------------------------------------------------------------------------- */

void *ew_current_stream(ew_state *st, int device, PyObject **stream_ref)
{
    if (stream_ref)
        *stream_ref = NULL;
    if (st->current_stream == Py_None)
        return NULL;
    StreamObject *s = (StreamObject *)st->current_stream;
    if (s->device != device)
        return NULL;
    if (stream_ref)
        *stream_ref = (PyObject *)s;
    return s->handle;
}

PyObject *ew_set_current_stream(ew_state *st, PyObject *s)
{
    if (s != Py_None && !Py_IS_TYPE(s, st->Stream_Type)) {
        PyErr_Format(PyExc_TypeError, "expected an ewkern.Stream or None, got %.200s", Py_TYPE(s)->tp_name);
        return NULL;
    }
    PyObject *prev = st->current_stream;
    Py_INCREF(s);
    st->current_stream = s;
    return prev;   /* the reference the state held */
}

PyObject *ew_get_current_stream(ew_state *st)
{
    Py_INCREF(st->current_stream);
    return st->current_stream;
}
