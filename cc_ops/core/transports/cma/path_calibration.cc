#include "transports/cma/path_calibration.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <vector>

#include "common/span_staging.h"
#include "transports/mpi/mpi_types.h"

namespace smdist {
namespace {
constexpr int kTrials = 3;        // best of: a stray preemption cannot decide
constexpr int kRunsPerTrial = 3;  // back to back, as a training step issues them
// Bounds init's cost when a path is very slow (e.g. a tiny SMDIST_SHM_SEGMENT_BYTES
// makes the copy path take thousands of rounds): sizes not reached are not tried.
constexpr double kBudgetSeconds = 0.25;

// Seconds for kRunsPerTrial allreduces of `count` floats on the slowest local rank.
Status TimeRuns(MPI_Comm local, bool cross_memory, SharedMemoryAllreduce* shm, CrossMemoryAllreduce* cma,
                const float* in, float* out, int64_t count, double* seconds) {
  int rc = MPI_Barrier(local);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Barrier(calibration)");
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRunsPerTrial; ++i) {
    if (cross_memory) {
      SMDIST_RETURN_IF_ERROR(cma->Run({TensorSpan{in, out, count}}, DataType::kFloat32, ReduceOp::kSum, 1.0));
    } else {
      SMDIST_RETURN_IF_ERROR(shm->Allreduce(
          SpanStaging({TensorSpan{in, out, count}}, DataType::kFloat32, DataType::kFloat32, 1.0, 1.0),
          ReduceOp::kSum));
    }
  }
  double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  rc = MPI_Allreduce(&mine, seconds, 1, MPI_DOUBLE, MPI_MAX, local);
  return MpiError(rc, "MPI_Allreduce(calibration time)");
}
}  // namespace

Status MeasureCrossMemoryMin(MPI_Comm local, SharedMemoryAllreduce* shm, CrossMemoryAllreduce* cma,
                             int64_t floor, int64_t* min_bytes, bool* measured) {
  const int64_t largest = *std::max_element(std::begin(kCalibrationSizes), std::end(kCalibrationSizes));
  // Separate input and output, as an eager op has: the common case to get right.
  // The output where the kernels put it: in the arena when there is one.
  std::vector<float> in(static_cast<size_t>(largest / 4), 1.0f), own_out;
  std::unique_ptr<SharedOutputBlock> arena_out;
  if (cma->output_arena()) arena_out = cma->output_arena()->Allocate(largest);
  if (!arena_out) own_out.resize(in.size(), 0.0f);
  float* out = arena_out ? static_cast<float*>(arena_out->data()) : own_out.data();
  int64_t answer = std::max(floor, kCrossMemoryMinFallback);
  double spent = 0;  // the sum of agreed (slowest-rank) times: the same on every rank
  for (auto it = std::rbegin(kCalibrationSizes); it != std::rend(kCalibrationSizes); ++it) {
    const int64_t bytes = *it;
    if (bytes < floor) break;
    const int64_t count = bytes / 4;
    double best[2] = {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
    for (int trial = -1; trial < kTrials && spent <= kBudgetSeconds; ++trial) {  // -1 warms both up
      for (int path = 0; path < 2; ++path) {
        double seconds = 0;
        SMDIST_RETURN_IF_ERROR(TimeRuns(local, path == 1, shm, cma, in.data(), out, count, &seconds));
        spent += seconds;
        if (trial >= 0) best[path] = std::min(best[path], seconds);
      }
    }
    // Out of time before any timed trial: this size was not measured.
    if (std::isinf(best[0]) || best[1] > best[0]) break;  // the copy path wins here, so below too
    answer = bytes;
  }
  *min_bytes = answer;
  *measured = spent > 0;
  return Status::OK();
}

}  // namespace smdist
