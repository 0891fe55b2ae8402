// Point-to-point messages between two ranks (pipeline parallelism): the
// framework-free interface the TF kernels talk to. A message is a list of
// tensors; the receiver learns their dtypes and shapes from the sender, so
// it allocates its outputs only once a message has arrived.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "common/status.h"
#include "common/types.h"

namespace smdist {

// Dtype and shape of one tensor of a message.
struct TensorSignature {
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;

  int64_t bytes() const { return NumElements(shape) * static_cast<int64_t>(DataTypeSize(dtype)); }
  bool operator==(const TensorSignature& o) const { return dtype == o.dtype && shape == o.shape; }
  bool operator!=(const TensorSignature& o) const { return !(*this == o); }
};

struct SendMessage {
  int peer = 0;
  int tag = 0;
  std::vector<TensorSignature> signature;
  std::vector<const void*> data;  // one buffer per tensor
  // Called once the buffers are no longer read (they must stay alive until then).
  std::function<void()> release;
};

struct RecvMessage {
  int peer = 0;
  int tag = 0;
  // Allocates one output per tensor once the sender's signature is known;
  // an error fails the receive (the message is still drained).
  std::function<Status(const std::vector<TensorSignature>& signature, std::vector<void*>* data)>
      allocate;
  // Called exactly once, from the channel's thread (or the caller's on early failure).
  std::function<void(const Status&)> done;
};

class PointToPointChannel {
 public:
  virtual ~PointToPointChannel() = default;

  // Messages between one pair of ranks with one tag arrive in the order they
  // were sent. Send never waits for the receiver: it returns once the
  // message is queued, so neighbours that both send first cannot deadlock.
  // A later transport failure is reported by the next call on this rank.
  virtual Status Send(SendMessage message) = 0;
  // Queues a receive; `done` runs when the data is in the outputs.
  virtual Status Recv(RecvMessage message) = 0;
  // Fails every receive not yet matched, and all later calls, with `status`:
  // when the engine stops (another rank exited), nobody waits on a dead peer.
  virtual void Abort(const Status& status) = 0;
};

}  // namespace smdist
