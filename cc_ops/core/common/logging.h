// stderr logging tagged with the rank, so interleaved output stays readable.
// Messages below the level in force (SMDIST_LOG_LEVEL, default WARNING) are
// dropped.
#pragma once

#include <string>

namespace smdist {

// Horovod's levels, most verbose first. Nothing logs at FATAL: choosing it
// hides every message.
enum class LogLevel : int { kTrace = 0, kDebug, kInfo, kWarning, kError, kFatal };

// TRACE, DEBUG, INFO, WARNING, ERROR or FATAL, in any case; false otherwise.
bool ParseLogLevel(const std::string& text, LogLevel* out);
const char* LogLevelName(LogLevel level);

// "1" or "2.5" rather than std::to_string's "2.500000", for messages.
std::string FormatNumber(double value);

void SetLogRank(int rank);
void SetLogLevel(LogLevel level);
// Whether a message of `level` would be written: callers skip composing
// messages nobody sees.
bool LogEnabled(LogLevel level);

void LogTrace(const std::string& message);
void LogDebug(const std::string& message);
void LogInfo(const std::string& message);
void LogWarning(const std::string& message);
void LogError(const std::string& message);
// Whatever the level: a result the user asked for (autotune's choice).
void LogResult(const std::string& message);

}  // namespace smdist
