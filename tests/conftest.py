import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import ewkern  # noqa: E402

HAS_CUDA = ewkern.cuda_available()
gpu = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU on this machine (GPU tests run on the GPU machine)")


def device_params():
    """'cpu' always; 'cuda:0' marked gpu (skipped with a reason where there is no GPU)."""
    return ["cpu", pytest.param("cuda:0", marks=[pytest.mark.gpu, gpu])]

