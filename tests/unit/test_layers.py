"""The layering rules of DESIGN.md, checked on the source (parsed with ``ast``, nothing imported).

Rules, for every ``import``/``from ... import`` anywhere in a file (also inside functions), with
relative imports resolved against the file's package:
1. The neutral layer (``hvlite/*.py``) imports neither torch, tensorflow nor keras, nor
   ``hvlite.torch``/``hvlite.tensorflow``.
2. ``hvlite/torch`` imports neither tensorflow/keras nor ``hvlite.tensorflow``, and
   ``hvlite/tensorflow`` neither torch nor ``hvlite.torch``.
3. An adapter reaches nothing private of hvlite outside its own package: no module whose path
   (after ``hvlite``) has a part starting with ``_`` (``hvlite._lib``, ``hvlite._core``, ...),
   no imported name starting with ``_``, and no ``_`` attribute of an hvlite module it imported
   (``ops._reduce_op``). Dunder names (``__version__``) are public. Inside its own package an
   adapter may use its private names freely.
4. Training code does not import the launcher: ``hvlite/elastic`` imports nothing of
   ``hvlite.runner`` (what both need is ``hvlite.protocol``). ``hvlite.protocol`` imports nothing
   of hvlite outside itself; ``hvlite.runner`` nothing outside itself and ``hvlite.protocol``.
5. The runner's folders (``hvlite/runner/cli``, ``world``, ...) import each other without a
   cycle, and so do its modules.
Imports made with ``importlib`` from strings are not seen (hvlite/__init__.py loads its own API
modules that way, and nothing else does).
"""
import ast
import glob
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE_DIR = os.path.join(ROOT, "hvlite")
FRAMEWORKS = {"torch": ("torch",), "tensorflow": ("tensorflow", "keras")}
ADAPTERS = ("hvlite.torch", "hvlite.tensorflow")


def module_of(path):
    """``hvlite/torch/ops.py`` -> ("hvlite.torch.ops", package "hvlite.torch")."""
    rel = os.path.relpath(path, ROOT)[:-len(".py")].split(os.sep)
    if rel[-1] == "__init__":
        rel = rel[:-1]
        return ".".join(rel), ".".join(rel)
    return ".".join(rel), ".".join(rel[:-1])


def is_private(part):
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def is_module(dotted):
    """True if ``dotted`` (under hvlite) is a module or package of the source tree."""
    path = os.path.join(ROOT, *dotted.split("."))
    return os.path.isfile(path + ".py") or os.path.isfile(os.path.join(path, "__init__.py"))


