// The MPI library's process-wide lifetime: initialised once (with the custom
// datatypes and reductions of mpi_types.h), finalised at process exit, so the
// engine can be shut down and started again in one process.
#pragma once

#include "common/status.h"

namespace smdist {

Status EnsureMpiInitialized(bool* threads_multiple);
void FinalizeMpiIfOwned();
// Whether smdist_tf started MPI and it has not been finalized yet.
bool MpiFinalizePending();
// Whether smdist_tf started MPI (not, say, mpi4py before it).
bool MpiStartedHere();

}  // namespace smdist
