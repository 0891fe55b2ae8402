#include "control/negotiator.h"

#include <unordered_map>
#include <utility>

#include "common/numbered_names.h"
#include "control/stall_inspector.h"

namespace smdist {
namespace {

// Word 0 of the bit-vector round: flags every member must set for the cycle
// to stay on the fast path. The cache bits follow from word 1.
constexpr uint64_t kNotShuttingDown = 1, kNothingUncached = 2, kNoStallSuspected = 4,
                   kCoordinatorIdle = 8, kNobodyJoined = 16;
constexpr uint64_t kFastPath = kNotShuttingDown | kNothingUncached | kCoordinatorIdle | kNobodyJoined;

bool TestBit(const std::vector<uint64_t>& words, int64_t bit) {
  return (words[1 + bit / 64] >> (bit % 64)) & 1u;
}

// The earlier of the stall warning and shutdown times that are set (<= 0: neither).
double StallAfter(const EngineConfig& config) {
  double stall_after = config.stall_check_seconds;
  if (stall_after <= 0 || (config.stall_shutdown_seconds > 0 && config.stall_shutdown_seconds < stall_after)) {
    stall_after = config.stall_shutdown_seconds;
  }
  return stall_after;
}

}  // namespace

Negotiator::Negotiator(std::vector<int> members, const EngineConfig& config, const FusionPlanner* planner,
                       ControlPlane* control)
    : planner_(planner),
      control_(control),
      stall_after_(StallAfter(config)),
      cache_(config.cache_capacity),
      coordinator_(std::move(members), planner,
                   StallInspector(config.stall_check_seconds, config.stall_shutdown_seconds),
                   config.cache_capacity > 0 ? &cache_ : nullptr) {}

Status Negotiator::NegotiateCached(std::vector<Request> fresh, bool shutting_down, std::vector<Request>* uncached,
                                   std::vector<Response>* ready, bool* needs_full) {
  for (const Request& r : fresh) joined_ |= r.type == CollectiveType::kJoin;
  *uncached = std::move(requeued_);
  requeued_.clear();
  *needs_full = true;
  if (cache_.capacity() <= 0) {
    for (Request& r : fresh) uncached->push_back(std::move(r));
    return Status::OK();
  }
  const auto now = std::chrono::steady_clock::now();
  for (Request& r : fresh) {
    const int64_t bit = cache_.Lookup(r);
    if (bit >= 0) {
      cached_pending_[bit] = CachedPending{std::move(r), now};
    } else {
      uncached->push_back(std::move(r));
    }
  }
  bool stall_suspected = false;
  std::vector<uint64_t> words(1 + (cache_.capacity() + 63) / 64, 0);
  for (const auto& kv : cached_pending_) {
    words[1 + kv.first / 64] |= uint64_t{1} << (kv.first % 64);
    const double waited = std::chrono::duration<double>(now - kv.second.since).count();
    stall_suspected |= stall_after_ > 0 && waited >= stall_after_;
  }
  if (!shutting_down) words[0] |= kNotShuttingDown;
  if (uncached->empty()) words[0] |= kNothingUncached;
  if (!stall_suspected) words[0] |= kNoStallSuspected;
  if (!coordinator_.HasPending()) words[0] |= kCoordinatorIdle;  // only the first member's can be busy
  if (!joined_) words[0] |= kNobodyJoined;
  std::vector<uint64_t> mine = words;
  SMDIST_RETURN_IF_ERROR(control_->AllreduceBits(&words, /*bitwise_and=*/true));

  std::vector<int64_t> ready_bits;
  for (const auto& kv : cached_pending_) {
    if (TestBit(words, kv.first)) ready_bits.push_back(kv.first);  // ascending: same order everywhere
  }
  std::unordered_map<std::string, int64_t> bit_of;
  for (int64_t bit : ready_bits) {
    cache_.Touch(bit);  // in ascending bit order: the same recency on every rank
    Response r = cache_.response(bit);
    r.names = {cache_.name(bit)};
    bit_of[cache_.name(bit)] = bit;
    ready->push_back(std::move(r));
    cached_pending_.erase(bit);
  }
  planner_->Fuse(ready, [this, &bit_of](const std::string& name) -> const Request& {
    return cache_.params(bit_of.at(name));
  });
  *needs_full = (words[0] & kFastPath) != kFastPath;
  if ((words[0] & kNoStallSuspected) == 0) {
    // Everyone forgets every collective still pending anywhere and sends the
    // ones it holds in full; the same evictions happen on every rank.
    std::vector<uint64_t> any = mine;
    any[0] = 0;
    SMDIST_RETURN_IF_ERROR(control_->AllreduceBits(&any, /*bitwise_and=*/false));
    for (int64_t bit = 0; bit < cache_.capacity(); ++bit) {
      if (!TestBit(any, bit)) continue;
      auto it = cached_pending_.find(bit);
      if (it != cached_pending_.end()) {
        uncached->push_back(it->second.request);
        cached_pending_.erase(it);
      }
      cache_.Erase(cache_.name(bit));
    }
    *needs_full = true;
  }
  if ((words[0] & kNobodyJoined) == 0) {
    // A joined rank sets no bits, so none of these can become ready here:
    // the coordinator completes them without it. They stay cached.
    for (auto& kv : cached_pending_) {
      kv.second.request.cached = true;
      uncached->push_back(std::move(kv.second.request));
    }
    cached_pending_.clear();
  }
  return Status::OK();
}

Status Negotiator::NegotiateFull(const RequestList& mine, ResponseList* out) {
  std::vector<std::vector<uint8_t>> gathered;
  SMDIST_RETURN_IF_ERROR(control_->GatherToRoot(mine.Serialize(), &gathered));
  std::vector<uint8_t> bytes;
  if (control_->topology().rank == 0) {
    for (size_t r = 0; r < gathered.size(); ++r) {
      RequestList list;
      if (!RequestList::Parse(gathered[r].data(), gathered[r].size(), &list)) {
        return Status::Unknown("malformed request list from rank " + std::to_string(r));
      }
      coordinator_.Add(list, static_cast<int>(r));
    }
    bytes = coordinator_.BuildResponses().Serialize();
  }
  SMDIST_RETURN_IF_ERROR(control_->BroadcastFromRoot(&bytes));
  if (!ResponseList::Parse(bytes.data(), bytes.size(), out)) {
    return Status::Unknown("malformed response list");
  }
  return Status::OK();
}

void Negotiator::Forget(const std::vector<std::string>& evictions) {
  for (const std::string& name : evictions) {
    for (auto it = cached_pending_.begin(); it != cached_pending_.end(); ++it) {
      if (it->second.request.name == name) {
        requeued_.push_back(it->second.request);
        cached_pending_.erase(it);
        break;
      }
    }
    cache_.Erase(name);
  }
}

void Negotiator::Remember(const Response& response, const std::vector<Request>& requests) {
  // Join, and collectives some rank took part in without an entry, happen
  // only now: there is nothing to remember.
  if (response.response_type != ResponseType::kCollective || !response.joined.empty() ||
      response.type == CollectiveType::kJoin || cache_.capacity() <= 0) {
    return;
  }
  // Every rank executes the same responses in the same order, so every
  // cache assigns the same bits.
  // Copied once without its names: copying a fused response per member made
  // remembering a group of n tensors cost n^2 name copies.
  Response single = response;
  single.names.clear();
  for (const Request& request : requests) {
    // Numbered unnamed eager collectives ("allreduce.noname.7") never recur:
    // caching them would only crowd out the ones that do. A rule on the name
    // alone, which every rank shares, keeps the caches' bits in step.
    if (IsNumberedCallName(request.name)) continue;
    single.names.assign(1, request.name);
    const int64_t evicted = cache_.Put(request, single);
    auto pending = cached_pending_.find(evicted);
    if (pending != cached_pending_.end()) {
      // Submitted here as cached, now evicted everywhere: negotiate it in full.
      requeued_.push_back(std::move(pending->second.request));
      cached_pending_.erase(pending);
    }
  }
}

}  // namespace smdist
