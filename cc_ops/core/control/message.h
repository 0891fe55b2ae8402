// Negotiation messages. Every cycle each rank sends the coordinator a
// RequestList (the collectives it newly submitted); the coordinator answers
// every rank with the same ResponseList, which all ranks execute in order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/device.h"
#include "common/types.h"

namespace smdist {

struct Request {
  int32_t rank = 0;
  std::string name;
  CollectiveType type = CollectiveType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  Device device;  // host or GPU: ranks must agree on which, and only same-device tensors fuse
  int32_t root_rank = 0;
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  WireCompression compression = WireCompression::kNone;  // allreduce only
  std::vector<int64_t> splits;  // alltoall only; empty means equal splits
  bool same_first_dim = false;  // allgather, alltoall: see TensorEntry
  std::string error;            // a local validation error, reported to all ranks
  // Sent in full only because a rank has joined: the sender still has it
  // cached with these parameters, so the coordinator must not evict it.
  bool cached = false;
};

struct RequestList {
  std::vector<Request> requests;
  bool shutdown = false;
  // Non-empty: this rank is exiting because of a failure ("rank 1 is exiting
  // with code 3"); the others stop with this error instead of waiting for it.
  std::string failure;
  // Non-empty: a process set stops because this rank's engine stopped (a peer's
  // failure, a stall); its members fail with this reason, as the job's ranks do,
  // whichever of the two streams tells them first.
  std::string relayed_stop;
  int32_t relayed_failed_peer = -1;  // with relayed_stop: the job rank that failed, if any

  std::vector<uint8_t> Serialize() const;
  static bool Parse(const uint8_t* data, size_t size, RequestList* out);
};

enum class ResponseType : int32_t {
  kCollective = 0,  // execute `type` over `names`
  kError,           // fail `names` with `error` on every rank
};

struct Response {
  ResponseType response_type = ResponseType::kCollective;
  CollectiveType type = CollectiveType::kAllreduce;
  std::vector<std::string> names;  // more than one when fused
  std::string error;
  // The error is in one rank's own input (bad splits, root out of range):
  // InvalidArgument on every rank, as Horovod raises it; otherwise the ranks
  // disagree (PreconditionFailed).
  bool invalid_input = false;
  // allgather: first dimension of each rank's tensor.
  // alltoall: row-major size x size matrix, sizes[src * size + dst] = rows
  // rank src sends to rank dst.
  std::vector<int64_t> sizes;
  // Ranks that have joined and take part without an entry of their own
  // (zeros or the reduction's identity, no rows); Average divides by the
  // ranks that contributed. A joined rank fails its join on an error response.
  std::vector<int32_t> joined;
  // With `joined`: one contributor's parameters per name, from which a joined
  // rank builds the buffers it takes part with.
  std::vector<Request> params;
  int32_t last_joined = -1;  // join: the rank that joined last
};

struct ResponseList {
  std::vector<Response> responses;
  bool shutdown = false;
  std::string shutdown_error;  // non-empty: the engine stops with this error
  int32_t failed_peer = -1;    // the job rank whose failure stopped the stream, if any
  // Cached collectives every rank must forget before executing `responses`
  // (some rank submitted them with new parameters).
  std::vector<std::string> evictions;

  std::vector<uint8_t> Serialize() const;
  static bool Parse(const uint8_t* data, size_t size, ResponseList* out);
};

}  // namespace smdist
