// Finds collectives some ranks submitted and others did not: warns after
// the check time, and after the shutdown time (if set) says the job must stop.
#pragma once

#include <chrono>
#include <string>
#include <unordered_set>
#include <vector>

namespace smdist {

class StallInspector {
 public:
  StallInspector(double check_seconds, double shutdown_seconds)
      : check_seconds_(check_seconds), shutdown_seconds_(shutdown_seconds) {}

  // Examines one pending collective: warns (once) past the check time and
  // returns true when it has stalled past the shutdown time.
  bool Inspect(const std::string& name, const std::vector<bool>& seen,
                      std::chrono::steady_clock::time_point first_seen,
                      std::chrono::steady_clock::time_point now);
  void Forget(const std::string& name) { warned_.erase(name); }
  // Opening line of the error every rank fails with on a stall shutdown.
  std::string ShutdownHeader() const;

 private:
  double check_seconds_;
  double shutdown_seconds_;
  std::unordered_set<std::string> warned_;
};

std::string DescribeStall(const std::string& name, const std::vector<bool>& seen, double seconds);

}  // namespace smdist
