"""``hvlite.torch.mpi_ops``: the module path of Horovod's ``horovod.torch.mpi_ops``.

Contract: the names Horovod scripts import from ``horovod.torch.mpi_ops`` (``from
horovod.torch.mpi_ops import allreduce_async_, synchronize``, ``Average``, ``init``, ...) are
here under the same names, and are the very objects ``hvlite.torch`` exports (collectives,
basics, reduce ops, process sets, ``Compression``, ``HorovodInternalError``). What Horovod's
module holds besides (its compiled ``mpi_lib``, the autograd ``Function`` classes behind the
collectives, the pre-0.21 ``average=`` shim) has no counterpart: ``tools/horovod_api.py`` lists
each with its reason.
"""
from ..basics import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built,
                      gloo_enabled, init, is_homogeneous, is_initialized, local_rank, local_size,
                      mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank, rocm_built,
                      shutdown, size)
from ..errors import HorovodInternalError
from ..process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from ..timeline import start_timeline, stop_timeline
from .compression import Compression
from .ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allgather_async, allreduce,
                  allreduce_, allreduce_async, allreduce_async_, alltoall, alltoall_async, barrier,
                  broadcast, broadcast_, broadcast_async, broadcast_async_, grouped_allgather,
                  grouped_allgather_async, grouped_allreduce, grouped_allreduce_,
                  grouped_allreduce_async, grouped_allreduce_async_, grouped_reducescatter,
                  grouped_reducescatter_async, join, poll, reducescatter, reducescatter_async,
                  sparse_allreduce_async, synchronize)

__all__ = [
    "HorovodInternalError", "ProcessSet", "global_process_set", "add_process_set",
    "remove_process_set", "Compression", "init", "shutdown", "is_initialized", "start_timeline",
    "stop_timeline", "size", "local_size", "cross_size", "rank", "local_rank", "cross_rank",
    "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
    "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "is_homogeneous",
    "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "allreduce_async", "allreduce", "allreduce_async_", "allreduce_", "grouped_allreduce_async",
    "grouped_allreduce", "grouped_allreduce_async_", "grouped_allreduce_",
    "sparse_allreduce_async", "allgather_async", "allgather", "grouped_allgather_async",
    "grouped_allgather", "broadcast_async", "broadcast", "broadcast_async_", "broadcast_",
    "alltoall_async", "alltoall", "reducescatter_async", "reducescatter",
    "grouped_reducescatter_async", "grouped_reducescatter", "poll", "synchronize", "join",
    "barrier",
]
