"""Compare Horovod's public Python API with hvlite's, name by name, from the source of both.

Contract:
    python tools/horovod_api.py HOROVOD_CHECKOUT [--module M ...] [--verbose] [--hvlite TREE]
    HOROVOD_CHECKOUT is a Horovod source tree (the folder holding ``horovod/``), read from outside
    this project and never imported: both sides are parsed with ``ast``, so neither Horovod, its
    extensions, torch nor TensorFlow need be installed. hvlite is read from this checkout (or
    from TREE, e.g. an older commit's ``git archive``).
    For each module pair in ``MODULES`` it prints one line of counts and then, per public
    Horovod name, what is wrong: ``missing`` (hvlite has no such name), ``differs`` (a call that
    works on Horovod's signature would not bind, or binds with another default, on hvlite's;
    for classes also their public methods, and for the classes a factory returns, ``FACTORIES``),
    and ``allowed`` (a deliberate difference, from ``ALLOWED``, printed with its reason).
    ``--verbose`` also lists the names that match. Exit status: 0 when nothing is missing or
    differs outside the allow-list, 1 otherwise, 2 on a bad checkout path.

What counts as public in Horovod (it has no ``__all__``): every top-level name not starting with
``_``, defined in the module or imported into it from a ``horovod`` module, except modules
imported with ``import`` and names imported from Horovod's internal helper modules
(``INTERNAL_SOURCES``). Names bound inside top-level ``if``/``try`` blocks count. Names are
resolved to their definitions through imports (``from x import y``, ``*``, relative imports),
aliases (``rank = _basics.rank``: a method of an instance's class) and wrappers that forward
``*args, **kwargs``. Classes built inside functions are not followed.
"""
import argparse
import ast
import os
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (Horovod module, hvlite module): what a script imports, with its import swapped.
MODULES = [
    ("horovod", "hvlite"),
    ("horovod.common.basics", "hvlite"),
    ("horovod.common.process_sets", "hvlite.process_sets"),
    ("horovod.common.exceptions", "hvlite.errors"),
    ("horovod.common.elastic", "hvlite.elastic"),
    ("horovod.runner", "hvlite.runner"),
    ("horovod.torch", "hvlite.torch"),
    ("horovod.torch.mpi_ops", "hvlite.torch.mpi_ops"),
    ("horovod.torch.elastic", "hvlite.torch.elastic"),
    ("horovod.tensorflow", "hvlite.tensorflow"),
    ("horovod.tensorflow.mpi_ops", "hvlite.tensorflow.mpi_ops"),
    ("horovod.tensorflow.elastic", "hvlite.tensorflow.elastic"),
    ("horovod.tensorflow.keras", "hvlite.tensorflow.keras"),
    ("horovod.tensorflow.keras.callbacks", "hvlite.tensorflow.keras.callbacks"),
    ("horovod.tensorflow.keras.elastic", "hvlite.tensorflow.keras.elastic"),
    ("horovod.keras", "hvlite.keras"),
    ("horovod.keras.callbacks", "hvlite.keras.callbacks"),
    ("horovod.keras.elastic", "hvlite.keras.elastic"),
]

# Classes that a public factory returns (a script calls their methods): (module, public name,
# Horovod class, hvlite class, the framework class hvlite's is put in front of), compared method
# by method. hvlite's torch optimizers are mixins placed before the wrapped optimizer's class,
# so they have torch.optim.Optimizer's methods too.
FACTORIES = [
    ("horovod.torch", "DistributedOptimizer", "horovod.torch.optimizer._DistributedOptimizer",
     "hvlite.torch.optimizer._DistributedOptimizer", "torch.optim.Optimizer"),
    ("horovod.torch", "DistributedOptimizer(op=Adasum)", "horovod.torch.optimizer._DistributedAdasumOptimizer",
     "hvlite.torch.adasum_optimizer._AdasumOptimizer", "torch.optim.Optimizer"),
]

# Horovod modules whose names are helpers of Horovod's own, not API, wherever they are imported.
INTERNAL_SOURCES = ("horovod.common.util", "horovod.tensorflow.util", "horovod.runner.common",
                    "horovod.runner.util", "horovod.runner.launch", "horovod.runner.elastic",
                    "horovod.runner.gloo_run", "horovod.runner.mpi_run", "horovod.runner.js_run",
                    "horovod.common.basics", "horovod.tensorflow.gradient_aggregation",
                    "horovod.tensorflow.gradient_aggregation_eager", "horovod._keras")

