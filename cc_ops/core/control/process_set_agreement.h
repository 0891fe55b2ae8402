// Registering and removing process sets is collective over every rank. Each
// rank proposes what it is asked to do; rank 0 checks that all proposals
// agree and are valid against the sets it knows (every rank knows the same
// ones) and sends one verdict to all, so a bad call fails on every rank alike
// instead of leaving some of them waiting.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "transports/control_plane.h"

namespace smdist {

struct ProcessSetProposal {
  enum class Kind : int64_t { kAdd = 1, kRemove = 2 };
  Kind kind = Kind::kAdd;
  int32_t id = 0;          // kRemove: the set to remove
  std::vector<int> ranks;  // kAdd: the members, as the caller gave them
  bool busy = false;       // kRemove: collectives in flight on the set here
};

// Why the proposals (indexed by rank) cannot be carried out, or "" when they
// can. `known`: the registered sets by id; `world_size`: all ranks.
std::string CheckProcessSetProposals(const std::vector<ProcessSetProposal>& proposals,
                                     const std::map<int32_t, std::vector<int>>& known, int world_size);

// Runs the agreement over `control` (collective over all its ranks): OK, or
// the same InvalidArgument error on every rank.
Status AgreeOnProcessSetProposal(ControlPlane* control, const ProcessSetProposal& mine,
                                 const std::map<int32_t, std::vector<int>>& known);

}  // namespace smdist
