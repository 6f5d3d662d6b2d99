"""``hvd.elastic`` for Keras 3: ``KerasState`` and Horovod's elastic callbacks.

Keep the model in a ``KerasState(model, epoch=0, batch=0)``, give ``model.fit`` the three
callbacks below (they record the epoch and batch, and commit), and run ``fit`` inside a
function decorated with ``run``: an elastic ``hvlrun`` then goes on from the last commit when
workers are lost or added. The :doc:`elastic guide </guides/elastic>` walks through it.

Contract: ``run``, ``State``, ``ObjectState``, ``HostsUpdatedInterrupt`` and
``KerasState(model, optimizer=None, **kwargs)`` (the same as
``hvlite.tensorflow.elastic.TensorFlowKerasState``), plus the callbacks, which keep
``state.epoch``/``state.batch`` and commit during ``model.fit``. Every rank uses the same
callbacks. Their order in the list does not matter:
  * ``UpdateEpochStateCallback(state)``: at each epoch's end ``state.epoch`` becomes the number
    of epochs done (counting from ``state.epoch`` when ``fit`` began, whether ``fit`` numbers
    its epochs from 0 or from ``initial_epoch``).
  * ``UpdateBatchStateCallback(state)``: after each batch ``state.batch`` is the number of
    batches done in the current epoch (counting from ``state.batch`` at the epoch's start, so a
    world that resumes mid-epoch, fitting only the remaining batches, keeps counting); 0 at
    the epoch's end.
  * ``CommitStateCallback(state, batches_per_commit=1)``: commits after every
    ``batches_per_commit`` batches and at each epoch's end (as Horovod's). The commit runs when
    the other callbacks have recorded that batch or epoch: at the start of the next batch or
    epoch, or at the end of training.
  Keras 3 cannot skip batches inside an epoch: to resume mid-epoch, fit the epoch's remaining
  batches (``steps_per_epoch - state.batch``, or the remaining data) and go on from there.
"""
import keras

from ..elastic import (HostsUpdatedInterrupt, ObjectState, State,
                       TensorFlowKerasState as KerasState, run)

__all__ = ["run", "State", "ObjectState", "KerasState", "HostsUpdatedInterrupt",
           "CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback"]


class CommitStateCallback(keras.callbacks.Callback):
    """Commit ``state`` every ``batches_per_commit`` batches and at each epoch's end, once the
    other callbacks have recorded that batch or epoch (at the start of the next one, or at the
    end of training).

    Args:
        state: the elastic state to commit (usually a ``KerasState``).
        batches_per_commit: batches between commits.
    Raises:
        ValueError: ``batches_per_commit`` < 1.
    """

    def __init__(self, state: State, batches_per_commit: int = 1) -> None:
        super().__init__()
        if batches_per_commit < 1:
            raise ValueError("batches_per_commit must be at least 1")
        self.state = state
        """The state it commits."""
        self.batches_per_commit = batches_per_commit
        """Batches between commits."""
        self._since = 0
        self._due = False

    def commit(self) -> None:
        """Commit the state now (what the callback does when a commit is due)."""
        self.state.commit()

    def _commit_if_due(self) -> None:
        if self._due:
            self._due = False
            self.commit()

    def on_train_batch_end(self, batch, logs=None):
        self._since += 1
        if self._since >= self.batches_per_commit:
            self._since, self._due = 0, True

    def on_train_batch_begin(self, batch, logs=None):
        self._commit_if_due()

    def on_epoch_begin(self, epoch, logs=None):
        self._commit_if_due()

    def on_epoch_end(self, epoch, logs=None):
        self._since, self._due = 0, True

    def on_train_end(self, logs=None):
        self._commit_if_due()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keep ``state.batch`` equal to the batches done in the current epoch, counting on from its
    value when the epoch began (so a world that resumes mid-epoch keeps counting); 0 at the
    epoch's end.

    Args:
        state: the elastic state, with a ``batch`` attribute.
    """

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state
        """The state whose counter it keeps."""
        self._offset = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._offset = self.state.batch

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = self._offset + batch + 1

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = self._offset = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keep ``state.epoch`` equal to the epochs done, counting on from its value when ``fit`` began.

    Args:
        state: the elastic state, with an ``epoch`` attribute.
    """

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state
        """The state whose counter it keeps."""
        self._base = 0
        self._first = None

    def on_train_begin(self, logs=None):
        self._base, self._first = self.state.epoch, None

    def on_epoch_begin(self, epoch, logs=None):
        if self._first is None:
            self._first = epoch

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = self._base + (epoch - self._first) + 1