# Framework classes whose methods an hvlite class inherits (they are not in this tree): base
# class as written in the source -> its public methods, as Keras 3 defines them.
_KERAS_CALLBACK = "\n".join(
    ["def %s(self, batch, logs=None): pass" % "on_%s_%s" % (mode, edge)
     for mode in ("batch", "train_batch", "test_batch", "predict_batch") for edge in ("begin", "end")]
    + ["def on_epoch_%s(self, epoch, logs=None): pass" % edge for edge in ("begin", "end")]
    + ["def on_%s_%s(self, logs=None): pass" % (mode, edge)
       for mode in ("train", "test", "predict") for edge in ("begin", "end")]
    + ["def set_model(self, model): pass", "def set_params(self, params): pass"])
_TORCH_OPTIMIZER = "\n".join([
    "def zero_grad(self, set_to_none=True): pass", "def step(self, closure=None): pass",
    "def state_dict(self): pass", "def load_state_dict(self, state_dict): pass",
    "def add_param_group(self, param_group): pass"])
EXTERNAL_BASES = {"keras.callbacks.Callback": _KERAS_CALLBACK,
                  "tf.keras.callbacks.Callback": _KERAS_CALLBACK,
                  "torch.optim.Optimizer": _TORCH_OPTIMIZER}

# Defaults that differ in text only: (Horovod's, hvlite's) -> why they mean the same.
SAME_DEFAULT = {
    ("global_process_set", "None"): "None stands for the global process set in hvlite",
    ("Compression.none", "None"): "None stands for Compression.none",
}

# Deliberate differences: (Horovod module, name or Class.method) -> the reason.
ALLOWED = {
    ("horovod.tensorflow", "SyncBatchNormalization.call"): "Horovod's override only adds the "
        "layer's updates to TF1's UPDATE_OPS collection; Keras 3 layers have no `updates` and TF2 "
        "no collections, so the inherited call is the whole behaviour",
    ("horovod.common.basics", "HorovodBasics"): "Horovod's ctypes loader class; hvlite's basics are "
        "module functions (hvlite.basics, hvlite.timeline), compared here method by name",
    ("horovod.common.basics", "MPI"): "a typing stand-in for mpi4py's class inside Horovod's module",
    ("horovod.common.process_sets", "MPI"): "a typing stand-in for mpi4py's class inside Horovod's module",
    ("horovod.common.process_sets", "HorovodBasics"): "a typing stand-in inside Horovod's module",
    ("horovod.common.exceptions", "get_version_mismatch_message"): "a helper that formats the "
        "message of HorovodVersionMismatchError, which hvlite never raises (no framework extension "
        "is compiled, so no version can mismatch)",
    ("horovod.common.elastic", "run_fn"): "Horovod's elastic loop, parameterised by a reset "
        "function; hvlite's loop is hvlite.elastic.run (restarted worlds, not in-process resets)",
    ("horovod.common.elastic", "notification_manager"): "Horovod's in-process listener for host "
        "changes; hvlite's workers hear them over hvlrun's authenticated control channel",
    ("horovod.common.elastic", "WorkerNotificationManager"): "as notification_manager",
    ("horovod.common.elastic", "HostUpdateResult"): "the listener's message type; hvlite's "
        "workers get host changes as HostsUpdatedInterrupt, as Horovod's scripts see them",
    ("horovod.torch.mpi_ops", "handle_average_backwards_compatibility"): "Horovod's shim for the "
        "pre-0.21 `average=` argument; hvlite's collectives take `average=` themselves",
    ("horovod.tensorflow", "handle_average_backwards_compatibility"): "as in horovod.torch.mpi_ops",
    ("horovod.tensorflow.mpi_ops", "handle_average_backwards_compatibility"): "as in horovod.torch.mpi_ops",
    ("horovod.tensorflow.mpi_ops", "MPI_LIB"): "Horovod's compiled extension; hvlite compiles none",
    ("horovod.torch.mpi_ops", "HorovodAllreduce"): "Horovod's autograd Function classes are the "
        "inside of allreduce/allgather/...; hvlite's are private (_AllreduceFn, ...) with the "
        "same gradients",
    ("horovod.torch.mpi_ops", "HorovodGroupedAllreduce"): "as HorovodAllreduce",
    ("horovod.torch.mpi_ops", "HorovodAllgather"): "as HorovodAllreduce",
    ("horovod.torch.mpi_ops", "HorovodGroupedAllgather"): "as HorovodAllreduce",
    ("horovod.torch.mpi_ops", "HorovodBroadcast"): "as HorovodAllreduce",
    ("horovod.torch.mpi_ops", "HorovodAlltoall"): "as HorovodAllreduce",
    ("horovod.torch.mpi_ops", "HorovodReducescatter"): "as HorovodAllreduce",
    ("horovod.torch.mpi_ops", "HorovodGroupedReducescatter"): "as HorovodAllreduce",
    ("horovod.torch.mpi_ops", "mpi_lib"): "Horovod's compiled extension; hvlite compiles none "
        "(its engine is hvlite._core, reached through hvlite's neutral layer)",
    ("horovod.runner", "run_commandline"): "Horovod's console entry; hvlite's is "
        "hvlite.runner.cli.launch.main (the hvlrun script), with horovodrun's flags",
    ("horovod.runner", "is_gloo_used"): "hvlite has no Gloo controller: hvlrun always runs MPI",
    ("horovod.runner", "parse_args"): "horovodrun's parser; hvlrun's is "
        "hvlite.runner.cli.flags, which takes horovodrun's flags too",
    ("horovod.runner", "check_build"): "hvlrun --check-build (hvlite.runner.cli.build_info)",
    ("horovod.runner", "make_override_action"): "an argparse helper of horovodrun's parser",
    ("horovod.runner", "make_override_bool"): "an argparse helper of horovodrun's parser",
    ("horovod.runner", "make_override_true"): "an argparse helper of horovodrun's parser",
    ("horovod.runner", "make_override_false"): "an argparse helper of horovodrun's parser",
    ("horovod.runner", "make_check_build_action"): "an argparse helper of horovodrun's parser",
    ("horovod.runner", "HorovodArgs"): "horovodrun's settings holder; hvlite.runner.run takes "
        "keyword arguments",
}


