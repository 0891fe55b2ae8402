// Zero-filled host buffers that live as long as their owner: the neutral data
// a rank inside join() takes part with (joined_participation.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace smdist {

class ZeroedBuffers {
 public:
  // A new zero-filled buffer of `bytes`, never empty: transports may take the
  // address even of zero elements.
  uint8_t* New(int64_t bytes) {
    const size_t size = static_cast<size_t>(std::max<int64_t>(bytes, 8));
    buffers_.push_back(std::make_unique<uint8_t[]>(size));
    std::memset(buffers_.back().get(), 0, size);
    return buffers_.back().get();
  }

 private:
  std::vector<std::unique_ptr<uint8_t[]>> buffers_;
};

}  // namespace smdist
