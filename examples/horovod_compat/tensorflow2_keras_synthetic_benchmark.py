"""Horovod's Keras synthetic benchmark, as Horovod users write it, with only the import changed.

Keras `fit` on random images with `hvd.DistributedOptimizer`, rank 0's weights broadcast by
a callback, throughput timed by a callback. The one Keras 3 change Horovod's example needs is marked:
`compile` no longer takes `experimental_run_tf_function`. A small convolutional model by default
(`--model ResNet50` takes Keras' application, untrained). Run with:

    smdistrun -np 2 python examples/horovod_compat/tensorflow2_keras_synthetic_benchmark.py
"""

import argparse
import time

import keras
import numpy as np
import tensorflow as tf

import smdist_tf.keras as hvd  # was: import horovod.tensorflow.keras as hvd

parser = argparse.ArgumentParser(description="Keras synthetic benchmark")
parser.add_argument("--fp16-allreduce", action="store_true", default=False, help="fp16 compression in allreduce")
parser.add_argument("--model", default="small", help="'small', or a keras.applications model name")
parser.add_argument("--batch-size", type=int, default=16, help="input batch size")
parser.add_argument("--num-warmup-batches", type=int, default=2, help="batches before timing")
parser.add_argument("--num-batches-per-iter", type=int, default=3, help="batches per timed iteration")
parser.add_argument("--num-iters", type=int, default=3, help="timed iterations")
args = parser.parse_args()

hvd.init()

if args.model == "small":
    model = keras.Sequential([
        keras.Input((32, 32, 3)),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])
    shape, classes = (32, 32, 3), 10
else:
    model = getattr(keras.applications, args.model)(weights=None)
    shape, classes = (224, 224, 3), 1000

opt = keras.optimizers.SGD(0.01)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
opt = hvd.DistributedOptimizer(opt, compression=compression)
# Horovod's example also passes experimental_run_tf_function=False, a Keras 2 argument Keras 3 refuses
# (docs/migrate-from-horovod.md): the one line a Horovod user changes here.
model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer=opt)

data = tf.random.uniform([args.batch_size, *shape], seed=hvd.rank())
target = tf.random.uniform([args.batch_size, 1], minval=0, maxval=classes, dtype=tf.int64, seed=hvd.rank())
dataset = tf.data.Dataset.from_tensors((data, target)).cache().repeat()  # each element is one batch


class TimingCallback(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.img_secs = []

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.time()

    def on_epoch_end(self, epoch, logs=None):
        img_sec = args.batch_size * args.num_batches_per_iter / (time.time() - self.start)
        if hvd.rank() == 0:
            print(f"Iter #{epoch}: {img_sec:.1f} img/sec per CPU")
        if epoch > 0:  # the first includes compiling the step
            self.img_secs.append(img_sec)


timing = TimingCallback()
callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), timing]
# Warm up, then time (the same number of steps on every rank: fit's steps_per_epoch fixes it).
model.fit(dataset, steps_per_epoch=args.num_warmup_batches, epochs=1, verbose=0,
          callbacks=callbacks, shuffle=False)
model.fit(dataset, steps_per_epoch=args.num_batches_per_iter, epochs=args.num_iters,
          verbose=0, callbacks=callbacks, shuffle=False)
if hvd.rank() == 0:
    per_cpu = np.mean(timing.img_secs)
    print(f"Img/sec per CPU: {per_cpu:.1f}")
    print(f"Total img/sec on {hvd.size()} CPU(s): {hvd.size() * per_cpu:.1f}")
