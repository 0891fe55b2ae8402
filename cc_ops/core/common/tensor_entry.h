// One collective submitted by a framework kernel: what to do, where the data
// is, and how to hand results back. Framework-free: buffers are raw pointers
// kept alive by whatever the callbacks capture.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/device.h"
#include "common/status.h"
#include "common/types.h"

namespace smdist {

// Every rank's join entry carries this name, so the joins match.
inline constexpr const char* kJoinName = "smdist.join";

struct TensorEntry {
  std::string name;
  // The process set that runs it (0: all ranks). Broadcast roots are world ranks.
  int32_t process_set_id = 0;
  CollectiveType type = CollectiveType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  // Where `input` and `output` live; the data plane picks a transport that reaches it.
  Device device;
  // Null for host tensors. Otherwise the data is ready only once this event
  // fires, and `stream` (opaque: the framework's GPU stream) is where results
  // are expected.
  std::shared_ptr<ReadyEvent> ready_event;
  void* stream = nullptr;
  const void* input = nullptr;
  // Preallocated output for ops whose output shape is known up front
  // (allreduce, broadcast, reducescatter). May equal `input`.
  void* output = nullptr;
  int32_t root_rank = 0;
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  WireCompression compression = WireCompression::kNone;  // allreduce only
  std::vector<int64_t> splits;  // alltoall: rows sent to each rank
  // allgather, alltoall: the output's shape was fixed before negotiation (XLA
  // compiles it), so every rank must pass the same first dimension.
  bool same_first_dim = false;
  // A problem found locally (bad splits, bad root): reported through
  // negotiation so every rank fails together instead of this one alone.
  std::string local_error;
  // When the entry was queued (timeline: negotiation starts here).
  std::chrono::steady_clock::time_point enqueued_at;

  // Allocates the output once negotiation has fixed its shape (allgather,
  // alltoall). Called on the engine thread.
  std::function<Status(const std::vector<int64_t>& shape, void** data)> allocate_output;
  // alltoall: rows received from each rank.
  std::function<void(const std::vector<int64_t>& received_splits)> set_received_splits;
  // Called exactly once, on the engine thread (or the caller's on early failure).
  std::function<void(const Status&)> done;
};

}  // namespace smdist
