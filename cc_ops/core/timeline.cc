#include "timeline.h"

#include <cerrno>
#include <cstring>

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
}  // namespace

Status Timeline::Start(const std::string& path, int rank) {
  Stop();
  std::lock_guard<std::mutex> lock(mu_);
  file_ = std::fopen(path.c_str(), "w");
  if (file_ == nullptr) {
    return Status::InvalidArgument("cannot write timeline '" + path + "': " + std::strerror(errno));
  }
  rank_ = rank;
  first_event_ = true;
  rows_.clear();
  origin_ = Clock::now();
  std::fputs("[\n", file_);
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

int Timeline::RowLocked(const std::string& name) {
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
                      Clock::time_point begin, Clock::time_point end, const char* extra_args) {
  if (!active_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr) return;
  const auto ts = std::chrono::duration_cast<std::chrono::microseconds>(begin - origin_).count();
  const auto dur = std::chrono::duration_cast<std::chrono::microseconds>(end - begin).count();
  for (const std::string& name : names) {
    const int row = RowLocked(name);
    std::fprintf(file_,
                 ",\n{\"name\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%lld,\"dur\":%lld,"
                 "\"args\":{\"fused\":%zu%s%s}}",
                 phase, rank_, row, static_cast<long long>(ts), static_cast<long long>(dur),
                 names.size(), extra_args == nullptr ? "" : ",", extra_args == nullptr ? "" : extra_args);
  }
}

}  // namespace smdist
