// The one place that knows the concrete transports. It starts the runtime
// they share (MPI), and builds the control plane, the data-plane transports in
// order of preference (transports/data_transport.h), and the point-to-point
// channel. The engine sees only the interfaces.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/shared_output_arena.h"
#include "common/status.h"
#include "transports/control_plane.h"
#include "transports/data_transport.h"
#include "transports/point_to_point.h"
#include "transports/topology.h"

namespace smdist {

class MpiCommunicators;
class SharedMemoryAllreduce;
class CrossMemoryAllreduce;

// The process-wide runtime under the transports: started once (later calls
// only report), finished at process exit, so the engine can stop and start
// again in one process.
Status StartCommunicationRuntime(bool* threads_multiple);
void FinishCommunicationRuntimeIfOwned();
// Whether smdist_tf started the runtime and it has not been finished yet.
bool CommunicationRuntimeFinishPending();
// Whether smdist_tf started the runtime (not, say, mpi4py before it).
bool CommunicationRuntimeStartedHere();

class Transports {
 public:
  // Collective over all processes; the runtime must be started.
  // `point_to_point`: whether the runtime allows a channel of its own thread.
  static Status Create(const EngineConfig& config, bool point_to_point, std::unique_ptr<Transports>* out);
  // A process set's transports, made from the all-ranks transports: collective
  // over every rank (each calls it for the same set, in the same order, from
  // the thread that registers sets). `members`: ascending ranks. *out stays
  // null on a rank that is not a member. No point-to-point channel or output
  // arena; the cross-memory size threshold is this one's.
  Status CreateForMembers(const EngineConfig& config, const std::vector<int>& members,
                          std::unique_ptr<Transports>* out) const;
  // Negotiation among all ranks that no collective stream uses: process-set
  // registration runs on it while the streams run. Null on a process set's transports.
  ControlPlane* registration() const { return registration_.get(); }
  Transports() = default;  // use Create(); public for std::make_unique
  ~Transports();
  Transports(const Transports&) = delete;
  Transports& operator=(const Transports&) = delete;

  const Topology& topology() const { return control_->topology(); }
  ControlPlane* control() const { return control_.get(); }
  // In order of preference: each piece of work runs on the first enabled one.
  std::vector<DataTransport*> data_plane() const;
  // Null when the runtime cannot give it a thread of its own; why, then.
  PointToPointChannel* point_to_point() const { return point_to_point_.get(); }
  static const char* point_to_point_missing() {
    return "point-to-point send/recv needs an MPI library with MPI_THREAD_MULTIPLE";
  }
  // Why process sets cannot run without a runtime that allows several threads
  // (each set's stream has its own).
  static const char* process_sets_missing() {
    return "process sets need an MPI library with MPI_THREAD_MULTIPLE (each set runs on its own thread)";
  }
  // Memory for allreduce outputs that this host's peers store into, or null.
  const std::shared_ptr<SharedOutputArena>& output_arena() const { return output_arena_; }
  // How large allreduces travel between ranks of one host (for introspection).
  const std::string& intra_host_allreduce() const { return intra_host_allreduce_; }
  // How long a negotiation round polls without pause before it yields and sleeps.
  std::chrono::microseconds negotiation_busy_poll() const { return negotiation_wait_.busy_poll; }
  // Single-host allreduces of at least this many bytes read peers' memory
  // directly; whether that size was measured here (config unset) or given.
  int64_t cross_memory_min_bytes() const { return cross_memory_min_bytes_; }
  bool cross_memory_min_measured() const { return cross_memory_min_measured_; }
  // Which intra-host paths there are, whose size thresholds autotuning may move.
  bool has_shared_memory() const { return shm_ != nullptr; }
  bool has_cross_memory() const { return cma_ != nullptr; }
  // New size thresholds for the intra-host paths (the cross-memory one never
  // below the shared-memory one, as at init). Between cycles of the stream
  // that uses these transports, on every member at the same cycle.
  void SetSizeThresholds(int64_t shm_min_bytes, int64_t cross_memory_min_bytes);

 private:
  static Status Assemble(const EngineConfig& config, std::shared_ptr<MpiCommunicators> comms, int64_t arena_bytes,
                         Transports* t);

  std::unique_ptr<ControlPlane> control_;
  std::unique_ptr<ControlPlane> registration_;
  std::vector<std::unique_ptr<DataTransport>> data_;
  std::unique_ptr<PointToPointChannel> point_to_point_;
  std::shared_ptr<SharedOutputArena> output_arena_;
  std::string intra_host_allreduce_;
  int64_t cross_memory_min_bytes_ = 0;
  bool cross_memory_min_measured_ = false;
  // How negotiation rounds wait: shorter polls where some host runs more ranks than it has cores.
  NegotiationWait negotiation_wait_ = NegotiationWait::OwnCores();
  // The intra-host transports among data_, or null.
  SharedMemoryAllreduce* shm_ = nullptr;
  CrossMemoryAllreduce* cma_ = nullptr;
};

}  // namespace smdist
