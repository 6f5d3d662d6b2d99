"""Elastic Keras training for tests/test_elastic.py: ``KerasState`` and the elastic callbacks.

Each epoch has BATCHES global batches of 12 rows that depend only on (epoch, batch); each rank
fits its rows of them, so the averaged gradient, and the whole trajectory, do not depend on how
many ranks a world has. Training resumes mid-epoch by fitting only the epoch's remaining
batches. The state counts how often each global batch was applied. Rank 0 prints
  ``BEGIN w=<world> e=<epoch> b=<batch> size=<ranks>`` when training starts in a world,
  ``STEP w=<world> s=<global batch> loss=<its full-batch loss before the step, repr>``,
  ``COMMIT w=<world> e=<epoch> b=<batch> seq=<commit>`` after each commit,
and every rank at the end ``FINAL rank=<r> size=<n> digest=<sha256 of the weights>
counts=<applied count per global batch> refdiff=<max |weight - one-process reference|>``.

Options: --epochs E --batches B --commit-every C --hosts-file F
  --event WORLD:RANK:STEP:HOSTS[:kill]   in world WORLD, rank RANK writes HOSTS to F after global
                                         batch STEP (and SIGKILLs itself with ``:kill``)
"""
import argparse
import hashlib
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import numpy as np  # noqa: E402

import hvlite.tensorflow.keras as hvd  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batches", type=int, default=8)
parser.add_argument("--commit-every", type=int, default=3)
parser.add_argument("--sleep", type=float, default=0.1)
parser.add_argument("--hosts-file")
parser.add_argument("--event", action="append", default=[])
opts = parser.parse_args()

ROWS = 12
WORLD = int(os.environ.get("HVLRUN_ELASTIC_WORLD", "0") or 0)


def global_batch(epoch, batch):
    rng = np.random.RandomState(100 * epoch + batch)
    x = rng.randn(ROWS, 6).astype(np.float32)
    y = (x @ np.arange(1, 7, dtype=np.float32) / 6).reshape(-1, 1)
    return x, y


def make_model(optimizer):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse", jit_compile=False)
    return model


def write_hosts(text):
    tmp = opts.hosts_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(text.replace(",", "\n") + "\n")
    os.replace(tmp, opts.hosts_file)


def reference():
    model = make_model(keras.optimizers.SGD(0.05, momentum=0.9))
    for epoch in range(opts.epochs):
        for b in range(opts.batches):
            model.train_on_batch(*global_batch(epoch, b))
    return model


class Events(keras.callbacks.Callback):
    """Counts applied batches; logs each step's loss; plays the --event lines; slows batches
    down a little. Last in the list: a commit due at a batch's start runs before its STEP."""

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch, self.offset = state.epoch, state.batch

    def on_train_batch_begin(self, batch, logs=None):
        if RANK == 0:
            b = self.offset + batch
            x, y = global_batch(self.epoch, b)
            loss = float(np.mean((np.asarray(model(x, training=False)) - y) ** 2))
            print("STEP w=%d s=%d loss=%r" % (WORLD, self.epoch * opts.batches + b, loss),
                  flush=True)

    def on_train_batch_end(self, batch, logs=None):
        step = self.epoch * opts.batches + self.offset + batch
        state.counts[step] += 1
        for event in opts.event:
            world, rank, at, rest = event.split(":", 3)
            hosts, _, kill = rest.partition(":kill")
            if (int(world), int(rank), int(at)) == (WORLD, hvd.rank(), step):
                write_hosts(hosts)
                if rest.endswith(":kill"):
                    sys.stdout.flush()
                    os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(opts.sleep)


hvd.init()
RANK = hvd.rank()
model = make_model(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)))


class State(hvd.elastic.KerasState):
    def commit(self):
        try:
            super().commit()
        finally:     # the callbacks commit when epoch and batch are recorded: they are saved
            if RANK == 0:
                print("COMMIT w=%d e=%d b=%d seq=%d" % (WORLD, self.epoch, self.batch,
                                                        self.commit_seq), flush=True)


state = State(model, epoch=0, batch=0, counts=np.zeros(opts.epochs * opts.batches, np.int64))
callbacks = [hvd.elastic.CommitStateCallback(state, batches_per_commit=opts.commit_every),
             hvd.elastic.UpdateBatchStateCallback(state),
             hvd.elastic.UpdateEpochStateCallback(state), Events()]


@hvd.elastic.run
def train(state):
    if hvd.rank() == 0:
        print("BEGIN w=%d e=%d b=%d size=%d" % (WORLD, state.epoch, state.batch, hvd.size()),
              flush=True)
    while state.epoch < opts.epochs:
        rows = [global_batch(state.epoch, b) for b in range(state.batch, opts.batches)]
        x = np.concatenate([bx[hvd.rank()::hvd.size()] for bx, _ in rows])
        y = np.concatenate([by[hvd.rank()::hvd.size()] for _, by in rows])
        model.fit(x, y, batch_size=ROWS // hvd.size(), epochs=state.epoch + 1,
                  initial_epoch=state.epoch, shuffle=False, callbacks=callbacks, verbose=0)


train(state)
SIZE = hvd.size()
weights = np.concatenate([np.asarray(w).reshape(-1) for w in model.get_weights()])
ref = np.concatenate([np.asarray(w).reshape(-1) for w in reference().get_weights()])
print("FINAL rank=%d size=%d digest=%s counts=%s refdiff=%.3g" % (
    RANK, SIZE, hashlib.sha256(weights.tobytes()).hexdigest(),
    ",".join(map(str, state.counts)), float(np.abs(weights - ref).max())), flush=True)
