// Chrome-trace (chrome://tracing, Perfetto) timeline of what the engine does
// with each tensor: negotiation, fusion copy-in, the transfer, copy-out.
// One row per tensor name; the process id is the rank. Optionally an instant
// event marks the start of every cycle that ran collectives.
#pragma once

#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace smdist {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  ~Timeline() { Stop(); }

  // Starts writing to `path` (replacing an earlier timeline of this process),
  // with cycle marks when `mark_cycles`. Refuses a symbolic link or anything
  // but a regular file; an existing file is overwritten with a warning. With
  // `sample_every` > 1 (the engine records only every N-th working cycle) the
  // file's first event says so: the rank's process is named "rank R (1 cycle in
  // N)", and its args hold "sample_every".
  Status Start(const std::string& path, int rank, bool mark_cycles, int64_t sample_every = 1);
  // Finishes the JSON document and closes the file.
  void Stop();
  bool active() const { return active_; }

  // A complete event [begin, end] on the row of each of `names`. `extra_args`
  // (optional) is more members of the event's "args" object, already JSON.
  // A process set's collectives (`process_set` > 0) have rows of their own,
  // labelled "<name> [process set N]", and say their set in "args".
  void Record(const std::vector<std::string>& names, const char* phase, Clock::time_point begin,
              Clock::time_point end, const char* extra_args = nullptr, int32_t process_set = 0);
  // With cycle marks on: a process-wide instant event "CYCLE_START" at
  // `begin`, the start of a cycle that ran `tensors` tensors' collectives.
  void MarkCycle(Clock::time_point begin, size_t tensors);

 private:
  int RowLocked(const std::string& name, int32_t process_set);

  std::mutex mu_;
  bool active_ = false;  // read without the lock as a cheap hint
  bool mark_cycles_ = false;
  std::FILE* file_ = nullptr;
  int rank_ = 0;
  bool first_event_ = true;
  Clock::time_point origin_;
  std::unordered_map<std::string, int> rows_;
};

// This rank's file for a timeline path given to every rank: "{rank}" in it is
// replaced by the rank; otherwise ranks of a larger job append ".<rank>".
std::string TimelinePathOfRank(std::string path, int rank, int size);

}  // namespace smdist
