"""``hvd.elastic`` for TensorFlow: Horovod's elastic names on hvlite's re-forming worlds.

Keep the model, its optimizer and the counters in a :class:`TensorFlowKerasState` (or a list
of variables in a :class:`TensorFlowState`), decorate the training function with
:data:`run`, and call ``state.commit()`` every few batches; an elastic ``hvlrun`` then goes on
from the last commit when workers are lost or added. The :doc:`elastic guide
</guides/elastic>` walks through it.

Contract: ``run``, ``State``, ``ObjectState``, ``HostsUpdatedInterrupt`` (``hvlite.elastic``;
``run`` also treats an hvlite peer error that TensorFlow wrapped in ``tf.errors.OpError`` inside
a graph as one: its message names the hvlite error class), plus
  * ``TensorFlowKerasState(model, optimizer=None, backend=None, **kwargs)``: an
    ``ObjectState`` (``kwargs`` as attributes; ``backend`` is TF1's Keras backend, accepted
    and unused: TensorFlow 2 is eager) that also commits the Keras model's weights and
    its optimizer's variables (the model's compiled optimizer unless one is given; built first
    if it was not yet, so a fresh process can load them before its first step). The model must
    be built. Keras models as Horovod's ``KerasState``; ``state.model``/``state.optimizer``.
  * ``TensorFlowState(variables=None, session=None, **kwargs)``: commits a list of
    ``tf.Variable`` (``session`` is TF1's, accepted and ignored: TensorFlow 2 is eager).
  Errors: ``CommitFormatError`` when a commit's variables do not match this model's (count,
  shapes, dtypes), naming the first that differs.
"""
from typing import Any, List, Sequence

import numpy as np
import tensorflow as tf

from ..elastic import HostsUpdatedInterrupt, ObjectState, State, make_run
from ..elastic.codec import CommitFormatError

__all__ = ["run", "State", "ObjectState", "TensorFlowKerasState", "TensorFlowState",
           "HostsUpdatedInterrupt"]

_MODEL, _OPTIMIZER, _VARIABLES = "tf.model", "tf.optimizer", "tf.variables"
# hvlite's peer errors, as their class names appear in a wrapped message
_PEER_ERRORS = ("HvliteTimeoutError", "HvliteShutdownError")


def _wrapped_peer_error(error: BaseException) -> bool:
    return isinstance(error, tf.errors.OpError) and any(n in str(error) for n in _PEER_ERRORS)


run = make_run(_wrapped_peer_error)
"""Horovod's ``hvd.elastic.run`` decorator. Decorate ``train(state, ...)`` with it so that an
elastic job goes on from the last commit when it loses or gains workers, and call it as
``train(state, ...)``. As ``hvlite.elastic.run``, and an hvlite error that TensorFlow wrapped in ``tf.errors.OpError``
inside a graph counts as the error it wraps."""


def _values(variables: Sequence[Any]) -> List[np.ndarray]:
    return [np.array(v.numpy(), copy=True) for v in variables]


def _assign(variables: Sequence[Any], values: Sequence[Any], what: str) -> None:
    """Assign committed ``values`` to ``variables``, after checking they fit."""
    if len(values) != len(variables):
        raise CommitFormatError("the commit holds %d %s variables, this process has %d"
                                % (len(values), what, len(variables)))
    for variable, value in zip(variables, values):
        shape = tuple(variable.shape)
        dtype = getattr(variable.dtype, "name", variable.dtype)   # tf.DType or Keras's str
        if (not isinstance(value, np.ndarray) or value.shape != shape
                or str(value.dtype) != str(dtype)):
            raise CommitFormatError("%s variable %s is %s %s here but %s %s in the commit"
                                    % (what, variable.name, dtype, list(shape),
                                       getattr(value, "dtype", type(value).__name__),
                                       list(getattr(value, "shape", ()))))
    for variable, value in zip(variables, values):
        variable.assign(value)


class TensorFlowKerasState(ObjectState):
    """Horovod's ``TensorFlowKerasState`` (``KerasState``): an :class:`ObjectState` that also
    commits a Keras model's weights and its optimizer's variables.

    Args:
        model: a built Keras model (give it an ``Input``, or call it once).
        optimizer: the optimizer whose variables to commit (default: the model's compiled
            optimizer). It is built first if it was not yet, so that a new worker can load
            its variables before its first step.
        backend: TF1's Keras backend; accepted and unused (TensorFlow 2 is eager).
        **kwargs: other values to keep, as for :class:`ObjectState` (``epoch=0, batch=0``).
    Raises:
        ValueError: the model is not built.
        CommitFormatError: (when a commit is loaded) its variables do not match this model's
            (count, shapes, dtypes), naming the first that differs.
    """

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None,
                 **kwargs: Any) -> None:
        self.model = model
        """The Keras model."""
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        """The optimizer whose variables are committed, or None."""
        self.backend = backend
        """Accepted for Horovod compatibility; unused."""
        if not model.built:
            raise ValueError("TensorFlowKerasState needs a built model (give it an Input or "
                             "call it once) so that its weights exist on every rank")
        super().__init__(**kwargs)

    def _optimizer_variables(self) -> List[Any]:
        optimizer = self.optimizer
        if optimizer is None:
            return []
        if not optimizer.built:      # a fresh process: create the slots to load into
            optimizer.build(self.model.trainable_variables)
        return list(optimizer.variables)

    def _capture(self) -> Any:
        tree = super()._capture()
        tree[_MODEL] = _values(self.model.weights)
        tree[_OPTIMIZER] = _values(self._optimizer_variables())
        return tree

    def _apply(self, tree: Any) -> None:
        if not isinstance(tree, dict) or _MODEL not in tree or _OPTIMIZER not in tree:
            raise CommitFormatError("the commit holds no Keras model state")
        super()._apply({k: v for k, v in tree.items() if k not in (_MODEL, _OPTIMIZER)})
        _assign(self.model.weights, tree[_MODEL], "model")
        _assign(self._optimizer_variables(), tree[_OPTIMIZER], "optimizer")


class TensorFlowState(ObjectState):
    """Horovod's ``TensorFlowState``: an :class:`ObjectState` that also commits a list of
    ``tf.Variable``.

    Args:
        variables: the variables to commit.
        session: TF1's session; accepted and ignored (TensorFlow 2 is eager).
        **kwargs: other values to keep, as for :class:`ObjectState`.
    Raises:
        CommitFormatError: (when a commit is loaded) its variables do not match these.
    """

    def __init__(self, variables: Sequence[Any] = None, session: Any = None, **kwargs: Any) -> None:
        self.variables = list(variables or [])
        """The committed variables."""
        super().__init__(**kwargs)

    def _capture(self) -> Any:
        tree = super()._capture()
        tree[_VARIABLES] = _values(self.variables)
        return tree

    def _apply(self, tree: Any) -> None:
        if not isinstance(tree, dict) or _VARIABLES not in tree:
            raise CommitFormatError("the commit holds no TensorFlow variables")
        super()._apply({k: v for k, v in tree.items() if k != _VARIABLES})
        _assign(self.variables, tree[_VARIABLES], "")
