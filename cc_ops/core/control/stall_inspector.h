// Finds collectives some ranks submitted and others did not: every check
// time, while any has waited that long, one warning names them and the ranks
// they wait for; after the shutdown time (if set) it says the job must stop.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace smdist {

struct PendingCollective {
  std::string name;
  std::vector<bool> seen;  // by rank: submitted it
  std::vector<int> ranks;  // the job rank of each index (a process set's members); empty: the index
  double waited_seconds = 0;
};

class StallInspector {
 public:
  using Clock = std::chrono::steady_clock;

  StallInspector(double check_seconds, double shutdown_seconds)
      : check_seconds_(check_seconds), shutdown_seconds_(shutdown_seconds) {}

  // Examines the collectives still waiting for ranks (any order): logs the
  // warning when one is due and returns true when one has stalled past the
  // shutdown time.
  bool Inspect(std::vector<PendingCollective> pending, Clock::time_point now);
  // Whether a collective waiting this long may need a warning or a shutdown:
  // callers skip gathering the pending ones before that.
  bool MayAct(double longest_waited_seconds) const {
    return (check_seconds_ > 0 && longest_waited_seconds >= check_seconds_) ||
           (shutdown_seconds_ > 0 && longest_waited_seconds >= shutdown_seconds_);
  }
  // Opening line of the error every rank fails with on a stall shutdown.
  std::string ShutdownHeader() const;

 private:
  double check_seconds_;
  double shutdown_seconds_;
  bool warned_ = false;
  Clock::time_point last_warning_;
};

// "collective 'x' was submitted by rank(s) [0] but not by rank(s) [1] for 12 s"
std::string DescribeStall(const PendingCollective& pending);

}  // namespace smdist
