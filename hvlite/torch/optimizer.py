"""Horovod's ``DistributedOptimizer`` for torch on the hvlite engine.

``hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())`` wraps a torch
optimizer so that ``loss.backward()`` also averages the gradients over every rank: when it
returns, ``p.grad`` holds the same averaged gradients on every rank, as with DDP, and
``optimizer.step()`` applies them. Every rank builds the same model and runs the same steps.

Contract: ``DistributedOptimizer(optimizer, ...)`` returns an optimizer of a subclass of
``type(optimizer)`` sharing its state and param groups. A hook on every parameter notes when
backward has accumulated its gradient ``backward_passes_per_step`` times; gradients are then
submitted as asynchronous allreduces in buckets of ``bucket_bytes`` (or one by one, or by
``groups``), so communication overlaps the rest of backward. Once every parameter's
gradient is final for the step (the last of ``backward_passes_per_step`` passes), the end of
that backward pass waits for all of them and writes the averaged gradients into ``p.grad``, as
DDP does: code between ``backward()`` and ``step()`` (torch's ``GradScaler``, gradient
clipping) sees the averaged gradients on every rank, so every rank takes the same decisions (a
``GradScaler`` skips a step on every rank or on none). Where a parameter got no gradient in the
step, that wait happens at ``step()`` (with a warning, once) or ``synchronize()`` instead, as in
Horovod. A backward pass after that and before ``step()`` starts the step over from the
averaged gradients, as after Horovod's ``synchronize()`` (with ``op=Sum`` it raises
``RuntimeError`` instead, as Horovod does: the summed gradient would be summed again).
``step()`` then runs the wrapped step. Every rank must build the same model (checked at
construction: a clear ``ValueError`` on every rank otherwise) and call backward/step in the
same pattern.

Gradient names are ``allreduce.<parameter name>`` (from ``named_parameters``, else the
parameter's position), the same every step, so the engine's response cache agrees on them
without a coordinator round. Sparse gradients are allgathered (indices and values) and summed
(``sparse_allreduce_async``), or densified for the allreduce with ``sparse_as_dense=True``; either
way ``p.grad`` stays sparse, as optimizers such as ``SparseAdam`` need.

A rank that is not in ``process_set`` does what Horovod's does: it registers no hooks and takes
no part, and its ``step()`` applies its own local gradients.

A parameter is reduced by the last wrapper made over it: wrapping it again (a second
``DistributedOptimizer`` for a new training phase) removes the earlier wrapper's hook, which
would otherwise reduce its gradients a second time. ``add_param_group`` after wrapping hooks
and names the new parameters as at wrapping (every rank adds the same group, between steps).

As Horovod's, ``set_backward_passes_per_step(n)`` (or setting ``backward_passes_per_step``)
changes the accumulation from the next step on, and ``load_state_dict`` starts the step over
(accumulation counters reset; allreduces already submitted are waited for, their results
dropped: every rank submitted them, so they end) before loading the wrapped optimizer's state.

The wrapper shares the optimizer's objects (``param_groups``, ``state``) and keeps them when
it loads a state dict, so a learning rate scheduler made on the optimizer before wrapping
drives the wrapper's learning rates; its ``step`` is the wrapper's (see ``wrapping.py``).
"""
import contextlib
import threading

import torch

from ..once import warn_once
from ..handles import burst
from ..objects import allgather_object
from ..process_sets import rank_and_size
from .adasum_optimizer import adasum_optimizer
from .compression import Compression
from .ops import Adasum, Average, Sum, allreduce_async_, sparse_allreduce_async
from .parameter_names import find_duplicates, parameter_names
from .wrapping import adopt, hook, load_in_place

# Autograd runs a model's CPU and CUDA gradients on different threads at once: the hooks' shared
# state (bucket, handles) is changed under this lock (module-wide: an optimizer stays copyable)
_HOOKS = threading.RLock()

__all__ = ["DistributedOptimizer"]


