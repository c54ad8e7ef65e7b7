# The README's commands. Each sets up what it needs: a virtual environment in .venv with the
# dependencies from PyPI, and an in-place build of ewkern._C.
PY        ?= python3
VENV      := .venv
VPY       := $(VENV)/bin/python
# nvidia-cuda-cuobjdump/nvdisasm: the SASS tests read the built kernels (the toolkit here has no cuobjdump)
# torch: ewkern.torch's tests (the GPU machine's version; about 1.5 minutes to install from PyPI)
DEPS      := numpy ml_dtypes pytest matplotlib tqdm apache-tvm-ffi setuptools nbclient nbformat ipykernel \
             nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm torch==2.11.0
SOURCES   := $(wildcard csrc/*.c csrc/*.h csrc/*.def csrc/cpu/*.c csrc/cpu/*.h csrc/cuda/*.cu csrc/cuda/*.cuh) setup.py
BENCH_ARGS ?= --all --quick

.PHONY: bench test build gpu-check clean

# Main job: the benchmark harness on the default device (GPU when present, else CPU).
bench: build
	$(VPY) -m ewkern.bench $(BENCH_ARGS)

# The test suite (GPU tests skip themselves without a GPU).
test: build
	$(VPY) -m pytest -q tests

build: $(VENV)/.deps ewkern/.built

$(VENV)/.deps:
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q $(DEPS)
	touch $@

ewkern/.built: $(SOURCES) $(VENV)/.deps
	$(VPY) setup.py -q build_ext --inplace
	touch $@

# On the GPU machine (python3 with torch, CuPy, NumPy; no network): build in place with the
# system python3 and run the whole suite plus a quick benchmark. See scripts/gpu-check.sh.
gpu-check:
	bash scripts/gpu-check.sh

clean:
	rm -rf build ewkern/_C*.so ewkern/.built