# --- reading one side ------------------------------------------------------------------------

class Tree:
    """One side: modules of package ``package`` under ``root``, parsed once and cached."""

    def __init__(self, root, package, inherits_external):
        self.root, self.package = root, package
        self.inherits_external = inherits_external   # list EXTERNAL_BASES' methods as its own
        self.cache = {}

    def path_of(self, module):
        base = os.path.join(self.root, *module.split("."))
        for path in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(path):
                return path
        return None

    def module(self, name):
        """The parsed Module ``name``, or None where no file holds it (a submodule may still be
        an alias that its parent put in sys.modules: see Module.aliases)."""
        if name not in self.cache:
            path = self.path_of(name) if name.split(".")[0] == self.package else None
            if path is None and "." in name:
                parent = self.module(name.rsplit(".", 1)[0])
                target = parent.aliases.get(name.rsplit(".", 1)[1]) if parent else None
                self.cache[name] = self.resolve(parent, target) if target else None
                if self.cache[name] is not None and self.cache[name][0] == "module":
                    self.cache[name] = self.module(self.cache[name][1])
                else:
                    self.cache[name] = None
            else:
                self.cache[name] = Module(self, name, path) if path else None
        return self.cache[name]

    def resolve(self, module, name, seen=None):
        """What ``name`` in ``module`` is: ("func", FunctionDef, Module, bound), ("class",
        ClassDef, Module), ("module", module name), ("value", node, Module), or None."""
        seen = seen or set()
        if module is None or (module.name, name) in seen:
            return None
        seen.add((module.name, name))
        binding = module.bindings.get(name)
        if binding is None:
            for star in module.stars:
                found = self.resolve(self.module(star), name, seen)
                if found is not None:
                    return found
            sub = self.module(module.name + "." + name) if module.is_package else None
            return ("module", sub.name) if sub else None
        kind = binding[0]
        if kind == "def":
            return ("func", binding[1], module, False)
        if kind == "class":
            return ("class", binding[1], module)
        if kind == "import":
            source, attr = binding[1], binding[2]
            if attr is None:
                return ("module", source)
            found = self.resolve(self.module(source), attr, seen)
            if found is None and self.module(source + "." + attr) is not None:
                return ("module", source + "." + attr)
            return found
        return self.resolve_expr(module, binding[1], seen)

    def resolve_expr(self, module, node, seen):
        if isinstance(node, ast.Name):
            return self.resolve(module, node.id, seen)
        if isinstance(node, ast.Attribute):
            base = self.resolve_expr(module, node.value, seen)
            if base is not None and base[0] == "module" and self.module(base[1]) is not None:
                return self.resolve(self.module(base[1]), node.attr, seen)
            if base is not None and base[0] in ("class", "instance"):
                method = self.method(base, node.attr)
                if method is not None:
                    return ("func", method[0], method[1], base[0] == "instance")
            return ("value", node, module)      # an attribute of something not followed
        if isinstance(node, ast.Call):
            callee = self.resolve_expr(module, node.func, seen)
            if callee is not None and callee[0] == "class":
                return ("instance", callee[1], callee[2])
        return ("value", node, module)

    def bases(self, cls):
        """``cls`` (a ("class", node, module) triple) and its bases found in this tree, in order."""
        out, todo = [], [cls]
        while todo:
            c = todo.pop(0)
            if any(c[1] is o[1] for o in out):
                continue
            out.append(c)
            for base in c[1].bases:
                found = self.resolve_expr(c[2], base, set())
                if found is not None and found[0] == "class":
                    todo.append(found)
        return out

    def external(self, cls):
        """Method definitions ``cls`` inherits from the framework classes of EXTERNAL_BASES
        (also one it is put in front of: a 4th element of the triple, from FACTORIES)."""
        names = list(cls[3:4]) + [ast.unparse(b) for c in self.bases(cls) for b in c[1].bases]
        return [d for name in dict.fromkeys(names) if name in EXTERNAL_BASES
                for d in ast.parse(EXTERNAL_BASES[name]).body]

    def method(self, cls, name):
        """(FunctionDef, Module) of method ``name`` of ``cls`` or a base, else None."""
        for c in self.bases(("class", cls[1], cls[2])):
            for item in c[1].body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == name:
                    return item, c[2]
        for item in self.external(cls):
            if item.name == name:
                return item, cls[2]
        return None

    def methods(self, cls):
        """Public method names of ``cls`` and its bases (in this tree, or EXTERNAL_BASES)."""
        names = []
        for c in self.bases(cls):
            for item in c[1].body:
                if (isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not item.name.startswith("_")
                        and item.name not in names):
                    names.append(item.name)
        if not self.inherits_external:
            return names
        return names + [d.name for d in self.external(cls) if d.name not in names]


