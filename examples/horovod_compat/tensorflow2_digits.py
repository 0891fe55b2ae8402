"""Horovod's documented TensorFlow 2 training loop, with only the import changed.

Written as a Horovod user writes it (init, scale the learning rate, wrap the tape,
broadcast after the first step, take 1/size of the steps, checkpoint on rank 0).
The two Keras 3 changes every Horovod user makes anyway are marked. Digits come
from scikit-learn instead of a download. Run with:

    smdistrun -np 2 python examples/horovod_compat/tensorflow2_digits.py
"""

import os
import tempfile

import keras
import tensorflow as tf
from sklearn.datasets import load_digits

import smdist_tf as hvd  # was: import horovod.tensorflow as hvd

hvd.init()

digits = load_digits()
images = (digits.data / 16.0).astype("float32")
labels = digits.target.astype("int64")
dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().shuffle(2000, seed=hvd.rank()).batch(32)

model = keras.Sequential([
    keras.Input((64,)),
    keras.layers.Dense(128, activation="relu"),
    keras.layers.Dense(10),
])
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
# Horovod: scale the learning rate by the number of workers.
opt = keras.optimizers.Adam(0.001 * hvd.size())

checkpoint_dir = os.environ.get("CHECKPOINT_DIR", tempfile.mkdtemp())
checkpoint = tf.train.Checkpoint(model=model, optimizer=opt)


@tf.function
def training_step(images, labels, first_batch):
    with tf.GradientTape() as tape:
        probs = model(images, training=True)
        loss_value = loss(labels, probs)

    # Horovod: add Horovod Distributed GradientTape.
    tape = hvd.DistributedGradientTape(tape)

    grads = tape.gradient(loss_value, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))

    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    # This is necessary to ensure consistent initialization of all workers when
    # training is started with random weights or restored from a checkpoint.
    #
    # Note: broadcast should be done after the first gradient step to ensure optimizer
    # initialization.
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)  # Keras 3: a list, not opt.variables()

    return loss_value


# Horovod: adjust the number of steps based on the number of workers.
steps = 400 // hvd.size()
for batch, (images, labels) in enumerate(dataset.take(steps)):
    loss_value = training_step(images, labels, batch == 0)
    if batch % 50 == 0 and hvd.local_rank() == 0:
        print("Step #%d\tLoss: %.6f" % (batch, loss_value))

# Every rank ends with the same weights; rank 0 alone saves them.
fingerprint = float(sum(tf.reduce_sum(v) for v in model.trainable_variables))
everyone = hvd.allgather_object(fingerprint)
if hvd.rank() == 0:
    checkpoint.save(os.path.join(checkpoint_dir, "ckpt"))
    print("final loss: %.6f" % loss_value)
    print("weights identical on all ranks:", all(f == everyone[0] for f in everyone))
