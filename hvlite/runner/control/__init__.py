"""The control channel between hvlrun and the processes it starts on every host.

Contract: ``server`` is hvlrun's end (what the rank wrappers and host guards report, who is
lost, ``stop`` to everyone); ``client`` is the wrappers' and guards' end; ``names`` names the
variables hvlrun sets for them. Lines are authenticated by ``hvlite.protocol.wire``. Uses nothing
else of the runner. Importing the package loads nothing.
"""
