"""The command line: ``hvlrun``'s flags, their checks, ``--check-build`` and ``main``.

Contract: ``launch`` (``main(argv) -> int``, ``run()``), ``flags`` (the parser and the checks
argparse cannot make), ``knobs`` (the one table of knob flags and the ``HVLITE_*`` variables
they set), ``horovod_flags`` (horovodrun's flag names and ``--config-file``), ``build_info`` (what the engine was built with, which ``mpiexec``). Turning the flags
into a job is all this package does: a plain job is run by ``world``, an elastic one by
``elastic``. The top of the runner: nothing imports it but the package's own ``main``/``run``
and ``__main__``. Importing the package loads nothing.
"""
