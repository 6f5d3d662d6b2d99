"""Shared benchmark harness (nccl-tests shape): timing, reference data planes and the table.

Contract: benchmarks run under ``hvlrun -np N`` with mpi4py and (optionally) torch installed.
``timed(fn, comm, iters, warmup)`` aligns ranks with a barrier before every call, times each
call, takes the slowest rank per call and returns the median in seconds. Nothing here asserts a
time: benchmarks print tables; tests never depend on speed.
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


def memcpy_floor(nbytes, comm, iters=20):
    """Time to copy ``nbytes`` once (all ranks at once, as in a collective): the memory floor."""
    src = np.ones(max(nbytes // 4, 1), np.float32)
    dst = np.empty_like(src)
    return timed(lambda: np.copyto(dst, src), comm, iters)


def init_gloo(comm):
    """torch.distributed with gloo over loopback, rendezvous port chosen by rank 0; None if
    torch is not installed."""
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
    dist.init_process_group("gloo", rank=comm.rank, world_size=comm.size)
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


def print_table(title, header, rows):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = "  ".join("%*s" % (w, h) for w, h in zip(widths, header))
    print("\n" + title)
    print(line)
    print("-" * len(line))
    for r in rows:
        print("  ".join("%*s" % (w, c) for w, c in zip(widths, r)))
