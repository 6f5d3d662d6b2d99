"""tools/check_engine.py keeps the engine's shape: the checkout passes, and each rule fails when
a violation is planted in a copy of the sources (so the check cannot pass vacuously). The Python
layers have their own check, tests/unit/test_layers.py."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "check_engine.py")


def check(root):
    return subprocess.run([sys.executable, TOOL, root], capture_output=True, text=True, timeout=60)


def test_checkout_keeps_the_rules():
    out = check(ROOT)
    assert out.returncode == 0, out.stdout


@pytest.fixture
def copy(tmp_path):
    shutil.copytree(os.path.join(ROOT, "csrc"), tmp_path / "csrc")
    return tmp_path


def plant(path, text):
    with open(path, "a") as f:
        f.write(text)


@pytest.mark.parametrize("where, text, expected", [
    ("csrc/core/queue.c", "\nvoid hvl__planted(void) { hvl_init(); }\n", "calls up into the cycle file"),
    ("csrc/util/util.c", "\nvoid hvl__planted(void) { hvl__queue_drain(0); }\n", "call circle"),
    ("csrc/core/fusion.c", "\nint hvl__planted(void) { return HVL_ERR_SYSTEM; }\n", "bare 'return HVL_ERR_SYSTEM;'"),
    ("csrc/core/execute.c", '\n#include "coordinator.h"\n', "private to core/negotiate.c"),
    ("csrc/core/pset.c", "\nconst void *hvl__planted = &hvl__backend_shm;\n", "names the data plane hvl__backend_shm"),
    ("csrc/backends/backend_shm.c", "\nint hvl__planted(void) { int r; return MPI_Comm_rank(MPI_COMM_WORLD, &r); }\n",
     "names MPI_COMM_WORLD"),
    ("csrc/util/strmap.c", '\n#include "engine.h"\n', "util/ includes engine.h"),
    # a leaf calling up is judged by where the callee is defined, public hvl_ names included
    ("csrc/kernels/reduce_kernels.c", "\nint hvl__planted(void) { return (int)hvl_reducescatter_rows(4, 0, 2); }\n",
     "kernels/reduce_kernels.c calls hvl_reducescatter_rows, defined in core/request.c: kernels/ is a leaf"),
    ("csrc/util/buf.c", "\nint hvl__planted(void) { return hvl__adasum_dtype_ok(0); }\n",
     "util/buf.c calls hvl__adasum_dtype_ok, defined in kernels/adasum_kernels.c: util/ is a leaf"),
])
def test_a_planted_violation_is_reported(copy, where, text, expected):
    plant(copy / where, text)
    out = check(str(copy))
    assert out.returncode == 1 and expected in out.stdout, out.stdout


def test_a_leaf_calling_up_is_found_whatever_the_name(copy):
    """A non-static function with no hvl prefix, defined in core/, called from util/: reported
    as a leaf calling out (the checker does not go by names' prefixes)."""
    plant(copy / "csrc/core/fusion.c", "\nint planted_helper(int x) { return x + 1; }\n")
    plant(copy / "csrc/util/util.c", "\nint hvl__planted(void) { return planted_helper(1); }\n")
    out = check(str(copy))
    assert out.returncode == 1, out.stdout
    assert "util/util.c calls planted_helper, defined in core/fusion.c: util/ is a leaf" in out.stdout, out.stdout


def test_leaves_calling_leaves_pass(copy):
    """kernels/ may call util/ and kernels/; util/ may call util/."""
    plant(copy / "csrc/kernels/reduce_kernels.c", "\nint hvl__planted(void) { return hvl_dtype_size(0) + (int)hvl__now(); }\n")
    plant(copy / "csrc/util/buf.c", "\nint hvl__planted2(void) { return (int)hvl__now(); }\n")
    out = check(str(copy))
    assert out.returncode == 0, out.stdout
