"""Running a world: one ``mpiexec`` of the job, from its command line to its end.

Contract: ``run`` runs a world to its end, and a plain job as an elastic job of one world;
``start`` opens its control channel, checks its hosts and builds its command (with
``settings``: what the flags mean for launching, and ``mpi_command``: the command per MPI
flavour); ``supervise`` is the one supervision loop, ``rules`` what a plain job and an elastic
world do differently in it; ``spec`` the types they share; ``say`` hvlrun's voice;
``rank_exec`` the wrapper every rank runs in (``python -m hvlite.runner.world.rank_exec``).
Uses ``control``, ``hosts`` and ``procs``; never ``cli`` or ``elastic``. Importing the package
loads nothing (the rank wrapper loads only what it uses).
"""
