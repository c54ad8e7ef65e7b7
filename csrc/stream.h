/*
 * stream.h: floor 2 (see state.h). The ewkern.Stream type (its layout and the current-stream
 * rule are on floor 0, in state.h).
 */
#ifndef EWKERN_STREAM_H
#define EWKERN_STREAM_H

#include "device.h"
#include "state.h"

extern PyType_Spec ew_stream_spec;

#endif /* EWKERN_STREAM_H */
