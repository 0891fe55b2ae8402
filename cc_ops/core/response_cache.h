// Collectives negotiated before, remembered under a bit index. In steady
// state a rank announces "my cached collective #i is ready" by setting bit i,
// and one bitwise-AND allreduce replaces the request/response round trip.
// Every rank applies the same Put/Erase sequence (driven by the executed
// responses), so bit assignments agree everywhere without communication.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "message.h"

namespace smdist {

class ResponseCache {
 public:
  explicit ResponseCache(int64_t capacity);

  int64_t capacity() const { return capacity_; }
  // Bit of `request` when cached with identical parameters, else -1.
  int64_t Lookup(const Request& request) const;
  bool Contains(const std::string& name) const { return by_name_.count(name) > 0; }
  // Remembers a successfully negotiated single-tensor collective (no-op when full).
  void Put(const Request& local_params, const Response& response);
  void Erase(const std::string& name);

  const Request& params(int64_t bit) const { return slots_[bit].params; }
  const Response& response(int64_t bit) const { return slots_[bit].response; }
  const std::string& name(int64_t bit) const { return slots_[bit].params.name; }

 private:
  struct Slot {
    bool used = false;
    Request params;
    Response response;
  };
  int64_t capacity_;
  std::vector<Slot> slots_;
  std::unordered_map<std::string, int64_t> by_name_;
  std::set<int64_t> free_;  // ordered: every rank picks the same lowest free bit
};

// Whether two requests describe the same collective from one rank's view.
bool SameParameters(const Request& a, const Request& b);

}  // namespace smdist
