#include "config.h"

#include <unistd.h>

#include <cstdlib>

#include "logging.h"

namespace smdist {
namespace {

const char* FirstSet(const char* a, const char* b) {
  const char* v = std::getenv(a);
  if (v != nullptr && *v != '\0') return v;
  v = std::getenv(b);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

// A malformed value is reported and ignored rather than silently parsed as 0.
double ReadDouble(const char* name, const char* horovod_name, double fallback) {
  const char* v = FirstSet(name, horovod_name);
  if (v == nullptr) return fallback;
  char* end = nullptr;
  double d = std::strtod(v, &end);
  if (end == v || *end != '\0') {
    LogWarning(std::string("ignoring ") + name + "='" + v + "': not a number");
    return fallback;
  }
  return d;
}

}  // namespace

EngineConfig EngineConfig::FromEnvironment() {
  EngineConfig c;
  c.fusion_threshold_bytes = static_cast<int64_t>(ReadDouble(
      "SMDIST_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD",
      static_cast<double>(c.fusion_threshold_bytes)));
  if (c.fusion_threshold_bytes < 0) c.fusion_threshold_bytes = 0;
  c.cycle_time_ms = ReadDouble("SMDIST_CYCLE_TIME", "HOROVOD_CYCLE_TIME", c.cycle_time_ms);
  if (c.cycle_time_ms < 0) c.cycle_time_ms = 0;
  c.stall_check_seconds = ReadDouble("SMDIST_STALL_CHECK_TIME", "HOROVOD_STALL_CHECK_TIME_SECONDS",
                                     c.stall_check_seconds);
  c.stall_shutdown_seconds =
      ReadDouble("SMDIST_STALL_SHUTDOWN_TIME", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
                 c.stall_shutdown_seconds);
  // On by default (unlike Horovod): with several hosts of equal layout, reducing
  // inside each host first sends 1/local_size of the bytes per rank across hosts.
  c.hierarchical_allreduce = ReadDouble("SMDIST_HIERARCHICAL_ALLREDUCE",
                                        "HOROVOD_HIERARCHICAL_ALLREDUCE", 1.0) != 0.0;
  c.shm_segment_bytes = static_cast<int64_t>(
      ReadDouble("SMDIST_SHM_SEGMENT_BYTES", "SMDIST_SHM_SEGMENT_BYTES",
                 static_cast<double>(c.shm_segment_bytes)));
  c.shm_min_bytes = static_cast<int64_t>(ReadDouble("SMDIST_SHM_MIN_BYTES", "SMDIST_SHM_MIN_BYTES",
                                                    static_cast<double>(c.shm_min_bytes)));
  c.cross_memory_attach = ReadDouble("SMDIST_CROSS_MEMORY_ATTACH", "SMDIST_CROSS_MEMORY_ATTACH", 1.0) != 0.0;
  c.cross_memory_min_bytes = static_cast<int64_t>(
      ReadDouble("SMDIST_CROSS_MEMORY_MIN_BYTES", "SMDIST_CROSS_MEMORY_MIN_BYTES",
                 static_cast<double>(c.cross_memory_min_bytes)));
  c.shared_output_bytes = static_cast<int64_t>(
      ReadDouble("SMDIST_SHARED_OUTPUT_BYTES", "SMDIST_SHARED_OUTPUT_BYTES",
                 static_cast<double>(c.shared_output_bytes)));
  if (c.shared_output_bytes < 0) c.shared_output_bytes = 0;
  c.cache_capacity = static_cast<int64_t>(ReadDouble(
      "SMDIST_CACHE_CAPACITY", "HOROVOD_CACHE_CAPACITY", static_cast<double>(c.cache_capacity)));
  if (c.cache_capacity < 0) c.cache_capacity = 0;
  const char* timeline = FirstSet("SMDIST_TIMELINE", "HOROVOD_TIMELINE");
  if (timeline != nullptr) c.timeline_path = timeline;
  const char* host = std::getenv("SMDIST_HOSTNAME");
  if (host != nullptr && *host != '\0') {
    c.hostname = host;
  } else {
    char buf[256] = {0};
    gethostname(buf, sizeof(buf) - 1);
    c.hostname = buf;
  }
  return c;
}

}  // namespace smdist
