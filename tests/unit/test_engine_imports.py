"""hvlite imports no cluster engine: only ``hvlite.ray`` imports Ray and only ``hvlite.spark``
imports pyspark (checked on the source, with ``ast``, every import anywhere in a file, and with
planted violations); ``import hvlite`` and the pieces both engines share (``hvlite.cluster``)
load neither, in a fresh interpreter."""
import ast
import os
import subprocess
import sys

import pytest

from test_layers import PACKAGE_DIR, ROOT, imports, module_of, package_files

ENGINES = {"hvlite.ray": "ray", "hvlite.spark": "pyspark"}


def engine_violations(path, source):
    """What ``path`` imports of an engine (``ray``, ``pyspark``) or of an engine's hvlite
    package that only that package may import."""
    module, package = module_of(path)
    owner = next((p for p in ENGINES if module == p or module.startswith(p + ".")), None)
    found = []
    for base, name, _, _ in imports(ast.parse(source, path), package):
        target = base if name is None else base + "." + name
        for engine_package, engine in ENGINES.items():
            theirs = base.split(".")[0] == engine or target == engine_package \
                or target.startswith(engine_package + ".")
            if theirs and owner != engine_package:
                found.append("%s imports %s (only %s may)" % (os.path.relpath(path, ROOT),
                                                              target, engine_package))
    return found


def test_only_the_engines_packages_import_their_engine():
    found = []
    for path in package_files():
        with open(path) as f:
            found += engine_violations(path, f.read())
    assert not found, "\n".join(found)


@pytest.mark.parametrize("relpath,source", [
    ("hvlite/ops.py", "import ray\n"),
    ("hvlite/cluster/agent.py", "def f():\n    import pyspark\n"),
    ("hvlite/runner/world/run.py", "from ray.util import placement_group\n"),
    ("hvlite/spark/runner.py", "import ray\n"),
    ("hvlite/ray/executor.py", "from pyspark import SparkContext\n"),
    ("hvlite/func_job.py", "from .ray import RayExecutor\n"),
])
def test_planted_engine_imports_are_found(relpath, source):
    assert engine_violations(os.path.join(ROOT, relpath), source), (relpath, source)


@pytest.mark.parametrize("relpath,source", [
    ("hvlite/ray/executor.py", "import ray\nfrom ..cluster.job import Hvlrun\n"),
    ("hvlite/spark/runner.py", "import pyspark\nfrom ..cluster import JobError\n"),
])
def test_allowed_engine_imports_pass(relpath, source):
    assert engine_violations(os.path.join(ROOT, relpath), source) == []


def test_importing_hvlite_loads_no_engine():
    code = ("import sys, hvlite, hvlite.elastic, hvlite.cluster, hvlite.cluster.agent, "
            "hvlite.cluster.job, hvlite.cluster.worker, hvlite.cluster.rsh\n"
            "print(sorted(m for m in ('ray', 'pyspark') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
    assert os.path.isdir(PACKAGE_DIR)
