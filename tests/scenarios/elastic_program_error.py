"""An elastic program whose state cannot go on, for tests/test_elastic.py: every rank must end
with the program's own error and hvlrun must end the job (exit 1) instead of re-forming it.

Usage: ``elastic_program_error.py MODE`` where MODE is
  ``key``       a dict in the state gets a NumPy integer key, then ``commit()`` (refused at save);
  ``horovod``   a Horovod-style State subclass (its own save/restore/sync) is committed;
  ``mismatch``  rank 1's state differs from rank 0's after rank 0's is loaded (world start).
Every rank prints ``WORLD w=<world>`` when its training function starts.
"""
import os
import sys

import numpy as np

import hvlite as hvd
from hvlite.elastic import ObjectState, State, run

mode = sys.argv[1]
hvd.init()


class HorovodStyle(State):
    def save(self):
        pass

    def restore(self):
        pass

    def sync(self):
        pass


class Drifting(ObjectState):
    """Rank 1 changes its copy after loading: the start-of-world check must see it."""

    def _apply(self, tree):
        super()._apply(tree)
        if hvd.rank() == 1:
            self.step = 99


@run
def train(state):
    print("WORLD w=%s" % os.environ.get("HVLRUN_ELASTIC_WORLD"), flush=True)
    if mode == "key":
        state.counts = {np.int64(1): 2}
    state.commit()


if mode == "key":
    train(ObjectState(counts={1: 2}))
elif mode == "horovod":
    train(HorovodStyle())
else:
    train(Drifting(step=0))
