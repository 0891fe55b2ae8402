// Collectives negotiated before, remembered under a bit index. In steady
// state a rank announces "my cached collective #i is ready" by setting bit i,
// and one bitwise-AND allreduce replaces the request/response round trip.
// Every rank applies the same Put/Touch/Erase sequence (driven by the
// executed responses), so bit assignments agree everywhere without
// communication. When full, a new collective takes the bit of the least
// recently executed one: a job with ever new names keeps its memory bounded
// and its recent names cached.
#pragma once

#include <cstdint>
#include <list>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "control/message.h"

namespace smdist {

class ResponseCache {
 public:
  explicit ResponseCache(int64_t capacity);

  int64_t capacity() const { return capacity_; }
  // Bit of `request` when cached with identical parameters, else -1.
  int64_t Lookup(const Request& request) const;
  bool Contains(const std::string& name) const { return by_name_.count(name) > 0; }
  // Remembers a successfully negotiated single-tensor collective as the most
  // recently used. Returns the bit of the collective it evicted to make room,
  // or -1.
  int64_t Put(const Request& local_params, const Response& response);
  // Marks a cached collective as just executed.
  void Touch(int64_t bit);
  void Erase(const std::string& name);
  // Cached names, most recently executed first.
  std::vector<std::string> NamesByRecency() const;

  const Request& params(int64_t bit) const { return slots_[bit].params; }
  const Response& response(int64_t bit) const { return slots_[bit].response; }
  const std::string& name(int64_t bit) const { return slots_[bit].params.name; }

 private:
  struct Slot {
    bool used = false;
    Request params;
    Response response;
    std::list<int64_t>::iterator recency;  // in recency_, when used
  };
  int64_t capacity_;
  std::vector<Slot> slots_;
  std::list<int64_t> recency_;  // used bits, most recently executed first
  std::unordered_map<std::string, int64_t> by_name_;
  std::set<int64_t> free_;  // ordered: every rank picks the same lowest free bit
};

// Whether two requests describe the same collective from one rank's view.
bool SameParameters(const Request& a, const Request& b);

}  // namespace smdist
