// Runs negotiated collectives on this rank's entries over the data plane:
// follows the fusion planner's plan for allreduces (tensors read where they
// lie, or packed into a fusion buffer), applies Average and scaling, sizes
// ragged outputs, and reports each entry's completion. Each piece of work
// runs on the first enabled data-plane transport. A rank inside join() runs
// the same calls on neutral buffers (joined_participation.h).
#pragma once

#include <vector>

#include "adasum_allreduce.h"
#include "common/cuda_runtime.h"
#include "common/tensor_entry.h"
#include "control/fusion_planner.h"
#include "control/message.h"
#include "control/timeline.h"
#include "host_staging.h"
#include "transports/data_transport.h"
#include "transports/topology.h"

namespace smdist {

class CollectiveExecutor {
 public:
  // `data_plane`: transports in order of preference. `process_set_id`: whose
  // collectives these are (the timeline says so).
  CollectiveExecutor(const Topology& topology, std::vector<DataTransport*> data_plane,
                     const FusionPlanner* planner, Timeline* timeline, int32_t process_set_id)
      : topology_(topology),
        data_plane_(std::move(data_plane)),
        planner_(planner),
        timeline_(timeline),
        process_set_id_(process_set_id),
        adasum_(topology, data_plane_) {}

  // `entries` are this rank's entries for `response.names`, in that order.
  // Completes every entry (calls done). Returns a transport failure, after
  // which the engine must stop.
  Status Execute(const Response& response, std::vector<TensorEntry>* entries);
  // Whether the timeline records the responses executed from now on: false in
  // the cycles SMDIST_TIMELINE_SAMPLE_EVERY leaves out.
  void set_traced(bool traced) { traced_ = traced; }

 private:
  bool tracing() const { return traced_ && timeline_->active(); }
  // Sets up the per-response state (entry_status_, device, contributors_)
  // and marks in the timeline how long `entries` waited for negotiation.
  void Begin(const Response& response, const std::vector<TensorEntry>& entries, Timeline::Clock::time_point start);
  // A collective response where its tensors can be reached: on a device
  // transport that takes them all, else staged through host memory. Returns
  // a transport failure; `outcome` gets what the entries report (the first
  // failure, `ready` after the transport's).
  Status RunCollective(const Response& response, std::vector<TensorEntry>* entries, const Status& ready,
                       Status* outcome);
  // The collective itself, by kind: one function each.
  Status Dispatch(const Response& response, std::vector<TensorEntry>* entries);

  Status Allreduce(std::vector<TensorEntry>* entries);
  // One step of the planner's plan over `spans` (the step's non-empty tensors).
  Status AllreduceStep(const AllreduceStep& step, const TensorEntry& first, std::vector<TensorSpan> spans);
  // An Adasum response: packed in host memory, combined there (adasum_allreduce.h).
  Status Adasum(std::vector<TensorEntry>* entries);
  Status Allgather(TensorEntry* entry, const std::vector<int64_t>& first_dims);
  Status Broadcast(TensorEntry* entry);
  Status Alltoall(TensorEntry* entry, const std::vector<int64_t>& split_matrix);
  Status Reducescatter(TensorEntry* entry);
  // Join: every rank's join() returns the rank that joined last.
  Status Join(TensorEntry* entry, int32_t last_joined);

  // The transport for a non-allreduce collective on `entry`'s device, or null
  // (entry_status_ then says why).
  DataTransport* TransportFor(const TensorEntry& entry);
  // Memory to take part in a collective with when an output could not be
  // allocated: on the host, or on the device for a device transport.
  Status Scratch(int64_t bytes, void** out);
  // The host fusion buffer, grown to at least `bytes`.
  uint8_t* FusionBuffer(int64_t bytes);

  // The factor results are multiplied by when scaling is folded into a
  // transport's pass (postscale, and 1/contributors for Average); false for integer
  // Average, which divides afterwards like TF does.
  bool FoldedPostscale(const TensorEntry& first, double* postscale) const;

  // Sum-then-scale: turns Average into Sum plus a division and applies the
  // postscale factor to `count` reduced elements.
  void FinishReduction(DataType dtype, ReduceOp op, double postscale, void* data,
                       int64_t count) const;

  // Records `phase` for the entries being executed, from `begin` to now;
  // `extra_args`: more JSON members of the event's args (Timeline::Record).
  void Trace(const char* phase, Timeline::Clock::time_point begin, const char* extra_args = nullptr);

  Topology topology_;
  std::vector<DataTransport*> data_plane_;
  const FusionPlanner* planner_;
  Timeline* timeline_;
  int32_t process_set_id_;
  bool traced_ = true;
  std::vector<std::string> tracing_;  // names of the response being executed
  std::vector<uint8_t> fusion_buffer_;  // reused across cycles
  std::vector<uint8_t> scratch_;
  DeviceBuffer device_scratch_;
  HostStaging staging_;  // GPU tensors no device transport takes
  // Whether the current response runs on a device transport, and on which GPU.
  bool on_device_ = false;
  int device_ = -1;
  // Fails the current response's entries on this rank without a transport
  // failure: an output allocation that failed (the rank took part with scratch
  // memory), or no transport for the tensors' device (which every rank finds).
  Status entry_status_;
  // Ranks whose data the current response reduces: Average divides by this
  // (ranks inside join() take part without contributing).
  int contributors_ = 1;
  AdasumAllreduce adasum_;
};

}  // namespace smdist
