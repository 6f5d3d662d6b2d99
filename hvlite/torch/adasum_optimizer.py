"""Horovod's ``DistributedOptimizer(op=hvd.Adasum)`` for torch: the delta optimizer.

Contract (Horovod's documented behaviour, docs/adasum_user_guide.rst): each rank applies the
wrapped optimizer's step to its own gradients, then the change of every parameter (the
delta, new minus old) is reduced with Adasum over the set and the parameter becomes old plus
the reduced delta, so every rank ends the step with the same parameters. Adasum works on the
whole update, not on gradients scaled by a learning rate schedule of the size.

``adasum_optimizer(optimizer, ...)`` returns an optimizer of a subclass of ``type(optimizer)``
sharing its state and param groups, as ``DistributedOptimizer`` does. ``step()`` runs the
local step and then the reduction: the deltas of all parameters go in one burst, so the
engine fuses them (each tensor keeps its own dot products). Horovod starts each parameter's
step from a gradient hook during backward; hvlite steps once, after backward, with the wrapped
optimizer's own ``step`` (and closure): the same updates for per-parameter optimizers, and the
parameters keep their values while backward still reads them. As in Horovod, ``synchronize()``
does nothing and ``skip_synchronize()`` raises. Delta names are ``adasum.<parameter name>``.
``set_backward_passes_per_step(n)`` and ``load_state_dict`` reset the accumulation counters.
As ``DistributedOptimizer``, it shares the optimizer's objects, so a learning rate scheduler
made before wrapping drives it and its ``step`` is the Adasum one.
"""
import torch

from ..collectives import Adasum
from ..errors import HvliteNotSupportedError
from ..handles import burst, wait_all
from ..objects import allgather_object
from ..process_sets import rank_and_size
from .ops import allreduce_async_
from .parameter_names import find_duplicates, parameter_names
from .wrapping import adopt, hook, load_in_place

__all__ = ["adasum_optimizer"]


