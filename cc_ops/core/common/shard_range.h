// How the intra-host allreduce paths split `count` elements into one shard per
// rank. Shards start on cache-line boundaries so neighbours never share a line.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace smdist {

// [begin, end) in elements of shard `index` when `count` elements are split `parts` ways.
inline void ShardRange(int64_t count, size_t elem, int parts, int index, int64_t* begin, int64_t* end) {
  constexpr int64_t kAlignBytes = 64;
  const int64_t align = std::max<int64_t>(1, kAlignBytes / static_cast<int64_t>(elem));
  int64_t per = (count + parts - 1) / parts;
  per = (per + align - 1) / align * align;
  *begin = std::min(count, per * index);
  *end = std::min(count, *begin + per);
}

}  // namespace smdist
