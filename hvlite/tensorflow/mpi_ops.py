"""``hvlite.tensorflow.mpi_ops``: the module path of Horovod's ``horovod.tensorflow.mpi_ops``,
for scripts that import from it (``from horovod.tensorflow.mpi_ops import allgather, rank``).

Contract: the names Horovod's module holds, with its signatures: the basics (``init``,
``rank``, ``size``, ...), the reduce ops, process sets, ``allgather``, ``grouped_allgather``,
``broadcast``, ``broadcast_``, ``alltoall``, ``join``, the topology ops (``rank_op``, ...),
and the raw reductions ``_allreduce``, ``_grouped_allreduce``, ``_reducescatter`` and
``_grouped_reducescatter``, whose default op is ``Sum`` and which take no compression (what
Horovod's ``hvd.allreduce`` builds on). They are hvlite's ops (``hvlite.tensorflow.ops``):
same engine, gradients and errors. ``handle_average_backwards_compatibility(op, average)``
resolves Horovod's deprecated ``average`` argument; ``check_num_rank_power_of_2(n)`` says
whether ``n`` is a power of two.
"""
from ..basics import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built,
                      gloo_enabled, init, is_homogeneous, is_initialized, local_rank, local_size,
                      mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank,
                      rocm_built, shutdown, size)
from ..collectives import reduce_op as _reduce_op
from ..process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from ..timeline import start_timeline, stop_timeline
from . import ops as _ops
from ._bridge import library as _library
from .ops import (Adasum, Average, Max, Min, Product, Sum, allgather, alltoall, broadcast,
                  grouped_allgather, join, local_rank_op, local_size_op,
                  process_set_included_op, rank_op, size_op)
from .functions import broadcast_

__all__ = ["init", "shutdown", "is_initialized", "start_timeline", "stop_timeline", "size",
           "local_size", "cross_size", "rank", "local_rank", "cross_rank", "is_homogeneous",
           "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
           "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "Average", "Sum",
           "Adasum", "Min", "Max", "Product", "ProcessSet", "global_process_set",
           "add_process_set", "remove_process_set", "allgather", "grouped_allgather",
           "broadcast", "broadcast_", "alltoall", "join", "size_op", "process_set_included_op",
           "local_size_op", "rank_op", "local_rank_op", "handle_average_backwards_compatibility",
           "check_num_rank_power_of_2"]


def handle_average_backwards_compatibility(op, average):
    """The reduce op for Horovod's ``op``/``average`` pair: ``op`` if given, else Average or
    Sum as ``average`` says (Average when both are None).

    Raises:
        ValueError: both given.
    """
    return _reduce_op(average, op)


def check_num_rank_power_of_2(num_rank):
    """True if ``num_rank`` is a power of two (what Adasum needs)."""
    return num_rank != 0 and (num_rank & (num_rank - 1)) == 0


@_library
def _allreduce(tensor, name=None, op=Sum, prescale_factor=1.0, postscale_factor=1.0,
               ignore_name_scope=False, process_set=global_process_set):
    """Reduce ``tensor`` over the process set (default op: Sum). Collective: every rank of the
    set calls it, in the same order. Returns the reduced tensor; raises as
    ``hvlite.tensorflow.allreduce``."""
    return _ops.allreduce(tensor, op=op, prescale_factor=prescale_factor,
                          postscale_factor=postscale_factor, name=name, process_set=process_set)


@_library
def _grouped_allreduce(tensors, name=None, op=Sum, prescale_factor=1.0, postscale_factor=1.0,
                       ignore_name_scope=False, process_set=global_process_set):
    """Reduce a list of tensors submitted together (default op: Sum). Collective."""
    return _ops.grouped_allreduce(tensors, op=op, prescale_factor=prescale_factor,
                                  postscale_factor=postscale_factor, process_set=process_set,
                                  name=name)


@_library
def _reducescatter(tensor, name=None, op=Sum, ignore_name_scope=False,
                   process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """This rank's rows of the reduction of ``tensor`` (default op: Sum). Collective."""
    return _ops.reducescatter(tensor, op=op, name=name, process_set=process_set,
                              prescale_factor=prescale_factor, postscale_factor=postscale_factor)


@_library
def _grouped_reducescatter(tensors, name=None, op=Sum, ignore_name_scope=False,
                           process_set=global_process_set, prescale_factor=1.0,
                           postscale_factor=1.0):
    """``_reducescatter`` of a list of tensors submitted together. Collective."""
    return _ops.grouped_reducescatter(tensors, op=op, process_set=process_set,
                                      prescale_factor=prescale_factor,
                                      postscale_factor=postscale_factor, name=name)
