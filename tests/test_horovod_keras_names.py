"""Every public name of Horovod 0.28.1's ``horovod.tensorflow.keras`` (and its ``callbacks``) exists in
``smdist_tf.keras`` and takes Horovod's parameters, in Horovod's order (ours may add more after them).

Horovod does not build on TensorFlow 2.21, so its signatures are written out here.
"""

from __future__ import annotations

import inspect

import tensorflow as tf

import smdist_tf.keras as hvd

MODULE_FUNCTIONS = {
    "DistributedOptimizer": ["optimizer", "name", "device_dense", "device_sparse", "compression", "sparse_as_dense",
                             "gradient_predivide_factor", "op", "backward_passes_per_step",
                             "average_aggregated_gradients", "num_groups", "groups", "process_set",
                             "scale_local_gradients"],
    "PartialDistributedOptimizer": ["optimizer", "name", "device_dense", "device_sparse", "compression",
                                    "sparse_as_dense", "gradient_predivide_factor", "op",
                                    "backward_passes_per_step", "average_aggregated_gradients", "groups",
                                    "process_set", "local_layers", "scale_local_gradients"],
    "broadcast_global_variables": ["root_rank"],
    "allreduce": ["value", "name", "average", "prescale_factor", "postscale_factor", "op", "compression"],
    "allgather": ["value", "name"],
    "broadcast": ["value", "root_rank", "name"],
    "reducescatter": ["value", "name", "op"],
    "load_model": ["filepath", "custom_optimizers", "custom_objects", "compression", "partial_distributed_optimizer"],
}
CALLBACKS = {
    "BroadcastGlobalVariablesCallback": ["root_rank", "device", "local_variables"],
    "MetricAverageCallback": ["device"],
    "LearningRateScheduleCallback": ["initial_lr", "multiplier", "start_epoch", "end_epoch", "staircase",
                                     "momentum_correction", "steps_per_epoch"],
    "LearningRateWarmupCallback": ["initial_lr", "warmup_epochs", "momentum_correction", "steps_per_epoch",
                                   "verbose"],
    "BestModelCheckpoint": ["monitor", "verbose", "save_weights_only", "mode", "save_freq"],
}
REEXPORTED = ["init", "shutdown", "is_initialized", "start_timeline", "stop_timeline", "size", "local_size",
              "cross_size", "rank", "local_rank", "cross_rank", "mpi_threads_supported", "mpi_enabled", "mpi_built",
              "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built",
              "ProcessSet", "global_process_set", "add_process_set", "remove_process_set", "Average", "Sum",
              "Adasum", "Compression", "callbacks", "elastic"]


class HorovodKerasNamesTest(tf.test.TestCase):
    def assert_parameters_start_with(self, where: str, fn, horovods: list[str]) -> None:
        ours = [p for p in inspect.signature(fn).parameters if p != "self"]
        self.assertEqual(ours[:len(horovods)], horovods, f"{where}: ours {ours}")

    def test_module_functions(self):
        for name, parameters in MODULE_FUNCTIONS.items():
            self.assert_parameters_start_with(f"smdist_tf.keras.{name}", getattr(hvd, name), parameters)

    def test_callbacks(self):
        for name, parameters in CALLBACKS.items():
            self.assert_parameters_start_with(f"callbacks.{name}", getattr(hvd.callbacks, name), parameters)

    def test_reexported_names(self):
        self.assertEqual([n for n in REEXPORTED if not hasattr(hvd, n)], [])

    def test_the_distributed_optimizer_has_horovods_methods(self):
        import keras

        hvd.init()
        optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD())
        self.assert_parameters_start_with("DistributedOptimizer()._compute_gradients", optimizer._compute_gradients,
                                          ["loss", "var_list", "grad_loss", "tape"])
        self.assertTrue(callable(optimizer.register_local_var))


if __name__ == "__main__":
    tf.test.main()
