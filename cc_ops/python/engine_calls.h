// Submitting entries from Python and waiting for them, for the binding's
// collectives on raw buffers.
#pragma once

#include <vector>

#include "common/status.h"
#include "common/tensor_entry.h"

namespace smdist_python {

// Submits `entries` as one group (fused where they can be) and waits until
// every one completed, without the GIL (the engine thread may run them).
// Returns the first failure.
smdist::Status RunToCompletion(std::vector<smdist::TensorEntry> entries);

}  // namespace smdist_python
