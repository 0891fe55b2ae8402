#include "mpi_transport.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "mpi_types.h"
#include "path_calibration.h"
#include "reduction.h"

namespace smdist {
namespace {

// MPI has no float16/bfloat16 and its float MIN/MAX need not propagate NaN,
// so those reductions run our own kernels through MPI user ops.
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
  if (dt == g_types.float16) return DataType::kFloat16;
  if (dt == g_types.bfloat16) return DataType::kBFloat16;
  if (dt == MPI_DOUBLE) return DataType::kFloat64;
  return DataType::kFloat32;
}

template <ReduceOp kOp>
void CustomReduce(void* in, void* inout, int* len, MPI_Datatype* dt) {
  ReduceInto(DataTypeOfMpi(*dt), kOp, in, inout, *len);
}

Status ToIntCounts(const std::vector<int64_t>& counts, std::vector<int>* out,
                   std::vector<int>* displs) {
  out->resize(counts.size());
  displs->resize(counts.size());
  int64_t offset = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] > INT_MAX || offset > INT_MAX) {
      return Status::InvalidArgument("tensor too large for one MPI call (more than 2^31 elements)");
    }
    (*out)[i] = static_cast<int>(counts[i]);
    (*displs)[i] = static_cast<int>(offset);
    offset += counts[i];
  }
  return Status::OK();
}

