#include "control/timeline.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/logging.h"

namespace smdist {
namespace {
std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out;
}

Status CannotWrite(const std::string& path, const std::string& why) {
  return Status::InvalidArgument("cannot write timeline '" + path + "': " + why);
}

// Opens `path` for writing without following a symbolic link at its end: a
// link planted where the timeline goes must not redirect it onto another file.
Status OpenForWriting(const std::string& path, int* out) {
  const int flags = O_WRONLY | O_NOFOLLOW | O_CLOEXEC;
  int fd = open(path.c_str(), flags | O_CREAT | O_EXCL, 0644);
  if (fd >= 0) {
    *out = fd;
    return Status::OK();
  }
  if (errno != EEXIST) return CannotWrite(path, std::strerror(errno));
  const Status link = CannotWrite(path, "it is a symbolic link (smdist_tf does not follow links for its "
                                        "timeline; give the link's target instead)");
  const Status not_regular = CannotWrite(path, "it exists and is not a regular file");
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return CannotWrite(path, std::strerror(errno));
  if (S_ISLNK(st.st_mode)) return link;
  if (!S_ISREG(st.st_mode)) return not_regular;
  // O_NOFOLLOW again: the file may have been swapped for a link since lstat.
  fd = open(path.c_str(), flags | O_NONBLOCK);
  if (fd < 0) return errno == ELOOP ? link : CannotWrite(path, std::strerror(errno));
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return not_regular;
  }
  if (ftruncate(fd, 0) != 0) {
    const int err = errno;
    close(fd);
    return CannotWrite(path, std::strerror(err));
  }
  LogWarning("timeline: overwriting the existing file '" + path + "'");
  *out = fd;
  return Status::OK();
}
}  // namespace

std::string TimelinePathOfRank(std::string path, int rank, int size) {
  const auto pos = path.find("{rank}");
  if (pos != std::string::npos) {
    path.replace(pos, 6, std::to_string(rank));
  } else if (size > 1) {
    path += "." + std::to_string(rank);
  }
  return path;
}

Status Timeline::Start(const std::string& path, int rank, bool mark_cycles, int64_t sample_every) {
  Stop();
  std::lock_guard<std::mutex> lock(mu_);
  int fd = -1;
  SMDIST_RETURN_IF_ERROR(OpenForWriting(path, &fd));
  file_ = fdopen(fd, "w");
  if (file_ == nullptr) {
    const int err = errno;
    close(fd);
    return CannotWrite(path, std::strerror(err));
  }
  rank_ = rank;
  mark_cycles_ = mark_cycles;
  first_event_ = true;
  rows_.clear();
  origin_ = Clock::now();
  std::fputs("[\n", file_);
  if (sample_every > 1) {
    std::fprintf(file_,
                 "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,"
                 "\"args\":{\"name\":\"rank %d (1 cycle in %lld)\",\"sample_every\":%lld}}",
                 rank, rank, static_cast<long long>(sample_every), static_cast<long long>(sample_every));
    first_event_ = false;
  }
  active_ = true;
  return Status::OK();
}

void Timeline::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr) return;
  std::fputs("\n]\n", file_);
  std::fclose(file_);
  file_ = nullptr;
  active_ = false;
}

int Timeline::RowLocked(const std::string& tensor, int32_t process_set) {
  const std::string name =
      process_set == 0 ? tensor : tensor + " [process set " + std::to_string(process_set) + "]";
  auto it = rows_.find(name);
  if (it != rows_.end()) return it->second;
  const int row = static_cast<int>(rows_.size()) + 1;
  rows_[name] = row;
  // Metadata event: label the row with the tensor name.
  std::fprintf(file_, "%s{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
               first_event_ ? "" : ",\n", rank_, row, JsonEscape(name).c_str());
  first_event_ = false;
  return row;
}

void Timeline::Record(const std::vector<std::string>& names, const char* phase,
                      Clock::time_point begin, Clock::time_point end, const char* extra_args,
                      int32_t process_set) {
  if (!active_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr) return;
  const auto ts = std::chrono::duration_cast<std::chrono::microseconds>(begin - origin_).count();
  const auto dur = std::chrono::duration_cast<std::chrono::microseconds>(end - begin).count();
  const std::string set_arg = process_set == 0 ? "" : ",\"process_set\":" + std::to_string(process_set);
  for (const std::string& name : names) {
    const int row = RowLocked(name, process_set);
    std::fprintf(file_,
                 ",\n{\"name\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%lld,\"dur\":%lld,"
                 "\"args\":{\"fused\":%zu%s%s%s}}",
                 phase, rank_, row, static_cast<long long>(ts), static_cast<long long>(dur), names.size(),
                 extra_args == nullptr ? "" : ",", extra_args == nullptr ? "" : extra_args, set_arg.c_str());
  }
}

void Timeline::MarkCycle(Clock::time_point begin, size_t tensors) {
  if (!active_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr || !mark_cycles_) return;
  // A cycle that began before this timeline did is marked at its start.
  const auto ts = std::max<long long>(
      0, std::chrono::duration_cast<std::chrono::microseconds>(begin - origin_).count());
  // Scope "p": a line across this rank's rows (each rank writes its own file).
  std::fprintf(file_,
               "%s{\"name\":\"CYCLE_START\",\"ph\":\"i\",\"s\":\"p\",\"pid\":%d,\"tid\":0,\"ts\":%lld,"
               "\"args\":{\"tensors\":%zu}}",
               first_event_ ? "" : ",\n", rank_, static_cast<long long>(ts), tensors);
  first_event_ = false;
}

}  // namespace smdist
