"""hvlite: Horovod-style distributed training on one C engine.

``import hvlite`` gives the framework-neutral API on NumPy arrays, with the names and semantics
of Horovod's torch API. The names come from these modules, each documented on its own page:

* :mod:`hvlite.basics`: ``init``, ``shutdown``, ``rank``, ``size`` and the other queries;
* :mod:`hvlite.ops`: the collectives and the reduce ops;
* :mod:`hvlite.objects`: ``broadcast_object``, ``allgather_object``;
* :mod:`hvlite.process_sets`: ``ProcessSet`` and its functions;
* :mod:`hvlite.timeline`: ``start_timeline``, ``stop_timeline``;
* :mod:`hvlite.errors`: the exceptions.

``hvlite.run`` is :func:`hvlite.func_job.run`. :mod:`hvlite.torch`, :mod:`hvlite.tensorflow`
and :mod:`hvlite.tensorflow.keras` adapt the API to the frameworks; :mod:`hvlite.elastic` is
the elastic API they build on.

Contract: the engine (and libmpi) load on first use of an API name, not at ``import hvlite``: the launcher
``hvlite.runner`` lives in this package and must start fast and work where the engine was never
built. A missing engine surfaces as an ImportError naming the build command.
"""
import importlib
import importlib.util

__version__ = "0.1.0"

_API_MODULES = ("basics", "errors", "objects", "ops", "process_sets", "timeline")
_api_names = None


def _load_api():
    """Import the engine-backed modules and publish their ``__all__`` here (once)."""
    global _api_names
    if _api_names is None:
        names = []
        for module_name in _API_MODULES:
            module = importlib.import_module("." + module_name, __name__)
            for name in module.__all__:
                globals()[name] = getattr(module, name)
            names += module.__all__
        globals()["mpi_vendor"] = importlib.import_module(".basics", __name__).mpi_vendor
        _api_names = names
    return _api_names


def __getattr__(name):
    if name.startswith("__") and name != "__all__":
        raise AttributeError(name)
    if name == "run":     # Horovod's horovod.run: a launcher, so it loads no engine here
        return importlib.import_module(".runner.func_run", __name__).run
    if importlib.util.find_spec("." + name, __name__) is not None:
        # a submodule asked for before it was imported (``from . import collectives`` looks
        # here first): import just it; loading the API now would import ``hvlite.ops`` half-made
        return importlib.import_module("." + name, __name__)
    names = _load_api()
    if name == "__all__":
        return list(names)
    if name in globals():
        return globals()[name]
    raise AttributeError("module 'hvlite' has no attribute %r" % name)


def __dir__():
    return sorted(set(globals()) | set(_load_api()))
