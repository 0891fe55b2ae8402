// Rank 0's view of negotiation: which ranks have submitted which named
// collectives. A collective becomes ready when every rank has submitted it;
// ready collectives are checked for agreement, fused, and announced to all
// ranks in one ResponseList so every rank executes the same sequence.
#pragma once

#include <chrono>
#include <string>
#include <unordered_map>
#include <vector>

#include "message.h"
#include "stall_inspector.h"

namespace smdist {

class Coordinator {
 public:
  Coordinator(int size, int64_t fusion_threshold_bytes, StallInspector stall_inspector);

  void Add(const RequestList& list, int rank);
  ResponseList BuildResponses();

 private:
  struct Pending {
    std::vector<Request> by_rank;
    std::vector<bool> seen;
    int count = 0;
    std::chrono::steady_clock::time_point first_seen;
  };

  Response ResponseFor(const std::string& name, const Pending& pending) const;
  void FuseAllreduces(std::vector<Response>* responses) const;

  int size_;
  int64_t fusion_threshold_bytes_;
  StallInspector stall_inspector_;
  std::unordered_map<std::string, Pending> table_;
  std::vector<std::string> ready_;  // in the order they became ready
  bool shutdown_ = false;
  int shutdown_rank_ = -1;
  // Byte size and fusion key of each ready allreduce, for fusion planning.
  std::unordered_map<std::string, std::pair<std::string, int64_t>> fusion_info_;
};

// Validates that all ranks agree on a collective. Returns "" when they do,
// otherwise a message naming the tensor and what differs.
std::string CheckAgreement(const std::string& name, const std::vector<Request>& by_rank);

// Rows of a reducescatter output on `rank`: dim0 split as evenly as possible,
// lower ranks taking the remainder.
int64_t ReducescatterRows(int64_t dim0, int size, int rank);

}  // namespace smdist
