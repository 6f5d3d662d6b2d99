"""Keras training throughput: hvlite on 2 ranks vs tf.distribute.MultiWorkerMirroredStrategy on
2 localhost workers vs one process; and the per-call overhead of hvlite.tensorflow ops over the
raw hvlite NumPy call (4 KiB and 4 MiB float32, eager and inside tf.function).

    python bench/tf_training.py                # both tables (starts its own jobs)
    python bench/tf_training.py --smoke        # a few steps, to check it runs

The same model (an MLP on synthetic 784-feature rows, 10 classes) is trained with model.fit,
--batch rows per process per step: one process alone; hvlite (hvlrun -np 2, DistributedOptimizer,
each rank its own data); MultiWorkerMirroredStrategy (2 workers on localhost ports, TF_CONFIG,
global batch 2 x --batch; two Keras 3.15 bugs worked around, see keras_mwms_workarounds).
Each process gets cores / processes intra-op threads. samples/s
counts every process's rows over the timed steps (after --warmup steps). The overhead table
takes the median over calls of the slowest rank (harness.timed) under hvlrun -np 2, with the
same name every call (so the engine's response cache hits, as in training). Nothing is
asserted: this prints tables.
"""
import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64, help="rows per process per step")
    p.add_argument("--steps", type=int, default=60, help="timed steps")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--skip-overhead", action="store_true")
    p.add_argument("--worker", choices=["single", "hvlite", "mwms", "overhead"])
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--ports", default="")
    args = p.parse_args()
    if args.smoke:
        args.steps, args.warmup, args.hidden = 4, 2, 64
    return args


# ---- workers (one process each) ----

def setup_tf(processes):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    threads = max(1, (os.cpu_count() or 1) // processes)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    return tf


def build_model(keras, hidden):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(hidden, activation="relu"),
                              keras.layers.Dense(hidden, activation="relu"),
                              keras.layers.Dense(10)])
    return model


def timed_fit(keras, model, data, args):
    """Fit warmup + steps batches; return seconds spent in the timed steps."""
    marks = {}

    class Clock(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == args.warmup:
                marks["start"] = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            marks["end"] = time.perf_counter()
    model.fit(data, epochs=1, steps_per_epoch=args.warmup + args.steps, verbose=0,
              callbacks=[Clock()])
    return marks["end"] - marks["start"]


def dataset(tf, np, batch, seed):
    rng = np.random.default_rng(seed)
    x = rng.random((batch * 8, 784), np.float32)
    y = rng.integers(0, 10, batch * 8)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options)


def compile_model(keras, model, optimizer):
    model.compile(optimizer=optimizer, jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def keras_mwms_workarounds(tf, model):
    """Keras 3.15's model.fit fails under MultiWorkerMirroredStrategy with 2+ workers in two
    places: the symbolic build reduces the first batch (PerReplica of (x, y)) and the train
    step reduces every scalar metric with axis=0. Build with a plain batch, and return metrics
    as 1-element vectors (the reduction then gives scalars); the computation is unchanged."""
    model._symbolic_build(data_batch=(tf.zeros([1, 784]), tf.zeros([1], tf.int64)))
    model._maybe_symbolic_build = lambda *a, **k: None
    train_step = model.train_step
    model.train_step = lambda data: {k: tf.reshape(v, [1]) for k, v in train_step(data).items()}


def worker(args):
    import numpy as np
    if args.worker == "mwms":
        ports = args.ports.split(",")
        os.environ["TF_CONFIG"] = json.dumps({
            "cluster": {"worker": ["localhost:%s" % p for p in ports]},
            "task": {"type": "worker", "index": args.index}})
    processes = 1 if args.worker == "single" else 2
    tf = setup_tf(processes)
    import keras
    if args.worker == "mwms":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        with strategy.scope():
            model = build_model(keras, args.hidden)
            compile_model(keras, model, keras.optimizers.SGD(0.01))
        keras_mwms_workarounds(tf, model)
        seconds = timed_fit(keras, model, dataset(tf, np, args.batch * 2, 0), args)
        report = args.index == 0
    elif args.worker == "hvlite":
        import hvlite.tensorflow.keras as hvd
        hvd.init()
        model = build_model(keras, args.hidden)
        compile_model(keras, model, hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)))
        seconds = timed_fit(keras, model, dataset(tf, np, args.batch, hvd.rank()), args)
        seconds = float(hvd.allreduce(seconds, op=hvd.Max, name="bench.seconds"))
        report = hvd.rank() == 0
    else:
        model = build_model(keras, args.hidden)
        compile_model(keras, model, keras.optimizers.SGD(0.01))
        seconds = timed_fit(keras, model, dataset(tf, np, args.batch, 0), args)
        report = True
    if report:
        samples = args.batch * processes * args.steps
        print("RESULT " + json.dumps({"seconds": seconds, "samples_per_s": samples / seconds,
                                      "params": model.count_params()}), flush=True)


