"""The torch training the Ray and Spark tests run on their clusters (``ray_driver.py``,
``spark_driver.py``); the drivers send these functions to the ranks by value.

Every step trains on a global batch that depends only on the step; each rank takes its rows of
it (rank, rank + size, ...), so Horovod's averaged gradient equals the gradient of the whole
batch's loss, which :func:`reference` computes in one process.
"""
import hashlib
import os
import signal
import time

import numpy as np

BATCH = 12          # divisible by 1, 2, 3, 4 and 6


def batch(step):
    import torch
    rng = np.random.RandomState(1000 + step)
    x = rng.randn(BATCH, 8).astype(np.float32)
    y = (x @ np.arange(1, 9, dtype=np.float32) / 8 + 0.1 * rng.randn(BATCH).astype(np.float32))
    return torch.from_numpy(x), torch.from_numpy(y.reshape(-1, 1))


def make_model():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def reference(steps):
    """One process, whole batches: the gradients of each step and the final parameters."""
    import torch
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    grads = []
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        grads.append([p.grad.numpy().copy() for p in model.parameters()])
        opt.step()
    return grads, [p.detach().numpy().copy() for p in model.parameters()]


class Trainer:
    """A stateful worker (Ray's ``executable_cls``): the world joined once, the model and the
    optimizer kept between calls."""

    def __init__(self):
        import torch
        import hvlite.torch as hvd
        hvd.init()
        self.hvd = hvd
        self.model = make_model()
        self.opt = hvd.DistributedOptimizer(
            torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9),
            named_parameters=self.model.named_parameters())
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        self.pid = os.getpid()

    def step(self, step):
        """One training step; this rank's view of the averaged gradients and parameters."""
        import torch
        hvd = self.hvd
        x, y = batch(step)
        mine = slice(hvd.rank(), BATCH, hvd.size())
        self.opt.zero_grad()
        torch.nn.functional.mse_loss(self.model(x[mine]), y[mine]).backward()
        self.opt.synchronize()
        grads = [p.grad.numpy().copy() for p in self.model.parameters()]
        with self.opt.skip_synchronize():
            self.opt.step()
        return {"rank": hvd.rank(), "size": hvd.size(), "pid": self.pid, "grads": grads,
                "params": [p.detach().numpy().copy() for p in self.model.parameters()]}


def train_once(steps):
    """A whole job in one call (Spark's ``run``): the gradients of every step on this rank."""
    trainer = Trainer()
    out = [trainer.step(s) for s in range(steps)]
    return {"rank": out[-1]["rank"], "size": out[-1]["size"], "host": os.environ.get("HVLRUN_HOST"),
            "grads": [o["grads"] for o in out], "params": out[-1]["params"]}


def digest(params):
    return hashlib.sha256(b"".join(np.ascontiguousarray(p).tobytes() for p in params)).hexdigest()


def elastic_train(steps, commit_every, hold_at, hold_file, sleep=0.05):
    """An elastic job: commit every ``commit_every`` steps; from step ``hold_at`` on, while
    ``hold_file`` exists (rank 0 looks, every rank follows), commit and wait instead of
    training (so the test can change the hosts at a known point). Rank 0 prints ``BEGIN``,
    ``HOLDING`` and ``STEP`` lines. Returns this rank's final counts and parameter digest."""
    import torch
    import hvlite.torch as hvd
    hvd.init()
    world = int(os.environ.get("HVLRUN_ELASTIC_WORLD", "0") or 0)
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, step=0, counts=np.zeros(steps, np.int64))

    @hvd.elastic.run
    def train(state):
        if hvd.rank() == 0:
            print("BEGIN w=%d s=%d size=%d" % (world, state.step, hvd.size()), flush=True)
        said_hold = False
        while state.step < steps:
            step = state.step
            if step >= hold_at and hvd.broadcast_object(os.path.exists(hold_file), 0):
                if hvd.rank() == 0 and not said_hold:
                    print("HOLDING w=%d s=%d size=%d" % (world, step, hvd.size()), flush=True)
                said_hold = True
                state.commit()
                time.sleep(0.2)
                continue
            x, y = batch(step)
            mine = slice(hvd.rank(), BATCH, hvd.size())
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
            opt.step()
            state.counts[step] += 1
            state.step = step + 1
            if hvd.rank() == 0:
                print("STEP w=%d s=%d" % (world, step), flush=True)
            time.sleep(sleep)
            if state.step % commit_every == 0:
                state.commit()

    train(state)
    params = [p.detach().numpy().copy() for p in model.parameters()]
    return {"rank": hvd.rank(), "size": hvd.size(), "world": world,
            "counts": state.counts.tolist(), "digest": digest(params), "params": params}


def linear_batch(step):
    """The NumPy job's global batch for a step: 12 rows of (x, y), y linear in x."""
    rng = np.random.RandomState(2000 + step)
    x = rng.randn(BATCH, 4)
    return x, x @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1 * rng.randn(BATCH)


def linear_reference(steps, lr=0.1):
    """One process, whole batches: the weights after ``steps`` steps of gradient descent."""
    w = np.zeros(4)
    for step in range(steps):
        x, y = linear_batch(step)
        w -= lr * 2 * x.T @ (x @ w - y) / BATCH
    return w


