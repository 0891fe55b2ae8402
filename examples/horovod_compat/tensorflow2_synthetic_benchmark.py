"""Horovod's TensorFlow 2 synthetic benchmark (custom loop), as Horovod users write it, import changed.

A `tf.function` step with `hvd.DistributedGradientTape`, rank 0's model and optimizer state
broadcast after the first step, `timeit` iterations on random images. The one Keras 3 change
Horovod's example needs is marked: `opt.variables` is a list in Keras 3, a method in Keras 2.
Run with (``--use-adasum``: gradients combined with Adasum, docs/api.md#adasum):

    smdistrun -np 2 python examples/horovod_compat/tensorflow2_synthetic_benchmark.py [--use-adasum]
"""

import argparse
import timeit

import keras
import numpy as np
import tensorflow as tf

import smdist_tf as hvd  # was: import horovod.tensorflow as hvd

parser = argparse.ArgumentParser(description="TensorFlow 2 synthetic benchmark")
parser.add_argument("--fp16-allreduce", action="store_true", default=False, help="fp16 compression in allreduce")
parser.add_argument("--use-adasum", action="store_true", default=False, help="combine gradients with Adasum")
parser.add_argument("--batch-size", type=int, default=16, help="input batch size")
parser.add_argument("--num-warmup-batches", type=int, default=2, help="batches before timing")
parser.add_argument("--num-batches-per-iter", type=int, default=3, help="batches per timed iteration")
parser.add_argument("--num-iters", type=int, default=3, help="timed iterations")
args = parser.parse_args()

hvd.init()

model = keras.Sequential([
    keras.Input((32, 32, 3)),
    keras.layers.Conv2D(16, 3, activation="relu"),
    keras.layers.GlobalAveragePooling2D(),
    keras.layers.Dense(10),
])
opt = keras.optimizers.SGD(0.01)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

data = tf.random.uniform([args.batch_size, 32, 32, 3], seed=hvd.rank())
target = tf.random.uniform([args.batch_size, 1], minval=0, maxval=10, dtype=tf.int64, seed=hvd.rank())


@tf.function
def benchmark_step(first_batch):
    with tf.GradientTape() as tape:
        probs = model(data, training=True)
        loss = loss_fn(target, probs)
    tape = hvd.DistributedGradientTape(tape, compression=compression, op=hvd.Adasum if args.use_adasum else hvd.Average)
    gradients = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(gradients, model.trainable_variables))
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)  # Keras 3: a list (Keras 2: opt.variables())


benchmark_step(first_batch=True)
timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_warmup_batches)
img_secs = []
for x in range(args.num_iters):
    seconds = timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_batches_per_iter)
    img_sec = args.batch_size * args.num_batches_per_iter / seconds
    if hvd.rank() == 0:
        print(f"Iter #{x}: {img_sec:.1f} img/sec per CPU")
    img_secs.append(img_sec)
weights = hvd.allgather_object(np.concatenate([w.numpy().ravel() for w in model.trainable_variables]))
if hvd.rank() == 0:
    print(f"Img/sec per CPU: {np.mean(img_secs):.1f}")
    print(f"weights identical on all ranks: {all(np.array_equal(w, weights[0]) for w in weights)}")
