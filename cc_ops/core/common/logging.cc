#include "common/logging.h"

#include <atomic>
#include <cctype>
#include <cstdio>

namespace smdist {
namespace {
std::atomic<int> g_rank{-1};
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarning)};

constexpr LogLevel kLevels[] = {LogLevel::kTrace, LogLevel::kDebug, LogLevel::kInfo,
                                LogLevel::kWarning, LogLevel::kError, LogLevel::kFatal};

void Log(LogLevel level, const std::string& message) {
  if (!LogEnabled(level)) return;
  const int rank = g_rank.load();
  if (rank >= 0) {
    std::fprintf(stderr, "[smdist_tf rank %d] %s: %s\n", rank, LogLevelName(level), message.c_str());
  } else {
    std::fprintf(stderr, "[smdist_tf] %s: %s\n", LogLevelName(level), message.c_str());
  }
  std::fflush(stderr);
}
}  // namespace

const char* LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return "TRACE";
    case LogLevel::kDebug: return "DEBUG";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kWarning: return "WARNING";
    case LogLevel::kError: return "ERROR";
    case LogLevel::kFatal: return "FATAL";
  }
  return "UNKNOWN";
}

bool ParseLogLevel(const std::string& text, LogLevel* out) {
  std::string upper;
  for (char c : text) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (LogLevel level : kLevels) {
    if (upper == LogLevelName(level)) {
      *out = level;
      return true;
    }
  }
  return false;
}

std::string FormatNumber(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

void SetLogRank(int rank) { g_rank.store(rank); }
void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

void LogTrace(const std::string& message) { Log(LogLevel::kTrace, message); }
void LogDebug(const std::string& message) { Log(LogLevel::kDebug, message); }
void LogInfo(const std::string& message) { Log(LogLevel::kInfo, message); }
void LogWarning(const std::string& message) { Log(LogLevel::kWarning, message); }
void LogError(const std::string& message) { Log(LogLevel::kError, message); }

void LogResult(const std::string& message) {
  const int rank = g_rank.load();
  if (rank >= 0) {
    std::fprintf(stderr, "[smdist_tf rank %d] %s\n", rank, message.c_str());
  } else {
    std::fprintf(stderr, "[smdist_tf] %s\n", message.c_str());
  }
  std::fflush(stderr);
}

}  // namespace smdist
