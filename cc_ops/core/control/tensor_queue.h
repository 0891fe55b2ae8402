// Entries submitted on this rank: new ones wait in a FIFO for the next
// negotiation cycle; all of them stay findable by name until executed.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/tensor_entry.h"
#include "control/message.h"

namespace smdist {

class TensorQueue {
 public:
  // Fails (without queuing) when `name` is already in flight on this rank.
  // `wake`: wake the engine thread (an inline caller runs the cycle itself).
  Status Add(std::vector<TensorEntry> entries, int rank, bool wake = true);

  // Moves newly added entries' requests into `out` (submission order).
  void PopRequests(std::vector<Request>* out);

  // Waits up to `timeout_us` for a new entry or a Wake(); returns whether
  // either came (false: the wait timed out with nothing to do).
  bool WaitForWork(int64_t timeout_us);
  void Wake();

  // Whether any entry submitted here is still waiting to be executed.
  bool HasInFlight();

  // Removes and returns the entry and the request made from it; false when unknown.
  bool Take(const std::string& name, TensorEntry* entry, Request* request);

  // Removes every entry (used when the engine stops).
  std::vector<TensorEntry> TakeAll();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  struct Pending {
    TensorEntry entry;
    Request request;
  };
  std::unordered_map<std::string, Pending> table_;
  std::deque<Request> fresh_;
  bool woken_ = false;
};

}  // namespace smdist
