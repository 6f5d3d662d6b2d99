"""hvlite: Horovod-style distributed training on one C engine.

``import hvlite`` gives the framework-neutral API on NumPy arrays (names and semantics of
Horovod's torch API); ``hvlite.torch`` and ``hvlite.tensorflow`` adapt it to the frameworks.
The launcher lives in ``hvlite.runner`` and imports no engine code, so ``hvlrun`` works even
where the engine is not built; then importing an engine name here raises the ImportError.
"""
__version__ = "0.1.0"

try:
    from . import _lib  # noqa: F401  (loads the compiled engine)
except ImportError as _engine_missing:     # pragma: no cover - exercised without a build
    _ENGINE_ERROR = _engine_missing

    def __getattr__(name):
        raise ImportError("hvlite.%s needs the compiled engine: %s" % (name, _ENGINE_ERROR))
else:
    from .basics import *  # noqa: F401,F403
    from .basics import __all__ as _basics_all
    from .basics import mpi_vendor  # noqa: F401
    from .errors import *  # noqa: F401,F403
    from .errors import __all__ as _errors_all
    from .objects import *  # noqa: F401,F403
    from .objects import __all__ as _objects_all
    from .ops import *  # noqa: F401,F403
    from .ops import __all__ as _ops_all
    from .process_sets import *  # noqa: F401,F403
    from .process_sets import __all__ as _ps_all

    __all__ = _basics_all + _errors_all + _objects_all + _ops_all + _ps_all
