#include "control/tensor_queue.h"

#include <chrono>
#include <string_view>
#include <unordered_set>

namespace smdist {

Status TensorQueue::Add(std::vector<TensorEntry> entries, int rank, bool wake) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A set, not a pairwise scan: one op may submit thousands of tensors.
    std::unordered_set<std::string_view> batch;
    batch.reserve(entries.size());
    for (size_t i = 0; i < entries.size(); ++i) {
      const bool dup = table_.count(entries[i].name) > 0 || !batch.insert(entries[i].name).second;
      if (dup) {
        return Status::InvalidArgument("a collective named '" + entries[i].name +
                                       "' is already in flight on rank " + std::to_string(rank) +
                                       "; give concurrent collectives distinct names");
      }
    }
    const auto now = std::chrono::steady_clock::now();
    for (TensorEntry& e : entries) {
      e.enqueued_at = now;
      Request r;
      r.rank = rank;
      r.name = e.name;
      r.type = e.type;
      r.dtype = e.dtype;
      r.shape = e.shape;
      r.device = e.device;
      r.root_rank = e.root_rank;
      r.reduce_op = e.reduce_op;
      r.prescale = e.prescale;
      r.postscale = e.postscale;
      r.compression = e.compression;
      r.splits = e.splits;
      r.same_first_dim = e.same_first_dim;
      r.error = e.local_error;
      fresh_.push_back(r);
      std::string name = e.name;
      table_.emplace(std::move(name), Pending{std::move(e), std::move(r)});
    }
    if (!wake) return Status::OK();
    woken_ = true;
  }
  cv_.notify_all();
  return Status::OK();
}

void TensorQueue::PopRequests(std::vector<Request>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  while (!fresh_.empty()) {
    out->push_back(std::move(fresh_.front()));
    fresh_.pop_front();
  }
  woken_ = false;
}

bool TensorQueue::WaitForWork(int64_t timeout_us) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::microseconds(timeout_us),
                      [this] { return woken_ || !fresh_.empty(); });
}

void TensorQueue::Wake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    woken_ = true;
  }
  cv_.notify_all();
}

bool TensorQueue::HasInFlight() {
  std::lock_guard<std::mutex> lock(mu_);
  return !table_.empty();
}

bool TensorQueue::Take(const std::string& name, TensorEntry* entry, Request* request) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = table_.find(name);
  if (it == table_.end()) return false;
  *entry = std::move(it->second.entry);
  *request = std::move(it->second.request);
  table_.erase(it);
  return true;
}

std::vector<TensorEntry> TensorQueue::TakeAll() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<TensorEntry> all;
  for (auto& kv : table_) all.push_back(std::move(kv.second.entry));
  table_.clear();
  fresh_.clear();
  return all;
}

}  // namespace smdist