class _DistributedOptimizer:
    """Mixin placed before the wrapped optimizer's class."""

    def _hvl_setup(self, named_parameters, compression, backward_passes_per_step, op,
                   gradient_predivide_factor, num_groups, groups, sparse_as_dense, process_set,
                   bucket_bytes):
        if op not in (Average, Sum):
            raise ValueError("DistributedOptimizer supports op=Average or op=Sum")
        if op != Average and gradient_predivide_factor != 1.0:
            raise ValueError("gradient_predivide_factor needs op=Average")
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be >= 1")
        self._compression = compression
        self._passes = backward_passes_per_step
        self._op = op
        self._predivide = float(gradient_predivide_factor)
        self._sparse_as_dense = sparse_as_dense
        self._process_set = process_set
        self._params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        if callable(named_parameters):      # model.named_parameters, not called
            named_parameters = named_parameters()
        self._named = None if named_parameters is None else list(named_parameters)
        #: param -> name (Horovod's attribute name; some scripts read it)
        self._parameter_names = parameter_names(self._params, self._named)
        self._groups = self._make_groups(num_groups, groups)
        self._included = rank_and_size(process_set)[0] >= 0
        if self._included:
            self._check_same_model_everywhere()
        self._handles = {}          # param -> (handle, ctx, sent tensor)
        self._delay = {p: self._passes for p in self._params}
        self._group_ready = {}      # group index -> params ready, waiting for the rest
        self._bucket_bytes = bucket_bytes
        self._bucket, self._bucket_fill = [], 0   # ungrouped params ready, not yet submitted
        self._unready = len(self._params)   # params whose gradient is not final for the step
        self._end_queued = False    # this backward pass's end calls _end_of_backward
        self._reduced = False       # p.grad holds this step's averaged gradients
        self._synchronized = False  # ... and synchronize() was called (for step()'s warning)
        self._should_synchronize = True
        # a parameter wrapped again (a second optimizer) keeps only the new wrapper's hook
        self._hooks = [hook(p, self._on_gradient if self._included else None)
                       for p in self._params]

    def _make_groups(self, num_groups, groups):
        if groups is not None:
            if isinstance(groups, int):
                num_groups = groups
            else:
                index = {p: gi for gi, group in enumerate(groups) for p in group}
                return {p: index.get(p) for p in self._params}
        if num_groups and num_groups > 0:
            per = -(-len(self._params) // num_groups)
            return {p: i // per for i, p in enumerate(self._params)}
        return {p: None for p in self._params}

    def _check_same_model_everywhere(self):
        mine = [(self._parameter_names[p], tuple(p.shape), str(p.dtype)) for p in self._params]
        everyone = allgather_object(mine, name="DistributedOptimizer.check",
                                    process_set=self._process_set)
        for r, theirs in enumerate(everyone):
            if theirs != mine:
                diff = [(a, b) for a, b in zip(mine, theirs) if a != b][:3]
                raise ValueError("DistributedOptimizer: the parameters differ across ranks: this "
                                 "rank has %d, rank %d has %d; first differences (this rank, "
                                 "rank %d): %s" % (len(mine), r, len(theirs), r, diff))

    @staticmethod
    def find_duplicates(lst):
        """Horovod's helper: the items of ``lst`` that occur more than once."""
        return find_duplicates(lst)

    @property
    def backward_passes_per_step(self):
        """The backward passes accumulated per step; setting it calls
        ``set_backward_passes_per_step``."""
        return self._passes

    @backward_passes_per_step.setter
    def backward_passes_per_step(self, passes):
        self.set_backward_passes_per_step(passes)

    def set_backward_passes_per_step(self, passes):
        """Accumulate gradients over ``passes`` backward passes per step (Horovod's); the
        step in progress starts over: call it between steps.

        Raises:
            ValueError: ``passes`` < 1.
        """
        if passes < 1:
            raise ValueError("backward_passes_per_step must be >= 1")
        self._passes = passes
        self._start_over()

    def load_state_dict(self, *args, **kwargs):
        """The wrapped optimizer's ``load_state_dict``, after starting the step over (as
        Horovod's: a checkpoint restored mid-accumulation begins a fresh step). The values go
        into the optimizer's own ``param_groups`` and ``state`` objects, which a scheduler made
        before wrapping also holds."""
        self._start_over()
        return load_in_place(self, super().load_state_dict, *args, **kwargs)

    def _start_over(self):
        """Forget the step in progress: wait out the allreduces already submitted (their
        results are dropped) and reset the accumulation counters."""
        for handle, _, _ in list(self._handles.values()):
            try:
                handle.wait()
            except Exception:    # noqa: BLE001 - dropped anyway; waiting frees its name
                pass
        self._handles.clear()
        self._group_ready.clear()
        self._bucket, self._bucket_fill = [], 0
        self._delay = {p: self._passes for p in self._params}
        self._unready = len(self._params)
        self._end_queued = self._reduced = self._synchronized = False
        self._should_synchronize = True

    def add_param_group(self, param_group):
        """torch's ``add_param_group``, and the new parameters' gradients are reduced too:
        hooked and named as at wrapping (from ``named_parameters``, else ``param.<i>``
        continuing the positions), reduced in buckets. A collective: every rank adds the
        same group, between steps (checked as at wrapping).

        Raises:
            RuntimeError: called during a step (between ``backward()`` and ``step()``).
            ValueError: as torch's; a new parameter missing from ``named_parameters``; or
                parameters that differ across ranks (on every rank).
        """
        if (self._handles or self._bucket or self._group_ready
                or any(d != self._passes for d in self._delay.values())):
            raise RuntimeError("add_param_group() was called between backward() and step(); "
                               "add parameter groups between steps")
        super().add_param_group(param_group)
        new = [p for p in self.param_groups[-1]["params"] if p.requires_grad]
        names = parameter_names(new, self._named, first=len(self._params))
        self._params += new
        self._parameter_names.update(names)
        for p in new:
            self._groups[p], self._delay[p] = None, self._passes
        self._unready += len(new)
        if self._included:
            self._check_same_model_everywhere()
        self._hooks += [hook(p, self._on_gradient if self._included else None) for p in new]

    # ---- during backward ----

    def _on_gradient(self, p):
        with _HOOKS:
            self._on_gradient_locked(p)

    def _on_gradient_locked(self, p):
        if self._reduced:            # a backward pass after one without step() (a skipped step)
            if self._op == Sum:      # the sum would count the summed gradient again, n times
                raise RuntimeError(
                    "gradient of '%s' computed more than backward_passes_per_step=%d times "
                    "before step(): with op=Sum a backward pass after the gradients were summed "
                    "would sum them again. Call optimizer.step() or optimizer.zero_grad() "
                    "between backward passes, or set backward_passes_per_step to the number of "
                    "passes to accumulate" % (self._parameter_names[p], self._passes))
            self._reduced = self._synchronized = False
        if not self._end_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
            self._end_queued = True
        if p in self._handles or self._delay[p] <= 0:
            raise RuntimeError("gradient of '%s' computed more than backward_passes_per_step=%d "
                               "times before step()/synchronize()"
                               % (self._parameter_names[p], self._passes))
        self._delay[p] -= 1
        if self._delay[p] > 0:
            return
        self._unready -= 1
        group = self._groups[p]
        if group is None:
            self._bucket.append(p)
            self._bucket_fill += p.numel() * p.element_size()
            if self._bucket_fill >= self._bucket_bytes:
                self._flush_bucket()
            return
        ready = self._group_ready.setdefault(group, [])
        ready.append(p)
        members = [q for q in self._params if self._groups[q] == group]
        if len(ready) == len(members):     # submit the group together, so it fuses
            with burst():
                for q in members:
                    self._handles[q] = self._start(q)
            del self._group_ready[group]

    def _flush_bucket(self):
        with burst():                   # negotiated together, so the engine fuses them
            for q in self._bucket:
                self._handles[q] = self._start(q)
        self._bucket, self._bucket_fill = [], 0

    def _start(self, p):
        name = "allreduce." + self._parameter_names[p]
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grad = p.grad
        if grad.is_sparse:
            if not self._sparse_as_dense:
                return sparse_allreduce_async(grad, name, self._op, self._process_set), \
                    "sparse", None
            grad = grad.to_dense()
        sent, ctx = self._compression.compress(grad)
        pre, post = (1.0 / self._predivide, self._predivide) if self._op == Average else (1.0, 1.0)
        handle = allreduce_async_(sent, name=name, op=self._op, prescale_factor=pre,
                                  postscale_factor=post, process_set=self._process_set)
        return handle, ctx, sent

    def _end_of_backward(self):
        """Autograd's callback at the end of a backward pass: the averaged gradients are in
        ``p.grad`` when ``backward()`` returns, once every parameter's is final."""
        with _HOOKS:
            self._end_queued = False
            if self._unready > 0:
                return
        self._reduce()
        self._reduced = True

    def _warn_unused(self):
        missing = [self._parameter_names[p] for p in self._params if self._delay[p] > 0]
        warn_once("gradients at step", "%d of the optimizer's parameters got no gradient in this "
                  "step (first: '%s'), so the gradients are averaged at step(), not when "
                  "backward() returns: code between the two (GradScaler, clipping) sees this "
                  "rank's own gradients. Call optimizer.synchronize() before it (hvlite warns "
                  "once per process)" % (len(missing), missing[0]))

    # ---- at step ----

    def synchronize(self):
        """Wait for every gradient allreduce and write the results into ``p.grad`` (at once
        where the end of backward already did)."""
        if self._included and not self._reduced:
            self._reduce()
        self._reduced = False       # as after Horovod's: a later backward or step() reduces again
        self._synchronized = True

    def _reduce(self):
        self._end_queued = False    # also where a failed backward never ran the callback
        self._flush_bucket()
        with burst():
            for p in self._params:
                if p not in self._handles:     # no (or too few) backward passes: still take part
                    self._handles[p] = self._start(p)
        error = None
        for p, (handle, ctx, sent) in self._handles.items():
            try:
                result = handle.wait()
            except Exception as e:   # noqa: BLE001 - every handle is still waited (each frees
                error = error or e   # its name for the next step); the first error is raised
                continue
            if ctx == "sparse":
                p.grad = result
            elif p.grad.is_sparse:   # sparse_as_dense: back to the layout the optimizer expects
                p.grad = self._compression.decompress(sent, ctx).to_sparse(p.grad.sparse_dim())
            elif sent is not p.grad:
                with torch.no_grad():
                    p.grad.copy_(self._compression.decompress(sent, ctx))
        self._handles.clear()
        self._group_ready.clear()
        self._bucket, self._bucket_fill = [], 0
        self._delay = {p: self._passes for p in self._params}
        self._unready = len(self._params)
        if error is not None:
            raise error

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Inside, ``step()`` does not synchronize: use after an explicit ``synchronize()``
        (e.g. to clip the averaged gradients before stepping)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        """Synchronize the gradients (unless inside ``skip_synchronize()``), then run the
        wrapped optimizer's ``step``."""
        if self._should_synchronize:
            if self._synchronized:
                warn_once("step after synchronize",
                          "optimizer.step() called without optimizer.skip_synchronize() context "
                          "after optimizer.synchronize(): step() allreduces every gradient a "
                          "second time (same values, time spent again). Wrap step() in `with "
                          "optimizer.skip_synchronize():` (hvlite warns once per process)")
            elif self._included and not self._reduced and 0 < self._unready < len(self._params):
                self._warn_unused()
            self.synchronize()
        self._synchronized = self._reduced = False
        return super().step(closure)

    def zero_grad(self, set_to_none=True):
        """The wrapped optimizer's ``zero_grad``.

        Raises:
            RuntimeError: called between ``backward()`` and ``step()``/``synchronize()``, while
                gradients are still being allreduced.
        """
        if self._handles or self._bucket:
            raise RuntimeError("optimizer.zero_grad() was called after loss.backward() but before "
                               "optimizer.step() or optimizer.synchronize()")
        self._reduced = self._end_queued = False    # a new step (after a skipped one)
        return super().zero_grad(set_to_none=set_to_none)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False, process_set=None,
                         bucket_bytes=25 << 20):
    """Wrap ``optimizer`` so that gradients are averaged (or summed) over every rank.

    The gradients are allreduced during ``backward()``, as each is ready, and are in ``p.grad``
    when it returns; ``step()`` then applies them. Every rank must build the same model and call
    ``backward()``/``step()`` in the same pattern. Besides the wrapped optimizer's methods, the
    result has Horovod's:

    * ``synchronize()``: wait for every gradient's allreduce and write the results into
      ``p.grad`` (at once where ``backward()`` already did);
    * ``skip_synchronize()``: a context manager in which ``step()`` does not synchronize, for
      a ``step()`` after an explicit ``synchronize()`` (to clip the averaged gradients first);
    * ``set_backward_passes_per_step(n)`` (or setting ``backward_passes_per_step``): change
      the accumulation between steps.

    Args:
        optimizer: a torch.optim.Optimizer over the model's parameters.
        named_parameters: ``model.named_parameters()``; names the allreduces (recommended).
        compression: Compression.none or Compression.fp16 (gradients sent as float16).
        backward_passes_per_step: gradients accumulate locally over this many backward passes
            before they are allreduced.
        op: Average (default), Sum, or Adasum (Horovod's delta optimizer: each rank steps, the
            parameter changes are Adasum-reduced; see ``hvlite.torch.adasum_optimizer``).
        gradient_predivide_factor: divide gradients by this before the sum and multiply after
            (Average only), to keep float16 sums in range.
        num_groups: submit gradients in this many groups (all of a group once it is complete).
        groups: an integer (as ``num_groups``), or a list of lists of parameters, each list
            submitted together once all of it is ready (the other parameters in buckets).
        sparse_as_dense: densify sparse gradients instead of allgathering them.
        process_set: the ProcessSet whose members average these gradients (None: every rank).
        bucket_bytes: (hvlite's) without groups, gradients are submitted in backward order
            each time this many bytes are ready, and the rest at the end of backward, as one
            burst the engine fuses. 0 submits each gradient when it is ready (Horovod's
            behaviour). The default, 25 MiB, is DDP's bucket size: on a machine without spare
            cores a collective that runs during backward competes with it (measured in
            :doc:`/benchmarks`); models larger than a bucket still overlap communication with
            backward.
    Returns:
        An optimizer whose class derives from ``type(optimizer)``.
    Raises:
        ValueError: bad arguments (an op other than Average, Sum and Adasum;
            ``gradient_predivide_factor`` with an op other than Average;
            ``backward_passes_per_step`` < 1), or parameters that differ across ranks (on every
            rank).
    """
    if op == Adasum:
        if gradient_predivide_factor != 1.0:
            raise ValueError("gradient_predivide_factor needs op=Average")
        return adasum_optimizer(optimizer, named_parameters, compression,
                                backward_passes_per_step, process_set)
    base = type(optimizer)
    cls = type(base.__name__, (_DistributedOptimizer, base), {})
    wrapped = cls.__new__(cls)
    adopt(wrapped, optimizer)    # same state, param groups and defaults (not a scheduler's step)
    wrapped._hvl_setup(named_parameters, compression, backward_passes_per_step, op,
                       gradient_predivide_factor, num_groups, groups, sparse_as_dense, process_set,
                       bucket_bytes)
    return wrapped
