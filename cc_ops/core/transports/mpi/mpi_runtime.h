// Transport over MPI. Owns its duplicated communicators so user MPI traffic
// (e.g. mpi4py on COMM_WORLD) never interleaves with the engine's.
#pragma once

#include <mpi.h>

#include <memory>

#include "config.h"
#include "cross_memory_allreduce.h"
#include "shared_memory_allreduce.h"
#include "transport.h"

namespace smdist {

// Process-wide MPI lifetime: initialised once, finalised at process exit, so
// the engine can be shut down and started again in one process.
Status EnsureMpiInitialized(bool* threads_multiple);
void FinalizeMpiIfOwned();
// Whether smdist_tf started MPI and it has not been finalized yet.
bool MpiFinalizePending();
// Whether smdist_tf started MPI (not, say, mpi4py before it).
bool MpiStartedHere();

class MpiTransport : public Transport {
 public:
  // Collective over COMM_WORLD. `config.hostname` decides which ranks share a
  // host; the shared-memory and hierarchical settings pick the allreduce path.
  static Status Create(const EngineConfig& config, std::unique_ptr<MpiTransport>* out);
  MpiTransport() = default;  // use Create(); public for std::make_unique
  ~MpiTransport() override;

  const Topology& topology() const override { return topology_; }
  std::string name() const override { return "mpi"; }
  std::string intra_host_allreduce() const override {
    return cma_ ? "cross_memory_attach" : shm_ ? "shared_memory" : "mpi";
  }

  Status GatherToRoot(const std::vector<uint8_t>& mine,
                      std::vector<std::vector<uint8_t>>* gathered) override;
  Status BroadcastFromRoot(std::vector<uint8_t>* bytes) override;
  Status AllreduceBits(std::vector<uint64_t>* words, bool bitwise_and) override;

  Status Allreduce(const void* input, void* output, int64_t count, DataType dtype,
                   ReduceOp op) override;
  bool CanAllreduceSpans(int64_t total_bytes, size_t num_spans) const override;
  Status AllreduceSpans(const std::vector<TensorSpan>& spans, DataType dtype, ReduceOp op,
                        double postscale) override;
  bool CanAllreduceStaged(int64_t wire_bytes) const override;
  Status AllreduceStaged(const SpanStaging& staging, ReduceOp op) override;
  bool hierarchical() const { return hierarchical_; }
  // True when single-host allreduces read peers' memory directly.
  bool cross_memory_attach() const { return cma_ != nullptr; }
  // Single-host allreduces of at least this many bytes read peers' memory
  // directly; whether that size was measured here (config unset) or given.
  int64_t cross_memory_min_bytes() const { return cma_min_bytes_; }
  bool cross_memory_min_measured() const { return cma_min_measured_; }
  // Where allreduce outputs go so peers can store into them, or null.
  std::shared_ptr<SharedOutputArena> output_arena() const {
    return cma_ ? cma_->output_arena() : nullptr;
  }
  Status Allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts,
                    DataType dtype) override;
  Status Broadcast(void* buffer, int64_t count, DataType dtype, int root) override;
  Status Alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                   const std::vector<int64_t>& recv_counts, DataType dtype) override;
  Status ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                       DataType dtype, ReduceOp op) override;
  Status Barrier() override;

 private:
  Topology topology_;
  MPI_Comm world_ = MPI_COMM_NULL;
  MPI_Comm local_ = MPI_COMM_NULL;
  MPI_Comm cross_ = MPI_COMM_NULL;
  std::unique_ptr<SharedMemoryAllreduce> shm_;
  std::unique_ptr<CrossMemoryAllreduce> cma_;
  int64_t shm_min_bytes_ = 0;
  int64_t cma_min_bytes_ = 0;  // with shm_ too; otherwise shm_min_bytes_
  bool cma_min_measured_ = false;
  bool hierarchical_ = false;
};

}  // namespace smdist
