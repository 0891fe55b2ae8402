#include "transports/mpi/mpi_control_plane.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "transports/mpi/mpi_collectives.h"
#include "transports/mpi/mpi_types.h"

namespace smdist {

namespace {

// Peers that are there answer a negotiation round within microseconds: poll
// without pause that long, as MPI's blocking calls do.
constexpr auto kPollWithoutPause = std::chrono::microseconds(100);
// A peer a little behind arrives within a millisecond: poll, yielding the core.
constexpr auto kPollWithYields = std::chrono::milliseconds(1);
// Bounds what a sleep adds to a round once the late peer arrives.
constexpr auto kLongestSleep = std::chrono::microseconds(250);

// A peer may be a whole step behind, and polling all that time takes the core
// from the ranks still computing (where ranks outnumber cores, from the very
// peer being waited for): after the polls above, sleep ever longer between polls.
Status WaitSparingTheCore(MPI_Request* request, const char* what) {
  const auto start = std::chrono::steady_clock::now();
  auto sleep = std::chrono::microseconds(20);
  while (true) {
    int done = 0;
    const int rc = MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return MpiError(rc, what);
    if (done) return Status::OK();
    const auto waited = std::chrono::steady_clock::now() - start;
    if (waited < kPollWithoutPause) continue;
    if (waited < kPollWithYields) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, kLongestSleep);
    }
  }
}

}  // namespace

Status MpiControlPlane::Round(const char* what, const std::function<int()>& blocking,
                              const std::function<int(MPI_Request*)>& start) const {
  if (!spare_cores_) {
    const int rc = blocking();
    return rc == MPI_SUCCESS ? Status::OK() : MpiError(rc, what);
  }
  MPI_Request request;
  const int rc = start(&request);
  if (rc != MPI_SUCCESS) return MpiError(rc, what);
  return WaitSparingTheCore(&request, what);
}

Status MpiControlPlane::GatherToRoot(const std::vector<uint8_t>& mine,
                                     std::vector<std::vector<uint8_t>>* gathered) {
  const Topology& topo = comms_->topology();
  const int n = topo.size;
  int my_size = static_cast<int>(mine.size());
  std::vector<int> sizes(topo.rank == 0 ? n : 0);
  MPI_Comm world = comms_->world();
  // The root waits here for the last rank to reach this round; the payload follows at once.
  SMDIST_RETURN_IF_ERROR(Round(
      "MPI_Gather", [&] { return MPI_Gather(&my_size, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, world); },
      [&](MPI_Request* r) { return MPI_Igather(&my_size, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, world, r); }));
  std::vector<int> displs;
  std::vector<uint8_t> all;
  if (topo.rank == 0) {
    displs.resize(n);
    int total = 0;
    for (int r = 0; r < n; ++r) {
      displs[r] = total;
      total += sizes[r];
    }
    all.resize(total);
  }
  const int rc = MPI_Gatherv(mine.data(), my_size, MPI_BYTE, all.data(), sizes.data(), displs.data(), MPI_BYTE, 0,
                             world);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Gatherv");
  if (topo.rank == 0) {
    gathered->assign(n, {});
    for (int r = 0; r < n; ++r) {
      (*gathered)[r].assign(all.begin() + displs[r], all.begin() + displs[r] + sizes[r]);
    }
  }
  return Status::OK();
}

Status MpiControlPlane::BroadcastFromRoot(std::vector<uint8_t>* bytes) {
  int64_t size = static_cast<int64_t>(bytes->size());
  MPI_Comm world = comms_->world();
  // The other ranks wait here for the root's answer; the payload follows at once.
  SMDIST_RETURN_IF_ERROR(Round(
      "MPI_Bcast", [&] { return MPI_Bcast(&size, 1, MPI_INT64_T, 0, world); },
      [&](MPI_Request* r) { return MPI_Ibcast(&size, 1, MPI_INT64_T, 0, world, r); }));
  bytes->resize(size);
  return MpiBroadcast(world, bytes->data(), size, DataType::kUInt8, 0);
}

Status MpiControlPlane::AllreduceBits(std::vector<uint64_t>* words, bool bitwise_and) {
  const int count = static_cast<int>(words->size());
  const MPI_Op op = bitwise_and ? MPI_BAND : MPI_BOR;
  MPI_Comm world = comms_->world();
  return Round(
      "MPI_Allreduce(bits)",
      [&] { return MPI_Allreduce(MPI_IN_PLACE, words->data(), count, MPI_UINT64_T, op, world); },
      [&](MPI_Request* r) { return MPI_Iallreduce(MPI_IN_PLACE, words->data(), count, MPI_UINT64_T, op, world, r); });
}

}  // namespace smdist
