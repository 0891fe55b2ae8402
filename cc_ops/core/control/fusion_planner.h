// Decides what is fused and where, in one place: which ready allreduces travel
// as one response (full and cached negotiation alike), and how the tensors of
// one response travel on this rank - read where they lie, or packed into a
// fusion buffer on their device - and over which transport. Its answers depend
// only on negotiated facts and shared settings, so every rank plans alike.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/tensor_entry.h"
#include "control/message.h"
#include "transports/data_transport.h"

namespace smdist {

// One part of an allreduce's plan.
struct AllreduceStep {
  std::vector<size_t> members;  // indices into the response's entries
  // Packed into a fusion buffer on `device` (in the wire type) and reduced
  // there; otherwise reduced where the tensors lie.
  bool packed = false;
  Device device;
  // A prescaled tensor reduced where it lies: scaled into its output first.
  bool scale_first = false;
  DataTransport* transport = nullptr;  // null: no transport reaches this device
};

class FusionPlanner {
 public:
  // Fused responses and fusion buffers hold at most `threshold_bytes`
  // (<= 0: nothing is fused).
  explicit FusionPlanner(int64_t threshold_bytes) : threshold_bytes_(threshold_bytes) {}
  // Autotuning changes it between cycles, on every rank at the same cycle.
  void set_threshold_bytes(int64_t threshold_bytes) { threshold_bytes_ = threshold_bytes; }

  // Merges allreduce responses with the same fusion key, in order, into
  // responses of at most the threshold (a larger tensor travels alone).
  // `params` gives any one rank's request for a response's (only) name.
  void Fuse(std::vector<Response>* responses,
            const std::function<const Request&(const std::string&)>& params) const;

  // How `entries` (one response's, same dtype, op, scaling and device) are
  // reduced, by the first of `transports` enabled for each step.
  std::vector<AllreduceStep> PlanAllreduce(const std::vector<TensorEntry>& entries,
                                           const std::vector<DataTransport*>& transports) const;

 private:
  // Tensors at least this big are not packed when no transport takes the
  // response as it lies: their transfer dwarfs one call's latency, and the
  // buffer would cost them two copies.
  static constexpr int64_t kUnfusedTensorBytes = 1 << 20;

  int64_t threshold_bytes_;
};

// Fusion key ("same dtype, device, op and scaling") and wire bytes of an allreduce.
std::pair<std::string, int64_t> FusionInfo(const Request& request);

}  // namespace smdist
