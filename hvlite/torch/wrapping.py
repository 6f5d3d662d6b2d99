"""What the two optimizer wrappers (``DistributedOptimizer`` and its Adasum form) share: taking
over a torch optimizer's own objects and loading a state dict into them.

Contract:

* ``adopt(wrapped, optimizer)``: ``wrapped`` (an instance of a subclass of ``type(optimizer)``)
  takes ``optimizer``'s attributes, the same objects (``param_groups``, ``state``, defaults,
  hooks), so a learning rate scheduler made on ``optimizer`` before wrapping changes the
  learning rates ``wrapped`` uses. The ``step`` a scheduler patches onto the instance is not
  taken (it would run the plain step on ``optimizer`` and bypass the wrapper's): ``wrapped``
  gets its own class's ``step``, marked so that the scheduler still sees the step called.
* ``load_in_place(optimizer, load, state_dict)``: runs torch's ``load_state_dict`` (``load``),
  then puts the loaded groups and state back into the objects the optimizer had, so whatever
  holds them (a scheduler on the optimizer that was wrapped) keeps seeing the live ones.
"""
import weakref

__all__ = ["adopt", "load_in_place"]


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


def load_in_place(optimizer, load, state_dict):
    groups, state = optimizer.param_groups, optimizer.state
    result = load(state_dict)
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

