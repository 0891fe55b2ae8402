#include "control/process_set_agreement.h"

#include <algorithm>
#include <cstring>
#include <set>

namespace smdist {
namespace {

std::string RanksText(const std::vector<int>& ranks) {
  std::string text = "[";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text + "]";
}

std::string Describe(const ProcessSetProposal& p) {
  return p.kind == ProcessSetProposal::Kind::kAdd ? "add_process_set(" + RanksText(p.ranks) + ")"
                                                  : "remove_process_set(" + std::to_string(p.id) + ")";
}

bool SameCall(const ProcessSetProposal& a, const ProcessSetProposal& b) {
  return a.kind == b.kind && a.id == b.id && a.ranks == b.ranks;
}

std::vector<uint8_t> Encode(const ProcessSetProposal& p) {
  std::vector<int64_t> words = {static_cast<int64_t>(p.kind), p.id, p.busy ? 1 : 0};
  for (int r : p.ranks) words.push_back(r);
  std::vector<uint8_t> bytes(words.size() * sizeof(int64_t));
  std::memcpy(bytes.data(), words.data(), bytes.size());
  return bytes;
}

bool Decode(const std::vector<uint8_t>& bytes, ProcessSetProposal* p) {
  if (bytes.size() % sizeof(int64_t) != 0 || bytes.size() < 3 * sizeof(int64_t)) return false;
  std::vector<int64_t> words(bytes.size() / sizeof(int64_t));
  std::memcpy(words.data(), bytes.data(), bytes.size());
  p->kind = static_cast<ProcessSetProposal::Kind>(words[0]);
  p->id = static_cast<int32_t>(words[1]);
  p->busy = words[2] != 0;
  p->ranks.assign(words.begin() + 3, words.end());
  return true;
}

}  // namespace

std::string CheckProcessSetProposals(const std::vector<ProcessSetProposal>& proposals,
                                     const std::map<int32_t, std::vector<int>>& known, int world_size) {
  const ProcessSetProposal& first = proposals.front();
  for (size_t r = 1; r < proposals.size(); ++r) {
    if (!SameCall(proposals[r], first)) {
      return "process sets must be added and removed by every rank with the same arguments, in the same "
             "order: rank 0 called " + Describe(first) + ", rank " + std::to_string(r) + " called " +
             Describe(proposals[r]);
    }
  }
  if (first.kind == ProcessSetProposal::Kind::kAdd) {
    if (first.ranks.empty()) return "a process set needs at least one rank";
    std::set<int> seen;
    for (int rank : first.ranks) {
      if (rank < 0 || rank >= world_size) {
        return "process set " + RanksText(first.ranks) + ": rank " + std::to_string(rank) +
               " is out of range for " + std::to_string(world_size) + " ranks";
      }
      if (!seen.insert(rank).second) {
        return "process set " + RanksText(first.ranks) + ": rank " + std::to_string(rank) + " is listed twice";
      }
    }
    const std::vector<int> sorted(seen.begin(), seen.end());
    for (const auto& kv : known) {
      if (kv.second == sorted) {
        return "a process set with ranks " + RanksText(sorted) + " is already registered (id " +
               std::to_string(kv.first) + ")";
      }
    }
    return "";
  }
  if (first.id == 0) return "the global process set (id 0) cannot be removed";
  if (known.find(first.id) == known.end()) {
    return "process set " + std::to_string(first.id) + " is not registered";
  }
  std::string busy;
  for (size_t r = 0; r < proposals.size(); ++r) {
    if (proposals[r].busy) busy += (busy.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!busy.empty()) {
    return "process set " + std::to_string(first.id) + " still has collectives in flight on rank(s) " + busy +
           ": wait for them before removing it";
  }
  return "";
}

Status AgreeOnProcessSetProposal(ControlPlane* control, const ProcessSetProposal& mine,
                                 const std::map<int32_t, std::vector<int>>& known) {
  std::vector<std::vector<uint8_t>> gathered;
  SMDIST_RETURN_IF_ERROR(control->GatherToRoot(Encode(mine), &gathered));
  std::vector<uint8_t> verdict;
  if (control->topology().rank == 0) {
    std::vector<ProcessSetProposal> proposals(gathered.size());
    std::string error;
    for (size_t r = 0; r < gathered.size() && error.empty(); ++r) {
      if (!Decode(gathered[r], &proposals[r])) error = "malformed process set proposal from rank " + std::to_string(r);
    }
    if (error.empty()) error = CheckProcessSetProposals(proposals, known, control->topology().size);
    verdict.assign(error.begin(), error.end());
  }
  SMDIST_RETURN_IF_ERROR(control->BroadcastFromRoot(&verdict));
  if (verdict.empty()) return Status::OK();
  return Status::InvalidArgument(std::string(verdict.begin(), verdict.end()));
}

}  // namespace smdist
