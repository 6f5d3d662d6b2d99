"""Shared benchmark harness (nccl-tests shape): timing, reference data planes, cell formats.

Contract: benchmarks run under ``hvlrun -np N`` with mpi4py and (optionally) torch installed.
``timed(fn, comm, iters, warmup)`` aligns ranks with a barrier before every call, times each
call, takes the slowest rank per call and returns the median in seconds. ``add_repeat_args``,
``median_over_repeats`` and ``restart_engine`` serve benchmarks that run their phases several
times in turn (hvlite as configured, references, hvlite restarted with other settings). Nothing
here asserts a time: benchmarks print tables; tests never depend on speed.
The table printer and the JSON output are in tables.py.
"""
import os
import socket
import statistics
import time

import numpy as np
from mpi4py import MPI


def timed(fn, comm, iters=20, warmup=3):
    """Median over ``iters`` calls of the slowest rank's time for ``fn()``, in seconds."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        samples.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return statistics.median(samples)


def add_repeat_args(parser):
    """--iters and --repeat, as every interleaving benchmark takes them."""
    parser.add_argument("--iters", type=int, default=10, help="timed calls per case and repeat")
    parser.add_argument("--repeat", type=int, default=3,
                        help="run the phases this many times, interleaved; a cell is the median "
                             "of the repeats' medians (this VM's speed drifts up to 4x as its host moves its CPUs)")


def median_over_repeats(runs):
    """Cells from ``runs``, one per repeat, each a list or dict of times or (time, wrong): the
    median time over repeats (and the wrong counts summed), in the same list or dict shape."""
    keys = list(runs[0].keys()) if isinstance(runs[0], dict) else range(len(runs[0]))

    def cell(k):
        if isinstance(runs[0][k], tuple):
            return statistics.median(r[k][0] for r in runs), sum(r[k][1] for r in runs)
        return statistics.median(r[k] for r in runs)
    cells = {k: cell(k) for k in keys}
    return cells if isinstance(runs[0], dict) else [cells[k] for k in keys]


def restart_engine(hvd, base, extra):
    """Restart hvlite (module ``hvd``) with exactly the HVLITE_*/HOROVOD_* settings base + extra
    (mpi4py owns MPI, so hvlite may stop and start again in one process)."""
    hvd.shutdown()
    for name in [n for n in os.environ if n.startswith(("HVLITE_", "HOROVOD_"))]:
        del os.environ[name]
    os.environ.update(base)
    os.environ.update(extra)
    hvd.init()


def memcpy_floor(nbytes, comm, iters=20):
    """Time to copy ``nbytes`` once (all ranks at once, as in a collective): the memory floor."""
    src = np.ones(max(nbytes // 4, 1), np.float32)
    dst = np.empty_like(src)
    return timed(lambda: np.copyto(dst, src), comm, iters)


def init_gloo(comm):
    """torch.distributed with gloo over loopback, rendezvous port chosen by rank 0; None if
    torch is not installed."""
    return init_torch_distributed(comm, "gloo")


def init_torch_distributed(comm, backend):
    """torch.distributed with `backend` (gloo, nccl), rendezvous on loopback at a port rank 0
    chose; None if torch is not installed."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    port = None
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=comm.rank, world_size=comm.size)
    return dist


def human(nbytes):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return "%d %s" % (nbytes, unit) if nbytes == int(nbytes) else "%.1f %s" % (nbytes, unit)
        nbytes /= 1024


def ratio(a, b):
    return "%.2fx" % (a / b) if a and b else "-"


def ms(t):
    return "%.3f" % (t * 1e3) if t else "-"
