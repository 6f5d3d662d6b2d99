"""Hosts: host lists and placement, reaching other hosts, and what runs on them.

Contract: ``hostlist`` (parsing ``-H``/``--hostfile``, this machine's names, placement),
``remote_shell`` (ssh, srun or ``--ssh-command``; MPICH's launcher hook, run as ``python -m
hvlite.runner.hosts.remote_shell``), ``host_check`` (can every host be reached, and reach back),
``host_guard`` (run on each remote host as ``python -m hvlite.runner.hosts.host_guard``: owns the
job's processes there). Uses ``control`` and ``procs`` only. Importing the package loads nothing.
"""
