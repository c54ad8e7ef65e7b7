"""Run-time kernels: ``ewkern.ElementwiseKernel`` and ``ewkern.ReductionKernel``, CuPy's
user-defined kernels, and ``ewkern.RowKernel`` (a row's reduction and an operation over the
same row, one kernel), for any DLPack arrays. CUDA arrays run code compiled by NVRTC (loaded when
first needed: ``import ewkern`` works without it); CPU arrays run the same body compiled by the
system C++ compiler. ``_codegen`` writes the sources, ``_build`` compiles and caches them."""
from ._build import CompileError
from ._kernel import ElementwiseKernel, ReductionKernel
from ._rowkernel import RowKernel

__all__ = ["ElementwiseKernel", "ReductionKernel", "RowKernel", "CompileError"]
