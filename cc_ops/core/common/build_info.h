// What this build of the engine contains; surfaced as mpi_built() etc.
#pragma once

namespace smdist {

constexpr bool kMpiBuilt = true;
constexpr bool kNcclBuilt = false;
constexpr bool kCudaBuilt = false;

}  // namespace smdist
