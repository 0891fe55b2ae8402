#include "common/numbered_names.h"

#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace smdist {
namespace {

std::mutex g_mu;
std::unordered_map<std::string, uint64_t> g_next;  // g_mu: by base name (and process set)

}  // namespace

std::string NextNumberedName(const std::string& base, int32_t process_set_id) {
  const std::string counter = process_set_id == 0 ? base : base + "#" + std::to_string(process_set_id);
  std::lock_guard<std::mutex> lock(g_mu);
  return base + "." + std::to_string(g_next[counter]++);
}

void ResetNumberedNames(int32_t process_set_id) {
  const std::string suffix = "#" + std::to_string(process_set_id);
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto it = g_next.begin(); it != g_next.end();) {
    const std::string& key = it->first;
    const bool of_set = key.size() > suffix.size() &&
                        key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0;
    it = of_set ? g_next.erase(it) : std::next(it);
  }
}

void SkipNumberedName(const std::string& name) {
  const std::string marker = std::string(kNumberedNameSuffix) + ".";
  const size_t at = name.find(marker);
  if (at == std::string::npos) return;
  uint64_t number = 0;
  size_t i = at + marker.size();
  const size_t first_digit = i;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) number = number * 10 + (name[i] - '0');
  if (i == first_digit || (i < name.size() && name[i] != '.')) return;  // not a number we made
  std::lock_guard<std::mutex> lock(g_mu);
  uint64_t& next = g_next[name.substr(0, at + marker.size() - 1)];
  if (next <= number) next = number + 1;
}

}  // namespace smdist
