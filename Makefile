# hvlite's single entry point. Every target sets up what it needs first (a venv in .venv with
# the MPICH wheel, mpi4py, torch CPU, and hvlite built in place), so on a fresh clone:
#   make run     # set up, then the main job: hvlrun -np 2 on examples/pytorch_digits.py
#   make test    # set up, then every test (unit, SPMD under hvlrun -np 2 and 3, failures, CLI,
#                # multi-host on simulated hosts, a real Slurm)
#   make bench   # set up, then the allreduce benchmark table
#   make docs    # the documentation site in build/docs/html (warnings are errors)
# Sanitizers and fuzzing (docs/development/testing.md): `make test-asan` / `make test-tsan` run
# the parallel, failure and fuzz suites against an ASan+UBSan / TSan build of the engine made in
# build/sanitize-*/ (never the normal build); `make fuzz` runs the collective fuzzer at the size
# CI runs it, `make fuzz-long` runs 10x as many sequences (FUZZ_SEED=<n> for another seed).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
HVLRUN := $(VENV)/bin/hvlrun
STAMP  := $(VENV)/.deps-installed
# The MPI to build against: the venv's MPICH wheel, so a checkout builds the same everywhere.
# Override with a site MPI, e.g. `make test HVLITE_MPICC=/usr/bin/mpicc.openmpi`.
HVLITE_MPICC ?= $(CURDIR)/$(VENV)/bin/mpicc
export HVLITE_MPICC

.PHONY: setup build system-deps run run-tf test test-gpu docs test-asan test-tsan sanitize-smoke fuzz fuzz-long bench bench-torch bench-tf clean

setup: $(STAMP) build

# torch==2.13.0 is pinned: pip takes the CPU wheel on this machine's disk (never a CUDA build).
# ray (with Ray Train: ray[train]) and pyspark (hvlite[ray], hvlite[spark]) are pinned for the
# cluster tests in tests/hosts (a real Ray cluster and a Spark standalone cluster on simulated
# hosts; Spark needs Java).
# NCCL's wheel (as torch's CUDA builds bring it; from disk too) gives the tests nccl.h to check
# the GPU plane's declarations against, and a real library for the finder and --check-build.
$(STAMP): Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "setuptools>=77" wheel cffi numpy ml_dtypes pytest mpich mpi4py "torch==2.13.0" \
		"tensorflow-cpu==2.21.0" scikit-learn pyyaml cloudpickle "ray[train]==2.60.0" "pyspark==4.3.0"
	$(PY) -m pip install -q --no-deps "nvidia-nccl-cu13==2.30.7"
	touch $(STAMP)

build: $(STAMP)
	$(PY) -m pip install -q --no-build-isolation -e .

run: setup
	$(HVLRUN) -np 2 $(PY) examples/pytorch_digits.py

run-tf: setup
	$(HVLRUN) -np 2 $(PY) examples/tensorflow_keras_digits.py

# What the multi-host tests (tests/hosts) run besides Python: a local Slurm, OpenSSH's sshd and
# a Java runtime (Spark). Installed with apt-get only when root (as CI is) and missing; elsewhere
# those tests skip and say why. On a machine whose package installs start services, this starts
# them too.
SYSTEM_PACKAGES := slurmctld slurmd slurm-client munge openssh-server openssh-client \
	openjdk-17-jre-headless
system-deps:
	@missing=; for tool in slurmctld slurmd sbatch munged /usr/sbin/sshd ssh-keygen java; do \
	  command -v $$tool >/dev/null || missing=yes; done; \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q $(SYSTEM_PACKAGES) >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q $(SYSTEM_PACKAGES) >/dev/null 2>&1; } || \
	  echo "warning: could not install $(SYSTEM_PACKAGES); the Slurm, ssh and Spark tests will skip"; \
	fi

test: setup system-deps
	$(PY) -m pytest -q --durations=20 tests

# The GPU suite (tests/test_gpu.py, docs/development/gpu-checks.md): CUDA tensors at 1, 2 and 4 ranks. On a GPU
# machine without a package registry, build hvlite in place with that machine's Python first
# (../shared/tools/gpu-prep writes the setup); without a GPU every test skips, saying why.
TEST_GPU_PY ?= $(if $(wildcard $(PY)),$(PY),python3)
test-gpu:
	$(TEST_GPU_PY) -m pytest -q -rs tests/test_gpu.py

# The sanitizer runs build their own engine in a copy of the tree; they need only the venv.
test-asan: $(STAMP)
	$(PY) tools/sanitizers/run.py address

test-tsan: $(STAMP)
	$(PY) tools/sanitizers/run.py thread

# A few minutes of each sanitizer on a sample of the suites (tools/sanitizers/run.py SMOKE); CI
# runs it after `make test`.
sanitize-smoke: $(STAMP)
	$(PY) tools/sanitizers/run.py address --smoke --timeout 1200
	$(PY) tools/sanitizers/run.py thread --smoke --timeout 1200

FUZZ_SEED ?= 1000
fuzz: setup
	$(PY) tests/fuzz/run.py --seed $(FUZZ_SEED)

fuzz-long: setup
	$(PY) tests/fuzz/run.py --seed $(FUZZ_SEED) --scale 10

# The documentation: its packages (pinned in docs/requirements.txt) go into .venv; the reference
# pages generated from the code are rewritten, then Sphinx builds the site with every warning an
# error. Needs neither the engine nor the frameworks (the API is read from the source).
DOCS_STAMP := $(VENV)/.docs-installed
$(PY):
	$(PYTHON) -m venv $(VENV)

$(DOCS_STAMP): docs/requirements.txt | $(PY)
	$(PY) -m pip install -q -r docs/requirements.txt
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(PY) tools/docs_reference.py
	$(PY) -m sphinx -W --keep-going -q -b html docs build/docs/html
	@echo "docs: build/docs/html/index.html"

bench: setup
	$(HVLRUN) -np 2 $(PY) bench/allreduce.py

bench-torch: setup
	$(PY) bench/torch_training.py

bench-tf: setup
	$(PY) bench/tf_training.py

clean:
	rm -rf build *.egg-info hvlite/_core*.so hvlite/_build_info.json
