"""Running a world: one ``mpiexec`` of the job, from its command line to its end.

Contract: ``run`` starts a world and watches it to its end; ``supervise`` is the one
supervision loop; ``settings`` says what the flags mean for launching, ``mpi_command`` builds
the launch command, ``rank_exec`` is the wrapper every rank runs in (``python -m
hvlite.runner.world.rank_exec``). Uses ``control``, ``hosts`` and ``procs``; never ``cli`` or
``elastic``. Importing the package loads nothing (the rank wrapper loads only what it uses).
"""
