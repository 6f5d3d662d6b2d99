"""Horovod's Keras callbacks for Keras 3 (``hvd.callbacks.*``).

Pass them to ``model.fit(callbacks=[...])``, the same list on every rank:
:class:`BroadcastGlobalVariablesCallback` starts every rank from rank 0's weights,
:class:`MetricAverageCallback` averages the epoch's metrics over the ranks, and the learning
rate callbacks warm up and schedule the learning rate.

Contract: every rank must use the same callbacks in the same order (the collective ones talk
to the other ranks). ``BroadcastGlobalVariablesCallback`` assigns root_rank's model and
optimizer variables to every rank when training begins (where every rank has the same ones),
and all of them after the first batch if that batch created variables (with TensorFlow and no
``tf.distribute`` strategy, Keras 3 builds a model without an ``Input``, and the optimizer,
inside the first train step: those ranks took one step from their own starting weights,
which root_rank's then replace, as Horovod's callback, which broadcasts only then, does for
every model). ``MetricAverageCallback`` replaces every value in the epoch-end logs by
its average over the ranks, in one allreduce; put it before callbacks that read the logs.
``LearningRateScheduleCallback`` sets ``initial_lr * multiplier(epoch)`` between start_epoch
and end_epoch, per epoch (staircase) or per batch with fractional epochs;
``LearningRateWarmupCallback`` ramps from ``initial_lr / size`` to ``initial_lr`` over
``warmup_epochs`` (Goyal et al.), per batch, and sets ``initial_lr`` when the warmup ends. Both need a learning rate that is not a schedule
object. ``momentum_correction`` is accepted but has no effect: Keras 3 optimizers hold momentum
as a Python float fixed when the train step is traced. ``BestModelCheckpoint`` is Keras's
``ModelCheckpoint`` with ``save_best_only=True`` and no file path yet (Horovod's estimators set
it): set ``callback.filepath`` (a ``.keras`` file, or ``.weights.h5`` with
``save_weights_only``) before training; ``fit`` raises ``ValueError`` at train begin otherwise.
"""
import numpy as np
import keras

from ... import objects as _objects
from ...basics import rank, size
from .. import functions as _functions
from .. import ops as _ops

__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback", "BestModelCheckpoint"]


def _model_variables(model):
    # weights, not variables: Keras 3's variables also hold each dropout layer's random state,
    # which every rank keeps its own (as with Keras 2, which had no such variable)
    variables = list(model.weights)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and optimizer.built:
        variables += list(optimizer.variables)
    return variables


