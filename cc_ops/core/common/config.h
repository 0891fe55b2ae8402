// Engine settings read from the environment at init(). Our SMDIST_* names
// win; Horovod's names are honoured so existing job scripts keep working.
#pragma once

#include <cstdint>
#include <string>

#include "common/logging.h"
#include "common/status.h"

namespace smdist {

struct EngineConfig {
  int64_t fusion_threshold_bytes = 64 * 1024 * 1024;
  double cycle_time_ms = 1.0;
  double stall_check_seconds = 60.0;   // <= 0 disables the warning
  double stall_shutdown_seconds = 0.0;  // <= 0 disables the shutdown
  std::string hostname;                 // identity of this host for topology
  // Reduce across hosts as: within host (shared memory) -> across hosts -> within host.
  bool hierarchical_allreduce = true;  // used only with several hosts of equal rank count
  // Per-rank shared-memory staging segment for intra-host reductions; 0 disables.
  int64_t shm_segment_bytes = 16 * 1024 * 1024;
  // Below this size MPI's own allreduce is faster than our shared-memory path.
  int64_t shm_min_bytes = 256 * 1024;
  // Single-host allreduce reads peers' tensors directly (process_vm_readv)
  // when the OS allows it; otherwise, or when off, through the shared segment.
  bool cross_memory_attach = true;
  // Smaller single-host allreduces still go through the shared segment: its
  // cached rounds can beat reading peers' memory until the tensors outgrow
  // cache. Where the two cross depends on the machine: negative (the default)
  // measures it at init. Set to the value in force once the engine is up,
  // with cross_memory_min_measured saying which it was.
  int64_t cross_memory_min_bytes = -1;
  bool cross_memory_min_measured = false;
  // Per-rank memory every local rank maps, for single-host allreduce outputs
  // that cannot reuse their input's buffer (eager mode), so peers store into
  // them without a system call; 0 disables. Set to 0 at init when no arena
  // could be shared.
  int64_t shared_output_bytes = 128 * 1024 * 1024;
  // Collectives remembered for bit-vector negotiation; 0 disables the cache.
  int64_t cache_capacity = 1024;
  std::string timeline_path;  // Chrome-trace output; empty disables
  // An instant event in the timeline for every cycle that ran collectives.
  bool timeline_mark_cycles = false;
  // The timeline records every N-th cycle that ran collectives (and what ran in
  // it), so a long run's file stays small; 1 records every one.
  int64_t timeline_sample_every = 1;
  LogLevel log_level = LogLevel::kWarning;
  // GPU tensors travel over NCCL where every rank of a group can load it;
  // false (SMDIST_GPU_OPERATIONS=MPI) stages them through host memory instead.
  bool gpu_operations_nccl = true;
  // Across hosts of equal rank count, reduce GPU tensors inside each host with
  // NCCL and across hosts on host memory (SMDIST_GPU_HIERARCHICAL_ALLREDUCE=1);
  // off, NCCL spans the hosts itself.
  bool gpu_hierarchical_allreduce = false;  // less severe messages are dropped
  // Autotuning of the fusion threshold, cycle time and intra-host size
  // thresholds during the first working cycles (control/parameter_tuner.h).
  bool autotune = false;
  int64_t autotune_warmup_samples = 3;
  int64_t autotune_steps_per_sample = 10;  // working cycles per sample
  std::string autotune_log;                // a CSV line per sample, on rank 0
  // Not read from the environment: Engine::config() says whether tuning has
  // chosen, and then gives the chosen values above.
  bool autotune_finished = false;

  // Reads SMDIST_* (or HOROVOD_*) variables; a malformed value is an
  // InvalidArgument error naming the variable.
  static Status FromEnvironment(EngineConfig* out);
};

}  // namespace smdist
