// Runs negotiated collectives on this rank's entries through a Transport:
// packs fused allreduces into one buffer, applies Average and scaling, sizes
// ragged outputs, and reports each entry's completion. A rank inside join()
// runs the same calls on neutral buffers (joined_participation.h).
#pragma once

#include <vector>

#include "message.h"
#include "tensor_entry.h"
#include "timeline.h"
#include "transport.h"

namespace smdist {

class CollectiveExecutor {
 public:
  CollectiveExecutor(Transport* transport, Timeline* timeline)
      : transport_(transport), timeline_(timeline) {}

  // `entries` are this rank's entries for `response.names`, in that order.
  // Completes every entry (calls done). Returns a transport failure, after
  // which the engine must stop.
  Status Execute(const Response& response, std::vector<TensorEntry>* entries);

 private:
  // Tensors at least this big skip the fusion buffer (the MPI and shared-memory
  // copy paths); smaller ones are packed, as their cost is the call's latency.
  static constexpr int64_t kUnfusedTensorBytes = 1 << 20;
  Status Allreduce(std::vector<TensorEntry>* entries);
  // One tensor, reduced from its input into its output.
  Status AllreduceSingle(TensorEntry* entry);
  // Fused or single allreduce straight between the ranks' tensors (no fusion buffer).
  Status AllreduceInPlace(const std::vector<const TensorEntry*>& entries);
  // Through a transport that stages the tensors itself (shared memory): no
  // fusion buffer, with conversion to `wire` and scaling folded into the copies.
  Status AllreduceStaged(const std::vector<TensorEntry>& entries, DataType wire);
  // Compression.fp16/bf16 without staging: narrow into the fusion buffer,
  // reduce the wire type, widen into the outputs (scaling folded into both passes).
  Status AllreduceCompressed(std::vector<TensorEntry>* entries, DataType wire);
  Status Allgather(TensorEntry* entry, const std::vector<int64_t>& first_dims);
  Status Broadcast(TensorEntry* entry);
  Status Alltoall(TensorEntry* entry, const std::vector<int64_t>& split_matrix);
  Status Reducescatter(TensorEntry* entry);

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

  Transport* transport_;
  Timeline* timeline_;
  std::vector<std::string> tracing_;  // names of the response being executed
  std::vector<uint8_t> fusion_buffer_;  // reused across cycles
  std::vector<uint8_t> scratch_;
  Status alloc_status_;  // output allocation result of the current response
  // Ranks whose data the current response reduces: Average divides by this
  // (ranks inside join() take part without contributing).
  int contributors_ = 1;
};

}  // namespace smdist
