// What a rank inside join() takes part in the others' collectives with: it
// holds no entry of its own, so it contributes neutral data (zeros, the
// reduction's identity, no rows) and its results are discarded.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/tensor_entry.h"
#include "control/message.h"

namespace smdist {

class JoinedParticipation {
 public:
  // An entry for the collective `params` describes (one contributor's
  // parameters) whose buffers live as long as this object.
  TensorEntry Entry(const Request& params);

 private:
  void* NewBuffer(int64_t bytes);

  std::vector<std::unique_ptr<uint8_t[]>> buffers_;
};

}  // namespace smdist
