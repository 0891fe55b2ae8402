#include "control/parameter_tuner.h"

#include <algorithm>

#include "common/logging.h"
#include "control/wire_format.h"

namespace smdist {
namespace {

constexpr int64_t kKiB = 1024, kMiB = 1024 * 1024;

// The dimensions, in the order they are tuned: fusion first, as it changes
// how many collectives the others then see.
enum Dimension : size_t { kFusion = 0, kCycleTime, kShmMin, kCrossMemoryMin };
constexpr const char* kDimensionNames[] = {"fusion threshold", "cycle time", "shared-memory minimum",
                                           "cross-memory minimum"};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2);
}

}  // namespace

std::string TunableParameters::ToString() const {
  return "fusion threshold " + std::to_string(fusion_threshold_bytes) + " bytes, cycle time " +
         FormatNumber(cycle_time_ms) + " ms, shared-memory minimum " + std::to_string(shm_min_bytes) +
         " bytes, cross-memory minimum " + std::to_string(cross_memory_min_bytes) + " bytes";
}

std::vector<uint8_t> TuningStep::Serialize() const {
  WireWriter w;
  w.Put<int64_t>(parameters.fusion_threshold_bytes);
  w.Put<double>(parameters.cycle_time_ms);
  w.Put<int64_t>(parameters.shm_min_bytes);
  w.Put<int64_t>(parameters.cross_memory_min_bytes);
  w.Put<uint8_t>(finished ? 1 : 0);
  return std::move(w.bytes());
}

bool TuningStep::Parse(const std::vector<uint8_t>& bytes, TuningStep* out) {
  WireReader rd(bytes.data(), bytes.size());
  out->parameters.fusion_threshold_bytes = rd.Get<int64_t>();
  out->parameters.cycle_time_ms = rd.Get<double>();
  out->parameters.shm_min_bytes = rd.Get<int64_t>();
  out->parameters.cross_memory_min_bytes = rd.Get<int64_t>();
  out->finished = rd.Get<uint8_t>() != 0;
  return rd.ok() && rd.done();
}

ParameterTuner::ParameterTuner(const TunableParameters& defaults, const TunerSettings& settings, bool tune_shm,
                               bool tune_cross_memory)
    : defaults_(defaults),
      settings_(settings),
      current_(defaults),
      best_(defaults),
      started_(std::chrono::steady_clock::now()),
      warmups_left_(std::max(0, settings.warmup_samples)) {
  dimensions_ = {kFusion, kCycleTime};
  if (tune_shm) dimensions_.push_back(kShmMin);
  if (tune_cross_memory) dimensions_.push_back(kCrossMemoryMin);
}

ParameterTuner::~ParameterTuner() {
  if (log_ != nullptr) std::fclose(log_);
}

std::vector<TunableParameters> ParameterTuner::CandidatesOf(size_t d, const TunableParameters& base) const {
  std::vector<TunableParameters> out = {base};  // re-measured first, in this dimension's conditions
  auto add = [&](TunableParameters p) {
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  };
  TunableParameters p = base;
  switch (d) {
    case kFusion:
      for (int64_t v : {4 * kMiB, 16 * kMiB, 32 * kMiB, 64 * kMiB, 128 * kMiB}) {
        p.fusion_threshold_bytes = v;
        add(p);
      }
      break;
    case kCycleTime:
      for (double v : {0.5, 1.0, 2.5, 5.0}) {
        p.cycle_time_ms = v;
        add(p);
      }
      break;
    case kShmMin:
      for (int64_t v : {64 * kKiB, 256 * kKiB, 1 * kMiB}) {
        p.shm_min_bytes = v;
        p.cross_memory_min_bytes = std::max(p.cross_memory_min_bytes, v);  // never below the shared-memory path
        add(p);
      }
      break;
    default:
      for (int64_t v : {1 * kMiB, 4 * kMiB, 16 * kMiB}) {
        p.cross_memory_min_bytes = std::max(v, base.shm_min_bytes);
        add(p);
      }
      break;
  }
  return out;
}

