"""smdist_tf.elastic in one process (a job of size 1): save/restore/sync, commits on disk, resume, callbacks.

The multi-rank behaviour (a rank killed, smdistrun restarting the job, rank 0's commit
reaching every rank) is in test_elastic_multiprocess.py.
"""

from __future__ import annotations

import json
import os
import tempfile
from unittest import mock

import keras
import numpy as np
import tensorflow as tf

import smdist_tf as sd
from smdist_tf.elastic.commit_store import MANIFEST, CommitStore


def small_model(units: int = 3, seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(units)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def train_steps(model: keras.Model, steps: int) -> None:
    rng = np.random.default_rng(steps)
    x = rng.normal(size=(8 * steps, 4)).astype(np.float32)
    y = rng.normal(size=(8 * steps, model.output_shape[-1])).astype(np.float32)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)


def values(variables) -> list[np.ndarray]:
    return [np.array(v.numpy()) for v in variables]


class _RecordingState(sd.elastic.ObjectState):
    """An ObjectState that remembers (epoch, batch) at every commit."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.commits: list[tuple[int, int]] = []

    def commit(self) -> None:
        super().commit()
        self.commits.append((self.epoch, self.batch))


class ElasticTestCase(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        sd.init()

    def use_elastic_dir(self) -> str:
        """Points SMDIST_ELASTIC_DIR at a fresh directory for this test, as smdistrun would."""
        directory = os.path.join(tempfile.mkdtemp(dir=self.get_temp_dir()), "commits")
        patcher = mock.patch.dict(os.environ, {"SMDIST_ELASTIC_DIR": directory})
        patcher.start()
        self.addCleanup(patcher.stop)
        return directory


class InMemoryTest(ElasticTestCase):
    def setUp(self):
        patcher = mock.patch.dict(os.environ)
        patcher.start()
        self.addCleanup(patcher.stop)
        os.environ.pop("SMDIST_ELASTIC_DIR", None)

    def test_object_state_save_restore_sync(self):
        state = sd.elastic.ObjectState(epoch=0, history=[])
        state.epoch, state.history = 2, [1.0]
        state.commit()
        state.epoch = 5
        state.history.append(2.0)  # in place: the saved copy must not change with it
        state.restore()
        self.assertEqual((state.epoch, state.history), (2, [1.0]))
        state.epoch = 7
        state.sync()  # rank 0's current values, saved
        state.restore()
        self.assertEqual(state.epoch, 7)

    def test_keras_state_restore_returns_model_and_optimizer_to_the_commit(self):
        model = small_model()
        state = sd.elastic.TensorFlowKerasState(model, epoch=0)
        train_steps(model, 2)
        state.epoch = 1
        state.commit()
        committed = values(model.variables) + values(model.optimizer.variables)
        train_steps(model, 3)
        state.epoch = 2
        state.restore()
        restored = values(model.variables) + values(model.optimizer.variables)
        self.assertEqual(len(restored), len(committed))
        for got, want in zip(restored, committed):
            self.assertTrue(np.array_equal(got, want))
        self.assertEqual(state.epoch, 1)

    def test_run_without_commit_syncs_and_calls_func(self):
        state = sd.elastic.ObjectState(epoch=3)
        resets = []
        state.register_reset_callbacks([lambda: resets.append(True)])

        @sd.elastic.run
        def train(state, factor, offset=0):
            return state.epoch * factor + offset

        self.assertEqual(train(state, 2, offset=1), 7)
        self.assertEqual(resets, [])

    def test_model_must_be_built(self):
        model = keras.Sequential([keras.layers.Dense(2)])
        with self.assertRaisesRegex(ValueError, "Model must be built first"):
            sd.elastic.TensorFlowKerasState(model)

    def test_optimizer_is_built_so_its_variables_are_saved(self):
        model = small_model()
        self.assertFalse(model.optimizer.built)
        state = sd.elastic.TensorFlowKerasState(model)
        self.assertTrue(model.optimizer.built)
        self.assertGreater(len(model.optimizer.variables), 2)  # iterations, learning rate and the slots
        initial = values(model.optimizer.variables)
        train_steps(model, 2)
        state.restore()
        for got, want in zip(values(model.optimizer.variables), initial):
            self.assertTrue(np.array_equal(got, want))

    def test_tensorflow_state(self):
        v = tf.Variable([1.0, 2.0])
        state = sd.elastic.TensorFlowState([v], step=0)
        v.assign([3.0, 4.0])
        state.step = 1
        state.commit()
        v.assign([9.0, 9.0])
        state.step = 2
        state.restore()
        self.assertAllEqual(v, [3.0, 4.0])
        self.assertEqual(state.step, 1)


class CommitOnDiskTest(ElasticTestCase):
    def test_commits_are_numbered_and_only_the_latest_is_kept(self):
        directory = self.use_elastic_dir()
        state = sd.elastic.ObjectState(epoch=0)
        for epoch in range(1, 4):
            state.epoch = epoch
            state.commit()
        manifest = json.loads(open(os.path.join(directory, MANIFEST)).read())
        self.assertEqual((manifest["commit"], manifest["file"]), (3, "commit-00000003.pkl"))
        self.assertEqual(sorted(os.listdir(directory)), ["commit-00000003.pkl", MANIFEST])
        number, snapshot = CommitStore(directory).latest()
        self.assertEqual((number, snapshot["attrs"]), (3, {"epoch": 3}))

    def test_a_killed_writers_leftovers_do_not_hide_the_commit(self):
        directory = self.use_elastic_dir()
        state = sd.elastic.ObjectState(epoch=1)
        state.commit()
        # What a writer killed mid-commit leaves: a partial commit file and a partial manifest.
        with open(os.path.join(directory, "commit-00000002.pkl.tmp999"), "wb") as f:
            f.write(b"\x80\x05partial")
        with open(os.path.join(directory, f"{MANIFEST}.tmp999"), "w") as f:
            f.write('{"format": 1, "comm')
        self.assertEqual(CommitStore(directory).latest()[0], 1)
        state.commit()
        self.assertEqual(sorted(os.listdir(directory)), ["commit-00000002.pkl", MANIFEST])

    def test_resume_restores_the_latest_commit_and_runs_reset_callbacks(self):
        self.use_elastic_dir()
        model = small_model(seed=1)
        state = sd.elastic.TensorFlowKerasState(model, epoch=0, batch=0)
        train_steps(model, 2)
        state.epoch, state.batch = 1, 4
        state.commit()
        train_steps(model, 1)
        state.commit()  # commit 2 is the one a restart must see
        committed = values(model.variables) + values(model.optimizer.variables)

        # The restarted program: a fresh model with other initial weights, the same layout.
        fresh = small_model(seed=2)
        restarted = sd.elastic.TensorFlowKerasState(fresh, epoch=0, batch=0, added_later="default")
        resets = []
        restarted.register_reset_callbacks([lambda: resets.append((restarted.epoch, restarted.batch))])

        @sd.elastic.run
        def train(state):
            return values(fresh.variables) + values(fresh.optimizer.variables)

        for got, want in zip(train(restarted), committed):
            self.assertTrue(np.array_equal(got, want))
        self.assertEqual(resets, [(1, 4)])
        self.assertEqual(restarted.added_later, "default")  # not in the commit: keeps its initial value
        restarted.commit()
        self.assertEqual(CommitStore(os.environ["SMDIST_ELASTIC_DIR"]).latest()[0], 3)  # numbering goes on

    def test_resume_refuses_a_commit_of_another_layout(self):
        self.use_elastic_dir()
        sd.elastic.TensorFlowKerasState(small_model(units=3)).commit()
        other = sd.elastic.TensorFlowKerasState(small_model(units=5))
        with self.assertRaisesRegex(ValueError, r"could not resume .*has shape \(4, 5\), the commit has \(4, 3\)"):
            other.resume()

    def test_unpicklable_value_fails_the_commit_clearly(self):
        self.use_elastic_dir()
        state = sd.elastic.ObjectState(step=0, callback=lambda: None)
        with self.assertRaisesRegex(RuntimeError, "rank 0 could not write commit 1 to .*pickle"):
            state.commit()


class KerasCallbacksTest(ElasticTestCase):
    def fit(self, state, epochs, batches, skip=0, initial_epoch=0, per_commit=2):
        model = small_model()
        data = tf.data.Dataset.from_tensor_slices((np.zeros((8 * batches, 4), np.float32),
                                                   np.zeros((8 * batches, 3), np.float32))).batch(8).skip(skip)
        # Horovod's documented order: the commit callback first. Commits must still see the updates.
        callbacks = [sd.elastic.CommitStateCallback(state, per_commit), sd.elastic.UpdateBatchStateCallback(state),
                     sd.elastic.UpdateEpochStateCallback(state)]
        model.fit(data, epochs=epochs, initial_epoch=initial_epoch, verbose=0, shuffle=False, callbacks=callbacks)

    def test_commits_carry_the_finished_batch_and_epoch(self):
        state = _RecordingState(epoch=0, batch=0)
        self.fit(state, epochs=2, batches=5)
        self.assertEqual(state.commits, [(0, 2), (0, 4), (1, 0), (1, 1), (1, 3), (2, 0)])
        self.assertEqual((state.epoch, state.batch), (2, 0))

    def test_resumed_epoch_counts_on_from_the_skipped_batches(self):
        state = _RecordingState(epoch=1, batch=3)
        self.fit(state, epochs=2, batches=5, skip=3, initial_epoch=1, per_commit=1)
        self.assertEqual(state.commits, [(1, 4), (2, 0)])

    def test_epochs_counted_from_zero_as_in_horovods_examples(self):
        state = _RecordingState(epoch=1, batch=0)
        self.fit(state, epochs=2, batches=2, per_commit=100)  # fit's epochs 0 and 1 are the 2nd and 3rd
        self.assertEqual(state.commits, [(2, 0), (3, 0)])

    def test_batches_per_commit_must_be_positive(self):
        with self.assertRaisesRegex(ValueError, "at least 1"):
            sd.elastic.CommitStateCallback(sd.elastic.ObjectState(), 0)


if __name__ == "__main__":
    tf.test.main()
