"""What hvlrun and the training processes both speak: the one module both sides import.

Contract:
  * ``wire`` is the authenticated line protocol (HMAC-SHA256 per line, per-job secret, nonces
    and sequence numbers) of the control channel and of the elastic commit store.
  * ``commit_client`` is the workers' end of the commit store (the commit's transfer: request
    lines, length and SHA-256 of the bytes); the store itself is hvlrun's
    (``hvlite/runner/elastic/commit_store.py``). The bytes are the training state as
    ``hvlite/elastic/codec.py`` encodes it; nobody on hvlrun's side decodes them.
  * ``elastic_env`` names what an elastic hvlrun and its workers agree on: variables and exit
    codes.
  * Pure Python and the standard library only: nothing here imports the engine, NumPy, a
    framework, ``hvlite.runner`` or ``hvlite.elastic`` (``tests/unit/test_layers.py`` checks),
    so the launcher can use it where the engine was never built, and training code without
    the launcher. Importing the package loads nothing else.
"""
