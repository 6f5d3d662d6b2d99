"""What an elastic hvlrun and its workers agree on: variable names and exit codes.

Contract: constants only; imports nothing. hvlrun's elastic driver sets the variables for every
rank of a world; the worker side (``hvlite.elastic``) reads them and exits with the codes below
so that the driver can tell an agreed re-form from a failure.

  * ``HVLRUN_ELASTIC_WORLD``: the world's number, 1 for the job's first, +1 per re-form.
  * ``HVLRUN_ELASTIC_STORE``: ``host:port`` of the driver's commit store
    (``hvlite/runner/elastic/commit_store.py``).
  * ``HVLRUN_ELASTIC_KEY``: the commit store's secret (environment only, never a command line).
  * ``HVLRUN_ELASTIC_REASON``: why this world was formed, in words (for the workers' logs).
"""

__all__ = ["ENV_WORLD", "ENV_STORE", "ENV_KEY", "ENV_REASON", "HOSTS_UPDATED_CODE",
           "PEER_LOST_CODE", "PROGRAM_ERROR_CODE"]

ENV_WORLD = "HVLRUN_ELASTIC_WORLD"
ENV_STORE = "HVLRUN_ELASTIC_STORE"
ENV_KEY = "HVLRUN_ELASTIC_KEY"
ENV_REASON = "HVLRUN_ELASTIC_REASON"

# Every rank exits with this after the ranks agreed, at a commit, that the hosts changed: the
# commit is stored, the driver re-forms the job on the new hosts.
HOSTS_UPDATED_CODE = 75
# A rank exits with this when a collective failed because a peer is gone (HorovodInternalError):
# a consequence of another rank's failure, not a failure of this rank's host.
PEER_LOST_CODE = 76
# Every rank exits with this after an error the ranks agreed on that a re-formed world would
# meet again (the state cannot be committed, or differs between ranks): the driver ends the job.
PROGRAM_ERROR_CODE = 77
