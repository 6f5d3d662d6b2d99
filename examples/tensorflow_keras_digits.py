"""Keras 3 model.fit on scikit-learn's digits, data-parallel with hvlite.

    hvlrun -np 2 python examples/tensorflow_keras_digits.py [--epochs 20]

A Horovod Keras script with only its import changed: every rank trains on its shard of the
training set (rows rank::size), DistributedOptimizer averages the gradients, the callbacks
broadcast rank 0's initial weights, warm the learning rate up (scaled by the number of
ranks) and average the logged metrics; rank 0 prints the test accuracy, averaged over every
rank's shard of the test set.
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import hvlite.tensorflow.keras as hvd  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.01, help="per rank; scaled by size")
    args = parser.parse_args()

    hvd.init()
    threads = max(1, (os.cpu_count() or 1) // hvd.local_size())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    keras.utils.set_random_seed(1234 + hvd.rank())   # different inits: the broadcast fixes it

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0)
    shard = slice(hvd.rank(), None, hvd.size())

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    lr = args.lr * hvd.size()
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9))
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], jit_compile=False)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback(),
                 hvd.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=3)]
    model.fit(x_train[shard], y_train[shard], batch_size=args.batch_size, epochs=args.epochs,
              callbacks=callbacks, verbose=2 if hvd.rank() == 0 else 0)

    loss, accuracy = model.evaluate(x_test[shard], y_test[shard], verbose=0)
    accuracy = float(hvd.allreduce(accuracy, name="test_accuracy"))
    if hvd.rank() == 0:
        print("ranks %d, test accuracy %.4f" % (hvd.size(), accuracy))


if __name__ == "__main__":
    main()