def overhead_worker(args):
    """Median per-call time: raw hvlite vs hvlite.tensorflow eager vs inside tf.function."""
    tf = setup_tf(2)
    import numpy as np
    from mpi4py import MPI
    import hvlite
    import hvlite.tensorflow as hvd
    from harness import human, ms, timed
    from tables import print_table
    hvd.init()
    comm = MPI.COMM_WORLD
    iters = 10 if args.smoke else 200
    rows = []
    for nbytes in (4 * 1024, 4 * 1024 * 1024):
        array = np.ones(nbytes // 4, np.float32)
        tensor = tf.constant(array)
        graph = tf.function(lambda x: hvd.allreduce(x, op=hvd.Sum, name="tf.graph"))
        t_raw = timed(lambda: hvlite.allreduce(array, op=hvlite.Sum, name="raw"), comm, iters, 10)
        t_eager = timed(lambda: hvd.allreduce(tensor, op=hvd.Sum, name="tf.eager"), comm, iters, 10)
        t_graph = timed(lambda: graph(tensor), comm, iters, 10)
        rows.append([human(nbytes), ms(t_raw), ms(t_eager), "%+.0f" % ((t_eager - t_raw) * 1e6),
                     ms(t_graph), "%+.0f" % ((t_graph - t_raw) * 1e6)])
    if comm.rank == 0:
        print_table("allreduce Sum float32, %d ranks: raw hvlite vs hvlite.tensorflow (ms; "
                    "overhead in us)" % comm.size,
                    ["size", "raw numpy", "tf eager", "overhead", "tf.function", "overhead"], rows)


# ---- driver ----

def free_ports(n):
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def run(cmd, timeout=600):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                          stdin=subprocess.DEVNULL)


def result_of(output, what):
    match = re.search(r"RESULT (\{.*\})", output)
    if not match:
        print("%s failed:\n%s" % (what, output[-3000:]), file=sys.stderr)
        return None
    return json.loads(match.group(1))


def worker_cmd(args, kind, *extra):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--batch", str(args.batch),
           "--hidden", str(args.hidden)]
    return cmd + (["--smoke"] if args.smoke else ["--steps", str(args.steps),
                                                   "--warmup", str(args.warmup)]) + list(extra)


def hvlrun(args, kind):
    return run([sys.executable, "-m", "hvlite.runner", "-np", "2"] + worker_cmd(args, kind))


def run_mwms(args):
    ports = ",".join(str(p) for p in free_ports(2))
    procs = [subprocess.Popen(worker_cmd(args, "mwms", "--index", str(i), "--ports", ports),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              stdin=subprocess.DEVNULL) for i in range(2)]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    return result_of(outputs[0], "MultiWorkerMirroredStrategy") if procs[0].returncode == 0 else \
        result_of("".join(outputs), "MultiWorkerMirroredStrategy")


def driver(args):
    from tables import print_table
    single = result_of(run(worker_cmd(args, "single")).stdout, "single process")
    job = hvlrun(args, "hvlite")
    hvl = result_of(job.stdout + job.stderr, "hvlite")
    mwms = run_mwms(args)
    rows = []
    for label, procs, res in (("1 process", 1, single), ("hvlite, 2 ranks", 2, hvl),
                              ("MultiWorkerMirroredStrategy, 2 workers", 2, mwms)):
        if res is None:
            rows.append([label, str(procs), "-", "-", "-", "-"])
            continue
        rows.append([label, str(procs), "%.0f" % res["samples_per_s"],
                     "%.2f" % (res["seconds"] / args.steps * 1e3),
                     "%.2fx" % (res["samples_per_s"] / single["samples_per_s"]) if single else "-",
                     "%.2fx" % (res["samples_per_s"] / mwms["samples_per_s"]) if mwms else "-"])
    params = (single or hvl or mwms or {}).get("params", 0)
    print_table("Keras model.fit, MLP 784-%d-%d-10 (%d params), batch %d per process, %d timed "
                "steps, %d cores" % (args.hidden, args.hidden, params, args.batch, args.steps,
                                     os.cpu_count() or 1),
                ["setup", "procs", "samples/s", "ms/step", "vs 1 process", "vs MWMS"], rows)
    if not args.skip_overhead:
        job = hvlrun(args, "overhead")
        print("\n".join(re.sub(r"^\[0\]<stdout>: ?", "", line) for line in job.stdout.splitlines()
                        if line.startswith("[0]<stdout>")))


def main():
    args = parse()
    if args.worker == "overhead":
        overhead_worker(args)
    elif args.worker:
        worker(args)
    else:
        driver(args)


if __name__ == "__main__":
    main()
