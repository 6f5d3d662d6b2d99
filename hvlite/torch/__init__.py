"""``import hvlite.torch as hvd``: Horovod's PyTorch API on the hvlite engine.

The collectives take CPU and CUDA tensors and return tensors on the input's device.
``DistributedOptimizer`` averages gradients during ``backward()``; ``broadcast_parameters`` and
``broadcast_optimizer_state`` start every rank from the same state. The basics (``init``,
``rank``, ``size``, ...) are :mod:`hvlite.basics`'s, the process sets
:mod:`hvlite.process_sets`'s, the errors :mod:`hvlite.errors`'s and the timeline
:mod:`hvlite.timeline`'s; ``hvd.elastic`` is :mod:`hvlite.torch.elastic`.

Contract: the names Horovod documents for ``horovod.torch`` (basics, collectives and their async
and in-place forms, ``DistributedOptimizer``, ``broadcast_parameters``,
``broadcast_optimizer_state``, object collectives, ``Compression``, ``SyncBatchNorm``,
``join``; ``elastic``: ``run``, ``TorchState``, ``ElasticSampler``, ...; the module path
``mpi_ops``) with Horovod's
signatures and semantics, on CPU and CUDA tensors (results on the input's device). Pure Python
over the framework-neutral layer; no torch extension is compiled.
"""
from ..basics import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built,
                      gloo_enabled, init, is_initialized, local_rank, local_size,
                      mpi_built, mpi_enabled, mpi_threads_supported,
                      is_homogeneous, nccl_built, rank,
                      rocm_built, shutdown, size)
from ..errors import (HorovodInternalError, HorovodVersionMismatchError, HvliteError, HvliteInvalidArgument,
                      HvliteShutdownError, HvliteTimeoutError, MismatchError,
                      HvliteDeadlockError)
from ..process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .compression import Compression
from .functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                        broadcast_parameters)
from .ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allgather_async,
                  allreduce, allreduce_, allreduce_async, allreduce_async_, alltoall,
                  alltoall_async, barrier, broadcast, broadcast_, broadcast_async,
                  broadcast_async_, grouped_allgather, grouped_allgather_async,
                  grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
                  grouped_allreduce_async_, grouped_reducescatter, grouped_reducescatter_async,
                  join, poll, reducescatter, reducescatter_async, sparse_allreduce_async,
                  synchronize)
from .optimizer import DistributedOptimizer
from ..timeline import start_timeline, stop_timeline
from .sync_batch_norm import SyncBatchNorm
from . import elastic, mpi_ops
from ..elastic import HostsUpdatedInterrupt

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "is_homogeneous",
    "mpi_threads_supported", "mpi_built", "mpi_enabled",
    "nccl_built", "gloo_built", "gloo_enabled", "cuda_built", "rocm_built", "ddl_built",
    "ccl_built", "HorovodInternalError", "HorovodVersionMismatchError", "HvliteError", "HvliteInvalidArgument",
    "HvliteShutdownError", "HvliteTimeoutError", "MismatchError", "HvliteDeadlockError",
    "ProcessSet", "add_process_set", "remove_process_set",
    "global_process_set", "Compression", "allgather_object", "broadcast_object",
    "broadcast_optimizer_state", "broadcast_parameters", "Adasum", "Average", "Max", "Min",
    "Product", "Sum", "allgather", "allgather_async", "allreduce", "allreduce_",
    "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async", "barrier",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "grouped_allgather",
    "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "grouped_reducescatter",
    "grouped_reducescatter_async", "join", "poll", "reducescatter", "reducescatter_async",
    "sparse_allreduce_async", "synchronize", "DistributedOptimizer",
    "SyncBatchNorm", "start_timeline", "stop_timeline", "elastic", "mpi_ops", "HostsUpdatedInterrupt",
]
