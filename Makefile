# hvlite's single entry point. Every target sets up what it needs first (a venv in .venv with
# the MPICH wheel, mpi4py, torch CPU, and hvlite built in place), so on a fresh clone:
#   make run     # set up, then the main job: hvlrun -np 2 on examples/pytorch_digits.py
#   make test    # set up, then every test (unit, SPMD under hvlrun -np 2 and 3, failures, CLI)
#   make bench   # set up, then the allreduce benchmark table
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
HVLRUN := $(VENV)/bin/hvlrun
STAMP  := $(VENV)/.deps-installed
# The MPI to build against: the venv's MPICH wheel, so a checkout builds the same everywhere.
# Override with a site MPI, e.g. `make test HVLITE_MPICC=/usr/bin/mpicc.openmpi`.
HVLITE_MPICC ?= $(CURDIR)/$(VENV)/bin/mpicc
export HVLITE_MPICC

.PHONY: setup build run run-tf test bench bench-torch bench-tf clean

setup: $(STAMP) build

# torch==2.13.0 is pinned: pip takes the CPU wheel on this machine's disk (never a CUDA build).
$(STAMP): Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "setuptools>=64" wheel cffi numpy ml_dtypes pytest mpich mpi4py "torch==2.13.0" \
		"tensorflow-cpu==2.21.0" scikit-learn
	touch $(STAMP)

build: $(STAMP)
	$(PY) -m pip install -q --no-build-isolation -e .

run: setup
	$(HVLRUN) -np 2 $(PY) examples/pytorch_digits.py

run-tf: setup
	$(HVLRUN) -np 2 $(PY) examples/tensorflow_keras_digits.py

test: setup
	$(PY) -m pytest -q tests

bench: setup
	$(HVLRUN) -np 2 $(PY) bench/allreduce.py

bench-torch: setup
	$(PY) bench/torch_training.py

bench-tf: setup
	$(PY) bench/tf_training.py

clean:
	rm -rf build *.egg-info hvlite/_core*.so hvlite/_build_info.json
