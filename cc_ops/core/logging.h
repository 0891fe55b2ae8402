// stderr logging tagged with the rank, so interleaved output stays readable.
#pragma once

#include <string>

namespace smdist {

void SetLogRank(int rank);
void LogWarning(const std::string& message);
void LogError(const std::string& message);

}  // namespace smdist
