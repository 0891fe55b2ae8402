// Rank 0's view of negotiation: which ranks have submitted which named
// collectives. A collective becomes ready when every rank has submitted it
// or joined; ready collectives are checked for agreement, fused, and
// announced to all ranks in one ResponseList so every rank executes the same
// sequence.
#pragma once

#include <chrono>
#include <string>
#include <unordered_map>
#include <vector>

#include <set>

#include "control/message.h"
#include "control/response_cache.h"
#include "control/stall_inspector.h"

namespace smdist {

class FusionPlanner;

class Coordinator {
 public:
  // `cache` (may be null) is rank 0's copy of the response cache, identical
  // to every rank's: a fresh request for a cached name evicts it everywhere.
  // `planner` fuses ready allreduces. `members`: the job rank of each
  // negotiating rank (a process set's members, or every rank), for messages.
  Coordinator(std::vector<int> members, const FusionPlanner* planner, StallInspector stall_inspector,
              const ResponseCache* cache);

  void Add(const RequestList& list, int rank);
  // Whether some collective is waiting for ranks (it needs stall inspection
  // every cycle, so negotiation must not stay on the cached fast path).
  bool HasPending() const { return !table_.empty(); }
  ResponseList BuildResponses();

 private:
  struct Pending {
    std::vector<Request> by_rank;
    std::vector<bool> seen;
    int count = 0;
    std::chrono::steady_clock::time_point first_seen;
  };

  // Whether every rank has submitted `pending` or joined.
  bool CompleteWithJoined(const Pending& pending) const;
  // May un-join ranks: an error response fails the joins of the ranks it lists.
  Response ResponseFor(const std::string& name, const Pending& pending);
  void Unjoin(int rank);

  std::vector<int> members_;
  int size_;
  const FusionPlanner* planner_;
  StallInspector stall_inspector_;
  std::unordered_map<std::string, Pending> table_;
  std::vector<std::string> ready_;  // in the order they became ready
  bool shutdown_ = false;
  int shutdown_rank_ = -1;
  std::string failure_;  // the first failing rank's reason
  int failed_rank_ = -1;
  std::string relayed_stop_;  // the first member's engine stop reason, if it relayed one
  int relayed_failed_peer_ = -1;
  const ResponseCache* cache_;
  std::vector<std::string> evictions_;
  std::set<std::string> evicting_;
  std::vector<bool> joined_;  // by rank: inside join()
  int joined_count_ = 0;
  int last_joined_ = -1;
};

// Validates that the ranks that submitted a collective (`submitted`, in rank
// order) agree on it. Returns "" when they do, otherwise a message naming the
// tensor and what differs.
std::string CheckAgreement(const std::string& name, const std::vector<Request>& submitted);

// Why the collective `first` describes cannot complete while the ranks
// `joined` take part without entries, or "".
std::string JoinConflict(const std::string& name, const Request& first, const std::vector<int32_t>& joined);

}  // namespace smdist