bool ParameterTuner::CycleDone(int64_t bytes) {
  if (finished_) return false;
  bytes_ += bytes;
  const int cycles = std::max(1, settings_.cycles_per_sample);
  ++cycles_;
  return (cycles_ >= cycles && bytes_ > 0 && bytes_ >= sample_bytes_) || cycles_ >= 10 * cycles;
}

void ParameterTuner::Log(const char* phase, double seconds, double score) {
  if (settings_.log_path.empty()) return;
  if (log_ == nullptr) {
    log_ = std::fopen(settings_.log_path.c_str(), "w");
    if (log_ == nullptr) {
      LogWarning("autotune: cannot write the log " + settings_.log_path);
      return;
    }
    std::fprintf(log_, "sample,phase,fusion_threshold_bytes,cycle_time_ms,shm_min_bytes,cross_memory_min_bytes,"
                       "bytes,seconds,bytes_per_second\n");
  }
  std::fprintf(log_, "%d,%s,%lld,%g,%lld,%lld,%lld,%.6f,%.1f\n", samples_, phase,
               static_cast<long long>(current_.fusion_threshold_bytes), current_.cycle_time_ms,
               static_cast<long long>(current_.shm_min_bytes), static_cast<long long>(current_.cross_memory_min_bytes),
               static_cast<long long>(bytes_), seconds, score);
  std::fflush(log_);
}

TuningStep ParameterTuner::Advance(std::chrono::steady_clock::time_point now) {
  const double seconds = std::chrono::duration<double>(now - started_).count();
  const double score = seconds > 0 ? static_cast<double>(bytes_) / seconds : 0;
  if (warmups_left_ > 0) {
    Log("warmup", seconds, score);
    if (--warmups_left_ > 0) return {current_, false};
    candidates_ = CandidatesOf(dimensions_[0], best_);
    candidate_ = 0;
    scores_.clear();
    return {candidates_[0], false};
  }
  if (!confirming_) {
    Log(kDimensionNames[dimensions_[dimension_]], seconds, score);
    scores_.push_back(score);
    if (++candidate_ < candidates_.size()) return {candidates_[candidate_], false};
    const size_t winner = std::max_element(scores_.begin(), scores_.end()) - scores_.begin();
    best_ = candidates_[winner];
    if (++dimension_ < dimensions_.size()) {
      candidates_ = CandidatesOf(dimensions_[dimension_], best_);
      candidate_ = 0;
      scores_.clear();
      return {candidates_[0], false};
    }
    if (best_ == defaults_) return Finish();
    // The search saw each candidate once: alternate the defaults and the best
    // before believing a gain, so one lucky sample does not change the job.
    confirming_ = true;
    return {defaults_, false};
  }
  Log("confirm", seconds, score);
  (current_ == defaults_ ? confirm_default_ : confirm_best_).push_back(score);
  const size_t rounds = static_cast<size_t>(std::max(1, settings_.confirm_rounds));
  if (confirm_default_.size() >= rounds && confirm_best_.size() >= rounds) return Finish();
  return {current_ == defaults_ ? best_ : defaults_, false};
}

TuningStep ParameterTuner::Finish() {
  const double with_defaults = Median(confirm_default_), with_best = Median(confirm_best_);
  const bool gain = !confirm_best_.empty() && with_best >= with_defaults * (1.0 + settings_.min_gain);
  const TunableParameters chosen = gain ? best_ : defaults_;
  summary_ = "autotune chose " + chosen.ToString() +
             (gain ? " (" + FormatNumber(with_best / 1e6) + " MB/s against " + FormatNumber(with_defaults / 1e6) +
                         " MB/s with the defaults)"
                   : " (the defaults: nothing beat them by " + FormatNumber(settings_.min_gain * 100) + " %)");
  return {chosen, true};
}

void ParameterTuner::Adopt(const TuningStep& step, std::chrono::steady_clock::time_point now) {
  current_ = step.parameters;
  finished_ = step.finished;
  if (++samples_ == settings_.warmup_samples) sample_bytes_ = bytes_;
  cycles_ = 0;
  bytes_ = 0;
  started_ = now;
}

}  // namespace smdist
