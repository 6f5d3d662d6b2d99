"""Elastic torch training for tests/test_elastic.py (and bench/elastic_reform.py).

Every step trains on a global batch that depends only on the step number; each rank takes its
rows of it, so the averaged gradient, and the whole trajectory, do not depend on how many ranks
a world has. The state counts how often each step was applied. Rank 0 prints:
  ``STEP w=<world> s=<step> loss=<full-batch loss before the step, repr>``
  ``COMMIT w=<world> s=<steps done> seq=<commit number>``
  ``BEGIN w=<world> s=<first step> size=<ranks> t=<wall time>`` (when training starts in a world)
and every rank at the end ``FINAL rank=<r> size=<n> digest=<sha256 of the parameters>
counts=<applied count per step> refdiff=<max |param - one-process reference|>``.

Options (argv): --steps N --commit-every C --sleep S --hosts-file F
  --kill RANK:STEP:HOSTS   rank RANK writes HOSTS to F, then SIGKILLs itself, at step STEP
                           (after backward, before the optimizer step), in world 1 only
  --stop RANK:STEP         rank RANK SIGSTOPs itself at step STEP (the same place), in world 1
                           only: its peers time out (HVLITE_PEER_TIMEOUT_SECONDS) and leave
  --change STEP:HOSTS      rank 0 writes HOSTS to F at step STEP, in world 1 only
  --fail-on-host H         a rank on host H (by hostname) exits 1 before training (a bad host)
  --sampler                also commit an ElasticSampler and check every sample of the epoch
                           is processed exactly once (prints ``SAMPLES ...``)
"""
import argparse
import hashlib
import os
import signal
import socket
import sys
import time

import numpy as np
import torch

import hvlite.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--commit-every", type=int, default=5)
parser.add_argument("--sleep", type=float, default=0.05)
parser.add_argument("--hosts-file")
parser.add_argument("--kill")
parser.add_argument("--stop")
parser.add_argument("--change")
parser.add_argument("--sampler", action="store_true")
parser.add_argument("--fail-on-host")
opts = parser.parse_args()

BATCH = 12          # divisible by 1, 2, 3, 4 and 6: every rank gets the same share
WORLD = int(os.environ.get("HVLRUN_ELASTIC_WORLD", "0") or 0)


def batch(step):
    rng = np.random.RandomState(1000 + step)
    x = rng.randn(BATCH, 8).astype(np.float32)
    y = (x @ np.arange(1, 9, dtype=np.float32) / 8 + 0.1 * rng.randn(BATCH).astype(np.float32))
    return torch.from_numpy(x), torch.from_numpy(y.reshape(-1, 1))


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def write_hosts(text):
    tmp = opts.hosts_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(text.replace(",", "\n") + "\n")
    os.replace(tmp, opts.hosts_file)


def reference():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(opts.steps):
        x, y = batch(step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model


hvd.init()
if opts.fail_on_host and socket.gethostname() == opts.fail_on_host:
    sys.exit("rank %d: this host (%s) is bad" % (hvd.rank(), opts.fail_on_host))
RANK = hvd.rank()      # read now: a rank that finishes first shuts the engine down everywhere
model = make_model()
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                     named_parameters=model.named_parameters())
extra = {}
if opts.sampler:
    extra["sampler"] = hvd.elastic.ElasticSampler(list(range(60)), shuffle=True, seed=3)
    extra["sampler_base"] = 0       # the step at which the sampler's current pass began
state = hvd.elastic.TorchState(model, optimizer, step=0, counts=np.zeros(opts.steps, np.int64),
                               seen=np.zeros(60, np.int64), **extra)


def train_step(step):
    x, y = batch(step)
    mine = slice(hvd.rank(), BATCH, hvd.size())
    with torch.no_grad():
        full = torch.nn.functional.mse_loss(model(x), y).item()
    if hvd.rank() == 0:
        print("STEP w=%d s=%d loss=%r" % (WORLD, step, full), flush=True)
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
    if opts.kill and WORLD == 1:
        rank, at, hosts = opts.kill.split(":", 2)
        if hvd.rank() == int(rank) and step == int(at):
            write_hosts(hosts)
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
    if opts.stop and WORLD == 1 and [hvd.rank(), step] == [int(v) for v in opts.stop.split(":")]:
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGSTOP)
    optimizer.step()
    state.counts[step] += 1


def record_samples():
    """Mark this step's samples (a few per rank) as processed, counting them in the state."""
    sampler = state.sampler
    indices = sampler.get_indices(state.step - state.sampler_base, 1)
    sampler.record_indices(indices)
    every = hvd.allgather(torch.tensor(indices, dtype=torch.int64), name="samples").numpy()
    np.add.at(state.seen, every, 1)


@hvd.elastic.run
def train(state):
    if hvd.rank() == 0:
        print("BEGIN w=%d s=%d size=%d t=%.6f" % (WORLD, state.step, hvd.size(), time.time()),
              flush=True)
    if opts.sampler:
        state.sampler_base = state.step      # this pass of the sampler starts here
    while state.step < opts.steps:
        step = state.step
        if opts.change and WORLD == 1 and hvd.rank() == 0:
            at, hosts = opts.change.split(":", 1)
            if step == int(at):
                write_hosts(hosts)
        train_step(step)
        if opts.sampler and step - state.sampler_base < len(state.sampler):
            record_samples()
        state.step = step + 1
        time.sleep(opts.sleep)
        if state.step % opts.commit_every == 0:
            try:
                state.commit()
            finally:       # also when the commit says the hosts changed (it is stored then)
                if hvd.rank() == 0:
                    print("COMMIT w=%d s=%d seq=%d" % (WORLD, state.step, state.commit_seq),
                          flush=True)


train(state)
SIZE = hvd.size()
hvd.barrier()

params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
ref = torch.cat([p.detach().reshape(-1) for p in reference().parameters()])
print("FINAL rank=%d size=%d digest=%s counts=%s refdiff=%.3g" % (
    RANK, SIZE, hashlib.sha256(params.numpy().tobytes()).hexdigest(),
    ",".join(map(str, state.counts)), float((params - ref).abs().max())), flush=True)
if opts.sampler and RANK == 0:
    print("SAMPLES seen=%s processed=%d" % (",".join(map(str, state.seen)),
                                            len(state.sampler.processed_indices)), flush=True)
