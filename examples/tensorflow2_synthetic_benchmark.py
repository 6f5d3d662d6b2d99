"""Synthetic-data training throughput with DistributedGradientTape inside tf.function.

    hvlrun -np 2 python examples/tensorflow2_synthetic_benchmark.py [--model mlp|cnn|ResNet50]

Horovod's TensorFlow 2 synthetic benchmark, with only its import changed: random images and
labels, one tf.function training step (forward, DistributedGradientTape, optimizer update),
rank 0's variables broadcast after the first step, then --num-iters timed rounds of
--num-batches-per-iter steps. Prints samples/s per rank and in total (mean +- 1.96 sd).
"""
import argparse
import os
import timeit

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvlite.tensorflow as hvd  # noqa: E402


def build_model(name, image_size, classes):
    if name == "mlp":
        return keras.Sequential([keras.Input((image_size, image_size, 3)), keras.layers.Flatten(),
                                 keras.layers.Dense(512, activation="relu"),
                                 keras.layers.Dense(512, activation="relu"),
                                 keras.layers.Dense(classes)])
    if name == "cnn":
        return keras.Sequential([keras.Input((image_size, image_size, 3)),
                                 keras.layers.Conv2D(32, 3, activation="relu"),
                                 keras.layers.MaxPooling2D(),
                                 keras.layers.Conv2D(64, 3, activation="relu"),
                                 keras.layers.GlobalAveragePooling2D(),
                                 keras.layers.Dense(classes)])
    return getattr(keras.applications, name)(weights=None, input_shape=(image_size, image_size, 3),
                                             classes=classes)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", help="mlp, cnn or a keras.applications name")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--num-warmup-batches", type=int, default=5)
    parser.add_argument("--num-batches-per-iter", type=int, default=10)
    parser.add_argument("--num-iters", type=int, default=5)
    parser.add_argument("--fp16-allreduce", action="store_true")
    args = parser.parse_args()

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(
        max(1, (os.cpu_count() or 1) // hvd.local_size()))
    model = build_model(args.model, args.image_size, 10)
    optimizer = keras.optimizers.SGD(0.01)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    rng = np.random.default_rng(hvd.rank())
    data = tf.constant(rng.random((args.batch_size, args.image_size, args.image_size, 3), np.float32))
    target = tf.constant(rng.integers(0, 10, args.batch_size))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(first_batch):
        with tf.GradientTape() as tape:
            loss = loss_fn(target, model(data, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:   # Python bool: traced once with the broadcast, once without
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables, root_rank=0)
        return loss

    def log(text):
        if hvd.rank() == 0:
            print(text, flush=True)

    log("Model %s, batch size %d per rank, %d ranks" % (args.model, args.batch_size, hvd.size()))
    step(True)
    timeit.timeit(lambda: step(False), number=args.num_warmup_batches)
    rates = []
    for i in range(args.num_iters):
        seconds = timeit.timeit(lambda: step(False), number=args.num_batches_per_iter)
        rate = args.batch_size * args.num_batches_per_iter / seconds
        log("Iter #%d: %.1f samples/sec per rank" % (i, rate))
        rates.append(rate)
    mean, conf = np.mean(rates), 1.96 * np.std(rates)
    log("Samples/sec per rank: %.1f +-%.1f" % (mean, conf))
    log("Total samples/sec on %d rank(s): %.1f +-%.1f" % (hvd.size(), hvd.size() * mean,
                                                          hvd.size() * conf))


if __name__ == "__main__":
    main()
