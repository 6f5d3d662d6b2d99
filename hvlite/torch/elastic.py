"""``hvd.elastic`` for PyTorch: Horovod's elastic names on hvlite's re-forming worlds.

``hvd.elastic.run`` decorates the training function, ``TorchState`` holds the model, the
optimizer and any other values to commit, ``ElasticSampler`` shards a data set so that a
re-formed world neither repeats nor skips samples.

Contract: ``run``, ``State``, ``ObjectState``, ``HostsUpdatedInterrupt`` (from
``hvlite.elastic``), plus
  * ``TorchState(model=None, optimizer=None, **kwargs)``: an ``ObjectState`` whose ``model`` and
    ``optimizer`` (any objects with ``state_dict``/``load_state_dict``: also schedulers,
    ``ElasticSampler``) are committed through their state dicts. Tensors travel as raw bytes
    with their dtype and shape (every torch dtype but quantized and sparse ones, which raise
    ``TypeError`` naming the value) and come back on the CPU; ``load_state_dict`` puts them
    where the model's own tensors live. A tensor kept as a plain attribute (``best=tensor``,
    also inside lists, tuples and dicts) comes back on the device of the tensor it replaces,
    as Horovod's pickled state does.
  * ``ElasticSampler(dataset, shuffle=True, seed=0)``: a ``torch.utils.data.Sampler`` with the
    behaviour of ``hvlite.elastic.ElasticIndexSampler`` (Horovod's: ``set_epoch``,
    ``record_batch``, ``record_indices``, ``get_indices``, ``state_dict``,
    ``load_state_dict``, ``reset``); kept in a ``TorchState``, a re-formed world neither redoes
    nor skips samples of the epoch.
"""
from typing import Any

import numpy as np
import torch
import torch.utils.data

from ..elastic import ElasticIndexSampler, HostsUpdatedInterrupt, ObjectState, State, run
from ..elastic.codec import Array, CommitFormatError

__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler", "HostsUpdatedInterrupt"]

_KIND = "torch"


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CommitFormatError("a committed tensor has unknown torch dtype %r" % name)
    return dtype


def tensor_to_array(tensor: torch.Tensor, path: str = "tensor") -> Array:
    """A copy of ``tensor``'s values as commit bytes (its dtype and shape kept).

    Raises:
        TypeError: a sparse or quantized tensor.
    """
    if tensor.layout != torch.strided or tensor.is_quantized:
        raise TypeError("cannot commit %s: %s tensors are not supported (strided, "
                        "not quantized only)" % (path, tensor.layout))
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    raw = flat.view(torch.uint8).numpy().copy() if flat.numel() else np.empty(0, np.uint8)
    return Array(_KIND, str(tensor.dtype).replace("torch.", ""), tuple(tensor.shape), raw)


def array_to_tensor(array: Array) -> torch.Tensor:
    """A fresh CPU tensor from commit bytes.

    Raises:
        CommitFormatError: not a torch tensor, an unknown dtype, or bytes that do not fit.
    """
    if array.kind != _KIND:
        raise CommitFormatError("a commit holds a %s tensor where a torch tensor belongs"
                                % array.kind)
    dtype = _dtype(array.dtype)
    count = int(np.prod(array.shape, dtype=np.int64))
    itemsize = torch.empty((), dtype=dtype).element_size()
    if array.data.size != count * itemsize:
        raise CommitFormatError("a committed %s tensor of shape %s has %d bytes"
                                % (array.dtype, list(array.shape), array.data.size))
    if count == 0:
        return torch.empty(array.shape, dtype=dtype)
    raw = torch.from_numpy(np.ascontiguousarray(array.data).copy())
    return raw.view(dtype).reshape(array.shape)


class TorchState(ObjectState):
    """The state of a PyTorch elastic job: a model, an optimizer and plain values, committed
    and restored together (Horovod's ``TorchState``).

    Args:
        model: a ``torch.nn.Module``, or anything with ``state_dict``/``load_state_dict``.
        optimizer: a ``torch.optim.Optimizer`` (or a scheduler, or an ``ElasticSampler``).
        **kwargs: more values to commit, each kept as an attribute (``state.epoch``): numbers,
            strings, bytes, lists, tuples, dicts, NumPy arrays and tensors.
    Raises:
        TypeError: at the first commit, a value that cannot be committed (a sparse or quantized
            tensor, an object of another kind), naming its place in the state.
    """

    def __init__(self, model: Any = None, optimizer: Any = None, **kwargs: Any) -> None:
        if model is not None:
            kwargs["model"] = model
        if optimizer is not None:
            kwargs["optimizer"] = optimizer
        super().__init__(**kwargs)

    def _leaf(self, obj: Any, path: str) -> Any:
        if isinstance(obj, torch.Tensor):
            return tensor_to_array(obj, path)
        return super()._leaf(obj, path)

    def _unleaf(self, array: Array) -> Any:
        return array_to_tensor(array)

    def _apply(self, tree: Any) -> None:
        before = {name: getattr(self, name) for name in self._names}
        super()._apply(tree)
        for name, old in before.items():
            new = getattr(self, name)
            if new is not old:                   # a plain value (state dicts load in place)
                setattr(self, name, _on_devices_of(new, old))


def _on_devices_of(new: Any, old: Any) -> Any:
    """``new`` with each tensor moved to the device of the tensor at the same place in ``old``
    (where ``old`` has one there); the rest as it is."""
    if isinstance(new, torch.Tensor):
        return new.to(old.device) if isinstance(old, torch.Tensor) else new
    if isinstance(new, dict) and isinstance(old, dict):
        return type(new)((k, _on_devices_of(v, old.get(k))) for k, v in new.items())
    if isinstance(new, (list, tuple)) and isinstance(old, (list, tuple)) and len(new) == len(old):
        moved = [_on_devices_of(n, o) for n, o in zip(new, old)]
        return moved if isinstance(new, list) else type(new)(moved)
    return new


class ElasticSampler(ElasticIndexSampler, torch.utils.data.Sampler):
    """A ``torch.utils.data.Sampler`` over this rank's share of the samples not yet processed
    this epoch (Horovod's ``ElasticSampler``; the rules are
    :class:`hvlite.elastic.ElasticIndexSampler`'s). Keep it in the ``TorchState`` and record each
    batch (``record_batch(batch_idx, batch_size)``).

    Args:
        dataset: the data set (anything with ``len()``).
        shuffle: shuffle the indices, alike on every rank.
        seed: the shuffle's seed (with the epoch).
    """

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0) -> None:
        ElasticIndexSampler.__init__(self, dataset, shuffle=shuffle, seed=seed)
