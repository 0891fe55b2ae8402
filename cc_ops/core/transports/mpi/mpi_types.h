// Mapping of engine types and reductions onto MPI handles, shared by the MPI
// transport and its shared-memory path.
#pragma once

#include <mpi.h>

#include "common/status.h"
#include "common/types.h"

namespace smdist {

MPI_Datatype MpiType(DataType dtype);
MPI_Op MpiOp(DataType dtype, ReduceOp op);
Status MpiError(int code, const char* what);

}  // namespace smdist
