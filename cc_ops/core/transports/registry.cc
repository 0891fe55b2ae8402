#include "transports/registry.h"

#include <sched.h>

#include <algorithm>

#include "common/build_info.h"
#include "common/cuda_runtime.h"
#include "common/logging.h"
#include "transports/cma/cross_memory_allreduce.h"
#include "transports/cma/path_calibration.h"
#include "transports/mpi/int8_ring_allreduce.h"
#include "transports/mpi/mpi_collectives.h"
#include "transports/mpi/mpi_communicators.h"
#include "transports/mpi/mpi_control_plane.h"
#include "transports/mpi/mpi_point_to_point.h"
#include "transports/mpi/mpi_runtime.h"
#include "transports/mpi/mpi_types.h"
#include "transports/mpi/stale_segments.h"
#include "transports/nccl/hierarchical_allreduce.h"
#include "transports/nccl/nccl_collectives.h"
#include "transports/nccl/nccl_library.h"
#include "transports/shm/shared_memory_allreduce.h"

namespace smdist {

namespace {

// Whether the ranks of this host outnumber the cores this process may run on.
bool HostOversubscribed(const Topology& topo) {
  cpu_set_t cores;
  if (sched_getaffinity(0, sizeof(cores), &cores) != 0) return false;
  return topo.local_size > CPU_COUNT(&cores);
}

}  // namespace

int NcclVersionLoadable() {
  const NcclLibrary* nccl = NcclLibrary::Get(nullptr);
  return nccl != nullptr && CudaRuntimeLoadable() ? nccl->VersionCode() : 0;
}
bool CudaRuntimeLoadable() { return CudaRuntime::Get(nullptr) != nullptr; }

Status StartCommunicationRuntime(bool* threads_multiple) {
  for (const std::string& path : RemoveStaleSharedMemorySegments()) {
    LogWarning("removed " + path + ", left behind by a job that was killed");
  }
  return EnsureMpiInitialized(threads_multiple);
}

void FinishCommunicationRuntimeIfOwned() { FinalizeMpiIfOwned(); }
bool CommunicationRuntimeFinishPending() { return MpiFinalizePending(); }
bool CommunicationRuntimeStartedHere() { return MpiStartedHere(); }

// The data plane and control plane over `comms`; `arena_bytes`: the
// cross-memory output arena (0: none).
Status Transports::Assemble(const EngineConfig& config, std::shared_ptr<MpiCommunicators> comms,
                            int64_t arena_bytes, Transports* t) {
  const Topology& topo = comms->topology();
  // Shared-memory path: within one host always; across hosts only when asked
  // for hierarchical allreduce and every host has the same layout (shards of
  // the same index must line up across hosts).
  const bool multi_host = topo.cross_size > 1;
  const bool hierarchical = multi_host && config.hierarchical_allreduce && topo.is_homogeneous;
  std::unique_ptr<SharedMemoryAllreduce> shm;
  if (topo.local_size > 1 && config.shm_segment_bytes > 0 && (!multi_host || hierarchical)) {
    SMDIST_RETURN_IF_ERROR(SharedMemoryAllreduce::Create(comms->local(), hierarchical ? comms->cross() : MPI_COMM_NULL,
                                                         config.shm_segment_bytes, config.shm_min_bytes, &shm));
  }
  std::unique_ptr<CrossMemoryAllreduce> cma;
  if (topo.local_size > 1 && !multi_host && config.cross_memory_attach) {
    SMDIST_RETURN_IF_ERROR(CrossMemoryAllreduce::Create(comms->local(), arena_bytes, &cma));
  }
  if (shm && cma && config.cross_memory_min_bytes < 0) {
    // Unset: measured on this host. Only single-host groups get here, so every
    // member takes part and all get the same answer.
    SMDIST_RETURN_IF_ERROR(MeasureCrossMemoryMin(comms->local(), shm.get(), cma.get(), config.shm_min_bytes,
                                                 &t->cross_memory_min_bytes_, &t->cross_memory_min_measured_));
  } else {
    const int64_t wished =
        config.cross_memory_min_bytes < 0 ? kCrossMemoryMinFallback : config.cross_memory_min_bytes;
    t->cross_memory_min_bytes_ = shm ? std::max(config.shm_min_bytes, wished) : config.shm_min_bytes;
  }
  t->intra_host_allreduce_ = cma ? "cross_memory_attach" : shm ? "shared_memory" : "mpi";

  // Preference: int8 compression has its own ring; otherwise read tensors in
  // place, else stage them through shared memory, else one MPI call.
  t->data_.push_back(std::make_unique<Int8RingAllreduce>(comms));
  t->shm_ = shm.get();
  t->cma_ = cma.get();
  if (cma) {
    cma->set_min_bytes(t->cross_memory_min_bytes_);
    t->output_arena_ = cma->output_arena();
    t->data_.push_back(std::move(cma));
  }
  if (shm) t->data_.push_back(std::move(shm));
  t->data_.push_back(std::make_unique<MpiCollectives>(comms));
  t->control_ = std::make_unique<MpiControlPlane>(comms, t->negotiation_wait_);
  // GPU tensors: NCCL first, where every rank of the group can load it (one
  // answer for all, or ranks would pick different transports); otherwise the
  // executor stages them through host memory for the transports above.
  const NcclLibrary* nccl = config.gpu_operations_nccl ? NcclLibrary::Get(nullptr) : nullptr;
  const CudaRuntime* cuda = nccl != nullptr ? CudaRuntime::Get(nullptr) : nullptr;
  std::vector<uint64_t> everywhere = {cuda != nullptr ? 1u : 0u};
  SMDIST_RETURN_IF_ERROR(t->control_->AllreduceBits(&everywhere, /*bitwise_and=*/true));
  if (everywhere[0] != 0) {
    t->data_.insert(t->data_.begin(), std::make_unique<NcclCollectives>(nccl, cuda, t->control_.get(),
                                                                        config.hostname));
    if (multi_host && config.gpu_hierarchical_allreduce && topo.is_homogeneous) {
      // Before flat NCCL, so it takes the allreduces; the rest stay on flat NCCL.
      std::shared_ptr<MpiCommunicators> local, cross;
      SMDIST_RETURN_IF_ERROR(MpiCommunicators::Create(comms->local(), config.hostname, &local));
      SMDIST_RETURN_IF_ERROR(MpiCommunicators::Create(comms->cross(), config.hostname, &cross));
      t->data_.insert(t->data_.begin(), std::make_unique<HierarchicalNcclAllreduce>(
                                            nccl, cuda, std::make_unique<MpiControlPlane>(local, t->negotiation_wait_),
                                            std::make_unique<MpiCollectives>(cross), t->control_.get(),
                                            config.hostname));
    }
  }
  return Status::OK();
}

Status Transports::Create(const EngineConfig& config, bool point_to_point, std::unique_ptr<Transports>* out) {
  auto t = std::make_unique<Transports>();
  std::shared_ptr<MpiCommunicators> comms;
  SMDIST_RETURN_IF_ERROR(MpiCommunicators::Create(MPI_COMM_WORLD, config.hostname, &comms));
  // Where ranks outnumber cores, a rank polling while it waits for a peer takes the core that peer
  // needs: there negotiation rounds stop polling without pause early (any host decides for all).
  int oversubscribed = HostOversubscribed(comms->topology()) ? 1 : 0;
  const int rc = MPI_Allreduce(MPI_IN_PLACE, &oversubscribed, 1, MPI_INT, MPI_LOR, comms->world());
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Allreduce(oversubscribed)");
  t->negotiation_wait_ = oversubscribed != 0 ? NegotiationWait::SharedCores() : NegotiationWait::OwnCores();
  if (oversubscribed != 0) LogInfo("ranks outnumber cores on a host: negotiation rounds poll briefly, then sleep");
  SMDIST_RETURN_IF_ERROR(Assemble(config, comms, config.shared_output_bytes, t.get()));
  // A communicator of its own: process sets are registered on the caller's
  // thread while the collective streams run, and one communicator must not
  // carry two threads' collectives at once.
  std::shared_ptr<MpiCommunicators> registration;
  SMDIST_RETURN_IF_ERROR(MpiCommunicators::Create(MPI_COMM_WORLD, config.hostname, &registration));
  t->registration_ = std::make_unique<MpiControlPlane>(registration, t->negotiation_wait_);
  if (point_to_point) {
    // Created here because duplicating COMM_WORLD is collective and this runs on every rank.
    std::unique_ptr<MpiPointToPoint> p2p;
    SMDIST_RETURN_IF_ERROR(MpiPointToPoint::Create(config.stall_check_seconds, config.stall_shutdown_seconds, &p2p));
    t->point_to_point_ = std::move(p2p);
  }
  *out = std::move(t);
  return Status::OK();
}

Status Transports::CreateForMembers(const EngineConfig& config, const std::vector<int>& members,
                                    std::unique_ptr<Transports>* out) const {
  out->reset();
  const auto* registration = static_cast<const MpiControlPlane*>(registration_.get());
  if (!registration) return Status::PreconditionFailed("process sets are made from the all-ranks transports");
  const int rank = registration->topology().rank;
  const bool member = std::binary_search(members.begin(), members.end(), rank);
  MPI_Comm group = MPI_COMM_NULL;
  int rc = MPI_Comm_split(registration->communicators().world(), member ? 0 : MPI_UNDEFINED, rank, &group);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Comm_split(process set)");
  if (!member) return Status::OK();
  std::shared_ptr<MpiCommunicators> comms;
  Status s = MpiCommunicators::Create(group, config.hostname, &comms);
  MPI_Comm_free(&group);
  SMDIST_RETURN_IF_ERROR(s);
  EngineConfig set_config = config;
  set_config.cross_memory_min_bytes = cross_memory_min_bytes_;  // measured once, for all ranks
  auto t = std::make_unique<Transports>();
  t->negotiation_wait_ = negotiation_wait_;  // the members agreed with the whole job
  SMDIST_RETURN_IF_ERROR(Assemble(set_config, comms, /*arena_bytes=*/0, t.get()));
  *out = std::move(t);
  return Status::OK();
}

void Transports::SetSizeThresholds(int64_t shm_min_bytes, int64_t cross_memory_min_bytes) {
  if (shm_ != nullptr) shm_->set_min_bytes(shm_min_bytes);
  if (cma_ != nullptr) {
    cross_memory_min_bytes_ = shm_ != nullptr ? std::max(shm_min_bytes, cross_memory_min_bytes) : cross_memory_min_bytes;
    cma_->set_min_bytes(cross_memory_min_bytes_);
  }
}

Transports::~Transports() {
  // The shared-memory windows go before the communicators they were made on,
  // which the control plane holds last.
  point_to_point_.reset();
  data_.clear();
  control_.reset();
  registration_.reset();
}

std::vector<DataTransport*> Transports::data_plane() const {
  std::vector<DataTransport*> out;
  for (const auto& t : data_) out.push_back(t.get());
  return out;
}

}  // namespace smdist