// Whether an MPI launcher (mpirun, srun, Hydra) started this process: each
// sets its rank in the environment for MPI_Init to find.
bool StartedByLauncher() {
  for (const char* var : {"PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "PMI_FD"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

// Large buffers go through MPI in pieces because MPI counts are ints.
constexpr int64_t kMaxChunk = INT_MAX / 2;

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
  const bool is_float = IsFloatingPoint(dtype);
  switch (op) {
    case ReduceOp::kMin: return is_float ? g_types.min : MPI_MIN;
    case ReduceOp::kMax: return is_float ? g_types.max : MPI_MAX;
    case ReduceOp::kProduct: return half_like ? g_types.prod : MPI_PROD;
    default: return half_like ? g_types.sum : MPI_SUM;
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

Status MpiTransport::Create(const EngineConfig& config, std::unique_ptr<MpiTransport>* out) {
  const std::string& hostname = config.hostname;
  auto t = std::make_unique<MpiTransport>();
  int rc = MPI_Comm_dup(MPI_COMM_WORLD, &t->world_);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Comm_dup");
  MPI_Comm_set_errhandler(t->world_, MPI_ERRORS_RETURN);
  Topology& topo = t->topology_;
  MPI_Comm_rank(t->world_, &topo.rank);
  MPI_Comm_size(t->world_, &topo.size);

  // Ranks on one host are those reporting the same host name.
  constexpr int kNameLen = 256;
  std::vector<char> names(static_cast<size_t>(kNameLen) * topo.size, 0);
  char mine[kNameLen] = {0};
  std::strncpy(mine, hostname.c_str(), kNameLen - 1);
  rc = MPI_Allgather(mine, kNameLen, MPI_CHAR, names.data(), kNameLen, MPI_CHAR, t->world_);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Allgather(hostnames)");
  int color = topo.rank;
  for (int r = 0; r < topo.size; ++r) {
    if (std::strncmp(&names[static_cast<size_t>(r) * kNameLen], mine, kNameLen) == 0) {
      color = r;
      break;
    }
  }
  MPI_Comm_split(t->world_, color, topo.rank, &t->local_);
  MPI_Comm_rank(t->local_, &topo.local_rank);
  MPI_Comm_size(t->local_, &topo.local_size);
  MPI_Comm_split(t->world_, topo.local_rank, topo.rank, &t->cross_);
  MPI_Comm_rank(t->cross_, &topo.cross_rank);
  MPI_Comm_size(t->cross_, &topo.cross_size);

  std::vector<int> local_sizes(topo.size);
  MPI_Allgather(&topo.local_size, 1, MPI_INT, local_sizes.data(), 1, MPI_INT, t->world_);
  topo.is_homogeneous = true;
  for (int s : local_sizes) topo.is_homogeneous &= (s == local_sizes[0]);

  // Shared-memory path: within one host always; across hosts only when asked
  // for hierarchical allreduce and every host has the same layout (shards of
  // the same index must line up across hosts).
  const bool multi_host = topo.cross_size > 1;
  t->hierarchical_ = multi_host && config.hierarchical_allreduce && topo.is_homogeneous;
  const bool use_shm = topo.local_size > 1 && config.shm_segment_bytes > 0 &&
                       (!multi_host || t->hierarchical_);
  if (use_shm) {
    SMDIST_RETURN_IF_ERROR(SharedMemoryAllreduce::Create(
        t->local_, t->hierarchical_ ? t->cross_ : MPI_COMM_NULL, config.shm_segment_bytes, &t->shm_));
  }
  if (topo.local_size > 1 && !multi_host && config.cross_memory_attach) {
    SMDIST_RETURN_IF_ERROR(CrossMemoryAllreduce::Create(t->local_, config.shared_output_bytes, &t->cma_));
  }
  t->shm_min_bytes_ = config.shm_min_bytes;
  if (t->shm_ && t->cma_ && config.cross_memory_min_bytes < 0) {
    // Unset: measured on this host. Only single-host jobs get here, so every
    // rank takes part and all get the same answer.
    SMDIST_RETURN_IF_ERROR(MeasureCrossMemoryMin(t->local_, t->shm_.get(), t->cma_.get(),
                                                 config.shm_min_bytes, &t->cma_min_bytes_,
                                                 &t->cma_min_measured_));
  } else {
    const int64_t wished = config.cross_memory_min_bytes < 0 ? kCrossMemoryMinFallback : config.cross_memory_min_bytes;
    t->cma_min_bytes_ = t->shm_ ? std::max(config.shm_min_bytes, wished) : config.shm_min_bytes;
  }
  *out = std::move(t);
  return Status::OK();
}

MpiTransport::~MpiTransport() {
  cma_.reset();  // both free their windows before the communicators go
  shm_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Comm* c : {&cross_, &local_, &world_}) {
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }
}

Status MpiTransport::GatherToRoot(const std::vector<uint8_t>& mine,
                                  std::vector<std::vector<uint8_t>>* gathered) {
  const int n = topology_.size;
  int my_size = static_cast<int>(mine.size());
  std::vector<int> sizes(topology_.rank == 0 ? n : 0);
  int rc = MPI_Gather(&my_size, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, world_);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Gather");
  std::vector<int> displs;
  std::vector<uint8_t> all;
  if (topology_.rank == 0) {
    displs.resize(n);
    int total = 0;
    for (int r = 0; r < n; ++r) {
      displs[r] = total;
      total += sizes[r];
    }
    all.resize(total);
  }
  rc = MPI_Gatherv(mine.data(), my_size, MPI_BYTE, all.data(), sizes.data(), displs.data(),
                   MPI_BYTE, 0, world_);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Gatherv");
  if (topology_.rank == 0) {
    gathered->assign(n, {});
    for (int r = 0; r < n; ++r) {
      (*gathered)[r].assign(all.begin() + displs[r], all.begin() + displs[r] + sizes[r]);
    }
  }
  return Status::OK();
}

Status MpiTransport::BroadcastFromRoot(std::vector<uint8_t>* bytes) {
  int64_t size = static_cast<int64_t>(bytes->size());
  int rc = MPI_Bcast(&size, 1, MPI_INT64_T, 0, world_);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Bcast");
  bytes->resize(size);
  return Broadcast(bytes->data(), size, DataType::kUInt8, 0);
}

Status MpiTransport::AllreduceBits(std::vector<uint64_t>* words, bool bitwise_and) {
  int rc = MPI_Allreduce(MPI_IN_PLACE, words->data(), static_cast<int>(words->size()),
                         MPI_UINT64_T, bitwise_and ? MPI_BAND : MPI_BOR, world_);
  return MpiError(rc, "MPI_Allreduce(bits)");
}

Status MpiTransport::Allreduce(const void* input, void* output, int64_t count, DataType dtype,
                               ReduceOp op) {
  const size_t elem = DataTypeSize(dtype);
  if (CanAllreduceSpans(count * static_cast<int64_t>(elem), 1)) {
    return cma_->Run({TensorSpan{input, output, count}}, dtype, op, 1.0);
  }
  if (CanAllreduceStaged(count * static_cast<int64_t>(elem))) {
    return shm_->Run(SpanStaging({TensorSpan{input, output, count}}, dtype, dtype, 1.0, 1.0), op);
  }
  const auto* in = static_cast<const uint8_t*>(input);
  auto* out = static_cast<uint8_t*>(output);
  for (int64_t done = 0; done < count; done += kMaxChunk) {
    int n = static_cast<int>(std::min(kMaxChunk, count - done));
    const void* send = in == out ? MPI_IN_PLACE : in + done * elem;
    int rc = MPI_Allreduce(send, out + done * elem, n, MpiType(dtype), MpiOp(dtype, op), world_);
    if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Allreduce");
  }
  return Status::OK();
}

bool MpiTransport::CanAllreduceSpans(int64_t total_bytes, size_t num_spans) const {
  return cma_ != nullptr && total_bytes >= cma_min_bytes_ && total_bytes > 0 &&
         static_cast<int64_t>(num_spans) <= CrossMemoryAllreduce::kMaxSpans &&
         total_bytes >= static_cast<int64_t>(num_spans) * CrossMemoryAllreduce::kMinMeanSpanBytes;
}

Status MpiTransport::AllreduceSpans(const std::vector<TensorSpan>& spans, DataType dtype,
                                    ReduceOp op, double postscale) {
  return cma_->Run(spans, dtype, op, postscale);
}

bool MpiTransport::CanAllreduceStaged(int64_t wire_bytes) const {
  return shm_ != nullptr && wire_bytes >= shm_min_bytes_ && wire_bytes > 0;
}

Status MpiTransport::AllreduceStaged(const SpanStaging& staging, ReduceOp op) {
  return shm_->Run(staging, op);
}

Status MpiTransport::Allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts,
                                DataType dtype) {
  std::vector<int> icounts, displs;
  SMDIST_RETURN_IF_ERROR(ToIntCounts(counts, &icounts, &displs));
  int rc = MPI_Allgatherv(send, icounts[topology_.rank], MpiType(dtype), recv, icounts.data(),
                          displs.data(), MpiType(dtype), world_);
  return MpiError(rc, "MPI_Allgatherv");
}

Status MpiTransport::Broadcast(void* buffer, int64_t count, DataType dtype, int root) {
  auto* p = static_cast<uint8_t*>(buffer);
  const size_t elem = DataTypeSize(dtype);
  for (int64_t done = 0; done < count; done += kMaxChunk) {
    int n = static_cast<int>(std::min(kMaxChunk, count - done));
    int rc = MPI_Bcast(p + done * elem, n, MpiType(dtype), root, world_);
    if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Bcast");
  }
  return Status::OK();
}

Status MpiTransport::Alltoallv(const void* send, const std::vector<int64_t>& send_counts,
                               void* recv, const std::vector<int64_t>& recv_counts,
                               DataType dtype) {
  std::vector<int> scounts, sdispls, rcounts, rdispls;
  SMDIST_RETURN_IF_ERROR(ToIntCounts(send_counts, &scounts, &sdispls));
  SMDIST_RETURN_IF_ERROR(ToIntCounts(recv_counts, &rcounts, &rdispls));
  int rc = MPI_Alltoallv(send, scounts.data(), sdispls.data(), MpiType(dtype), recv,
                         rcounts.data(), rdispls.data(), MpiType(dtype), world_);
  return MpiError(rc, "MPI_Alltoallv");
}

Status MpiTransport::ReduceScatter(const void* send, void* recv,
                                   const std::vector<int64_t>& recv_counts, DataType dtype,
                                   ReduceOp op) {
  std::vector<int> counts, displs;
  SMDIST_RETURN_IF_ERROR(ToIntCounts(recv_counts, &counts, &displs));
  int rc = MPI_Reduce_scatter(send, recv, counts.data(), MpiType(dtype), MpiOp(dtype, op), world_);
  return MpiError(rc, "MPI_Reduce_scatter");
}

Status MpiTransport::Barrier() { return MpiError(MPI_Barrier(world_), "MPI_Barrier"); }

}  // namespace smdist
