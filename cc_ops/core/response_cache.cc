#include "response_cache.h"

namespace smdist {

bool SameParameters(const Request& a, const Request& b) {
  return a.name == b.name && a.type == b.type && a.dtype == b.dtype && a.shape == b.shape &&
         a.root_rank == b.root_rank && a.reduce_op == b.reduce_op && a.prescale == b.prescale &&
         a.postscale == b.postscale && a.compression == b.compression && a.splits == b.splits && a.error.empty() && b.error.empty();
}

ResponseCache::ResponseCache(int64_t capacity) : capacity_(capacity), slots_(capacity) {
  for (int64_t i = 0; i < capacity; ++i) free_.insert(i);
}

int64_t ResponseCache::Lookup(const Request& request) const {
  auto it = by_name_.find(request.name);
  if (it == by_name_.end()) return -1;
  return SameParameters(slots_[it->second].params, request) ? it->second : -1;
}

void ResponseCache::Put(const Request& local_params, const Response& response) {
  auto it = by_name_.find(local_params.name);
  if (it != by_name_.end()) {
    slots_[it->second].params = local_params;
    slots_[it->second].response = response;
    return;
  }
  if (free_.empty()) return;
  const int64_t bit = *free_.begin();
  free_.erase(free_.begin());
  slots_[bit] = Slot{true, local_params, response};
  by_name_[local_params.name] = bit;
}

void ResponseCache::Erase(const std::string& name) {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return;
  slots_[it->second] = Slot{};
  free_.insert(it->second);
  by_name_.erase(it);
}

}  // namespace smdist
