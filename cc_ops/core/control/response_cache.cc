#include "control/response_cache.h"

namespace smdist {

bool SameParameters(const Request& a, const Request& b) {
  return a.name == b.name && a.type == b.type && a.dtype == b.dtype && a.shape == b.shape && a.device == b.device &&
         a.root_rank == b.root_rank && a.reduce_op == b.reduce_op && a.prescale == b.prescale &&
         a.postscale == b.postscale && a.compression == b.compression && a.splits == b.splits &&
         a.same_first_dim == b.same_first_dim && a.error.empty() && b.error.empty();
}

ResponseCache::ResponseCache(int64_t capacity) : capacity_(capacity), slots_(capacity) {
  for (int64_t i = 0; i < capacity; ++i) free_.insert(i);
}

int64_t ResponseCache::Lookup(const Request& request) const {
  auto it = by_name_.find(request.name);
  if (it == by_name_.end()) return -1;
  return SameParameters(slots_[it->second].params, request) ? it->second : -1;
}

int64_t ResponseCache::Put(const Request& local_params, const Response& response) {
  auto it = by_name_.find(local_params.name);
  if (it != by_name_.end()) {
    slots_[it->second].params = local_params;
    slots_[it->second].response = response;
    Touch(it->second);
    return -1;
  }
  if (capacity_ <= 0) return -1;
  int64_t evicted = -1;
  if (free_.empty()) {
    evicted = recency_.back();
    Erase(slots_[evicted].params.name);
  }
  const int64_t bit = *free_.begin();
  free_.erase(free_.begin());
  recency_.push_front(bit);
  slots_[bit] = Slot{true, local_params, response, recency_.begin()};
  by_name_[local_params.name] = bit;
  return evicted;
}

void ResponseCache::Touch(int64_t bit) {
  Slot& slot = slots_[bit];
  if (slot.used) recency_.splice(recency_.begin(), recency_, slot.recency);
}

std::vector<std::string> ResponseCache::NamesByRecency() const {
  std::vector<std::string> names;
  for (int64_t bit : recency_) names.push_back(slots_[bit].params.name);
  return names;
}

void ResponseCache::Erase(const std::string& name) {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return;
  recency_.erase(slots_[it->second].recency);
  slots_[it->second] = Slot{};
  free_.insert(it->second);
  by_name_.erase(it);
}

}  // namespace smdist
