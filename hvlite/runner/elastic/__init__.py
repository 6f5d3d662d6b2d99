"""Elastic jobs: a series of worlds that survive losing and gaining workers.

Contract: ``driver`` (``run_elastic``: worlds, re-forms, the exit code), ``commit_store`` (the
last commit, kept in hvlrun; its client is ``hvlite.protocol.commit_client``), ``discovery``
(the host discovery script), ``host_pool`` (blacklist, placement), ``trace`` (the job's own
timeline). Each world runs through ``world``'s one supervision loop. Importing the package
loads nothing.
"""
