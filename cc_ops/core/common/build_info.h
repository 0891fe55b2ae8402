// What this build of the engine contains; surfaced as mpi_built() etc.
#pragma once

namespace smdist {

constexpr bool kMpiBuilt = true;
// Every build carries the GPU data plane and loads NCCL and the CUDA runtime
// when first asked (transports/registry.cc): these say whether they load here.
// NCCL's version code (2.28.9: 22809) when NCCL and the CUDA runtime load, else 0.
int NcclVersionLoadable();
bool CudaRuntimeLoadable();

}  // namespace smdist
