#include "control/stall_inspector.h"

#include <algorithm>
#include <cstdio>

#include "common/logging.h"

namespace smdist {
namespace {

// A warning names at most this many collectives: a stalled rank can leave
// hundreds pending, and the longest waiting say enough.
constexpr size_t kMaxNamedInWarning = 10;

std::string RankList(const PendingCollective& p, bool want) {
  std::string s;
  for (size_t r = 0; r < p.seen.size(); ++r) {
    if (p.seen[r] != want) continue;
    if (!s.empty()) s += ", ";
    s += std::to_string(p.ranks.empty() ? static_cast<int>(r) : p.ranks[r]);
  }
  return s;
}

}  // namespace

std::string DescribeStall(const PendingCollective& p) {
  return "collective '" + p.name + "' was submitted by rank(s) [" + RankList(p, true) +
         "] but not by rank(s) [" + RankList(p, false) + "] for " +
         std::to_string(static_cast<int>(p.waited_seconds)) + " s";
}

bool StallInspector::Inspect(std::vector<PendingCollective> pending, Clock::time_point now) {
  double longest = 0;
  for (const PendingCollective& p : pending) longest = std::max(longest, p.waited_seconds);
  if (shutdown_seconds_ > 0 && longest >= shutdown_seconds_) return true;
  if (check_seconds_ <= 0 || longest < check_seconds_) return false;
  if (warned_ && std::chrono::duration<double>(now - last_warning_).count() < check_seconds_) return false;
  warned_ = true;
  last_warning_ = now;

  pending.erase(std::remove_if(pending.begin(), pending.end(),
                               [this](const PendingCollective& p) { return p.waited_seconds < check_seconds_; }),
                pending.end());
  std::sort(pending.begin(), pending.end(), [](const PendingCollective& a, const PendingCollective& b) {
    return a.waited_seconds != b.waited_seconds ? a.waited_seconds > b.waited_seconds : a.name < b.name;
  });
  std::string text = "stall: " + std::to_string(pending.size()) +
                     " collective(s) waiting for ranks longer than SMDIST_STALL_CHECK_TIME=" +
                     FormatNumber(check_seconds_) + " s:";
  for (size_t i = 0; i < pending.size() && i < kMaxNamedInWarning; ++i) text += "\n  " + DescribeStall(pending[i]);
  if (pending.size() > kMaxNamedInWarning) {
    text += "\n  ... and " + std::to_string(pending.size() - kMaxNamedInWarning) + " more";
  }
  text += "\n  The missing ranks are stalled or issue different collectives: every rank must run the "
          "same collectives with the same names. If ranks have different numbers of batches, a rank that "
          "runs out must call smdist_tf.join() (Keras fit does it at each epoch end), or give every rank "
          "the same number (steps_per_epoch, drop_remainder=True, repeat()).";
  if (shutdown_seconds_ > 0) {
    text += " The job stops once one has waited SMDIST_STALL_SHUTDOWN_TIME=" + FormatNumber(shutdown_seconds_) + " s.";
  }
  LogWarning(text);
  return false;
}

std::string StallInspector::ShutdownHeader() const {
  return "stall shutdown (SMDIST_STALL_SHUTDOWN_TIME=" + FormatNumber(shutdown_seconds_) +
         " s): every rank stops; incomplete collectives:";
}

}  // namespace smdist