class Module:
    """One source file's top-level bindings: name -> ("def"|"class", node) | ("import", module,
    attr or None) | ("assign", value node); ``stars``: modules imported with ``*``; ``all``: its
    literal ``__all__`` (None if it has none); ``aliases``: submodules it puts in sys.modules."""

    def __init__(self, tree, name, path):
        self.tree, self.name, self.path = tree, name, path
        self.is_package = path.endswith("__init__.py")
        self.bindings, self.stars, self.aliases, self.all = {}, [], {}, None
        with open(path) as f:
            self.walk(ast.parse(f.read(), path).body)

    def absolute(self, node):
        if not node.level:
            return node.module
        parts = self.name.split(".")
        if not self.is_package:
            parts = parts[:-1]
        parts = parts[:len(parts) - node.level + 1]
        return ".".join(parts + ([node.module] if node.module else []))

    def walk(self, body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.bindings[node.name] = ("def", node)
                if node.name == "__getattr__":       # names imported when first asked for
                    self.lazy(node)
            elif isinstance(node, ast.ClassDef):
                self.bindings[node.name] = ("class", node)
            elif isinstance(node, ast.ImportFrom):
                source = self.absolute(node)
                for alias in node.names:
                    if alias.name == "*":
                        self.stars.append(source)
                    else:
                        self.bindings[alias.asname or alias.name] = ("import", source, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    self.bindings[bound] = ("import", alias.name if alias.asname else bound, None)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                self.assign(node)
            elif isinstance(node, ast.If):
                self.walk(node.body)
                self.walk(node.orelse)
            elif isinstance(node, ast.Try):
                self.walk(node.body)
                for handler in node.handlers:
                    self.walk(handler.body)
                self.walk(node.orelse)
                self.walk(node.finalbody)

    def lazy(self, func):
        for node in ast.walk(func):
            if isinstance(node, ast.ImportFrom):
                source = self.absolute(node)
                for alias in node.names:
                    self.bindings.setdefault(alias.asname or alias.name, ("import", source, alias.name))

    def assign(self, node):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            if (isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                    and len(target.elts) == len(node.value.elts)):
                for name, value in zip(target.elts, node.value.elts):
                    if isinstance(name, ast.Name):
                        self.bindings[name.id] = ("assign", value)
            elif isinstance(target, ast.Name) and node.value is not None:
                if target.id == "__all__":
                    self.extend_all(node)
                elif not isinstance(node, ast.AugAssign):
                    self.bindings[target.id] = ("assign", node.value)
            elif (isinstance(target, ast.Subscript) and ast.unparse(target.value) == "sys.modules"
                  and isinstance(target.slice, ast.BinOp) and isinstance(target.slice.right, ast.Constant)
                  and isinstance(node.value, ast.Name)):
                self.aliases[target.slice.right.value.lstrip(".")] = node.value.id

    def extend_all(self, node):
        try:
            names = list(ast.literal_eval(node.value))
        except ValueError:
            return
        self.all = (self.all or []) + names if isinstance(node, ast.AugAssign) else names

    def public(self):
        """The module's public names (see the module docstring)."""
        names = self.all
        binding = self.bindings.get("__all__")
        if names is None and binding and binding[0] == "import":
            source = self.tree.module(binding[1])
            names = source.public() if source else None
        if names is not None:
            return list(names)
        names = []
        for name, binding in self.bindings.items():
            if name.startswith("_") or name in names:
                continue
            if binding[0] == "import" and (
                    binding[2] is None or not binding[1].startswith(self.tree.package)
                    or binding[1].startswith(INTERNAL_SOURCES)):
                if not (binding[2] and self.tree.module(binding[1] + "." + binding[2])):
                    continue            # a module import, or a helper of elsewhere
            names.append(name)
        for star in self.stars:
            source = self.tree.module(star)
            for name in source.public() if source else ():
                if name not in names:
                    names.append(name)
        return names


# --- signatures --------------------------------------------------------------------------------

def forwarded(tree, func, module):
    """For a wrapper ``def f(*args, **kwargs): return g(*args, **kwargs)``: g's FunctionDef,
    Module and whether it is bound; else None."""
    a = func.args
    if not (a.vararg and a.kwarg) or a.args or a.kwonlyargs:
        return None
    for node in ast.walk(func):
        if (isinstance(node, ast.Call) and any(isinstance(x, ast.Starred) for x in node.args)
                and any(k.arg is None for k in node.keywords)):
            found = tree.resolve_expr(module, node.func, set())
            if found is not None and found[0] == "func":
                return found[1], found[2], found[3]
    return None


def signature(tree, found):
    """The call signature of a resolved name: a dict with ``positional`` (names, in order),
    ``keyword`` (names callable by keyword), ``defaults`` (name -> source text), ``varargs``,
    ``varkw``; None for what is not callable or not followed."""
    kind = found[0]
    if kind == "func":
        func, module, bound = found[1], found[2], found[3]
        target = forwarded(tree, func, module)
        if target is not None:
            func, module, bound = target
        return params(func, 1 if bound else 0)
    if kind == "class":
        init = tree.method(found, "__init__")
        if init is None:
            return {"positional": [], "keyword": [], "defaults": {}, "varargs": True, "varkw": True}
        return params(init[0], 1)
    return None


def params(func, skip):
    a = func.args
    positional = [p.arg for p in a.posonlyargs + a.args]
    defaults = {}
    for p, d in zip((a.posonlyargs + a.args)[::-1], a.defaults[::-1]):
        defaults[p.arg] = ast.unparse(d)
    for p, d in zip(a.kwonlyargs, a.kw_defaults):
        if d is not None:
            defaults[p.arg] = ast.unparse(d)
    if any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in func.decorator_list):
        skip = 0
    positional = positional[skip:]
    keyword = [p.arg for p in a.args] + [p.arg for p in a.kwonlyargs]
    keyword = [k for k in keyword if k in positional or k in {p.arg for p in a.kwonlyargs}]
    return {"positional": positional, "keyword": keyword, "defaults": defaults,
            "varargs": a.vararg is not None, "varkw": a.kwarg is not None}


def compare_signatures(h, v):
    """Ways a call that binds to Horovod's signature ``h`` fails on hvlite's ``v`` (a list)."""
    problems = []
    for i, name in enumerate(h["positional"]):
        if i < len(v["positional"]):
            if v["positional"][i] != name:
                problems.append("parameter %d is %r, Horovod's is %r" % (i + 1, v["positional"][i], name))
        elif not v["varargs"]:
            problems.append("no parameter %d (Horovod's %r)" % (i + 1, name))
    for name in h["keyword"]:
        if name not in v["keyword"] and not v["varkw"]:
            problems.append("no parameter %r" % name)
    if h["varargs"] and not v["varargs"]:
        problems.append("no *args")
    if h["varkw"] and not v["varkw"]:
        problems.append("no **kwargs")
    for name, default in h["defaults"].items():
        mine = v["defaults"].get(name)
        if name in v["keyword"] or name in v["positional"]:
            if mine is None:
                problems.append("%r has no default (Horovod's: %s)" % (name, default))
            elif mine != default and (default, mine) not in SAME_DEFAULT:
                problems.append("%r defaults to %s (Horovod's: %s)" % (name, mine, default))
    for name in v["positional"][len(h["positional"]):]:
        if name not in v["defaults"] and not h["varargs"]:
            problems.append("extra required parameter %r" % name)
    return problems


def describe(found):
    if found is None:
        return None
    return {"func": "function", "class": "class", "module": "module",
            "instance": "object", "value": "value"}[found[0]]


# --- comparing -----------------------------------------------------------------------------------

class Report:
    def __init__(self, pair):
        self.pair = pair
        self.ok, self.missing, self.differs, self.allowed = [], [], [], []

    def add(self, name, problem):
        """problem: None (matches), "missing", or a text of how it differs."""
        reason = ALLOWED.get((self.pair[0], name))
        if problem is None:
            self.ok.append(name)
        elif reason is not None:
            self.allowed.append((name, problem, reason))
        elif problem == "missing":
            self.missing.append(name)
        else:
            self.differs.append((name, problem))


def compare_names(horovod, hvlite, h_found, v_found, name, report):
    if v_found is None:
        report.add(name, "missing")
        return
    h_sig, v_sig = signature(horovod, h_found), signature(hvlite, v_found)
    if h_sig is not None and v_sig is None and v_found[0] not in ("instance", "value"):
        report.add(name, "a %s in Horovod, a %s in hvlite" % (describe(h_found), describe(v_found)))
        return
    if h_sig is not None and v_sig is not None:
        problems = compare_signatures(h_sig, v_sig)
        report.add(name, "; ".join(problems) if problems else None)
    else:
        report.add(name, None)
    if h_found[0] == "class" and v_found[0] == "class":
        compare_methods(horovod, hvlite, h_found, v_found, name, report)


def compare_methods(horovod, hvlite, h_cls, v_cls, label, report):
    v_methods = set(hvlite.methods(v_cls))
    for method in horovod.methods(h_cls):
        qualified = "%s.%s" % (label, method)
        if method not in v_methods:
            report.add(qualified, "missing")
            continue
        h_def, _ = horovod.method(h_cls, method)
        v_def, _ = hvlite.method(v_cls, method)
        problems = compare_signatures(params(h_def, 1), params(v_def, 1))
        report.add(qualified, "; ".join(problems) if problems else None)


def hvlite_public(hvlite, module):
    """hvlite's public names of ``module``; the package ``hvlite`` publishes the ``__all__`` of
    the modules named in its ``_API_MODULES`` when first asked (see hvlite/__init__.py)."""
    names = module.public()
    if module.name == "hvlite":
        listed = module.bindings.get("_API_MODULES")
        for sub in ast.literal_eval(listed[1]) if listed else ():
            names += hvlite.module("hvlite." + sub).public()
        names.append("run")
    return names


def resolve_hvlite(hvlite, module, name):
    found = hvlite.resolve(module, name)
    if found is None and module.name == "hvlite":
        if name == "run":       # hvlite/__init__.py's __getattr__ imports it by name
            for path in ("hvlite.runner.func_run", "hvlite.func_job"):
                if hvlite.module(path) is not None:
                    return hvlite.resolve(hvlite.module(path), "run")
        listed = module.bindings.get("_API_MODULES")
        for sub in ast.literal_eval(listed[1]) if listed else ():
            sub_module = hvlite.module("hvlite." + sub)
            if name in sub_module.public():
                return hvlite.resolve(sub_module, name)
    return found


def compare_module(horovod, hvlite, pair):
    report = Report(pair)
    h_module, v_module = horovod.module(pair[0]), hvlite.module(pair[1])
    if h_module is None:
        return None
    names = h_module.public()
    if pair[0] == "horovod.common.basics":       # the API is HorovodBasics's methods
        cls = horovod.resolve(h_module, "HorovodBasics")
        names = [m for m in horovod.methods(cls) if not m.startswith("_")]
    for name in names:
        if v_module is None:
            report.add(name, "missing")
            continue
        if pair[0] == "horovod.common.basics":
            method, _ = horovod.method(horovod.resolve(h_module, "HorovodBasics"), name)
            h_found = ("func", method, h_module, True)
        else:
            h_found = horovod.resolve(h_module, name)
        compare_names(horovod, hvlite, h_found, resolve_hvlite(hvlite, v_module, name), name, report)
    if pair[0] == "horovod.common.basics":
        report.add("HorovodBasics", "missing")
    for module_name, label, h_class, v_class, in_front_of in FACTORIES:
        if module_name != pair[0]:
            continue
        h_cls = horovod.resolve(horovod.module(h_class.rsplit(".", 1)[0]), h_class.rsplit(".", 1)[1])
        v_cls = hvlite.resolve(hvlite.module(v_class.rsplit(".", 1)[0]), v_class.rsplit(".", 1)[1])
        if h_cls is None:
            continue
        if v_cls is None:
            report.add(label + " (its class)", "missing")
        else:
            compare_methods(horovod, hvlite, h_cls, v_cls + (in_front_of,), label + "()", report)
    return report


def print_report(report, verbose):
    n = len(report.ok) + len(report.missing) + len(report.differs) + len(report.allowed)
    print("%s -> %s: %d names: %d present, %d missing, %d differ, %d allowed" % (
        report.pair[0], report.pair[1], n, len(report.ok), len(report.missing), len(report.differs),
        len(report.allowed)))
    for name in report.missing:
        print("  missing  %s" % name)
    for name, problem in report.differs:
        print("  differs  %s: %s" % (name, problem))
    for name, problem, reason in report.allowed:
        print("  allowed  %s (%s): %s" % (name, problem, reason))
    if verbose:
        print("  present  " + ", ".join(report.ok))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkout", help="a Horovod source tree (the folder holding horovod/)")
    parser.add_argument("--module", action="append", help="only this Horovod module (repeatable)")
    parser.add_argument("--verbose", action="store_true", help="also list the names that match")
    parser.add_argument("--hvlite", default=HERE, help="the hvlite tree to read (the folder "
                        "holding hvlite/; default: this checkout)")
    args = parser.parse_args(argv)
    if not os.path.isfile(os.path.join(args.checkout, "horovod", "__init__.py")):
        print("%s holds no horovod/ package" % args.checkout, file=sys.stderr)
        return 2
    horovod, hvlite = Tree(args.checkout, "horovod", False), Tree(args.hvlite, "hvlite", True)
    bad = 0
    for pair in MODULES:
        if args.module and pair[0] not in args.module:
            continue
        report = compare_module(horovod, hvlite, pair)
        if report is None:
            print("%s: not in this Horovod checkout" % pair[0])
            continue
        print_report(report, args.verbose)
        bad += len(report.missing) + len(report.differs)
    print("total: %d missing or differing outside the allow-list" % bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
