#include "common/config.h"

#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdlib>

namespace smdist {
namespace {

// The variable a value came from (ours or Horovod's), for error messages.
struct EnvValue {
  const char* name = nullptr;
  const char* text = nullptr;
};

EnvValue FirstSet(const char* ours, const char* horovod) {
  for (const char* name : {ours, horovod}) {
    if (name == nullptr) continue;
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') return {name, v};
  }
  return {};
}

Status Malformed(const EnvValue& v, const std::string& want) {
  return Status::InvalidArgument(std::string(v.name) + "='" + v.text + "' is not valid: expected " + want);
}

// A malformed value fails init(): silently falling back to a default would
// run the job with settings the user did not ask for.
Status ReadNumber(const char* ours, const char* horovod, double min, double* out) {
  const EnvValue v = FirstSet(ours, horovod);
  if (v.text == nullptr) return Status::OK();
  char* end = nullptr;
  const double d = std::strtod(v.text, &end);
  if (end == v.text || *end != '\0' || !std::isfinite(d)) return Malformed(v, "a number");
  if (d < min) {
    return Malformed(v, min == 0 ? "a number of at least 0" : "a number of at least " + std::to_string(min));
  }
  *out = d;
  return Status::OK();
}

// Byte counts and capacities: whole, non-negative numbers ("1e6" is accepted).
Status ReadCount(const char* ours, const char* horovod, int64_t min, int64_t* out) {
  const EnvValue v = FirstSet(ours, horovod);
  if (v.text == nullptr) return Status::OK();
  double d = 0;
  SMDIST_RETURN_IF_ERROR(ReadNumber(ours, horovod, -INFINITY, &d));
  if (d != std::floor(d) || d < static_cast<double>(min) || d > 9.0e18) {
    return Malformed(v, "a whole number of at least " + std::to_string(min));
  }
  *out = static_cast<int64_t>(d);
  return Status::OK();
}

Status ReadFlag(const char* ours, const char* horovod, bool* out) {
  const EnvValue v = FirstSet(ours, horovod);
  if (v.text == nullptr) return Status::OK();
  const std::string s = v.text;
  if (s == "1" || s == "true" || s == "True" || s == "TRUE") {
    *out = true;
  } else if (s == "0" || s == "false" || s == "False" || s == "FALSE") {
    *out = false;
  } else {
    return Malformed(v, "1 or 0 (true or false)");
  }
  return Status::OK();
}

Status ReadLogLevel(const char* ours, const char* horovod, LogLevel* out) {
  const EnvValue v = FirstSet(ours, horovod);
  if (v.text == nullptr) return Status::OK();
  if (!ParseLogLevel(v.text, out)) return Malformed(v, "one of TRACE, DEBUG, INFO, WARNING, ERROR, FATAL");
  return Status::OK();
}

Status ReadGpuOperations(bool* nccl) {
  const EnvValue v = FirstSet("SMDIST_GPU_OPERATIONS", "HOROVOD_GPU_OPERATIONS");
  if (v.text == nullptr) return Status::OK();
  std::string s = v.text;
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (s != "NCCL" && s != "MPI") return Malformed(v, "NCCL or MPI");
  *nccl = s == "NCCL";
  return Status::OK();
}

}  // namespace

Status EngineConfig::FromEnvironment(EngineConfig* out) {
  EngineConfig c;
  SMDIST_RETURN_IF_ERROR(
      ReadCount("SMDIST_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD", 0, &c.fusion_threshold_bytes));
  SMDIST_RETURN_IF_ERROR(ReadNumber("SMDIST_CYCLE_TIME", "HOROVOD_CYCLE_TIME", 0, &c.cycle_time_ms));
  // Zero (or Horovod's negative "off") disables the stall warning and shutdown.
  SMDIST_RETURN_IF_ERROR(ReadNumber("SMDIST_STALL_CHECK_TIME", "HOROVOD_STALL_CHECK_TIME_SECONDS",
                                    -INFINITY, &c.stall_check_seconds));
  SMDIST_RETURN_IF_ERROR(ReadNumber("SMDIST_STALL_SHUTDOWN_TIME", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
                                    -INFINITY, &c.stall_shutdown_seconds));
  // Horovod's switch for the whole stall inspector: no warning, no shutdown.
  bool stall_check_disabled = false;
  SMDIST_RETURN_IF_ERROR(ReadFlag("HOROVOD_STALL_CHECK_DISABLE", nullptr, &stall_check_disabled));
  if (stall_check_disabled) c.stall_check_seconds = c.stall_shutdown_seconds = 0;
  // On by default (unlike Horovod): with several hosts of equal layout, reducing
  // inside each host first sends 1/local_size of the bytes per rank across hosts.
  SMDIST_RETURN_IF_ERROR(
      ReadFlag("SMDIST_HIERARCHICAL_ALLREDUCE", "HOROVOD_HIERARCHICAL_ALLREDUCE", &c.hierarchical_allreduce));
  SMDIST_RETURN_IF_ERROR(ReadCount("SMDIST_SHM_SEGMENT_BYTES", nullptr, 0, &c.shm_segment_bytes));
  SMDIST_RETURN_IF_ERROR(ReadCount("SMDIST_SHM_MIN_BYTES", nullptr, 0, &c.shm_min_bytes));
  SMDIST_RETURN_IF_ERROR(ReadFlag("SMDIST_CROSS_MEMORY_ATTACH", nullptr, &c.cross_memory_attach));
  // -1 (the default) measures the threshold at init.
  SMDIST_RETURN_IF_ERROR(ReadCount("SMDIST_CROSS_MEMORY_MIN_BYTES", nullptr, -1, &c.cross_memory_min_bytes));
  SMDIST_RETURN_IF_ERROR(ReadCount("SMDIST_SHARED_OUTPUT_BYTES", nullptr, 0, &c.shared_output_bytes));
  SMDIST_RETURN_IF_ERROR(ReadCount("SMDIST_CACHE_CAPACITY", "HOROVOD_CACHE_CAPACITY", 0, &c.cache_capacity));
  const EnvValue timeline = FirstSet("SMDIST_TIMELINE", "HOROVOD_TIMELINE");
  if (timeline.text != nullptr) c.timeline_path = timeline.text;
  SMDIST_RETURN_IF_ERROR(
      ReadFlag("SMDIST_TIMELINE_MARK_CYCLES", "HOROVOD_TIMELINE_MARK_CYCLES", &c.timeline_mark_cycles));
  SMDIST_RETURN_IF_ERROR(
      ReadCount("SMDIST_TIMELINE_SAMPLE_EVERY", nullptr, 1, &c.timeline_sample_every));
  SMDIST_RETURN_IF_ERROR(ReadLogLevel("SMDIST_LOG_LEVEL", "HOROVOD_LOG_LEVEL", &c.log_level));
  SMDIST_RETURN_IF_ERROR(ReadGpuOperations(&c.gpu_operations_nccl));
  SMDIST_RETURN_IF_ERROR(ReadFlag("SMDIST_GPU_HIERARCHICAL_ALLREDUCE", nullptr, &c.gpu_hierarchical_allreduce));
  SMDIST_RETURN_IF_ERROR(ReadFlag("SMDIST_AUTOTUNE", "HOROVOD_AUTOTUNE", &c.autotune));
  SMDIST_RETURN_IF_ERROR(ReadCount("SMDIST_AUTOTUNE_WARMUP_SAMPLES", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES", 0,
                                   &c.autotune_warmup_samples));
  SMDIST_RETURN_IF_ERROR(ReadCount("SMDIST_AUTOTUNE_STEPS_PER_SAMPLE", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", 1,
                                   &c.autotune_steps_per_sample));
  const EnvValue tune_log = FirstSet("SMDIST_AUTOTUNE_LOG", "HOROVOD_AUTOTUNE_LOG");
  if (tune_log.text != nullptr) c.autotune_log = tune_log.text;
  const EnvValue host = FirstSet("SMDIST_HOSTNAME", nullptr);
  if (host.text != nullptr) {
    c.hostname = host.text;
  } else {
    char buf[256] = {0};
    gethostname(buf, sizeof(buf) - 1);
    c.hostname = buf;
  }
  *out = std::move(c);
  return Status::OK();
}

}  // namespace smdist
