#include "transports/mpi/stale_segments.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <ctime>
#include <cstring>
#include <fstream>
#include <set>

namespace smdist {
namespace {

// Backing files of Open MPI 5's sm BTL and Open MPI 4's vader BTL.
bool IsOpenMpiSegment(const char* name) {
  return std::strncmp(name, "sm_segment.", 11) == 0 || std::strncmp(name, "vader_segment.", 14) == 0;
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = readdir(d)) names.emplace_back(e->d_name);
  closedir(d);
  return names;
}

bool AllDigits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// Removes from `candidates` every path some process has open or mapped. A
// process that is creating a segment holds it open before it maps it, so
// reading its descriptors before its mappings never misses a live one.
void DropPathsInUse(std::set<std::string>* candidates) {
  for (const std::string& pid : ListDir("/proc")) {
    if (candidates->empty()) return;
    if (!AllDigits(pid)) continue;
    const std::string fd_dir = "/proc/" + pid + "/fd";
    for (const std::string& fd : ListDir(fd_dir)) {
      char target[4096];
      const ssize_t n = readlink((fd_dir + "/" + fd).c_str(), target, sizeof(target) - 1);
      if (n <= 0) continue;
      candidates->erase(std::string(target, static_cast<size_t>(n)));
    }
    std::ifstream maps("/proc/" + pid + "/maps");
    std::string line;
    while (std::getline(maps, line)) {
      const size_t slash = line.find('/');
      if (slash != std::string::npos) candidates->erase(line.substr(slash));
    }
  }
}

}  // namespace

std::vector<std::string> RemoveStaleSharedMemorySegments(const std::string& dir, double min_age_seconds) {
  const time_t now = time(nullptr);
  std::set<std::string> candidates;
  for (const std::string& name : ListDir(dir)) {
    if (!IsOpenMpiSegment(name.c_str())) continue;
    const std::string path = dir + "/" + name;
    struct stat st;
    if (lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) continue;
    if (difftime(now, st.st_mtime) < min_age_seconds) continue;
    candidates.insert(path);
  }
  if (candidates.empty()) return {};
  DropPathsInUse(&candidates);
  std::vector<std::string> removed;
  for (const std::string& path : candidates) {
    if (unlink(path.c_str()) == 0) removed.push_back(path);
  }
  return removed;
}

}  // namespace smdist