def imports(tree, package):
    """(module, name, alias, bound) for every import, relative imports resolved: ``bound`` is
    what ``alias`` names. ``import a.b as c`` -> ("a.b", None, "c", "a.b"); ``import a.b`` ->
    ("a.b", None, "a", "a"); ``from ..x import y as z`` -> ("hvlite.x", "y", "z", "hvlite.x.y")."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                top = a.name.split(".")[0]
                yield a.name, None, a.asname or top, a.name if a.asname else top
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            for a in node.names:
                yield base, a.name, a.asname or a.name, base + "." + a.name


def adapter_of(module):
    return next((a for a in ADAPTERS if module == a or module.startswith(a + ".")), None)


def violations(path, source):
    """The rule violations of one file of the hvlite package, as readable strings."""
    module, package = module_of(path)
    adapter = adapter_of(module)
    neutral = adapter is None and package == "hvlite"
    tree = ast.parse(source, path)
    found, hvlite_modules = [], {}
    for base, name, alias, bound in imports(tree, package):
        target = base if name is None else base + "." + name
        top = base.split(".")[0]
        where = "%s imports %s" % (os.path.relpath(path, ROOT), target)
        for framework, tops in FRAMEWORKS.items():
            other_adapter = "hvlite." + framework
            uses = top in tops or base == other_adapter or base.startswith(other_adapter + ".") \
                or target == other_adapter
            if uses and (neutral or (adapter is not None and adapter != other_adapter)):
                found.append("%s (%s)" % (where, "the neutral layer imports no framework" if neutral
                                          else "an adapter imports no other framework"))
        if adapter is None or top != "hvlite" or adapter_of(target) == adapter:
            continue
        hvlite_parts = target.split(".")[1:] if name is None or is_module(target) \
            else base.split(".")[1:] + [name]
        if any(is_private(p) for p in hvlite_parts):
            found.append("%s (an adapter reaches a private hvlite name)" % where)
        if is_module(bound):
            hvlite_modules[alias] = bound
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in hvlite_modules and is_private(node.attr):
            found.append("%s uses %s.%s (an adapter reaches a private hvlite name)" % (
                os.path.relpath(path, ROOT), hvlite_modules[node.value.id], node.attr))
    return found


def package_files():
    for here, dirs, files in os.walk(PACKAGE_DIR):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                yield os.path.join(here, f)


def test_the_package_keeps_its_layers():
    files = list(package_files())
    assert any(f.endswith(os.path.join("torch", "ops.py")) for f in files)
    found = []
    for path in files:
        with open(path) as f:
            found += violations(path, f.read())
    assert not found, "layering rules broken:\n" + "\n".join(found)


def planted(relpath, source):
    return violations(os.path.join(ROOT, relpath), source)


@pytest.mark.parametrize("relpath,source", [
    ("hvlite/ops.py", "import torch\n"),
    ("hvlite/ops.py", "def f():\n    import tensorflow as tf\n"),
    ("hvlite/ops.py", "from keras import ops\n"),
    ("hvlite/handles.py", "from .torch import ops\n"),
    ("hvlite/handles.py", "from . import tensorflow\n"),
    ("hvlite/torch/ops.py", "import tensorflow\n"),
    ("hvlite/torch/ops.py", "from ..tensorflow import ops\n"),
    ("hvlite/torch/ops.py", "from .. import tensorflow\n"),
    ("hvlite/tensorflow/ops.py", "from torch import nn\n"),
    ("hvlite/tensorflow/keras/optimizer.py", "from ...torch.ops import allreduce\n"),
    ("hvlite/torch/ops.py", "from ..ops import _reduce_op\n"),
    ("hvlite/torch/ops.py", "from .._lib import lib\n"),
    ("hvlite/torch/ops.py", "from .. import _lib\n"),
    ("hvlite/torch/ops.py", "import hvlite._lib\n"),
    ("hvlite/tensorflow/ops.py", "from hvlite.process_sets import _registered\n"),
    ("hvlite/torch/ops.py", "from .. import ops as np_ops\nnp_ops._copy_back(1, 2)\n"),
    ("hvlite/tensorflow/keras/__init__.py", "from ... import handles\nhandles._keep_alive\n"),
])
def test_planted_violations_are_found(relpath, source):
    assert planted(relpath, source), "no violation found in %s: %r" % (relpath, source)


@pytest.mark.parametrize("relpath,source", [
    ("hvlite/ops.py", "import numpy\nfrom ._lib import lib\nfrom .handles import _keep_alive\n"),
    ("hvlite/torch/ops.py", "import torch\nfrom .. import ops as _np\n_np.allreduce\n"),
    ("hvlite/torch/optimizer.py", "from .ops import _check_tensor\n"),
    ("hvlite/tensorflow/keras/optimizer.py", "from ..ops import _allreduce_group\n"),
    ("hvlite/tensorflow/ops.py", "import tensorflow as tf\nfrom .. import __version__\n"),
])
def test_allowed_imports_pass(relpath, source):
    assert planted(relpath, source) == []


def test_every_neutral_module_imports_first():
    """Each module of the neutral layer imports as the first thing a fresh interpreter does
    (``hvlite.elastic`` imports ``hvlite.ops`` before anything loads the API, and the lazy
    ``hvlite.__getattr__`` must not load the API half-way through that import)."""
    import subprocess
    import sys
    names = sorted(module_of(p)[0] for p in glob.glob(os.path.join(PACKAGE_DIR, "*.py"))
                   + glob.glob(os.path.join(PACKAGE_DIR, "elastic", "*.py")))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = "import importlib, sys; importlib.import_module(sys.argv[1])"
    failed = []
    for name in names:
        job = subprocess.run([sys.executable, "-c", code, name], env=env, capture_output=True,
                             text=True, timeout=120)
        if job.returncode:
            failed.append("%s: %s" % (name, job.stderr.strip().splitlines()[-1:]))
    assert not failed, failed


# --- hvlite/elastic, hvlite/protocol and hvlite/runner ---------------------------------------
# 4. Training code does not import the launcher: nothing in hvlite/elastic imports hvlite.runner
#    (what both need lives in hvlite.protocol). hvlite.protocol imports nothing of hvlite outside
#    itself, and hvlite.runner nothing outside itself and hvlite.protocol (it must run where the
#    engine was never built; importing the hvlite package itself loads nothing).
# 5. The runner's folders (hvlite/runner/<folder>/) import each other without a cycle, and so do
#    its modules.

def within(module, part):
    return module == part or module.startswith(part + ".")


def hvlite_targets(path, source):
    """(module, target) for every hvlite module one file imports, resolved as far as the source
    tree knows it (``from ..runner import x`` names ``hvlite.runner.x`` if that is a module)."""
    module, package = module_of(path)
    for base, name, _, _ in imports(ast.parse(source, path), package):
        target = base if name is None else base + "." + name
        if target.split(".")[0] != "hvlite":
            continue
        while target != "hvlite" and not is_module(target):
            target = target.rsplit(".", 1)[0]
        yield module, target


def reach_violations(path, source):
    """Rule 4 for one file, as readable strings."""
    found = []
    for module, target in hvlite_targets(path, source):
        if within(module, "hvlite.elastic") and within(target, "hvlite.runner"):
            why = "training code does not import the runner"
        elif within(module, "hvlite.protocol") and not within(target, "hvlite.protocol"):
            why = "hvlite.protocol imports nothing else of hvlite"
        elif within(module, "hvlite.runner") and not (within(target, "hvlite.runner")
                                                     or within(target, "hvlite.protocol")):
            why = "the runner imports nothing of hvlite but hvlite.protocol"
        else:
            continue
        found.append("%s imports %s (%s)" % (os.path.relpath(path, ROOT), target, why))
    return found


def runner_edges(sources):
    """{(module, imported module)} and {(folder, imported folder)} inside hvlite.runner, from
    ``sources`` ({path: source})."""
    modules, folders = set(), set()
    for path, source in sources.items():
        for module, target in hvlite_targets(path, source):
            if module.startswith("hvlite.runner.") and target.startswith("hvlite.runner.") \
                    and module != target:
                modules.add((module, target))
                a, b = module.split(".")[2], target.split(".")[2]
                if a != b and all(os.path.isdir(os.path.join(PACKAGE_DIR, "runner", x))
                                  for x in (a, b)):
                    folders.add((a, b))
    return modules, folders


def cycle(edges):
    """One cycle of the directed graph ``edges`` as a list of nodes, or None."""
    graph = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
    state = {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, stack + [nxt])
                if found:
                    return found
        state[node] = "done"
        return None
    for node in sorted(graph):
        if node not in state:
            found = visit(node, [node])
            if found:
                return found
    return None


def test_training_code_and_the_runner_keep_to_their_parts():
    found = []
    for path in package_files():
        with open(path) as f:
            found += reach_violations(path, f.read())
    assert not found, "layering rules broken:\n" + "\n".join(found)


def test_the_runner_folders_and_modules_have_no_import_cycle():
    sources = {}
    for path in package_files():
        if os.path.relpath(path, PACKAGE_DIR).startswith("runner" + os.sep):
            with open(path) as f:
                sources[path] = f.read()
    modules, folders = runner_edges(sources)
    assert {"cli", "world", "elastic"} <= {a for a, _ in folders}, folders
    for kind, edges in (("folders", folders), ("modules", modules)):
        found = cycle(edges)
        assert found is None, "runner %s import in a circle: %s" % (kind, " -> ".join(found))


@pytest.mark.parametrize("relpath,source", [
    ("hvlite/elastic/world.py", "from ..runner.control.client import ControlClient\n"),
    ("hvlite/elastic/run.py", "import hvlite.runner.world.spec\n"),
    ("hvlite/elastic/state.py", "from .. import runner\n"),
    ("hvlite/protocol/wire.py", "from ..elastic import codec\n"),
    ("hvlite/protocol/wire.py", "from .. import basics\n"),
    ("hvlite/runner/world/run.py", "from ...elastic.codec import decode\n"),
    ("hvlite/runner/cli/launch.py", "from ... import ops\n"),
])
def test_planted_reach_violations_are_found(relpath, source):
    assert reach_violations(os.path.join(ROOT, relpath), source), relpath


def test_planted_runner_cycles_are_found():
    upward = {os.path.join(ROOT, "hvlite/runner/control/server.py"): "from ..world import spec\n",
              os.path.join(ROOT, "hvlite/runner/world/spec.py"): "from ..control import server\n"}
    modules, folders = runner_edges(upward)
    assert cycle(folders) in (["control", "world", "control"], ["world", "control", "world"])
    assert cycle(modules) is not None
    assert cycle({("a", "b"), ("b", "c")}) is None
