#include "logging.h"

#include <atomic>
#include <cstdio>

namespace smdist {
namespace {
std::atomic<int> g_rank{-1};

void Log(const char* level, const std::string& message) {
  int rank = g_rank.load();
  if (rank >= 0) {
    std::fprintf(stderr, "[smdist_tf rank %d] %s: %s\n", rank, level, message.c_str());
  } else {
    std::fprintf(stderr, "[smdist_tf] %s: %s\n", level, message.c_str());
  }
  std::fflush(stderr);
}
}  // namespace

void SetLogRank(int rank) { g_rank.store(rank); }
void LogWarning(const std::string& message) { Log("WARNING", message); }
void LogError(const std::string& message) { Log("ERROR", message); }

}  // namespace smdist
