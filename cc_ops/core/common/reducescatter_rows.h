// How a reducescatter splits its input among the ranks: the engine sizes the
// transfers with it, the framework kernels size each rank's output.
#pragma once

#include <cstdint>

namespace smdist {

// Rows of a reducescatter output on `rank`: dim0 split as evenly as possible,
// lower ranks taking the remainder.
inline int64_t ReducescatterRows(int64_t dim0, int size, int rank) {
  return dim0 / size + (rank < dim0 % size ? 1 : 0);
}

}  // namespace smdist
