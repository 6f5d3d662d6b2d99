"""tools/horovod_api.py on two small trees written here (a "horovod" and an "hvlite"): it finds
names missing, signatures that would not bind, defaults that differ, methods of classes and of
the classes a factory returns, names resolved through imports, aliases and forwarding wrappers,
and it keeps what the allow-list names apart. Nothing of Horovod is needed."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "tools"))
import horovod_api  # noqa: E402

HOROVOD = {
    "horovod/__init__.py": "from horovod.runner import run\n",
    "horovod/runner/__init__.py": "def run(func, args=(), kwargs=None, np=None):\n    pass\n",
    "horovod/common/__init__.py": "",
    "horovod/common/util.py": "def check_extension(name):\n    pass\n",
    "horovod/common/basics.py": (
        "class HorovodBasics:\n"
        "    def __init__(self, path):\n        self.Sum = 1\n"
        "    def init(self, comm=None, process_sets=None):\n        pass\n"
        "    def rank(self):\n        pass\n"),
    "horovod/torch/__init__.py": (
        "from horovod.common.util import check_extension\n"
        "import os\n"
        "try:\n    from horovod.torch.mpi_ops import init, rank, Sum, allreduce, wrapped\n"
        "except ImportError:\n    pass\n"
        "from horovod.torch.optimizer import DistributedOptimizer\n"
        "class Compression:\n    def compress(self, tensor):\n        pass\n"),
    "horovod/torch/mpi_ops.py": (
        "from horovod.common.basics import HorovodBasics as _HorovodBasics\n"
        "_basics = _HorovodBasics(__file__)\n"
        "rank = _basics.rank\nSum = _basics.Sum\n"
        "def init(*args, **kwargs):\n    return _basics.init(*args, **kwargs)\n"
        "def allreduce(tensor, average=None, name=None, op=Sum, process_set=global_process_set):\n"
        "    pass\n"
        "def wrapped(tensor, name):\n    pass\n"),
    "horovod/torch/optimizer.py": (
        "class _DistributedOptimizer:\n"
        "    def set_backward_passes_per_step(self, passes):\n        pass\n"
        "    def zero_grad(self):\n        pass\n"
        "def DistributedOptimizer(optimizer, named_parameters=None):\n    pass\n"),
}

HVLITE = {
    "hvlite/__init__.py": "_API_MODULES = ('basics',)\n",
    "hvlite/basics.py": "__all__ = ['init', 'rank']\ndef init(comm=None, process_sets=None):\n    pass\n"
                        "def rank():\n    pass\n",
    "hvlite/runner/__init__.py": "def __getattr__(name):\n    from .func_run import run\n    return run\n",
    "hvlite/runner/func_run.py": "def run(func, args=(), kwargs=None, np=None, extra=1):\n    pass\n",
    "hvlite/torch/__init__.py": (
        "from ..basics import init, rank\n"
        "from .ops import Sum, allreduce, wrapped\n"
        "from .optimizer import DistributedOptimizer\n"),
    "hvlite/torch/ops.py": (
        "Sum, Average = 1, 2\n"
        "def allreduce(tensor, average=None, name=None, op=None, process_set=None):\n    pass\n"
        "def wrapped(tensor):\n    pass\n"),
    "hvlite/torch/optimizer.py": (
        "class _DistributedOptimizer:\n    pass\n"
        "def DistributedOptimizer(optimizer, named_parameters=None, bucket_bytes=1):\n    pass\n"),
}


def write(root, files):
    for path, text in files.items():
        full = root / path
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_text(text)


@pytest.fixture
def trees(tmp_path, monkeypatch):
    write(tmp_path / "hvd", HOROVOD)
    write(tmp_path / "hvl", HVLITE)
    monkeypatch.setattr(horovod_api, "MODULES", [("horovod", "hvlite"), ("horovod.runner", "hvlite.runner"),
                                                 ("horovod.common.basics", "hvlite"),
                                                 ("horovod.torch", "hvlite.torch")])
    monkeypatch.setattr(horovod_api, "FACTORIES", [
        ("horovod.torch", "DistributedOptimizer", "horovod.torch.optimizer._DistributedOptimizer",
         "hvlite.torch.optimizer._DistributedOptimizer", "torch.optim.Optimizer")])
    return str(tmp_path / "hvd"), str(tmp_path / "hvl")


def run_tool(trees, capsys, allowed=None, monkeypatch=None):
    if allowed is not None:
        monkeypatch.setattr(horovod_api, "ALLOWED", allowed)
    code = horovod_api.main([trees[0], "--hvlite", trees[1]])
    return code, capsys.readouterr().out


def test_finds_what_is_missing_and_what_differs(trees, capsys, monkeypatch):
    code, out = run_tool(trees, capsys, allowed={}, monkeypatch=monkeypatch)
    assert code == 1
    assert "horovod.runner -> hvlite.runner: 1 names: 1 present, 0 missing, 0 differ" in out, out
    assert "horovod -> hvlite: 1 names: 1 present" in out, out
    # torch: Compression missing; allreduce's op default; wrapped lost a parameter; the factory
    # class lacks set_backward_passes_per_step (zero_grad comes from torch's Optimizer)
    assert "  missing  Compression\n" in out, out
    assert "  missing  DistributedOptimizer().set_backward_passes_per_step" in out, out
    assert "zero_grad" not in out, out
    assert "  differs  allreduce: 'op' defaults to None (Horovod's: Sum)" in out, out
    assert "  differs  wrapped: no parameter 2 (Horovod's 'name'); no parameter 'name'" in out, out
    # found through the alias (rank = _basics.rank), the forwarding wrapper (init) and the
    # HorovodBasics methods; a helper from horovod.common.util and `import os` are not API
    assert "check_extension" not in out and " os" not in out, out
    assert "  missing  HorovodBasics" in out, out
    assert "total: 5 missing or differing outside the allow-list" in out, out


def test_the_allow_list_keeps_deliberate_differences_apart(trees, capsys, monkeypatch):
    allowed = {("horovod.torch", "Compression"): "a reason",
               ("horovod.torch", "allreduce"): "another",
               ("horovod.torch", "wrapped"): "a third",
               ("horovod.torch", "DistributedOptimizer().set_backward_passes_per_step"): "4th",
               ("horovod.common.basics", "HorovodBasics"): "5th"}
    code, out = run_tool(trees, capsys, allowed=allowed, monkeypatch=monkeypatch)
    assert code == 0, out
    assert "  allowed  Compression (missing): a reason" in out, out
    assert "  allowed  allreduce ('op' defaults to None (Horovod's: Sum)): another" in out, out
    assert "total: 0 missing or differing" in out, out


def test_a_checkout_without_horovod_is_refused(tmp_path, capsys):
    assert horovod_api.main([str(tmp_path)]) == 2
