// Open MPI's shared-memory transport backs each rank's mailbox with a file in
// /dev/shm that its launcher deletes when the job ends. A job whose launcher
// was killed (SIGKILL, OOM, a lost node) leaves them behind, 16 MiB a rank,
// until reboot: every new job sweeps the ones no live process still uses.
#pragma once

#include <string>
#include <vector>

namespace smdist {

// Deletes this user's Open MPI segment files in `dir` that no process has
// open or mapped and that were last changed `min_age_seconds` ago or more.
// The age guards the files of a job just starting in another PID namespace
// (a container sharing /dev/shm), whose processes this one cannot see.
// Returns the paths it deleted.
std::vector<std::string> RemoveStaleSharedMemorySegments(const std::string& dir = "/dev/shm",
                                                         double min_age_seconds = 60);

}  // namespace smdist
