#include "stall_inspector.h"

#include <cstdio>

#include "logging.h"

namespace smdist {
namespace {
std::string RankList(const std::vector<bool>& seen, bool want) {
  std::string s;
  for (size_t r = 0; r < seen.size(); ++r) {
    if (seen[r] != want) continue;
    if (!s.empty()) s += ", ";
    s += std::to_string(r);
  }
  return s;
}
}  // namespace

std::string DescribeStall(const std::string& name, const std::vector<bool>& seen, double seconds) {
  return "collective '" + name + "' was submitted by rank(s) [" + RankList(seen, true) +
         "] but not by rank(s) [" + RankList(seen, false) + "] for " +
         std::to_string(static_cast<int>(seconds)) +
         " s: those ranks are stalled or issue different collectives (check that every rank "
         "runs the same collectives with the same names)";
}

bool StallInspector::Inspect(const std::string& name, const std::vector<bool>& seen,
                             std::chrono::steady_clock::time_point first_seen,
                             std::chrono::steady_clock::time_point now) {
  const double waited = std::chrono::duration<double>(now - first_seen).count();
  if (shutdown_seconds_ > 0 && waited >= shutdown_seconds_) return true;
  if (check_seconds_ > 0 && waited >= check_seconds_ && warned_.insert(name).second) {
    LogWarning("stall: " + DescribeStall(name, seen, waited));
  }
  return false;
}

std::string StallInspector::ShutdownHeader() const {
  char limit[32];
  std::snprintf(limit, sizeof(limit), "%g", shutdown_seconds_);
  return "stall shutdown (SMDIST_STALL_SHUTDOWN_TIME=" + std::string(limit) +
         " s): every rank stops; incomplete collectives:";
}

}  // namespace smdist
