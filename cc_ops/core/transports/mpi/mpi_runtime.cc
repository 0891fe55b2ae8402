#include "transports/mpi/mpi_runtime.h"

#include <cstdlib>
#include <mutex>

#include "common/reduction.h"
#include "transports/mpi/mpi_types.h"

namespace smdist {
namespace {

// MPI has no float16/bfloat16, its float MIN/MAX need not propagate NaN, and
// Open MPI's AVX component adds 8- and 16-bit integers with saturation
// (open-mpi/ompi#8045; TensorFlow wraps around), so those reductions run our
// own kernels through MPI user ops.
struct MpiCustomTypes {
  MPI_Datatype float16 = MPI_DATATYPE_NULL;
  MPI_Datatype bfloat16 = MPI_DATATYPE_NULL;
  MPI_Op sum = MPI_OP_NULL, min = MPI_OP_NULL, max = MPI_OP_NULL, prod = MPI_OP_NULL;
};

MpiCustomTypes g_types;
bool g_we_initialized_mpi = false;
bool g_threads_multiple = false;
std::mutex g_mpi_init_mutex;

DataType DataTypeOfMpi(MPI_Datatype dt) {
  if (dt == MPI_UINT8_T) return DataType::kUInt8;
  if (dt == MPI_INT8_T) return DataType::kInt8;
  if (dt == MPI_UINT16_T) return DataType::kUInt16;
  if (dt == MPI_INT16_T) return DataType::kInt16;
  if (dt == g_types.float16) return DataType::kFloat16;
  if (dt == g_types.bfloat16) return DataType::kBFloat16;
  if (dt == MPI_DOUBLE) return DataType::kFloat64;
  return DataType::kFloat32;
}

template <ReduceOp kOp>
void CustomReduce(void* in, void* inout, int* len, MPI_Datatype* dt) {
  ReduceInto(DataTypeOfMpi(*dt), kOp, in, inout, *len);
}

// Whether an MPI launcher (mpirun, srun, Hydra) started this process: each
// sets its rank in the environment for MPI_Init to find.
bool StartedByLauncher() {
  for (const char* var : {"PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "PMI_FD"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

}  // namespace

MPI_Datatype MpiType(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8: return MPI_UINT8_T;
    case DataType::kBool: return MPI_UINT8_T;
    case DataType::kInt8: return MPI_INT8_T;
    case DataType::kUInt16: return MPI_UINT16_T;
    case DataType::kInt16: return MPI_INT16_T;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kFloat16: return g_types.float16;
    case DataType::kBFloat16: return g_types.bfloat16;
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
  }
  return MPI_BYTE;
}

MPI_Op MpiOp(DataType dtype, ReduceOp op) {
  const bool half_like = dtype == DataType::kFloat16 || dtype == DataType::kBFloat16;
  const bool narrow_int = dtype == DataType::kUInt8 || dtype == DataType::kInt8 || dtype == DataType::kUInt16 ||
                          dtype == DataType::kInt16;
  const bool is_float = IsFloatingPoint(dtype);
  switch (op) {
    case ReduceOp::kMin: return is_float ? g_types.min : MPI_MIN;
    case ReduceOp::kMax: return is_float ? g_types.max : MPI_MAX;
    case ReduceOp::kProduct: return half_like || narrow_int ? g_types.prod : MPI_PROD;
    default: return half_like || narrow_int ? g_types.sum : MPI_SUM;
  }
}

Status MpiError(int code, const char* what) {
  if (code == MPI_SUCCESS) return Status::OK();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return Status::Unknown(std::string(what) + " failed: " + std::string(text, len));
}

Status EnsureMpiInitialized(bool* threads_multiple) {
  std::lock_guard<std::mutex> lock(g_mpi_init_mutex);
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    // Our shared windows need Open MPI's shared-memory one-sided component;
    // the UCX one only prints errors on a single host. Users can override.
    setenv("OMPI_MCA_osc", "^ucx", 0);
    // A process no launcher started is a job of one: Open MPI's shared-memory
    // transport would only leave its 16 MiB segment in /dev/shm, which no
    // launcher is there to delete.
    if (!StartedByLauncher()) setenv("OMPI_MCA_btl", "self", 0);
    // A thread waiting in Open MPI spins on its core. The engine's thread waits there
    // for the other ranks while this process's TensorFlow threads still compute the
    // backward pass (gradient buckets overlap it), so it yields the core between polls:
    // DataParallelStrategy + fit, np 2 on 2 cores: 0.57-0.64 -> 0.64-0.71 of the ceiling.
    setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
    int provided = 0;
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Init_thread");
    g_we_initialized_mpi = true;
    g_threads_multiple = provided >= MPI_THREAD_MULTIPLE;
    // The engine calls MPI from its own thread while Python may call it too.
    if (provided < MPI_THREAD_SERIALIZED) {
      return Status::PreconditionFailed(
          "the MPI library provides only MPI_THREAD_FUNNELED or less; smdist_tf needs at "
          "least MPI_THREAD_SERIALIZED");
    }
  } else if (g_types.float16 == MPI_DATATYPE_NULL) {
    int provided = 0;
    MPI_Query_thread(&provided);
    g_threads_multiple = provided >= MPI_THREAD_MULTIPLE;
  }
  if (g_types.float16 == MPI_DATATYPE_NULL) {
    MPI_Type_contiguous(2, MPI_BYTE, &g_types.float16);
    MPI_Type_commit(&g_types.float16);
    MPI_Type_contiguous(2, MPI_BYTE, &g_types.bfloat16);
    MPI_Type_commit(&g_types.bfloat16);
    MPI_Op_create(&CustomReduce<ReduceOp::kSum>, 1, &g_types.sum);
    MPI_Op_create(&CustomReduce<ReduceOp::kMin>, 1, &g_types.min);
    MPI_Op_create(&CustomReduce<ReduceOp::kMax>, 1, &g_types.max);
    MPI_Op_create(&CustomReduce<ReduceOp::kProduct>, 1, &g_types.prod);
  }
  *threads_multiple = g_threads_multiple;
  return Status::OK();
}

bool MpiStartedHere() {
  std::lock_guard<std::mutex> lock(g_mpi_init_mutex);
  return g_we_initialized_mpi;
}

bool MpiFinalizePending() {
  std::lock_guard<std::mutex> lock(g_mpi_init_mutex);
  int finalized = 0;
  MPI_Finalized(&finalized);
  return g_we_initialized_mpi && !finalized;
}

void FinalizeMpiIfOwned() {
  std::lock_guard<std::mutex> lock(g_mpi_init_mutex);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (g_we_initialized_mpi && !finalized) {
    MPI_Finalize();
  }
}

}  // namespace smdist
