"""Horovod's ``hvd.SyncBatchNormalization`` for Keras 3 on TensorFlow: batch normalization whose
training-time statistics are those of the global batch, every rank's samples together.

Use it in place of ``keras.layers.BatchNormalization`` where each rank's batch is too small for
good statistics; every rank must run the layer in the same order.

Contract:
- ``SyncBatchNormalization(**kwargs)`` takes ``keras.layers.BatchNormalization``'s arguments
  (``axis``, ``momentum``, ``epsilon``, ``center``, ``scale``, initializers, ``renorm``, ...) and
  Horovod's ``fused``, which must be ``False`` (``True`` or ``None`` raises ``ValueError``, as in
  Horovod); ``synchronized=True`` is refused too (that is tf.distribute's synchronisation).
- In training (``training=True`` and the layer trainable) the mean and variance over the
  reduction axes are computed over every rank's batch: the element count and sum are
  allreduced first, then the sum of squared deviations from the global mean (two passes, so a
  large mean does not cost precision). Ranks may hold different batch sizes, and a Keras mask
  weighs samples as in ``BatchNormalization``. The moving statistics are updated from these
  global moments, so they stay the same on every rank. Gradients flow through the allreduces.
- Inference uses the moving statistics, with no communication.
- Every rank of the global process set must run the layer in the same order (it is two
  collectives per training call): a rank that skips one leaves the others waiting, which the
  engine reports as a deadlock. The collectives run eagerly and inside ``tf.function``.
- Like Keras's own layer, float16/bfloat16 inputs are normalised in float32.
- Models holding the layer load with ``hvlite.tensorflow.keras.load_model`` (which registers
  it); ``keras.models.load_model`` needs ``hvlite.tensorflow.SyncBatchNormalization`` touched
  first, or passed in ``custom_objects``. The layer never runs under XLA (``supports_jit``).
"""
import keras
import tensorflow as tf

from .ops import Sum, allreduce, grouped_allreduce

__all__ = ["SyncBatchNormalization"]


@keras.saving.register_keras_serializable(package="hvlite")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalization whose training-time mean and variance are those of every rank's
    batch together; inference uses the moving statistics, with no communication.

    Each training call is two allreduces over every rank: every rank must run the layer, in
    the same order (eagerly or inside ``tf.function``; never under XLA). Float16 and bfloat16
    inputs are normalized in float32, as Keras's own layer does.

    Args:
        fused: Horovod's; must be False.
        **kwargs: ``keras.layers.BatchNormalization``'s arguments (``axis``, ``momentum``,
            ``epsilon``, ``center``, ``scale``, the initializers, ``renorm``, ...).
    Raises:
        ValueError: ``fused`` True or None (as in Horovod), or ``synchronized=True`` (that
            is ``tf.distribute``'s synchronization).
    """

    def __init__(self, fused=False, **kwargs):
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support fused=True (or None): its "
                             "statistics come from hvlite's allreduce, not a fused kernel")
        if kwargs.get("synchronized"):
            raise ValueError("SyncBatchNormalization synchronises through hvlite; "
                             "synchronized=True (tf.distribute's) does not apply")
        super().__init__(**kwargs)
        self.supports_jit = False       # XLA cannot run the engine's tf.numpy_function

    def _moments(self, inputs, mask):
        axes = list(self._reduction_axes)
        if mask is None:
            keep = None
            local_sum = tf.reduce_sum(inputs, axes, keepdims=True)
            per_channel = tf.size(inputs) // tf.maximum(tf.size(local_sum), 1)
            count = tf.ones_like(local_sum) * tf.cast(per_channel, inputs.dtype)
        else:       # as Keras: masked positions are zeroed (a NaN in padding stays out)
            keep = tf.broadcast_to(tf.expand_dims(tf.cast(mask, tf.bool), -1), tf.shape(inputs))
            inputs = tf.where(keep, inputs, tf.zeros_like(inputs))
            count = tf.reduce_sum(tf.cast(keep, inputs.dtype), axes, keepdims=True)
            local_sum = tf.reduce_sum(inputs, axes, keepdims=True)
        total_count, total_sum = grouped_allreduce([count, local_sum], op=Sum)
        mean = tf.math.divide_no_nan(total_sum, total_count)
        deviation = tf.square(inputs - mean)
        if keep is not None:
            deviation = tf.where(keep, deviation, tf.zeros_like(deviation))
        total_squares = allreduce(tf.reduce_sum(deviation, axes, keepdims=True), op=Sum)
        variance = tf.math.divide_no_nan(total_squares, total_count)
        return tf.squeeze(mean, axes), tf.squeeze(variance, axes)