class _AdasumOptimizer:
    """Mixin placed before the wrapped optimizer's class."""

    def _adasum_setup(self, named_parameters, compression, backward_passes_per_step,
                      process_set):
        size = rank_and_size(process_set)[1]
        if size & (size - 1):
            raise HvliteNotSupportedError(
                "DistributedOptimizer(op=Adasum) needs a power-of-2 number of ranks; the process "
                "set has %d" % size)
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be >= 1")
        self._compression = compression
        self._passes = backward_passes_per_step
        self._process_set = process_set
        self._params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        if callable(named_parameters):      # model.named_parameters, not called
            named_parameters = named_parameters()
        self._named = None if named_parameters is None else list(named_parameters)
        self._names = parameter_names(self._params, self._named)
        self._check_same_model_everywhere()
        self._passes_left = {p: self._passes for p in self._params}
        self._hooks = [hook(p, self._on_gradient) for p in self._params]

    def _check_same_model_everywhere(self):
        mine = [(self._names[p], tuple(p.shape), str(p.dtype)) for p in self._params]
        for r, theirs in enumerate(allgather_object(mine, name="AdasumOptimizer.check",
                                                    process_set=self._process_set)):
            if theirs != mine:
                raise ValueError("DistributedOptimizer(op=Adasum): the parameters differ across "
                                 "ranks: this rank has %d, rank %d has %d" %
                                 (len(mine), r, len(theirs)))

    def add_param_group(self, param_group):
        """torch's ``add_param_group``; the new parameters' deltas are reduced too (named as
        at wrapping). A collective: every rank adds the same group, between steps.

        Raises:
            ValueError: as torch's; a new parameter missing from ``named_parameters``; or
                parameters that differ across ranks (on every rank).
        """
        super().add_param_group(param_group)
        new = [p for p in self.param_groups[-1]["params"] if p.requires_grad]
        names = parameter_names(new, self._named, first=len(self._params))
        self._params += new
        self._names.update(names)
        self._passes_left.update((p, self._passes) for p in new)
        self._check_same_model_everywhere()
        self._hooks += [hook(p, self._on_gradient) for p in new]

    @staticmethod
    def find_duplicates(lst):
        """Horovod's helper: the items of ``lst`` that occur more than once."""
        return find_duplicates(lst)

    @property
    def backward_passes_per_step(self):
        return self._passes

    @backward_passes_per_step.setter
    def backward_passes_per_step(self, passes):
        self.set_backward_passes_per_step(passes)

    def set_backward_passes_per_step(self, passes):
        """Accumulate gradients over up to ``passes`` backward passes per step (Horovod's)."""
        if passes < 1:
            raise ValueError("backward_passes_per_step must be >= 1")
        self._passes = passes
        self._passes_left = {p: passes for p in self._params}

    def load_state_dict(self, *args, **kwargs):
        """The wrapped optimizer's, with the accumulation counters reset (as Horovod's), into
        the optimizer's own ``param_groups`` and ``state`` objects."""
        self._passes_left = {p: self._passes for p in self._params}
        return load_in_place(self, super().load_state_dict, *args, **kwargs)

    def _on_gradient(self, p):
        if self._passes_left[p] <= 0:
            raise RuntimeError("gradient of '%s' computed more than backward_passes_per_step=%d "
                               "times before step()" % (self._names[p], self._passes))
        self._passes_left[p] -= 1

    def synchronize(self):
        """Nothing to wait for: the reduction runs inside ``step()`` (as in Horovod)."""

    def skip_synchronize(self):
        raise AssertionError("Skipping synchronization is not supported when using Adasum "
                             "optimizer (the reduction is part of step())")

    def step(self, closure=None):
        """The wrapped optimizer's step on this rank's gradients, then every parameter's
        change Adasum-reduced over the set; returns the closure's loss."""
        with torch.no_grad():
            start = [p.detach().clone() for p in self._params]
        loss = super().step(closure)
        with torch.no_grad():
            sent = []
            with burst():      # negotiated together, so the engine fuses the deltas
                for p, old in zip(self._params, start):
                    delta, ctx = self._compression.compress(p.detach() - old)
                    handle = allreduce_async_(delta, name="adasum." + self._names[p], op=Adasum,
                                              process_set=self._process_set)
                    sent.append((handle, delta, ctx))
            wait_all([handle for handle, _, _ in sent])   # every one: each frees its name
            for p, old, (_, delta, ctx) in zip(self._params, start, sent):
                p.copy_(old.add_(self._compression.decompress(delta, ctx).to(p.dtype)))
        self._passes_left = {p: self._passes for p in self._params}
        return loss


def adasum_optimizer(optimizer, named_parameters, compression, backward_passes_per_step,
                     process_set):
    """Wrap ``optimizer`` as Horovod's Adasum delta optimizer (see the module docstring).

    Every rank of the process set must build it with the same parameters, and call
    ``step()`` in the same pattern.

    Args:
        optimizer: a torch.optim.Optimizer.
        named_parameters: ``model.named_parameters()`` (or the method); names the reductions.
        compression: Compression.none or Compression.fp16 (deltas sent as float16).
        backward_passes_per_step: gradients accumulate locally over up to this many backward
            passes before ``step()``.
        process_set: the set that reduces the deltas (None: every rank); a power-of-2 size.
    Returns:
        An optimizer whose class derives from ``type(optimizer)``.
    Raises:
        HvliteNotSupportedError: the set's size is not a power of 2 (on every rank).
        ValueError: bad arguments, or parameters that differ across ranks (on every rank).
    """
    base = type(optimizer)
    cls = type(base.__name__, (_AdasumOptimizer, base), {})
    wrapped = cls.__new__(cls)
    adopt(wrapped, optimizer)    # same state, param groups and defaults (not a scheduler's step)
    wrapped._adasum_setup(named_parameters, compression, backward_passes_per_step, process_set)
    return wrapped
