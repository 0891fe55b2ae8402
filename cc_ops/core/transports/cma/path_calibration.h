// Which single-host allreduce path is faster at which size depends on the
// machine (kernel copy speed, cache sizes, cores per rank), so it is measured
// at init instead of fixed.
#pragma once

#include <mpi.h>

#include <cstdint>

#include "common/status.h"
#include "transports/cma/cross_memory_allreduce.h"
#include "transports/shm/shared_memory_allreduce.h"

namespace smdist {

// Sizes tried, and the answer when cross-memory attach wins at none of them:
// from 4 MiB it wins everywhere measured (tensors outgrow the cache the
// shared-memory rounds live in).
constexpr int64_t kCalibrationSizes[] = {256 << 10, 512 << 10, 1 << 20, 2 << 20};
constexpr int64_t kCrossMemoryMinFallback = 4 << 20;

// The smallest tried size from which cross-memory attach was at least as fast
// as the shared-memory copy path at every larger tried size, never below
// `floor`. Times the two paths on this host's ranks, interleaved, keeping each
// path's best trial; ranks decide on the slowest rank's times, so all agree.
// Stops early, keeping the answer so far, once the trials have taken 0.25 s.
// `measured` is false when no size was tried (all below `floor`): the answer
// is then the fallback. Collective over `local`.
Status MeasureCrossMemoryMin(MPI_Comm local, SharedMemoryAllreduce* shm, CrossMemoryAllreduce* cma,
                             int64_t floor, int64_t* min_bytes, bool* measured);

}  // namespace smdist
