"""An elastic NumPy loop in which one rank freezes (tests/hosts/test_hosts_elastic.py).

Options (argv): --steps N --commit-every C --freeze RANK:STEP:WORLDS (WORLDS: e.g. ``1,2``)
--slow RANK:SECONDS. In each of those worlds, rank RANK SIGSTOPs itself before the allreduce of
step STEP: its peers time out (``HVLITE_PEER_TIMEOUT_SECONDS``) and leave with the peer-lost
code, mpiexec kills the rest, and hvlrun re-forms the job from the last commit. With ``--slow``,
another rank is busy for SECONDS before that step's allreduce (a healthy rank that has not
given up yet when mpiexec kills it). Every step checks an allreduce of the world's size and
counts itself in the state. Each rank prints at the end
``FINAL rank=<r> size=<n> counts=<applied count per step>`` (every step applied once).
"""
import argparse
import os
import signal
import time

import numpy as np

import hvlite as hvd
from hvlite.elastic import ObjectState, run

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--commit-every", type=int, default=4)
parser.add_argument("--freeze", default="")
parser.add_argument("--slow", default="")
opts = parser.parse_args()
WORLD = int(os.environ.get("HVLRUN_ELASTIC_WORLD", "0") or 0)
rank_, step_, worlds = (opts.freeze.split(":") + ["", "", ""])[:3]
FREEZE = (int(rank_), int(step_), {int(w) for w in worlds.split(",")}) if opts.freeze else None
SLOW = (int(opts.slow.split(":")[0]), float(opts.slow.split(":")[1])) if opts.slow else None

hvd.init()
RANK = hvd.rank()
state = ObjectState(step=0, counts=[0] * opts.steps)


@run
def train(state):
    while state.step < opts.steps:
        if FREEZE and WORLD in FREEZE[2] and state.step == FREEZE[1]:
            if RANK == FREEZE[0]:
                print("rank %d freezes in world %d" % (RANK, WORLD), flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
            elif SLOW and RANK == SLOW[0]:
                time.sleep(SLOW[1])
        total = hvd.allreduce(np.ones(4, np.float32), op=hvd.Sum, name="step")
        assert total[0] == hvd.size(), total
        state.counts[state.step] += 1
        state.step += 1
        time.sleep(0.02)
        if state.step % opts.commit_every == 0:
            state.commit()


train(state)
print("FINAL rank=%d size=%d counts=%s" % (RANK, hvd.size(), ",".join(map(str, state.counts))),
      flush=True)
