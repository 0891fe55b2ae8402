// Names of unnamed eager collectives. Frameworks submit them under a fixed
// "<kind>.noname" and number each call ("allreduce.noname.7"): every rank that
// issues them in the same order agrees on the names, and the engine knows
// such a name never recurs.
#pragma once

#include <cstdint>
#include <string>

namespace smdist {

constexpr char kNumberedNameSuffix[] = ".noname";

// Whether `name` asks to be numbered per call ("allreduce.noname").
inline bool IsNumberedPerCall(const std::string& name) {
  const size_t n = sizeof(kNumberedNameSuffix) - 1;
  return name.size() >= n && name.compare(name.size() - n, n, kNumberedNameSuffix) == 0;
}

// Whether `name` is one numbered call ("allreduce.noname.7", or ".7.0" in a group).
inline bool IsNumberedCallName(const std::string& name) {
  return name.find(std::string(kNumberedNameSuffix) + ".") != std::string::npos;
}

// The next call of `base` ("allreduce.noname" -> "allreduce.noname.7").
// Process-wide and never reset, like Horovod's counters: shared by every
// kernel of a kind (Sum and Average allreduces are different kernels); one
// count per process set, as only a set's members make its calls. Any thread.
std::string NextNumberedName(const std::string& base, int32_t process_set_id = 0);

// Starts the counts of process set `process_set_id` (> 0) afresh: done on
// every rank when a set takes the id, so a set that reuses a removed one's id
// (or one from before a restart) numbers its calls from 0 on all its members.
void ResetNumberedNames(int32_t process_set_id);

// A rank inside join() takes part in the others' numbered calls without
// making them: it moves its counter past `name` ("allreduce.noname.7.0"), so
// its next call gets the number the others' next call gets.
void SkipNumberedName(const std::string& name);

}  // namespace smdist