def _step_counter(optimizer):
    """The variable that counts an optimizer's steps: a LossScaleOptimizer's inner one's; with
    gradient accumulation ``iterations`` counts updates only (a tensor), the counter behind it
    every step."""
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    counter = getattr(optimizer, "_iterations", None)
    return counter if counter is not None else optimizer.iterations


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Broadcast ``root_rank``'s model and optimizer variables to every rank when training begins,
    and all of them once more after the first batch if that batch created variables.

    Put it in every rank's callbacks (it is collective), so every rank starts from the same
    weights.

    Args:
        root_rank: the rank whose variables every rank takes.
        device: accepted for compatibility.
        local_variables: variables each rank keeps (not broadcast).
    """

    def __init__(self, root_rank, device="", local_variables=None):
        super().__init__()
        self.root_rank = root_rank
        """The rank whose variables every rank takes."""
        self.local_variables = list(local_variables or [])
        """The variables each rank keeps."""
        self.broadcast_done = False
        """True once the last broadcast was made."""
        self._sent = None          # ids of the variables broadcast at train begin

    def register_local_var(self, var):
        """Keep ``var`` out of the broadcast: each rank keeps its own value (Horovod's method;
        the same as listing it in ``local_variables``).

        Args:
            var: a variable of the model or its optimizer.
        """
        self.local_variables.append(var)

    def _variables(self):
        local = {id(v) for v in self.local_variables}
        return [v for v in _model_variables(self.model) if id(v) not in local]

    def on_train_begin(self, logs=None):
        """Build the optimizer of a built model, then broadcast what exists if every rank has
        the same variables (collective: every rank); otherwise only the optimizer's step count
        is sent before the first batch has built them everywhere."""
        if self.broadcast_done or self._sent is not None:
            return
        optimizer = getattr(self.model, "optimizer", None)
        if self.model.built and optimizer is not None and not optimizer.built:
            # as Keras's own symbolic build does; else the first train step builds it while
            # tracing, tracing the step twice, where a rank that loaded a checkpoint (built)
            # traces once: their collectives' names would differ
            optimizer.build(self.model.trainable_variables)
        variables = self._variables()
        mine = [(tuple(v.shape), str(v.dtype)) for v in variables]
        ranks = _objects.allgather_object(mine, name="BroadcastGlobalVariablesCallback.check")
        self._sent = set()
        if all(theirs == mine for theirs in ranks):
            _functions.broadcast_variables(variables, self.root_rank,
                                           name="BroadcastGlobalVariablesCallback")
            self._sent = {id(v) for v in variables}
        elif optimizer is not None:
            # the step counter exists on every rank: the first batch must count the same step
            # everywhere (gradient accumulation's update steps, learning-rate schedules)
            _functions.broadcast_variables([_step_counter(optimizer)], self.root_rank,
                                           name="BroadcastGlobalVariablesCallback.iterations")

    def on_train_batch_end(self, batch, logs=None):
        """After the first batch: broadcast everything if that batch built variables, or if
        they differed at train begin (every rank runs the same model code: now they agree)."""
        if self.broadcast_done or self._sent is None:
            return
        variables = self._variables()
        if any(id(v) not in self._sent for v in variables):
            _functions.broadcast_variables(variables, self.root_rank,
                                           name="BroadcastGlobalVariablesCallback.built")
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """Replace every metric in the epoch-end logs by its average over the ranks, in one allreduce;
    put it before callbacks that read the logs (checkpoints, early stopping).

    Args:
        device: accepted for compatibility.
    """

    def __init__(self, device=""):
        super().__init__()

    def on_epoch_end(self, epoch, logs=None):
        """Replace ``logs[k]`` by its average over ranks (collective; same keys on every rank).

        Raises:
            MismatchError: ranks log different numbers of metrics.
        """
        if not logs:
            return
        keys = sorted(k for k in logs if np.ndim(logs[k]) == 0)
        values = np.array([float(logs[k]) for k in keys], np.float64)
        averaged = _ops.allreduce(values, op=_ops.Average, name="MetricAverageCallback").numpy()
        for key, value in zip(keys, averaged):
            logs[key] = float(value)


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Set the learning rate to ``initial_lr * multiplier(epoch)`` in the epochs from
    ``start_epoch`` up to (not including) ``end_epoch``.

    The optimizer's learning rate must be a number, not a schedule object.

    Args:
        initial_lr: the base learning rate.
        multiplier: a function of the epoch (fractional at each batch, unless ``staircase``),
            or a constant ``m``, which gives ``m ** (epoch - start_epoch)`` (exponential decay).
        start_epoch: the first epoch it applies to.
        end_epoch: the first epoch it no longer applies to (None: no end).
        staircase: set the rate once per epoch (True) or at every batch.
        momentum_correction: accepted; no effect (Keras 3 optimizers fix momentum when the
            train step is traced).
        steps_per_epoch: batches per epoch; default: what ``model.fit`` reports.
    Raises:
        ValueError: (when training begins or the rate is set) no ``steps_per_epoch`` for a
            per-batch schedule, or a learning rate that is a schedule object.
    """

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        self.initial_lr = initial_lr
        """The base learning rate."""
        # a constant decays the rate exponentially from start_epoch, as Horovod's code does
        self.multiplier = (multiplier if callable(multiplier)
                           else (lambda epoch: multiplier ** (epoch - start_epoch)))
        """The multiplier, as a function of the epoch."""
        self.start_epoch = start_epoch
        """The first epoch it applies to."""
        self.end_epoch = end_epoch
        """The first epoch it no longer applies to, or None for no end."""
        self.staircase = staircase
        """True to set the rate once per epoch, False to set it at every batch."""
        self.momentum_correction = momentum_correction
        """Accepted; no effect."""
        self.steps_per_epoch = steps_per_epoch
        """Batches per epoch (set from ``model.fit`` at train begin when None)."""
        self.current_epoch = 0
        """The epoch in progress."""

    def _in_range(self, epoch):
        return self.start_epoch <= epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _set_lr(self, epoch):
        optimizer = self.model.optimizer
        if isinstance(optimizer._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            raise ValueError("%s cannot set a learning rate that is a schedule object"
                             % type(self).__name__)
        optimizer.learning_rate = self.initial_lr * self.multiplier(epoch)

    def on_train_begin(self, logs=None):
        if self.steps_per_epoch is None:
            self.steps_per_epoch = self.params.get("steps")
        if not self.staircase and not self.steps_per_epoch:
            raise ValueError("%s needs steps_per_epoch when model.fit does not know it"
                             % type(self).__name__)

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch
        if self.staircase and self._in_range(epoch):
            self._set_lr(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        if not self.staircase and self._in_range(self.current_epoch):
            self._set_lr(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = float(np.asarray(self.model.optimizer.learning_rate))


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramp the learning rate from ``initial_lr / size`` to ``initial_lr`` over ``warmup_epochs``,
    at every batch (Goyal et al.): lr = initial_lr / size * (epoch * (size - 1) /
    warmup_epochs + 1), with epoch the fraction of epochs done at the end of the batch (as in
    Horovod); ``initial_lr`` exactly when it ends.

    Args:
        initial_lr: the learning rate reached at the end of the warmup.
        warmup_epochs: epochs of warmup.
        momentum_correction: accepted; no effect.
        steps_per_epoch: batches per epoch; default: what ``model.fit`` reports.
        verbose: if > 0, rank 0 prints the learning rate when the warmup ends.
    """

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            # as Horovod's: the batch's end, so the ramp reaches initial_lr at the last batch
            epoch += 1.0 / self.steps_per_epoch
            n = size()
            return 1.0 / n * (epoch * (n - 1) / warmup_epochs + 1)
        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.warmup_epochs = warmup_epochs
        """Epochs of warmup."""
        self.verbose = verbose
        """Rank 0 prints the learning rate when the warmup ends if > 0."""

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.warmup_epochs - 1:     # the ramp ends at initial_lr exactly
            self.model.optimizer.learning_rate = self.initial_lr
        super().on_epoch_end(epoch, logs)
        if epoch == self.warmup_epochs - 1 and self.verbose > 0 and rank() == 0:
            print("\nEpoch %d: finished gradual learning rate warmup to %g."
                  % (epoch + 1, self.initial_lr))


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Keras's ``ModelCheckpoint(save_best_only=True)``, whose ``filepath`` is set after it is
    made (Horovod's estimators set it): set ``callback.filepath`` (a ``.keras`` file, or
    ``.weights.h5`` with ``save_weights_only``) before training.

    Args:
        monitor, verbose, save_weights_only, mode, save_freq: as for
            ``keras.callbacks.ModelCheckpoint``.
    Raises:
        ValueError: (when training begins) no ``filepath`` set, or one Keras cannot save this
            way.
    """

    def __init__(self, monitor="val_loss", verbose=0, save_weights_only=False, mode="auto",
                 save_freq="epoch"):
        # Keras 3 checks the path's extension here: a stand-in passes, and is taken away
        super().__init__("best.weights.h5" if save_weights_only else "best.keras",
                         monitor=monitor, verbose=verbose, save_best_only=True,
                         save_weights_only=save_weights_only, mode=mode, save_freq=save_freq)
        self.filepath = None
        """Where to save the best model; set it before training."""

    def on_train_begin(self, logs=None):
        """Raises:
            ValueError: no ``filepath`` set, or one Keras cannot save this way.
        """
        ends = (".weights.h5",) if self.save_weights_only else (".keras", ".h5")
        if not self.filepath or not str(self.filepath).endswith(ends):
            raise ValueError("%s: set its filepath to a file ending in %s before training "
                             "(got %r)" % (type(self).__name__, " or ".join(ends), self.filepath))
        super().on_train_begin(logs)
