// The data plane: a transport that moves tensors for collectives. Several are
// registered (transports/registry.cc) in order of preference; for each piece
// of work the executor runs the first whose Enabled() accepts it, the way
// Horovod's operation manager picks the first enabled implementation. So a
// new transport (NCCL for GPU tensors) is one more entry in that list.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/device.h"
#include "common/span_staging.h"
#include "common/status.h"
#include "common/types.h"

namespace smdist {

// What a piece of work asks of a transport: enough to choose one without
// touching the data.
struct CollectiveWork {
  CollectiveType type = CollectiveType::kAllreduce;
  Device device;
  // Allreduce (and reducescatter: wire_bytes) from here on.
  DataType dtype = DataType::kFloat32;  // of the tensors
  DataType wire = DataType::kFloat32;   // reduced (differs under compression)
  int64_t wire_bytes = 0;               // all tensors together, in the wire type
  size_t num_tensors = 1;
  bool prescaled = false;               // inputs are multiplied before reducing
  // Allreduce and reducescatter: the op asked for (Average too) and whether
  // results are multiplied by a postscale factor other than 1.
  ReduceOp op = ReduceOp::kSum;
  bool postscaled = false;

  // Whether the tensors can be read where they lie: no conversion, no prescaling.
  bool readable_in_place() const { return wire == dtype && !prescaled; }
};

class DataTransport {
 public:
  virtual ~DataTransport() = default;

  // Shown in the timeline ("path") and logs.
  virtual std::string name() const = 0;
  // Whether this transport runs `work` on this rank. Every rank answers alike
  // for the same work (the answer depends only on negotiated facts and on
  // settings the job shares), so every rank calls the same transport.
  virtual bool Enabled(const CollectiveWork& work) const = 0;
  // Device transports queue the next calls' work on `stream` of `device`,
  // after what the framework queued there, and return without waiting for it
  // (the framework's later work on that stream runs after it). Host transports
  // ignore it. Called on every rank for the same work. A PreconditionFailed
  // status is every rank's answer (the collective fails, the ranks stay in
  // step); any other error stops the engine.
  virtual Status UseDevice(const Device& device, void* stream);

  // Reduces `staging`'s tensors (its wire type) across the ranks with `op`
  // (Sum, Min, Max or Product; Average is Sum plus the executor's scaling)
  // and writes the results through it, multiplied by its postscale.
  virtual Status Allreduce(const SpanStaging& staging, ReduceOp op) = 0;
  // The other collectives: only called when Enabled() accepted their type.
  // Concatenates every rank's `send` into `recv` in rank order.
  virtual Status Allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts,
                            DataType dtype);
  // Rank `root`'s `input` into every rank's `output` (they may be one buffer;
  // only the root's input is read).
  virtual Status Broadcast(const void* input, void* output, int64_t count, DataType dtype, int root);
  virtual Status Alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                           const std::vector<int64_t>& recv_counts, DataType dtype);
  // Reduces `send` (sum of recv_counts elements) across ranks; rank r keeps
  // block r, recv_counts[r] elements long. Host transports are given Sum,
  // Min, Max or Product; device transports also Average, which they finish
  // themselves.
  virtual Status ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                               DataType dtype, ReduceOp op);
};

}  // namespace smdist
