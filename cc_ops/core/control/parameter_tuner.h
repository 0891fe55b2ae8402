// Autotuning (SMDIST_AUTOTUNE=1, Horovod's HOROVOD_AUTOTUNE): during the first
// working cycles of the job, tries settings of the fusion threshold, the cycle
// time and the intra-host size thresholds, scores each by the bytes the
// collectives moved per second of wall time (in a training loop, proportional
// to steps per second), keeps the best, and then never changes it again.
//
// Every rank counts the same working cycles (they execute the same
// responses), so samples end on the same cycle everywhere. Only rank 0 scores
// and decides; the stream broadcasts its TuningStep to the others, and every
// rank switches before its next cycle, so all plan and choose transports alike.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace smdist {

struct TunableParameters {
  int64_t fusion_threshold_bytes = 0;
  double cycle_time_ms = 0;
  int64_t shm_min_bytes = 0;
  int64_t cross_memory_min_bytes = 0;

  bool operator==(const TunableParameters& o) const {
    return fusion_threshold_bytes == o.fusion_threshold_bytes && cycle_time_ms == o.cycle_time_ms &&
           shm_min_bytes == o.shm_min_bytes && cross_memory_min_bytes == o.cross_memory_min_bytes;
  }
  // "fusion threshold 67108864 bytes, cycle time 1 ms, ..."
  std::string ToString() const;
};

// What rank 0 tells every rank at the end of a sample.
struct TuningStep {
  TunableParameters parameters;  // in force from the next cycle on
  bool finished = false;         // the last step: keep these for good

  std::vector<uint8_t> Serialize() const;
  static bool Parse(const std::vector<uint8_t>& bytes, TuningStep* out);
};

struct TunerSettings {
  int warmup_samples = 3;      // not scored: tracing, caches and allocations settle first
  int cycles_per_sample = 10;  // working cycles of a warm-up sample
  // The best candidate replaces the defaults only if it beats them by this
  // much (medians) in confirmation samples that alternate the two: one sample
  // of a few steps on a busy machine varies by more than 2 %.
  double min_gain = 0.05;
  int confirm_rounds = 3;
  std::string log_path;  // a CSV line per sample, when set
};

class ParameterTuner {
 public:
  // `tune_shm` / `tune_cross_memory`: whether this rank's host has those paths
  // (rank 0 decides for all: hosts of one job share a layout).
  ParameterTuner(const TunableParameters& defaults, const TunerSettings& settings, bool tune_shm,
                 bool tune_cross_memory);
  ~ParameterTuner();

  // After every cycle that executed collectives, on every rank; `bytes`: what
  // its allreduces, broadcasts and reduce-scatters moved, the same on every
  // rank. True when a sample has ended: rank 0 then calls Advance, and every
  // rank Adopts what it returns. A sample lasts at least cycles_per_sample
  // working cycles and until it has moved bytes; a scored one also until it
  // has moved as many as the last warm-up sample did, so each holds about the
  // same work (a training step's gradients and its small collectives alike).
  // At 10 times cycles_per_sample cycles a sample ends regardless.
  bool CycleDone(int64_t bytes);
  // Rank 0: scores the sample that ended and returns the next step.
  TuningStep Advance(std::chrono::steady_clock::time_point now);
  // Every rank: takes up rank 0's step.
  void Adopt(const TuningStep& step, std::chrono::steady_clock::time_point now);

  bool finished() const { return finished_; }
  const TunableParameters& current() const { return current_; }
  // Rank 0's summary once finished: what it chose and what it measured.
  const std::string& summary() const { return summary_; }

 private:
  // Candidates of dimension `d` around `base`.
  std::vector<TunableParameters> CandidatesOf(size_t d, const TunableParameters& base) const;
  void Log(const char* phase, double seconds, double score);
  TuningStep Finish();

  const TunableParameters defaults_;
  const TunerSettings settings_;
  std::vector<size_t> dimensions_;  // which of the tunable dimensions this job has
  TunableParameters current_;
  TunableParameters best_;
  bool finished_ = false;
  std::string summary_;

  // Sample in progress.
  int cycles_ = 0;
  int64_t bytes_ = 0;
  int64_t sample_bytes_ = 0;  // a scored sample's work; 0: by cycles
  std::chrono::steady_clock::time_point started_;
  int samples_ = 0;

  // Where the search is: warm-up, then each dimension's candidates, then confirmation.
  int warmups_left_;
  size_t dimension_ = 0;  // index into dimensions_
  std::vector<TunableParameters> candidates_;
  size_t candidate_ = 0;
  std::vector<double> scores_;
  bool confirming_ = false;
  std::vector<double> confirm_default_, confirm_best_;

  std::FILE* log_ = nullptr;
};

}  // namespace smdist
