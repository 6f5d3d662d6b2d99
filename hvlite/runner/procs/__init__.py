"""A job's processes on one host, and what they leave behind.

Contract: ``proctree`` finds and ends process trees (``/proc``); ``job_files`` notes the files
the job's processes hold and removes them once nobody does. Leaves: they import nothing else of
the runner. Importing the package loads nothing.
"""
