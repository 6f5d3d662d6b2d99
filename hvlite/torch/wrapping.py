"""What the two optimizer wrappers (``DistributedOptimizer`` and its Adasum form) share: taking
over a torch optimizer's own objects, loading a state dict into them, and owning the gradient
hooks of its parameters.

Contract:

* ``adopt(wrapped, optimizer)``: ``wrapped`` (an instance of a subclass of ``type(optimizer)``)
  takes ``optimizer``'s attributes, the same objects (``param_groups``, ``state``, defaults,
  hooks), so a learning rate scheduler made on ``optimizer`` before wrapping changes the
  learning rates ``wrapped`` uses. The ``step`` a scheduler patches onto the instance is not
  taken (it would run the plain step on ``optimizer`` and bypass the wrapper's): ``wrapped``
  gets its own class's ``step``, marked so that the scheduler still sees the step called.
* ``load_in_place(optimizer, load, *args, **kwargs)``: runs torch's ``load_state_dict`` (``load``),
  then puts the loaded groups and state back into the objects the optimizer had, so whatever
  holds them (a scheduler on the optimizer that was wrapped) keeps seeing the live ones.
* ``hook(param, fn)``: registers ``fn`` as ``param``'s post-accumulate-grad hook for hvlite
  and returns its handle, first removing the one an earlier wrapper registered there: the
  last wrapper made over a parameter is the one that reduces its gradient (a second
  optimizer for a new training phase does not reduce it twice). ``fn`` None only removes
  the earlier one (a wrapper on a rank outside its process set) and returns None.
"""
import weakref

from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["adopt", "load_in_place", "hook"]

# parameter -> the handle of hvlite's hook on it (weak, by identity: a model may be dropped)
_HOOKS = WeakIdKeyDictionary()


def adopt(wrapped, optimizer):
    attributes = dict(optimizer.__dict__)
    patched = attributes.pop("step", None)    # an LR scheduler's wrapper, bound to `optimizer`
    wrapped.__dict__.update(attributes)
    if getattr(patched, "_wrapped_by_lr_sched", False):
        _mark_step(wrapped, optimizer)


def _mark_step(wrapped, optimizer):
    """Give ``wrapped`` a ``step`` that is its class's, recording the call where torch's
    schedulers look (``_opt_called``, on the optimizer they were made on and on ``wrapped``)."""
    refs = (weakref.ref(wrapped), weakref.ref(optimizer))

    def step(*args, **kwargs):
        this, original = refs[0](), refs[1]()
        if original is not None:
            original._opt_called = True
        this._opt_called = True
        return type(this).step(this, *args, **kwargs)

    step._wrapped_by_lr_sched = True
    wrapped.step = step


def load_in_place(optimizer, load, *args, **kwargs):
    groups, state = optimizer.param_groups, optimizer.state
    result = load(*args, **kwargs)
    for old, new in zip(groups, optimizer.param_groups):
        if old is not new:
            old.clear()
            old.update(new)
    if optimizer.state is not state:
        loaded = dict(optimizer.state)
        state.clear()
        state.update(loaded)
    optimizer.param_groups, optimizer.state = groups, state
    return result


def hook(param, fn):
    old = _HOOKS.get(param)
    if old is not None:
        old.remove()
        del _HOOKS[param]
    if fn is None:
        return None
    handle = _HOOKS[param] = param.register_post_accumulate_grad_hook(fn)
    return handle
