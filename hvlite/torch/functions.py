"""Broadcasting model and optimizer state from one rank (Horovod's torch functions).

Contract: both functions are collectives (every rank calls them, same order) and leave every
rank equal to ``root_rank``, in place. ``broadcast_parameters`` takes a ``state_dict()`` (sorted
by key, as Horovod does) or ``named_parameters()``/a list of tensors. ``broadcast_optimizer_state``
sends the root's ``state_dict()`` structure (hyper-parameters, step counts) as an object and
its tensors through the engine, then loads it on the other ranks. An optimizer without state
first creates it with one step on zero gradients, as Horovod's does (a migrated script then
trains the same numbers; a stateless optimizer such as plain SGD stays stateless).
"""
import torch

from ..basics import rank
from ..handles import wait_all
from ..objects import allgather_object, broadcast_object
from .ops import broadcast_async_

__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
           "allgather_object"]


def broadcast_parameters(params, root_rank=0, process_set=None):
    """Overwrite every rank's parameters with root_rank's values.

    Args:
        params: ``model.state_dict()``, ``model.named_parameters()``, or a list of tensors.
        root_rank: the rank whose values win.
    Raises:
        ValueError: params of another kind; HvliteError subclasses as for broadcast (e.g. a
            shape that differs across ranks raises MismatchError on every rank).
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, (list, tuple)) or hasattr(params, "__iter__"):
        items = [p if isinstance(p, tuple) else ("%d" % i, p) for i, p in enumerate(params)]
    else:
        raise ValueError("broadcast_parameters expects a state_dict or named parameters, got %s"
                         % type(params).__name__)
    handles = []
    with torch.no_grad():
        for name, tensor in items:
            if not isinstance(tensor, torch.Tensor):
                continue
            handles.append(broadcast_async_(tensor.data if tensor.requires_grad else tensor,
                                            root_rank, "broadcast_parameters." + name, process_set))
        wait_all(handles)       # every one, also after an error: each frees its name


class _TensorSpec:
    """Stands for a tensor in the state structure sent as an object."""

    def __init__(self, tensor):
        self.shape, self.dtype, self.cuda = tuple(tensor.shape), tensor.dtype, tensor.is_cuda

    def empty(self, cuda_device):
        """A tensor to receive it: on ``cuda_device`` when the root's is on a GPU (every rank's
        buffers must be in the same kind of memory, and on NCCL on this rank's GPU)."""
        return torch.empty(self.shape, dtype=self.dtype, device=cuda_device if self.cuda else "cpu")


def _split(obj, tensors):
    """obj with tensors replaced by _TensorSpec (appended to ``tensors`` in walk order)."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _TensorSpec(obj)
    if isinstance(obj, dict):
        return {k: _split(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_split(v, tensors) for v in obj)
    return obj


def _fill(obj, tensors, cuda_device):
    """The inverse walk: _TensorSpec -> a new tensor (appended to ``tensors``)."""
    if isinstance(obj, _TensorSpec):
        t = obj.empty(cuda_device)
        tensors.append(t)
        return t
    if isinstance(obj, dict):
        return {k: _fill(v, tensors, cuda_device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_fill(v, tensors, cuda_device) for v in obj)
    return obj


def _cuda_device(optimizer):
    """This rank's GPU for received state: its parameters' (a script may place them with
    ``.cuda(local_rank)`` and never call ``set_device``), else the current device."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.is_cuda:
                return p.device
    return torch.device("cuda")


def _initialize_state(optimizer, model):
    """Horovod's first-use step: an optimizer without state gets zero gradients (sparse for
    SparseAdam and for a sparse embedding of ``model``) and one step of the wrapped optimizer,
    so its state exists (and ``p.grad`` is a tensor afterwards, as under Horovod). The step is
    the plain optimizer's, never a distributed one's (only this rank may be taking it: one
    that resumed from a checkpoint has state); L-BFGS gets a closure of zero loss (its step
    then stops at once: the gradient is zero). On zero gradients only weight decay moves a
    parameter, so the parameters of groups with weight decay are put back after the step
    (Horovod keeps that move, so a resumed rank's parameters drifted from the root's they had
    just received); the copies are in host memory, asked for no GPU memory."""
    from .adasum_optimizer import _AdasumOptimizer   # their step() runs collectives
    from .optimizer import _DistributedOptimizer
    sparse = {id(p) for m in (model.modules() if model is not None else ())
              if isinstance(m, torch.nn.Embedding) and m.sparse for p in m.parameters()}
    decayed = [p for group in optimizer.param_groups if group.get("weight_decay")
               for p in group["params"] if p.requires_grad]
    with torch.no_grad():
        kept = [p.detach().to("cpu", copy=True) for p in decayed]
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
                if isinstance(optimizer, torch.optim.SparseAdam) or id(p) in sparse:
                    p.grad = p.grad.to_sparse()
    closure = (lambda: torch.zeros(())) if isinstance(optimizer, torch.optim.LBFGS) else None
    wrapper = next((c for c in (_DistributedOptimizer, _AdasumOptimizer) if isinstance(optimizer, c)), None)
    step = super(wrapper, optimizer).step if wrapper is not None else optimizer.step
    step(closure) if closure is not None else step()
    with torch.no_grad():
        for p, old in zip(decayed, kept):
            p.copy_(old)


def broadcast_optimizer_state(optimizer, root_rank=0, model=None, process_set=None):
    """Make every rank's optimizer state (moments, step counts, learning rates, ...) equal to
    root_rank's. Works for any torch optimizer whose ``state_dict`` holds tensors and
    picklable values (SGD, Adam, AdamW, ...). As Horovod does, a rank whose optimizer has no
    state yet first creates it with one step on zero gradients (``model``: to find sparse
    embeddings, whose zero gradients are then sparse).

    Args:
        optimizer: a torch optimizer or a DistributedOptimizer.
        root_rank: the rank whose state wins.
        model: optional, as in Horovod.
        process_set: None (all ranks) or a ProcessSet this rank is in.
    """
    if not optimizer.state_dict()["state"]:
        _initialize_state(optimizer, model)
    tensors = []
    structure = _split(optimizer.state_dict(), tensors) if rank() == root_rank else None
    structure = broadcast_object(structure, root_rank, "broadcast_optimizer_state.structure",
                                 process_set)
    if rank() != root_rank:
        tensors = []
        state = _fill(structure, tensors, _cuda_device(optimizer))
    wait_all([broadcast_async_(t, root_rank, "broadcast_optimizer_state.%d" % i, process_set)
              for i, t in enumerate(tensors)])
    if rank() != root_rank:
        optimizer.load_state_dict(state)
