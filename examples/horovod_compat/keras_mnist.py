"""Horovod's Keras MNIST example (the "advanced" one), run on smdist_tf by changing the import.

Written the way a ``horovod.tensorflow.keras`` script is: initialise, pin the GPU by
local rank, scale the learning rate by the number of ranks, wrap the optimizer, warm
the learning rate up and then decay it by schedule, broadcast rank 0's initial state,
average the metrics, checkpoint on rank 0 and resume from the latest checkpoint with
``hvd.load_model``. The data are scikit-learn's 8×8 digits instead of a download. Run
it again with more ``--epochs`` and the same ``--checkpoint-dir`` to resume:

    smdistrun -np 2 python examples/horovod_compat/keras_mnist.py
"""

from __future__ import annotations

import argparse
import os
import tempfile

import keras
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import smdist_tf.keras as hvd  # was: import horovod.tensorflow.keras as hvd

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--base-lr", type=float, default=0.05, help="learning rate of one rank")
parser.add_argument("--warmup-epochs", type=int, default=2)
# A fixed folder outside the working tree, so a second run resumes and the checkout stays clean.
parser.add_argument("--checkpoint-dir", default=os.path.join(tempfile.gettempdir(), "smdist_keras_mnist_checkpoints"))
args = parser.parse_args()
checkpoint_format = os.path.join(args.checkpoint_dir, "checkpoint-{epoch}.keras")

# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin GPU to be used to process local rank (one GPU per process).
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

x, y = load_digits(return_X_y=True)
x = (x / 16.0).astype("float32")
x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)

# Horovod: each rank trains on its own shard. Equal shards, so every rank runs the same steps.
per_rank = len(x_train) // hvd.size()
mine = slice(hvd.rank() * per_rank, (hvd.rank() + 1) * per_rank)
train = (tf.data.Dataset.from_tensor_slices((x_train[mine], y_train[mine]))
         .shuffle(per_rank, seed=hvd.rank()).repeat().batch(args.batch_size))
steps_per_epoch = per_rank // args.batch_size
x_val, y_val = x_test[hvd.rank()::hvd.size()], y_test[hvd.rank()::hvd.size()]

# Horovod: rank 0 looks for the latest checkpoint and tells the others which epoch to resume from.
resume_from_epoch = 0
for try_epoch in range(args.epochs, 0, -1):
    if os.path.exists(checkpoint_format.format(epoch=try_epoch)):
        resume_from_epoch = try_epoch
        break
resume_from_epoch = int(hvd.broadcast(resume_from_epoch, 0, name="resume_from_epoch"))

# Horovod: scale the learning rate by the number of ranks.
scaled_lr = args.base_lr * hvd.size()

# Horovod: restore from the checkpoint with hvd.load_model (its optimizer comes back distributed);
# the other ranks start fresh and get rank 0's state from BroadcastGlobalVariablesCallback.
if resume_from_epoch > 0 and hvd.rank() == 0:
    model = hvd.load_model(checkpoint_format.format(epoch=resume_from_epoch))
else:
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dropout(0.25),
        keras.layers.Dense(10, activation="softmax"),
    ])
    # Horovod: add Horovod Distributed Optimizer.
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=scaled_lr, momentum=0.9))
    model.compile(loss="sparse_categorical_crossentropy", optimizer=opt, metrics=["accuracy"])

callbacks = [
    # Horovod: broadcast initial variable states from rank 0 to all other processes, so that
    # every rank starts from the same random weights or from the restored checkpoint.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    # Horovod: average metrics among workers at the end of every epoch.
    hvd.callbacks.MetricAverageCallback(),
    # Horovod: ramp the learning rate up from scaled_lr / size() over the first epochs.
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=args.warmup_epochs, verbose=1),
    # Horovod: then keep it, and divide it by 10 twice.
    hvd.callbacks.LearningRateScheduleCallback(initial_lr=scaled_lr, start_epoch=args.warmup_epochs, end_epoch=6,
                                               multiplier=1.0),
    hvd.callbacks.LearningRateScheduleCallback(initial_lr=scaled_lr, start_epoch=6, end_epoch=8, multiplier=1e-1),
    hvd.callbacks.LearningRateScheduleCallback(initial_lr=scaled_lr, start_epoch=8, multiplier=1e-2),
    # Horovod: keep the model with the best (averaged) validation loss; only rank 0 writes it.
    hvd.callbacks.BestModelCheckpoint(monitor="val_loss", filepath=os.path.join(args.checkpoint_dir, "best.keras")),
]

# Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
if hvd.rank() == 0:
    callbacks.append(keras.callbacks.ModelCheckpoint(checkpoint_format))
    callbacks.append(keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: print(
        f"epoch {epoch + 1}: lr {logs['lr']:.6f}  loss {logs['loss']:.4f}  accuracy {logs['accuracy']:.4f}  "
        f"val_loss {logs['val_loss']:.4f}", flush=True)))
    print(f"{hvd.size()} rank(s), {steps_per_epoch} steps per epoch, resuming from epoch {resume_from_epoch}",
          flush=True)

model.fit(train, steps_per_epoch=steps_per_epoch, epochs=args.epochs, initial_epoch=resume_from_epoch,
          callbacks=callbacks, validation_data=(x_val, y_val), verbose=0)

# Horovod: average the test score of every rank's part of the test set.
score = hvd.allreduce(model.evaluate(x_val, y_val, verbose=0), name="test_score")
checksum = tf.add_n([tf.reduce_sum(tf.cast(w, tf.float64)) for w in model.get_weights()])
in_sync = bool(tf.reduce_all(tf.equal(hvd.allgather(checksum), checksum)))
if hvd.rank() == 0:
    print(f"Test loss: {float(score[0]):.4f}", flush=True)
    print(f"Test accuracy: {float(score[1]):.4f}", flush=True)
    print(f"optimizer iterations: {int(model.optimizer.iterations.numpy())}", flush=True)
    print(f"weights identical on all ranks: {in_sync}", flush=True)
