// One process set's negotiation: each cycle its members agree on what runs
// next. A collective negotiated before goes by its response-cache bit: one
// bitwise-AND allreduce says which every member has submitted. The rest go in
// full: every member's requests to the coordinator (the first member), its
// responses back to all. Every member makes the same cache changes in the same
// order (the responses it executes), so the bits agree without messages.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "control/coordinator.h"
#include "control/fusion_planner.h"
#include "control/message.h"
#include "control/response_cache.h"
#include "transports/control_plane.h"

namespace smdist {

class Negotiator {
 public:
  // `members`: the job rank of each member. `planner` fuses ready allreduces
  // on both paths alike; `control` is the members' control plane. Both
  // outlive this.
  Negotiator(std::vector<int> members, const EngineConfig& config, const FusionPlanner* planner,
             ControlPlane* control);
  Negotiator(const Negotiator&) = delete;
  Negotiator& operator=(const Negotiator&) = delete;

  // The bit-vector round. Of this cycle's `fresh` requests, those a cached
  // collective's bit stands for wait for the bit; the others go to `uncached`,
  // after those requeued since the last cycle. Fills `ready` with the cached
  // collectives every member has submitted (fused); `needs_full` when anyone
  // has uncached work, asked to shut down (`shutting_down` here), suspects a
  // stall or is inside join(). Without a cache, all of `fresh` goes in full.
  Status NegotiateCached(std::vector<Request> fresh, bool shutting_down, std::vector<Request>* uncached,
                         std::vector<Response>* ready, bool* needs_full);
  // The full round: `mine` to the coordinator, the same `out` to every member.
  Status NegotiateFull(const RequestList& mine, ResponseList* out);

  // After a full round, before its responses run: forgets the collectives
  // some member changed; one this rank has pending as cached goes in full next cycle.
  void Forget(const std::vector<std::string>& evictions);
  // After `response` (from a full round) ran here with this rank's
  // `requests`: caches its collectives, so they go by their bit next time.
  void Remember(const Response& response, const std::vector<Request>& requests);

  // Whether this rank's join() is in flight; JoinEnded when it completes or fails.
  bool join_in_flight() const { return joined_; }
  void JoinEnded() { joined_ = false; }

  // Tests: the cached names, most recently executed first.
  std::vector<std::string> cached_names() const { return cache_.NamesByRecency(); }

 private:
  struct CachedPending {
    Request request;
    std::chrono::steady_clock::time_point since;
  };

  const FusionPlanner* planner_;
  ControlPlane* control_;
  // A cached collective pending this long is renegotiated in full so the
  // coordinator's stall inspector can name the missing ranks.
  double stall_after_;
  ResponseCache cache_;
  Coordinator coordinator_;  // only the first member's is consulted
  std::map<int64_t, CachedPending> cached_pending_;  // by cache bit
  std::vector<Request> requeued_;  // evicted while pending: renegotiate in full
  bool joined_ = false;
};

}  // namespace smdist
