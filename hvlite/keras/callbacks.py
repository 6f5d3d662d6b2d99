"""``horovod.keras.callbacks`` under hvlite's name: the callbacks of
``hvlite.tensorflow.keras.callbacks`` (see there), with ``BestModelCheckpoint`` taking
``horovod.keras``'s parameters (it saves whole models: no ``save_weights_only``).
"""
from ..tensorflow.keras import callbacks as _callbacks
from ..tensorflow.keras.callbacks import (BroadcastGlobalVariablesCallback,  # noqa: F401
                                          LearningRateScheduleCallback,
                                          LearningRateWarmupCallback, MetricAverageCallback)

__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback", "BestModelCheckpoint"]


class BestModelCheckpoint(_callbacks.BestModelCheckpoint):
    """Keras's ``ModelCheckpoint(save_best_only=True)`` of whole models, whose ``filepath`` (a
    ``.keras`` file) is set after it is made; ``fit`` raises ``ValueError`` without it.

    Args:
        monitor, verbose, mode, save_freq: as for ``keras.callbacks.ModelCheckpoint``.
    """

    def __init__(self, monitor="val_loss", verbose=0, mode="auto", save_freq="epoch"):
        super().__init__(monitor=monitor, verbose=verbose, save_weights_only=False, mode=mode,
                         save_freq=save_freq)
