"""A Horovod TensorFlow 2 loop over uneven shards, finished with ``hvd.join()``.

Each rank trains on its own shard of scikit-learn's digits, and the shards differ in
length: without ``join()`` the rank with fewer batches would leave the others waiting
in their last gradient allreduce forever. The rank that runs out joins; the others'
allreduces then average over the ranks that still have data, and the weights are
re-synchronised from the rank that joined last. Run with:

    smdistrun -np 2 python examples/horovod_compat/tensorflow2_uneven_join.py
"""

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import smdist_tf as hvd  # was: import horovod.tensorflow as hvd

hvd.init()

digits = load_digits()
images = (digits.data / 16.0).astype("float32")
labels = digits.target.astype("int64")
# 1,797 samples in batches of 32: 57 batches, so the shards cannot be equal.
dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(32).shard(hvd.size(), hvd.rank())

model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
opt = keras.optimizers.SGD(0.05 * hvd.size())


@tf.function
def training_step(images, labels):
    with tf.GradientTape() as tape:
        loss_value = loss(labels, model(images, training=True))
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss_value, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss_value


model.build((None, 64))
opt.build(model.trainable_variables)
hvd.broadcast_variables(model.variables + opt.variables, root_rank=0)

for epoch in range(3):
    batches = 0
    for images_batch, labels_batch in dataset:
        loss_value = training_step(images_batch, labels_batch)
        batches += 1
    # Out of data: wait for the others while taking part in their collectives.
    last = hvd.join()
    hvd.broadcast_variables(model.variables + opt.variables, root_rank=last)
    counts = hvd.allgather_object(batches)
    if hvd.rank() == 0:
        print("epoch %d: batches per rank %s, last to join: rank %d" % (epoch, counts, last))

fingerprint = float(np.sum([np.sum(v.numpy()) for v in model.trainable_variables]))
everyone = hvd.allgather_object(fingerprint)
if hvd.rank() == 0:
    print("weights identical on all ranks:", all(f == everyone[0] for f in everyone))