def elastic_numpy(steps, commit_every, hold_at, hold_file, sleep=0.05, lr=0.1):
    """The elastic job without torch (a fresh world imports only NumPy and hvlite): linear
    regression, each rank's rows of the step's batch, gradients summed with ``allreduce``.
    As :func:`elastic_train` otherwise (commits, the hold, the lines rank 0 prints)."""
    import hvlite
    import hvlite.elastic
    hvlite.init()
    world = int(os.environ.get("HVLRUN_ELASTIC_WORLD", "0") or 0)
    state = hvlite.elastic.ObjectState(w=np.zeros(4), step=0, counts=np.zeros(steps, np.int64))

    @hvlite.elastic.run
    def train(state):
        if hvlite.rank() == 0:
            print("BEGIN w=%d s=%d size=%d" % (world, state.step, hvlite.size()), flush=True)
        said_hold = False
        while state.step < steps:
            step = state.step
            hold = hvlite.broadcast(np.array([os.path.exists(hold_file)], np.int32), 0,
                                    name="hold")[0]
            if step >= hold_at and hold:
                if hvlite.rank() == 0 and not said_hold:
                    print("HOLDING w=%d s=%d size=%d" % (world, step, hvlite.size()), flush=True)
                said_hold = True
                state.commit()
                time.sleep(0.2)
                continue
            x, y = linear_batch(step)
            mine = slice(hvlite.rank(), BATCH, hvlite.size())
            grad = 2 * x[mine].T @ (x[mine] @ state.w - y[mine])
            state.w = state.w - lr * hvlite.allreduce(grad, op=hvlite.Sum, name="grad") / BATCH
            state.counts[step] += 1
            state.step = step + 1
            if hvlite.rank() == 0:
                print("STEP w=%d s=%d" % (world, step), flush=True)
            time.sleep(sleep)
            if state.step % commit_every == 0:
                state.commit()

    train(state)
    return {"rank": hvlite.rank(), "size": hvlite.size(), "world": world,
            "counts": state.counts.tolist(), "w": state.w.tolist()}


def ray_train_loop(config):
    """Ray Train's ``train_loop_per_worker`` (``ray_train_driver.py``): ``config["steps"]``
    steps of the :class:`Trainer`'s training in one hvlite world, resumed from the run's last
    checkpoint when there is one. Every step, rank 0 reports a checkpoint holding the model,
    the optimizer, and every rank's averaged gradients and pid so far, with metrics that say
    how hvlite's world lines up with Ray Train's. ``config["raise_at"]`` (step, rank): that
    rank raises there, in a run that did not resume, while its peers wait in the step's
    allreduce."""
    import tempfile

    import torch
    import ray.train

    context = ray.train.get_context()
    trainer = Trainer()
    hvd = trainer.hvd
    grads, pids, start = [], [], 0
    restored = ray.train.get_checkpoint()
    if restored is not None:
        with restored.as_directory() as d:
            saved = torch.load(os.path.join(d, "state.pt"), weights_only=False)
        trainer.model.load_state_dict(saved["model"])
        trainer.opt.load_state_dict(saved["opt"])
        grads, pids, start = saved["grads"], saved["pids"], saved["step"] + 1
    raise_at = tuple(config.get("raise_at") or ())
    for step in range(start, config["steps"]):
        if restored is None and raise_at == (step, hvd.rank()):
            time.sleep(1.0)          # the peers are waiting in the step's allreduce by now
            raise ValueError("rank %d failed on purpose at %.6f" % (hvd.rank(), time.time()))
        out = trainer.step(step)
        grads.append(hvd.allgather_object(out["grads"]))
        pids.append(hvd.allgather_object(os.getpid()))
        metrics = {"step": step, "resumed_at": start,
                   "world": hvd.allgather_object(
                       {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
                        "ray_rank": context.get_world_rank(),
                        "ray_local_rank": context.get_local_rank(),
                        "host": os.environ.get("HVLRUN_HOST", ""), "pid": os.getpid()})}
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if hvd.rank() == 0:
                torch.save({"model": trainer.model.state_dict(), "opt": trainer.opt.state_dict(),
                            "grads": grads, "pids": pids, "step": step},
                           os.path.join(d, "state.pt"))
                checkpoint = ray.train.Checkpoint.from_directory(d)
            ray.train.report(metrics, checkpoint=checkpoint)


def ray_train_numpy(config):
    """Ray Train's loop without torch (a fresh world imports only NumPy and hvlite): the
    linear regression of :func:`linear_reference`, ``config["steps"]`` steps, resumed from the
    run's last checkpoint (``w`` and the step, reported by rank 0 every step).
    ``config["raise_at"]`` (step, rank): as in :func:`ray_train_loop`; ``config["die_at"]``
    likewise, but that rank's process kills itself (SIGKILL)."""
    import tempfile

    import hvlite
    import ray.train

    hvlite.init()
    w, start = np.zeros(4), 0
    restored = ray.train.get_checkpoint()
    if restored is not None:
        with restored.as_directory() as d:
            saved = np.load(os.path.join(d, "state.npz"))
            w, start = saved["w"], int(saved["step"]) + 1
    raise_at = tuple(config.get("raise_at") or ())
    die_at = tuple(config.get("die_at") or ())
    for step in range(start, config["steps"]):
        if restored is None and raise_at == (step, hvlite.rank()):
            time.sleep(1.0)          # the peers are waiting in the step's allreduce by now
            raise ValueError("rank %d failed on purpose at %.6f" % (hvlite.rank(), time.time()))
        if restored is None and die_at == (step, hvlite.rank()):
            time.sleep(1.0)
            print("DYING %.6f" % time.time(), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = linear_batch(step)
        mine = slice(hvlite.rank(), BATCH, hvlite.size())
        grad = 2 * x[mine].T @ (x[mine] @ w - y[mine])
        w = w - 0.1 * hvlite.allreduce(grad, op=hvlite.Sum, name="grad") / BATCH
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if hvlite.rank() == 0:
                np.savez(os.path.join(d, "state.npz"), w=w, step=step)
                checkpoint = ray.train.Checkpoint.from_directory(d)
            ray.train.report({"step": step, "resumed_at": start, "w": w.tolist(),
                              "size": hvlite.size()}, checkpoint=checkpoint)
