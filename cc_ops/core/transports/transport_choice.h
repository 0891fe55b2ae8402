// Which data-plane transport runs a piece of work: the first, in order of
// preference, whose Enabled() accepts it (data_transport.h). Shared by the
// fusion planner (allreduces) and the executor (the other collectives).
#pragma once

#include <vector>

#include "common/tensor_entry.h"
#include "transports/data_transport.h"

namespace smdist {

// What `entry` asks of a transport; and `entries` (one response's), taken together.
CollectiveWork WorkOf(const TensorEntry& entry);
CollectiveWork WorkOf(const std::vector<TensorEntry>& entries);

// The first of `transports` whose Enabled() accepts `work`, or null.
DataTransport* FirstEnabled(const std::vector<DataTransport*>& transports, const CollectiveWork& work);

}  // namespace smdist
