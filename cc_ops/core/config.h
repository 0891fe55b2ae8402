// Engine settings read from the environment at init(). Our SMDIST_* names
// win; Horovod's names are honoured so existing job scripts keep working.
#pragma once

#include <cstdint>
#include <string>

namespace smdist {

struct EngineConfig {
  int64_t fusion_threshold_bytes = 64 * 1024 * 1024;
  double cycle_time_ms = 1.0;
  double stall_check_seconds = 60.0;   // <= 0 disables the warning
  double stall_shutdown_seconds = 0.0;  // <= 0 disables the shutdown
  std::string hostname;                 // identity of this host for topology

  static EngineConfig FromEnvironment();
};

}  // namespace smdist
