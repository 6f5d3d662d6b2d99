"""``hvlrun``, the hvlite job launcher.

Contract: this package never imports the engine (``hvlite._core`` or any ``hvlite`` module outside
``hvlite.runner``) and uses only relative imports, so it works before the engine is built.
Modules: ``launch`` (flags, ``main``), ``job`` (running the job, exit code), ``hosts`` (host
lists), ``mpi_command`` (the mpiexec command per MPI flavour), ``build_info`` (build info, which
mpiexec), ``control`` (rank-to-launcher messages), ``rank_exec`` (per-rank wrapper, run with
``python -m``; not imported here).
"""

from .launch import main, run

__all__ = ["main", "run"]
